"""Read a checkpoint file as a flat `{name: numpy array}` state dict, never unpickling untrusted data.

* `.safetensors` — `safetensors.numpy.load_file` (a header of names/dtypes/shapes and raw bytes;
  bfloat16 tensors, which numpy holds only through ml_dtypes, are widened to float32);
* `.pt` / `.pth` / `.bin` — only through `torch.load(..., weights_only=True)` (torch's restricted
  unpickler: tensors and plain containers) when torch is installed (`pip install attngeo[torch]`);
  otherwise a one-line error with the conversion command. Nothing else is ever unpickled.

A training checkpoint that nests its weights (`{"model": ..., "ema": ..., "opt": ...}`, as SiT's and
DiT's `train.py` write) is unwrapped by `select` (SiT's `find_model` takes `"ema"`).
"""
from __future__ import annotations

import os

import numpy as np

TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def convert_hint(path: str) -> str:
  out = os.path.splitext(path)[0] + ".safetensors"
  return (f"python -c \"import torch; from safetensors.torch import save_file; "
          f"sd = torch.load('{path}', map_location='cpu', weights_only=True); sd = sd.get('ema', sd); "
          f"save_file({{k: v.contiguous() for k, v in sd.items()}}, '{out}')\"")


def _load_torch(path: str) -> dict:
  try:
    import torch
  except ImportError:
    raise ValueError(f"{path} is a PyTorch pickle; reading it needs torch (pip install 'attngeo[torch]'), "
                     f"or convert it once to safetensors: {convert_hint(path)}") from None
  obj = torch.load(path, map_location="cpu", weights_only=True)
  if not isinstance(obj, dict):
    raise ValueError(f"{path} holds a {type(obj).__name__}, not a state dict of tensors")
  obj = select(obj, path)

  def to_numpy(t):
    if t.dtype == torch.bfloat16:
      t = t.float()
    return t.detach().cpu().numpy()
  return {k: to_numpy(v) for k, v in obj.items() if hasattr(v, "detach")}


def select(state: dict, path: str = "checkpoint") -> dict:
  """The weights of a nested training checkpoint: its `"ema"`, else `"model"`/`"state_dict"`, else itself."""
  for key in ("ema", "model", "state_dict"):
    if key in state and isinstance(state[key], dict):
      return state[key]
  return state


def load(path: str) -> dict[str, np.ndarray]:
  """`{name: array}` of a `.safetensors` file (or, with torch installed, a `.pt` state dict)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint {path} does not exist")
  if path.endswith(".safetensors"):
    from safetensors import SafetensorError
    from safetensors.numpy import load_file
    try:
      tensors = load_file(path)
    except (SafetensorError, TypeError, ValueError) as e:
      raise ValueError(f"{path} is not a readable safetensors file: {str(e).splitlines()[0]}") from None
    return {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in tensors.items()}
  if path.endswith(TORCH_SUFFIXES):
    return _load_torch(path)
  raise ValueError(f"checkpoint must be a .safetensors file (or a {'/'.join(TORCH_SUFFIXES)} state dict with torch "
                   f"installed); got {path!r}")


def save(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None):
  """Write `{name: array}` as safetensors (contiguous copies; names as given)."""
  from safetensors.numpy import save_file
  save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path, metadata=metadata)
