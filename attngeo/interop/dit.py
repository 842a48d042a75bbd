"""The official SiT and DiT PyTorch checkpoints into `attngeo.nn.DiT` (same forward, to float32 round-off).

Matched against `models.py` of willisma/SiT (commit 947f95bd3a510e9af441d38c1e9f72e0eee873c5) and
facebookresearch/DiT (commit ed81ce2229091fd4ecc9a223645f95cf379d582b): the two networks are the same
module tree (SiT's forward drops the learned-sigma channels, DiT's returns them). Key layout, with
width D, MLP hidden F = mlp_ratio·D, patch p, input channels C, output channels C' (2C with learned
sigma), T tokens, K label rows (num_classes + 1 with label dropout: the null label is the last row):

    x_embedder.proj.weight [D, C, p, p], .bias [D]     stride-p Conv2d (timm PatchEmbed)
    pos_embed [1, T, D]                                fixed 2-D sin-cos (stored, not trained)
    t_embedder.mlp.{0,2}.weight [D, 256] / [D, D], .bias
    y_embedder.embedding_table.weight [K, D]
    blocks.{i}.attn.qkv.weight [3D, D], .bias [3D]     rows: q, k, v; within each, head-major (h, k)
    blocks.{i}.attn.proj.weight [D, D], .bias [D]
    blocks.{i}.mlp.fc1.weight [F, D], .bias; blocks.{i}.mlp.fc2.weight [D, F], .bias   (tanh GELU)
    blocks.{i}.adaLN_modulation.1.weight [6D, D], .bias [6D]   shift/scale/gate (attn), (mlp)
    final_layer.adaLN_modulation.1.weight [2D, D], .bias [2D]  shift, scale
    final_layer.linear.weight [p²C', D], .bias [p²C']           per-token (p, q, c) order

torch's `Linear` stores `[out, in]`; attngeo stores `[in, out]` (and `[d, h, k]` / `[h, k, d]` for the
attention projections). The number of heads is not in the weights: it comes from the preset of the
width (S 6, B 12, L 16, XL 16) or `num_heads`. SiT feeds t ∈ [0, 1] and DiT integer steps 0…999 to
the same sinusoid, so both import with `time_scale = 1`.
"""
from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

from attngeo.interop import layout, safetensors_io
from attngeo.nn import presets

HEADS_BY_WIDTH = {384: 6, 768: 12, 1024: 16, 1152: 16}
REQUIRED = ("x_embedder.proj.weight", "pos_embed", "final_layer.linear.weight", "y_embedder.embedding_table.weight")


def _names(keys, limit: int = 5) -> str:
  keys = sorted(keys, key=layout.natural_key)
  more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
  return ", ".join(keys[:limit]) + more


