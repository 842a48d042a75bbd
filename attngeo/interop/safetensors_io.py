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
safetensors itself creates 0600).
"""
from __future__ import annotations

import contextlib
import os
import pickle

import numpy as np

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
  from safetensors.numpy import save_file

  from attngeo import files
  bad = sorted(k for k, v in (metadata or {}).items() if not isinstance(v, str))
  if bad:
    raise TypeError(f"safetensors metadata values must be strings; not for {bad}")

  def save(tmp):
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata)
    os.chmod(tmp, file_mode())
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.atomic_write(path, save)


def conversion_hint(path: str) -> str:
  """A one-line shell command converting a `.pt` state dict to safetensors where torch is installed."""
  out = os.path.splitext(path)[0] + ".safetensors"
  return ("python -c \"import torch, safetensors.torch as st; "
          f"sd = torch.load('{path}', map_location='cpu', weights_only=True); "
          f"st.save_file({{k: v.detach().clone().contiguous() for k, v in sd.items()}}, '{out}')\"")


def read_torch(path: str) -> dict[str, np.ndarray]:
  """A PyTorch state dict via `torch.load(weights_only=True)`; bfloat16 is widened to float32 (exactly)."""
  try:
    import torch
  except ImportError:
    raise ImportError(f"{path} is a PyTorch pickle and torch is not installed: pip install 'attngeo[torch]', or "
                      f"convert it where torch is: {conversion_hint(path)}") from None
  with _unreadable(path):
    state = torch.load(path, map_location="cpu", weights_only=True)
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise ValueError(f"{path} does not hold a flat state dict of tensors (got {type(state).__name__})")
  out = {}
  for name, t in state.items():
    t = t.detach().cpu()
    out[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
  return out
