"""Conditioning and position embeddings shared by the diffusion models (DiT, PointFlow).

* `timestep_embedding(t, dim, scale)` — sinusoid `[cos(scale·t·ω_i), sin(scale·t·ω_i)]`,
  `ω_i = max_period^{−i/(dim/2)}`. SiT feeds t ∈ [0, 1] unscaled (scale 1); DiT feeds integer DDPM
  steps 0…999 (also scale 1); `scale=1000` spreads t ∈ [0, 1] over DiT's range (PointFlow's default).
* `sincos_2d(grid, dim)` — the fixed 2-D sin-cos patch positions of MAE/DiT: token `r·grid + c` (row r,
  column c) gets `[sin(c·ω), cos(c·ω), sin(r·ω), cos(r·ω)]`, `ω_i = 10000^{−i/(dim/4)}` (the first half
  encodes the column, as MAE's `np.meshgrid(grid_w, grid_h)` does).
* `TimestepEmbedder` — `MLP(sinusoid(t))`; `FinalLayer` — adaLN-modulated norm and a
  zero-initialised linear read-out (DiT's final layer).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attngeo.nn.layers import param

def timestep_embedding(t, dim: int, max_period: float = 10_000.0, scale: float = 1000.0):
  """Sinusoidal embedding of `scale·t` for t [b] -> [b, dim] (see the module docstring for `scale`)."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = scale * t.astype(jnp.float32)[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)


def sincos_2d(grid: int, dim: int) -> np.ndarray:
  """Fixed 2-D sin-cos position embedding [grid², dim] (MAE/DiT convention)."""
  def one_d(d, pos):
    omega = 1.0 / 10_000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2))
    out = pos.reshape(-1)[:, None] * omega[None]
    return np.concatenate([np.sin(out), np.cos(out)], 1)
  rows, cols = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="ij")
  return np.concatenate([one_d(dim // 2, cols), one_d(dim // 2, rows)], 1).astype(np.float32)


class TimestepEmbedder(nnx.Module):
  """`MLP(sinusoid(scale·t))`: t [b] -> [b, width]."""

  def __init__(self, width: int, freq_dim: int = 256, *, scale: float = 1000.0, rngs: nnx.Rngs):
    self.freq_dim, self.scale = freq_dim, scale
    self.w1 = param(rngs, (freq_dim, width), ("cond", "embed"), std=0.02)
    self.w2 = param(rngs, (width, width), ("embed", "embed"), std=0.02)
    self.b1 = param(rngs, (width,), ("embed",), zero=True)
    self.b2 = param(rngs, (width,), ("embed",), zero=True)

  def __call__(self, t):
    h = jax.nn.silu(timestep_embedding(t, self.freq_dim, scale=self.scale) @ self.w1[...] + self.b1[...])
    return h @ self.w2[...] + self.b2[...]


class FinalLayer(nnx.Module):
  """adaLN-modulated norm + zero-initialised linear read-out: [b, n, d] -> [b, n, out]."""

  def __init__(self, width: int, out: int, *, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(width, use_scale=False, use_bias=False, rngs=rngs)
    self.ada_w = param(rngs, (width, 2 * width), ("cond", "embed"), zero=True)
    self.ada_b = param(rngs, (2 * width,), ("embed",), zero=True)
    self.w = param(rngs, (width, out), ("embed", None), zero=True)
    self.b = param(rngs, (out,), (None,), zero=True)

  def __call__(self, x, cond):
    t, s = jnp.split(jax.nn.silu(cond) @ self.ada_w[...] + self.ada_b[...], 2, -1)
    h = self.norm(x) * (1 + s[:, None]) + t[:, None]
    return h.astype(jnp.float32) @ self.w[...] + self.b[...]