def config_from_state_dict(sd: dict, num_heads: int | None = None, num_classes: int | None = None, **overrides):
  """The `DiTConfig` of an official SiT/DiT state dict (shapes read from the weights).

  Args:
    sd: `{name: array}` in the official layout.
    num_heads: heads per layer, a positive divisor of the width (default: the preset of the width).
    num_classes: real classes (≥ 1); the table then has `num_classes + 1` rows (label dropout, null label
      last) or `num_classes` rows (no dropout). Default: rows − 1 with a null label, as the official
      class-conditional checkpoints (1001 rows for ImageNet's 1000 classes).
    overrides: further `DiTConfig.create` fields (e.g. `operator`, `implementation`).
  """
  from attngeo.nn import DiTConfig
  given = {k: v for k, v in (("num_heads", num_heads), ("num_classes", num_classes)) if v is not None}
  layout.positive_ints(given, given, "a SiT/DiT import")
  missing = [k for k in REQUIRED if k not in sd]
  if missing:
    raise ValueError(f"not a SiT/DiT checkpoint: missing {_names(missing)} (it has {_names(sd) or 'no tensors'})")
  d, c, p, p2 = np.shape(sd["x_embedder.proj.weight"])
  tokens = np.shape(sd["pos_embed"])[1]
  grid = int(round(tokens ** 0.5))
  if p != p2 or grid * grid != tokens:
    raise ValueError(f"x_embedder.proj.weight {np.shape(sd['x_embedder.proj.weight'])} / pos_embed "
                     f"{np.shape(sd['pos_embed'])} do not describe square patches on a square grid")
  depth = len({m.group(1) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))})
  hidden = np.shape(sd.get("blocks.0.mlp.fc1.weight", (4 * d, d)))[0]
  out = np.shape(sd["final_layer.linear.weight"])[0] // (p * p)
  if out not in (c, 2 * c):
    raise ValueError(f"final_layer.linear.weight has {np.shape(sd['final_layer.linear.weight'])[0]} rows; "
                     f"expected p²·C = {p * p * c} or p²·2C = {2 * p * p * c} (learned sigma)")
  rows = np.shape(sd["y_embedder.embedding_table.weight"])[0]
  if num_classes is None:
    num_classes, dropout = rows - 1, 0.1
  elif rows in (num_classes, num_classes + 1):
    dropout = 0.1 if rows == num_classes + 1 else 0.0
  else:
    raise ValueError(f"y_embedder.embedding_table.weight has {rows} rows; num_classes={num_classes} needs "
                     f"{num_classes} (no label dropout) or {num_classes + 1} (with the null label)")
  heads = num_heads or HEADS_BY_WIDTH.get(int(d))
  if heads is None:
    raise ValueError(f"width {d} is not a SiT/DiT preset width {sorted(HEADS_BY_WIDTH)}; pass num_heads")
  if d % heads:
    raise ValueError(f"num_heads={heads} must divide the checkpoint's width {d}")
  fields = dict(image_size=int(grid * p), patch=int(p), channels=int(c), depth=depth, num_classes=int(num_classes),
                class_dropout_prob=dropout, learn_sigma=out == 2 * c, time_scale=1.0, width=int(d),
                num_heads=int(heads), mlp_ratio=hidden / d, **presets.fields("dit"), operator="ATTN")
  return DiTConfig.create(**{**fields, **overrides})


