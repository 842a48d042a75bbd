"""Key layouts: checking a flat state dict against the keys and shapes a layout expects, and moving
arrays in and out of an attngeo model by parameter path.

A parameter path is the `nnx` state path joined by dots (`blocks.3.attn.wq`, `embed`). `check`
raises ONE line naming every missing key, unexpected key and wrong shape; `build` fills an
abstract (shape-only) model with given arrays, so no random weights are ever materialised.

Export is lossless or refuses: `settings` is what fixes the function a GPT computes, and
`unexpressed` names, in one line, every setting of a model that a layout's own reading of its
files (its importer's config) would not give back.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

import numpy as np

MAX_LISTED = 24
COMPUTE_ONLY = ("implementation", "dtype")   # how a forward is computed (kernel, precision), not which function


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


def positive_ints(source: dict, names, where: str) -> tuple[int, ...]:
  """source[name] for each of `names`, each required to be an integer ≥ 1: else one line naming them all."""
  bad = [f"{k}={source[k]!r}" for k in names
         if isinstance(source[k], bool) or not isinstance(source[k], (int, np.integer)) or source[k] < 1]
  if bad:
    raise ValueError(f"{where} needs positive integers; got {', '.join(bad)}")
  return tuple(int(source[k]) for k in names)


def shapes(tensors: dict[str, np.ndarray]) -> dict[str, tuple]:
  return {k: tuple(np.shape(v)) for k, v in tensors.items()}


def _path(path) -> str:
  return ".".join(str(p) for p in path)


def params(model) -> dict[str, np.ndarray]:
  """{parameter path: float32 numpy array} of every `nnx.Param` in `model`."""
  from flax import nnx
  return {_path(p): np.asarray(v.get_value(), np.float32) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def build(cfg, arrays: dict[str, np.ndarray], source: str = "converted state", model_class=None):
  """A `model_class` (default `nn.GPT`) for `cfg` whose every parameter is taken from `arrays` {path: array}
  (cast to float32).

  The model is first built abstractly (`nnx.eval_shape`), so memory holds only the given arrays.
  """
  import jax.numpy as jnp
  from flax import nnx
  from attngeo.nn.gpt import GPT
  abstract = nnx.eval_shape(lambda: (model_class or GPT)(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  flat = list(nnx.to_flat_state(state))
  non_params = [_path(p) for p, v in flat if not isinstance(v, nnx.Param)]
  if non_params:
    raise ValueError(f"cannot fill non-parameter state {non_params} from a checkpoint")
  check(shapes(arrays), {_path(p): tuple(v.get_value().shape) for p, v in flat}, source)
  bad = next((k for k in sorted(arrays, key=natural_key) if not np.all(np.isfinite(np.asarray(arrays[k], np.float32)))),
             None)
  if bad is not None:
    raise ValueError(f"{source}: the weights of {bad} (attngeo parameter) hold NaN or Inf; a checkpoint must be finite")
  for p, v in flat:
    v.set_value(jnp.asarray(np.asarray(arrays[_path(p)], np.float32)))
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def settings(cfg) -> dict:
  """{field: value} of a GPTConfig and its block that fix the function the model computes.

  Left out: the `COMPUTE_ONLY` fields, and fields that cannot act — rotary options without rotary,
  QK-norm's scale without QK-norm, the gate width without value embeddings, CMAP's coupling under
  another operator. Equal functions get equal values: head_dim as the head width used, num_kv_heads
  and padded_vocab None when they equal num_heads / vocab_size, mlp_ratio as hidden/width of the
  integer hidden width, the operator as its corner name (else (β, α); "CMAP"), every window equal
  to seq_len as () (the same attention on every input of up to seq_len + 1 tokens).
  """
  b = cfg.block
  out = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name != "block"}
  out.update({f.name: getattr(b, f.name) for f in dataclasses.fields(b) if f.name not in COMPUTE_ONLY})
  out.update(head_dim=b.dh, num_kv_heads=None if b.num_kv_heads in (None, b.num_heads) else b.num_kv_heads,
             padded_vocab=None if cfg.padded_vocab in (None, cfg.vocab_size) else cfg.padded_vocab,
             mlp_ratio=int(b.width * b.mlp_ratio) / b.width,
             operator=_operator_name(b.operator),
             attn_windows=() if all(w == cfg.seq_len for w in cfg.attn_windows) else tuple(cfg.attn_windows))
  inert = [("use_rope", ("rope_base", "rope_sign", "rope_style", "rope_dtype")), ("qk_norm", ("qk_norm_scale",)),
           ("value_embeds", ("value_gate_channels",))]
  for switch, fields in inert:
    if not out[switch]:
      for name in fields:
        out.pop(name)
  if out["operator"] != "CMAP":
    out.pop("coupling")
  return out


def _operator_name(operator):
  from attngeo import operators
  from attngeo.nn.layers import resolve_operator
  if operators.is_magnetic(operator):
    return "CMAP"
  pair = resolve_operator(operator)
  return next((name for name, corner in operators.CORNERS.items() if corner == pair), pair)


def unexpressed(cfg, readback, layout_name: str) -> None:
  """Raise one ValueError line naming every setting of `cfg` that `readback` (the config an import of
  the exported files gives) does not reproduce; `settings` decides what counts (a field that only
  acts under a switch is compared where both have the switch: the switch itself is named)."""
  have, get = settings(cfg), settings(readback)
  bad = [f"{k}={have[k]!r} ({layout_name}: {get[k]!r})" for k in have.keys() & get.keys() if have[k] != get[k]]
  if bad:
    raise ValueError(f"cannot export to {layout_name} without changing the model: " + ", ".join(sorted(bad)) +
                     f" ({layout_name}'s files cannot carry these settings)")


def read_json(path: str) -> dict:
  """A JSON object from `path`, or one line naming the file."""
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from None
  if not isinstance(out, dict):
    raise ValueError(f"{path} must hold a JSON object; got {type(out).__name__}")
  return out


def paths(path: str) -> tuple[str, str]:
  """(weights file, config.json) of a model folder (model.safetensors, else pytorch_model.bin) or a weights file."""
  if os.path.isdir(path):
    for name in ("model.safetensors", "pytorch_model.bin"):
      if os.path.isfile(os.path.join(path, name)):
        return os.path.join(path, name), os.path.join(path, "config.json")
    raise FileNotFoundError(f"{path} has neither model.safetensors nor pytorch_model.bin")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no checkpoint folder or file at {path}")
  return path, os.path.join(os.path.dirname(path), "config.json")


def hf_config(weights: str, cfg_path: str, given, name: str) -> dict:
  """The Hugging Face config of `weights`: `given` itself when a dict, else the JSON at `given` (a path) or at
  `cfg_path` (beside the weights, from `paths`); a missing file is one line naming `name`'s layout."""
  if isinstance(given, dict):
    return given
  cfg_path = given or cfg_path
  if not os.path.isfile(cfg_path):
    raise FileNotFoundError(f"no {name} config.json at {cfg_path}; pass the one that came with {weights}")
  return read_json(cfg_path)
