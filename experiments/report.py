"""The one table writer of the experiments: a list of row dicts → Markdown (printed), CSV and JSON.

    cols = [Col("operator"), Col("seconds", "step ms", lambda s: f"{1e3 * s:.1f}")]
    report.write(out, "bench_train", rows, cols, payload={"config": ...}, note="…")

writes `<out>/<name>.md` (the table and the note), `<out>/<name>.csv` (raw values of the
columns) and `<out>/<name>.json` (`payload`, default the rows), prints the Markdown and returns it.
A command that writes files ends with one line naming them, `report.wrote(out, "a.md", "a.png")`.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
from typing import Any, Callable

from attngeo import files


@dataclasses.dataclass(frozen=True)
class Col:
  """A column: `key` in each row, its `label`, a formatter (a format spec like ".3g" or a callable)
  and alignment (numbers right-aligned)."""
  key: str
  label: str | None = None
  fmt: str | Callable[[Any], str] = ""
  align: str = "auto"

  def cell(self, row: dict) -> str:
    v = row.get(self.key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
      return "—"
    if callable(self.fmt):
      return self.fmt(v)
    return format(v, self.fmt) if self.fmt else str(v)


def markdown(rows: list[dict], cols: list[Col]) -> str:
  """A GitHub-Markdown table of `rows` over `cols`."""
  def right(c):
    if c.align != "auto":
      return c.align == "right"
    return any(isinstance(r.get(c.key), (int, float)) and not isinstance(r.get(c.key), bool) for r in rows)
  lines = ["| " + " | ".join(c.label or c.key for c in cols) + " |",
           "|" + "|".join("---:" if right(c) else "---" for c in cols) + "|"]
  lines += ["| " + " | ".join(c.cell(r) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def write(out: str, name: str, rows: list[dict], cols: list[Col], *, payload=None, note: str = "",
          quiet: bool = False) -> str:
  """Write `<out>/<name>.{md,csv,json}`; print and return the Markdown (table, then `note`)."""
  md = markdown(rows, cols) + (f"\n\n{note}" if note else "")
  if not quiet:
    print(md)
  os.makedirs(out, exist_ok=True)
  table = io.StringIO(newline="")
  w = csv.writer(table)
  w.writerow([c.key for c in cols])
  w.writerows([[r.get(c.key) for c in cols] for r in rows])
  # each file through a temporary and a rename: a kill mid-write never leaves a half-written table
  files.atomic_write(os.path.join(out, f"{name}.json"), json.dumps(rows if payload is None else payload, indent=1,
                                                                   default=str))
  files.atomic_write(os.path.join(out, f"{name}.csv"), table.getvalue())
  files.atomic_write(os.path.join(out, f"{name}.md"), md + "\n")
  return md


def wrote(out: str, *names: str, suffix: str = "") -> None:
  """Print the one line every command that writes files ends with: `wrote OUT/a, b, c` (and `suffix`)."""
  print(f"wrote {os.path.join(out, names[0])}" + "".join(f", {n}" for n in names[1:]) + suffix, flush=True)
