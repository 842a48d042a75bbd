"""Flat tensor files: safetensors (first-class) and, only when torch is installed, PyTorch `.pt`.

A checkpoint is a flat mapping `name -> numpy array` (the state dict of the public model code,
e.g. `transformer.h.0.attn.c_q.weight`). safetensors is read and written with the `safetensors`
package's numpy API (bfloat16 arrives as `ml_dtypes.bfloat16`); string metadata rides along. A
`.pt` state dict is read only through `torch.load(weights_only=True)` — tensors and containers,
never arbitrary pickled objects — and only when torch is installed (`pip install 'attngeo[torch]'`);
otherwise the error names a one-line conversion to run where torch is.
"""
from __future__ import annotations

import os

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
    return dict(load_file(path))
  if path.endswith(TORCH_SUFFIXES):
    return read_torch(path)
  raise ValueError(f"checkpoint {path} must end in {SAFETENSORS_SUFFIXES + TORCH_SUFFIXES}")


def metadata(path: str) -> dict[str, str]:
  """The string metadata of a safetensors file's header ({} if it has none)."""
  from safetensors import safe_open
  with safe_open(path, framework="np") as f:
    return dict(f.metadata() or {})


def write(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
  """Write {name: array} to a safetensors file (contiguous copies; metadata values must be strings)."""
  from safetensors.numpy import save_file
  bad = sorted(k for k, v in (metadata or {}).items() if not isinstance(v, str))
  if bad:
    raise TypeError(f"safetensors metadata values must be strings; not for {bad}")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata=metadata)


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
  state = torch.load(path, map_location="cpu", weights_only=True)
  if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
    raise ValueError(f"{path} does not hold a flat state dict of tensors (got {type(state).__name__})")
  out = {}
  for name, t in state.items():
    t = t.detach().cpu()
    out[name] = (t.float() if t.dtype == torch.bfloat16 else t).numpy()
  return out
