"""Where experiment tables go: `<out>/<name>.md` (printed too) and `<out>/<name>.json`."""
from __future__ import annotations

import json
import os


def write(out: str, name: str, markdown: str, payload) -> None:
  """Print the Markdown table and write it with its JSON payload to `out`."""
  print(markdown)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, f"{name}.md"), "w") as f:
    f.write(markdown + "\n")
  with open(os.path.join(out, f"{name}.json"), "w") as f:
    json.dump(payload, f, indent=1, default=str)
