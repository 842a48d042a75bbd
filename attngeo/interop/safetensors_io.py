"""Flat tensor files: safetensors (first-class) and, only when torch is installed, PyTorch `.pt`.

A checkpoint is a flat mapping `name -> numpy array` (the state dict of the public model code,
e.g. `transformer.h.0.attn.c_q.weight`). safetensors is read and written with the `safetensors`
package's numpy API (bfloat16 arrives as `ml_dtypes.bfloat16`); string metadata rides along. A
`.pt` state dict is read only through `torch.load(weights_only=True)` — tensors and containers,
never arbitrary pickled objects — and only when torch is installed (`pip install 'attngeo[torch]'`);
otherwise the error names a one-line conversion to run where torch is.

A file that is not what its suffix says (empty, truncated, another format) is one line naming it.
`write` goes through a temporary file and a rename (`files.atomic_write`: never half-written) and
leaves the file with the mode `open` would give (0o666 less the umask: 0644 under umask 022;
safetensors itself creates 0600); a full disk or the file-size limit during `write` is the `OSError`
(ENOSPC / EFBIG) it is, not safetensors' own error text (`os_error`). A pickle `torch.load(weights_only=True)`
refuses is one line naming what it holds, its warnings silenced and torch's advice to load it unsafely dropped.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import re
import warnings

import numpy as np

from attngeo import errors

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def read(path: str) -> dict[str, np.ndarray]:
  """All tensors of a `.safetensors` file or (with torch) a `.pt`/`.pth`/`.bin` state dict.

  Args:
    path: the file.
  Returns:
    {name: array}, dtypes as stored (float32, float16, bfloat16, ...).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no checkpoint file at {path}")
  if path.endswith(SAFETENSORS_SUFFIXES):
    from safetensors.numpy import load_file
    with _unreadable(path):
      return dict(load_file(path))
  if path.endswith(TORCH_SUFFIXES):
    return read_torch(path)
  raise ValueError(f"checkpoint {path} must end in {SAFETENSORS_SUFFIXES + TORCH_SUFFIXES}")


def metadata(path: str) -> dict[str, str]:
  """The string metadata of a safetensors file's header ({} if it has none)."""
  from safetensors import safe_open
  with _unreadable(path), safe_open(path, framework="np") as f:
    return dict(f.metadata() or {})


@contextlib.contextmanager
def _unreadable(path: str):
  """Turn a reader's failure on a damaged file (empty, truncated, another format) into one ValueError line."""
  from safetensors import SafetensorError
  try:
    yield
  except (SafetensorError, OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as e:
    raise ValueError(f"{path} is not a readable checkpoint (empty, truncated or another format; "
                     f"{os.path.getsize(path)} bytes): {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0]


def file_mode() -> int:
  """The permission bits `open(path, "w")` gives a new file here: 0o666 less the process umask."""
  mask = os.umask(0)
  os.umask(mask)
  return 0o666 & ~mask


def write(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
  """Write {name: array} to a safetensors file (contiguous copies; metadata values must be strings)."""
  from safetensors import SafetensorError
  from safetensors.numpy import save_file

  from attngeo import files
  bad = sorted(k for k, v in (metadata or {}).items() if not isinstance(v, str))
  if bad:
    raise errors.InputTypeError(f"safetensors metadata values must be strings; not for {bad}")

  def save(tmp):
    try:
      save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata)
    except SafetensorError as e:
      raise os_error(e, path) from None
    os.chmod(tmp, file_mode())
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.atomic_write(path, save)


def refuse_overwrite(path: str, tensors: dict[str, np.ndarray], header: dict[str, str] | None,
                     others: dict[str, str | bytes]) -> None:
  """One ValueError line, before anything is written, when a file an export would write exists and does not hold
  exactly what it would write: `path` (the safetensors of `tensors` and metadata `header`) and `others` ({path: text or
  bytes}: config.json, a meta json, vocab.txt). Writing the same export again is allowed; nothing else is ever
  overwritten (a run folder's own config.json, an export of another model). The safetensors file is compared by
  content (names, dtypes, values, metadata): its header's key order is not fixed."""
  def holds(p, data):
    if not os.path.isfile(p) or os.path.getsize(p) != len(data):
      return False
    with open(p, "rb") as f:
      return f.read() == data

  def holds_tensors():
    try:
      old, meta = read(path), metadata(path)
    except ValueError:                             # not a safetensors file: something else
      return False
    return meta == (header or {}) and old.keys() == tensors.keys() and all(
        old[k].dtype == np.asarray(v).dtype and np.array_equal(old[k], v) for k, v in tensors.items())
  clash = [p for p, data in others.items()
           if os.path.lexists(p) and not holds(p, data.encode() if isinstance(data, str) else data)]
  if os.path.lexists(path) and not (os.path.isfile(path) and path.endswith(SAFETENSORS_SUFFIXES) and holds_tensors()):
    clash.insert(0, path)
  if clash:
    raise ValueError(f"export would overwrite {', '.join(clash)} (holding something else than this export); "
                     "choose a new --out folder or remove it first")


def os_error(e: Exception, path: str) -> Exception:
  """The `OSError(errno, strerror, path)` a writer's error text names (safetensors' Rust writer raises
  `SafetensorError: ... No space left on device (os error 28)`), so a full disk (ENOSPC) or the file-size
  limit (EFBIG, `ulimit -f`) reads as the OSError it is; `e` itself when it names none."""
  m = re.search(r"\(os error (\d+)\)", str(e))
  return OSError(int(m.group(1)), os.strerror(int(m.group(1))), path) if m else e


def conversion_hint(path: str) -> str:
  """A one-line shell command converting a `.pt` state dict to safetensors where torch is installed."""
  out = os.path.splitext(path)[0] + ".safetensors"
  return ("python -c \"import torch, safetensors.torch as st; "
          f"sd = torch.load('{path}', map_location='cpu', weights_only=True); "
          f"st.save_file({{k: v.detach().clone().contiguous() for k, v in sd.items()}}, '{out}')\"")


def _refused(e: Exception) -> str:
  """What `torch.load(weights_only=True)` refused, in one line ("Unsupported global: GLOBAL io.open")."""
  m = re.search(r"WeightsUnpickler error:\s*(.+?)(?: was not an allowed global|\n|$)", str(e).strip(), re.S)
  what = m.group(1).strip() if m else _first_line(e)
  return f"its pickle holds more than tensors ({what}); refused, never run"


def read_torch(path: str) -> dict[str, np.ndarray]:
  """A PyTorch state dict via `torch.load(weights_only=True)`; bfloat16 is widened to float32 (exactly)."""
  try:
    import torch
  except ImportError:
    raise ImportError(f"{path} is a PyTorch pickle and torch is not installed: pip install 'attngeo[torch]', or "
                      f"convert it where torch is: {conversion_hint(path)}") from None
  with _unreadable(path), warnings.catch_warnings():
    warnings.simplefilter("ignore")              # "Detected pickle protocol 4 …": the refusal below says it all
    try:
      state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:          # torch's text advises weights_only=False: never here
      raise pickle.UnpicklingError(_refused(e)) from None
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise ValueError(f"{path} does not hold a flat state dict of tensors (got {type(state).__name__})")
  out = {}
  for name, t in state.items():
    t = t.detach().cpu()
    out[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
  return out