def expected_shapes(cfg) -> dict[str, tuple[int, ...]]:
  """`{official key: shape}` of a `DiTConfig` in the SiT/DiT layout."""
  d, p, c = cfg.block.width, cfg.patch, cfg.channels
  f = int(d * cfg.block.mlp_ratio)
  rows = cfg.num_classes + (cfg.null_label is not None)
  shapes = {"x_embedder.proj.weight": (d, c, p, p), "x_embedder.proj.bias": (d,),
            "pos_embed": (1, (cfg.image_size // p) ** 2, d),
            "t_embedder.mlp.0.weight": (d, 256), "t_embedder.mlp.0.bias": (d,),
            "t_embedder.mlp.2.weight": (d, d), "t_embedder.mlp.2.bias": (d,),
            "y_embedder.embedding_table.weight": (rows, d),
            "final_layer.adaLN_modulation.1.weight": (2 * d, d), "final_layer.adaLN_modulation.1.bias": (2 * d,),
            "final_layer.linear.weight": (p * p * cfg.out_channels, d),
            "final_layer.linear.bias": (p * p * cfg.out_channels,)}
  for i in range(cfg.depth):
    b = f"blocks.{i}."
    shapes.update({b + "attn.qkv.weight": (3 * d, d), b + "attn.qkv.bias": (3 * d,),
                   b + "attn.proj.weight": (d, d), b + "attn.proj.bias": (d,),
                   b + "mlp.fc1.weight": (f, d), b + "mlp.fc1.bias": (f,),
                   b + "mlp.fc2.weight": (d, f), b + "mlp.fc2.bias": (d,),
                   b + "adaLN_modulation.1.weight": (6 * d, d), b + "adaLN_modulation.1.bias": (6 * d,)})
  return shapes


def check_state_dict(sd: dict, cfg, path: str = "checkpoint"):
  """One-line error naming the missing, unexpected and wrongly shaped keys against `expected_shapes(cfg)`."""
  layout.check(layout.shapes(sd), expected_shapes(cfg),
               f"{path} (SiT/DiT, {cfg.depth} blocks of width {cfg.block.width})")


def load_state_dict(model, sd: dict, path: str = "checkpoint"):
  """Copy an official SiT/DiT state dict into `model` (an ATTN-parametrised `attngeo.nn.DiT`), in place."""
  cfg = model.cfg
  check_state_dict(sd, cfg, path)
  if cfg.block.distance_form:
    raise ValueError("load the checkpoint into the W_Q/W_K form first, then fold_distance")
  f32 = lambda k: np.asarray(sd[k], np.float32)
  d, p, c, h = cfg.block.width, cfg.patch, cfg.channels, cfg.block.num_heads
  dh = d // h

  def put(var, value):
    var[...] = jnp.asarray(value, jnp.float32)

  put(model.patch_w, f32("x_embedder.proj.weight").transpose(2, 3, 1, 0).reshape(p * p * c, d))
  put(model.patch_b, f32("x_embedder.proj.bias"))
  put(model.pos, f32("pos_embed")[0])
  te = model.t_embed
  put(te.w1, f32("t_embedder.mlp.0.weight").T)
  put(te.b1, f32("t_embedder.mlp.0.bias"))
  put(te.w2, f32("t_embedder.mlp.2.weight").T)
  put(te.b2, f32("t_embedder.mlp.2.bias"))
  put(model.y_embed, f32("y_embedder.embedding_table.weight"))
  for i, blk in enumerate(model.blocks):
    b = f"blocks.{i}."
    att = blk.attn
    wq, wk, wv = np.split(f32(b + "attn.qkv.weight"), 3, 0)       # each [D_out = (h, k), D_in]
    bq, bk, bv = np.split(f32(b + "attn.qkv.bias"), 3)
    for name, w in (("wq", wq), ("wk", wk), ("wv", wv)):
      put(getattr(att, name), w.T.reshape(d, h, dh))
    for name, bias in (("bq", bq), ("bk", bk), ("bv", bv)):
      put(getattr(att, name), bias.reshape(h, dh))
    put(att.wo, f32(b + "attn.proj.weight").T.reshape(h, dh, d))
    put(att.bo, f32(b + "attn.proj.bias"))
    put(blk.mlp.w1, f32(b + "mlp.fc1.weight").T)
    put(blk.mlp.b1, f32(b + "mlp.fc1.bias"))
    put(blk.mlp.w2, f32(b + "mlp.fc2.weight").T)
    put(blk.mlp.b2, f32(b + "mlp.fc2.bias"))
    put(blk.ada_w, f32(b + "adaLN_modulation.1.weight").T)
    put(blk.ada_b, f32(b + "adaLN_modulation.1.bias"))
  put(model.final.ada_w, f32("final_layer.adaLN_modulation.1.weight").T)
  put(model.final.ada_b, f32("final_layer.adaLN_modulation.1.bias"))
  put(model.final.w, f32("final_layer.linear.weight").T)
  put(model.final.b, f32("final_layer.linear.bias"))
  return model


def import_checkpoint(path: str, num_heads: int | None = None, num_classes: int | None = None, seed: int = 0,
                      **overrides):
  """An `attngeo.nn.DiT` holding an official SiT/DiT checkpoint (`.safetensors`, or `.pt` with torch).

  The released SiT-XL-2-256x256.pt and DiT-XL-2-*.pt are flat state dicts; a `train.py` checkpoint
  nests them (`{"model", "ema", "opt", "args"}`): convert its `"ema"` entry to safetensors first.

  Returns the model; `model.cfg` records the inferred `DiTConfig` (learned sigma, null label, width,
  depth, heads, patch, image size), so it can be trained, grafted and saved as an attngeo run.
  """
  from flax import nnx

  from attngeo.nn import DiT
  sd = safetensors_io.read(path)
  cfg = config_from_state_dict(sd, num_heads=num_heads, num_classes=num_classes, **overrides)
  check_state_dict(sd, cfg, path)
  model = DiT(cfg, rngs=nnx.Rngs(seed))
  return load_state_dict(model, sd, path)
