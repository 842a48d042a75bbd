"""Diffusion transformer (DiT / SiT backbone) with any attention operator.

Patchify `[b, H, W, C]` into `(H/p)·(W/p)` tokens of `p²·C` values (row-major tokens, features in
(row-in-patch, column-in-patch, channel) order: a stride-p convolution), add fixed 2-D sin-cos
positions, condition every block by adaLN-Zero on `c = t_embed(time_scale·t) + y_embed(y)`, read
out with the zero-initialised final layer (`p²·C_out` values per token) and unpatchify.

The layout is that of the official SiT (willisma/SiT) and DiT (facebookresearch/DiT) `models.py`,
so their checkpoints import exactly (`attngeo.interop.dit`):
* blocks are timm `Attention` (q/k/v and output biases) and a tanh-GELU MLP, LayerNorms without
  affine parameters (ε = 1e-6), adaLN-Zero modulation `(shift, scale, gate)` × (attention, MLP);
* `learn_sigma`: the final layer emits `2C` channels (DiT's ε and learned variance); `__call__`
  returns the first C (SiT's forward), `raw` returns all of them;
* the label table has `num_classes + 1` rows when `class_dropout_prob > 0`: row `num_classes` is the
  null label that classifier-free guidance drops labels to (SiT's `LabelEmbedder`);
* `time_scale`: SiT embeds t ∈ [0, 1] as it is (1.0, the default); DiT feeds integer steps 0…999.

`DiTConfig.preset("XL/2")` is SiT-XL/2 (depth 28, width 1152, 16 heads, patch 2, 675M parameters).
Labels outside the table (`[0, num_classes]` with the null label, else `[0, num_classes)`) are one
line when the call sees concrete values (JAX's gather would clamp them to a wrong class);
`flops_per_image` is the training cost of one image, for plans.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from flax import nnx

from attngeo import _checks
from attngeo.nn.embeddings import FinalLayer, TimestepEmbedder, sincos_2d
from attngeo.nn.config import BlockConfig, DiTConfig  # noqa: F401  (DiTConfig's old home)
from attngeo.nn.layers import Block, param


class DiT(nnx.Module):
  """(x [b, H, W, C], t [b] ∈ [0, 1], y [b] int) -> velocity [b, H, W, C].

  Label `num_classes` is the null class (classifier-free guidance drops labels to it) when
  `class_dropout_prob > 0`. `raw(x, t, y)` returns all `out_channels` (learned-sigma channels too).
  """

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    bc = cfg.block.validate()
    if cfg.image_size % cfg.patch:
      raise ValueError(f"patch={cfg.patch} does not divide image_size={cfg.image_size}")
    if not 0.0 <= cfg.class_dropout_prob < 1.0:
      raise ValueError(f"class_dropout_prob must lie in [0, 1); got {cfg.class_dropout_prob}")
    p, c = cfg.patch, cfg.channels
    self.grid = cfg.image_size // p
    self.patch_w = param(rngs, (p * p * c, bc.width), (None, "embed"))
    self.patch_b = param(rngs, (bc.width,), ("embed",), zero=True)
    self.pos = nnx.Variable(jnp.asarray(sincos_2d(self.grid, bc.width)))
    self.t_embed = TimestepEmbedder(bc.width, scale=cfg.time_scale, rngs=rngs)
    rows = cfg.num_classes + (cfg.null_label is not None)
    self.y_embed = param(rngs, (rows, bc.width), ("vocab", "embed"), std=0.02)
    self.blocks = nnx.List([Block(bc, cond_dim=bc.width, rngs=rngs) for _ in range(cfg.depth)])
    self.final = FinalLayer(bc.width, p * p * cfg.out_channels, rngs=rngs)

  def patchify(self, x):
    b, hgt, wid, c = x.shape
    p, g = self.cfg.patch, self.grid
    if (hgt, wid, c) != (self.cfg.image_size, self.cfg.image_size, self.cfg.channels):
      raise ValueError(f"x must be [b, {self.cfg.image_size}, {self.cfg.image_size}, {self.cfg.channels}]; got {x.shape}")
    return x.reshape(b, g, p, g, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * g, p * p * c)

  def unpatchify(self, z):
    b = z.shape[0]
    p, g = self.cfg.patch, self.grid
    c = z.shape[-1] // (p * p)
    return z.reshape(b, g, g, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * p, g * p, c)

  def raw(self, x, t, y):
    """All `out_channels` output channels [b, H, W, C_out] (DiT's ε and learned variance)."""
    rows = self.y_embed[...].shape[0]
    if _checks.is_concrete(y) and np.size(y):        # numpy: jnp on a constant inside a jit trace is traced
      lo, hi = int(np.min(np.asarray(y))), int(np.max(np.asarray(y)))
      if not 0 <= lo <= hi < rows:
        null = f" and the null label {self.cfg.null_label}" if self.cfg.null_label is not None else ""
        raise ValueError(f"labels y must lie in [0, {rows}) ({self.cfg.num_classes} classes{null}); got [{lo}, {hi}]")
    h = self.patchify(x) @ self.patch_w[...] + self.patch_b[...] + self.pos[...][None]
    cond = self.t_embed(t) + self.y_embed[...][y]
    for blk in self.blocks:
      h = blk(h, cond)
    return self.unpatchify(self.final(h, cond))

  def __call__(self, x, t, y):
    out = self.raw(x, t, y)
    return out[..., :self.cfg.channels] if self.cfg.learn_sigma else out


PER_IMAGE = ("t_embed", "ada_w")   # parameters applied once per image (to the conditioning vector)


def flops_per_image(cfg: DiTConfig) -> float:
  """Training FLOPs of one image (forward + backward): `6·(T·N_token + N_image) + 12·L·T²·d`.

  T = (image_size/patch)² tokens; N_token = the weight matrices applied to every token (patch
  embedding, q, k, v, o, MLP, read-out), N_image = those applied once to the conditioning vector
  (the timestep MLP, every adaLN map), both counted on the abstract model; the label table is a
  lookup, biases are not counted. The attention term counts q·k and P·v over T keys in each of the
  L blocks (PaLM's convention, as `gpt.flops_per_token`); DMTN/ATAP are credited ATTN's count.
  """
  model = nnx.eval_shape(lambda: DiT(cfg, rngs=nnx.Rngs(0)))
  tokens = (cfg.image_size // cfg.patch) ** 2
  per_token = per_image = 0
  for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    shape = v.get_value().shape
    if len(shape) < 2 or path[-1] == "y_embed":
      continue
    if any(name in path for name in PER_IMAGE):
      per_image += math.prod(shape)
    else:
      per_token += math.prod(shape)
  return 6.0 * (tokens * per_token + per_image) + 12.0 * cfg.depth * tokens ** 2 * cfg.block.width
