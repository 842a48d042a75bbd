"""Key layouts: checking a flat state dict against the keys and shapes a layout expects, and moving
arrays in and out of an attngeo model by parameter path.

A parameter path is the `nnx` state path joined by dots (`blocks.3.attn.wq`, `embed`). `check`
raises ONE line naming every missing key, unexpected key and wrong shape; `build` fills an
abstract (shape-only) model with given arrays, so no random weights are ever materialised.
"""
from __future__ import annotations

import re

import numpy as np

MAX_LISTED = 24


def natural_key(name: str):
  """Sort key putting `h.2` before `h.10`."""
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def _listing(names) -> str:
  names = sorted(names, key=natural_key)
  more = f", … (+{len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else ""
  return ", ".join(names[:MAX_LISTED]) + more


def check(found: dict[str, tuple], expected: dict[str, tuple], source: str) -> None:
  """Raise one ValueError line if `found` {key: shape} differs from `expected` {key: shape}.

  Args:
    found: keys and shapes present in the checkpoint.
    expected: keys and shapes the layout (and the config) call for.
    source: the file or layout named in the message.
  """
  missing = set(expected) - set(found)
  unexpected = set(found) - set(expected)
  wrong = [k for k in set(found) & set(expected) if tuple(found[k]) != tuple(expected[k])]
  parts = []
  if missing:
    parts.append(f"missing keys: {_listing(missing)}")
  if unexpected:
    parts.append(f"unexpected keys: {_listing(unexpected)}")
  if wrong:
    shown = [f"{k} {tuple(found[k])} (expected {tuple(expected[k])})" for k in sorted(wrong, key=natural_key)]
    parts.append("wrong shapes: " + ", ".join(shown[:MAX_LISTED]) + (" …" if len(shown) > MAX_LISTED else ""))
  if parts:
    raise ValueError(f"{source} does not match the expected layout: " + "; ".join(parts))


def shapes(tensors: dict[str, np.ndarray]) -> dict[str, tuple]:
  return {k: tuple(np.shape(v)) for k, v in tensors.items()}


def _path(path) -> str:
  return ".".join(str(p) for p in path)


def params(model) -> dict[str, np.ndarray]:
  """{parameter path: float32 numpy array} of every `nnx.Param` in `model`."""
  from flax import nnx
  return {_path(p): np.asarray(v.get_value(), np.float32) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def build(cfg, arrays: dict[str, np.ndarray], source: str = "converted state"):
  """An `nn.GPT` for `cfg` whose every parameter is taken from `arrays` {path: array} (cast to float32).

  The model is first built abstractly (`nnx.eval_shape`), so memory holds only the given arrays.
  """
  import jax.numpy as jnp
  from flax import nnx
  from attngeo.nn.gpt import GPT
  abstract = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = list(nnx.to_flat_state(state))
  non_params = [_path(p) for p, v in flat if not isinstance(v, nnx.Param)]
  if non_params:
    raise ValueError(f"cannot fill non-parameter state {non_params} from a checkpoint")
  check(shapes(arrays), {_path(p): tuple(v.get_value().shape) for p, v in flat}, source)
  for p, v in flat:
    v.set_value(jnp.asarray(np.asarray(arrays[_path(p)], np.float32)))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))
