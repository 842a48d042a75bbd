"""Flax NNX models whose attention is any member of the transport family.

Shapes use einsum letters: `b` batch, `n` tokens, `d` width (embed), `h` heads, `k` head dim,
`f` MLP hidden. Every parameter carries logical axis names in its `axes` metadata
(`embed`, `heads`, `kv`, `mlp`, `vocab`, `cond`); `attngeo.train` maps them to mesh axes.

* `Attention` — multi-head attention under operator (β, α) (a named corner, fixed floats, or
  learnable per-head values), optional rotary embedding, QK-norm and q/k/v biases, causal or not.
  With `capture=True` it sows its post-rotary q, k as `nnx.Intermediate` for geometry probes.
* `Block` — pre-norm residual block, sub-layer order `attn_first` (MHSA→FFN) or `ffn_first`
  (FFN→MHSA), optionally adaLN-Zero modulated by a conditioning vector.
* `GPT` (decoder LM, nanochat-style depth knob), `DiT` (diffusion transformer, SiT/DiT shape),
  `PointFlow` (set transformer over points, velocity field for flow matching).
* `graft(model, operator)` — run the same weights under another (β, α).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attngeo import _checks, operators

ORDERS = ("attn_first", "ffn_first")


def _param(rngs, shape, axes, *, std=None, zero=False, dtype=jnp.float32):
  if zero:
    value = jnp.zeros(shape, dtype)
  else:
    fan_in = shape[0] if std is None else None
    value = jax.random.normal(rngs.params(), shape, dtype) * (std if std is not None else fan_in ** -0.5)
  return nnx.Param(value, axes=axes)


def resolve_operator(operator) -> tuple[float, float]:
  """A corner name ('DMAP', …) or a (β, α) pair of floats in [0, 1] -> (β, α)."""
  if isinstance(operator, str):
    return operators.corner(operator)
  beta, alpha = (float(x) for x in operator)
  for name, x in (("beta", beta), ("alpha", alpha)):
    if not 0.0 <= x <= 1.0:
      raise ValueError(f"operator {name} must lie in [0, 1]; got {x}")
  return beta, alpha


def rope(x, positions, base: float = 10_000.0):
  """Rotary embedding of x [b, n, h, k] at integer positions [n] (rotate-half convention)."""
  half = x.shape[-1] // 2
  freqs = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  ang = positions[:, None].astype(jnp.float32) * freqs[None]            # [n, k/2]
  cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)


class Attention(nnx.Module):
  """Multi-head attention `y = Σ_h W_O^h · transport(q^h, k^h, v^h; β_h, α_h)`.

  x: [b, n, d] -> [b, n, d]. Weights `wq, wk, wv`: [d, h, k]; `wo`: [h, k, d].
  """

  def __init__(self, width: int, num_heads: int, head_dim: int, *, operator="ATTN", learnable_operator=False,
               causal=False, use_rope=False, qk_norm=False, qkv_bias=False, implementation=None,
               dtype=jnp.float32, rngs: nnx.Rngs):
    self.num_heads, self.head_dim, self.causal = num_heads, head_dim, causal
    self.use_rope, self.qk_norm, self.qkv_bias = use_rope, qk_norm, qkv_bias
    self.implementation, self.dtype, self.capture = implementation, dtype, False
    for name in ("wq", "wk", "wv"):
      setattr(self, name, _param(rngs, (width, num_heads, head_dim), ("embed", "heads", "kv")))
    self.wo = _param(rngs, (num_heads, head_dim, width), ("heads", "kv", "embed"), std=(num_heads * head_dim) ** -0.5)
    if qkv_bias:
      for name in ("bq", "bk", "bv"):
        setattr(self, name, _param(rngs, (num_heads, head_dim), ("heads", "kv"), zero=True))
    if qk_norm:
      self.q_norm = nnx.RMSNorm(head_dim, dtype=dtype, rngs=rngs)
      self.k_norm = nnx.RMSNorm(head_dim, dtype=dtype, rngs=rngs)
    self.learnable_operator = learnable_operator
    self.set_operator(operator)

  def set_operator(self, operator):
    """Switch (β, α) in place — the weights are untouched (grafting)."""
    beta, alpha = resolve_operator(operator)
    if self.learnable_operator:
      self.beta = nnx.Param(jnp.full((self.num_heads,), beta), axes=("heads",))
      self.alpha = nnx.Param(jnp.full((self.num_heads,), alpha), axes=("heads",))
    else:
      self.beta, self.alpha = beta, alpha

  def coefficients(self):
    """(β, α): floats, or per-head arrays [h] clipped to [0, 1] when learnable."""
    if self.learnable_operator:
      return jnp.clip(self.beta[...], 0.0, 1.0), jnp.clip(self.alpha[...], 0.0, 1.0)
    return self.beta, self.alpha

  def qkv(self, x):
    """Projections (with biases, QK-norm and rotary applied): three [b, n, h, k] arrays."""
    x = x.astype(self.dtype)
    proj = lambda w: jnp.einsum("bnd,dhk->bnhk", x, w[...].astype(self.dtype))
    q, k, v = proj(self.wq), proj(self.wk), proj(self.wv)
    if self.qkv_bias:
      q, k, v = q + self.bq[...].astype(self.dtype), k + self.bk[...].astype(self.dtype), v + self.bv[...].astype(self.dtype)
    if self.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    if self.use_rope:
      pos = jnp.arange(x.shape[1])
      q, k = rope(q, pos), rope(k, pos)
    return q, k, v

  def __call__(self, x, mask=None):
    q, k, v = self.qkv(x)
    if self.capture:
      self.sow(nnx.Intermediate, "qk", (q, k))
    beta, alpha = self.coefficients()
    y = operators.transport(q, k, v, beta=beta, alpha=alpha, causal=self.causal, mask=mask,
                            implementation=self.implementation)
    return jnp.einsum("bnhk,hkd->bnd", y, self.wo[...].astype(self.dtype))


class Mlp(nnx.Module):
  """`W_2 act(W_1 x)`, act ∈ {relu2, gelu, silu}; x: [b, n, d]."""

  def __init__(self, width: int, hidden: int, act: str = "gelu", dtype=jnp.float32, *, rngs: nnx.Rngs):
    acts = {"relu2": lambda z: jnp.square(jax.nn.relu(z)), "gelu": jax.nn.gelu, "silu": jax.nn.silu}
    if act not in acts:
      raise ValueError(f"mlp activation must be one of {sorted(acts)}; got {act!r}")
    self.act, self.fn, self.dtype = act, acts[act], dtype
    self.w1 = _param(rngs, (width, hidden), ("embed", "mlp"))
    self.b1 = _param(rngs, (hidden,), ("mlp",), zero=True)
    self.w2 = _param(rngs, (hidden, width), ("mlp", "embed"), std=hidden ** -0.5)
    self.b2 = _param(rngs, (width,), ("embed",), zero=True)

  def __call__(self, x):
    x = x.astype(self.dtype)
    h = self.fn(x @ self.w1[...].astype(self.dtype) + self.b1[...].astype(self.dtype))
    return h @ self.w2[...].astype(self.dtype) + self.b2[...].astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  """What every transformer block shares. `operator`: corner name or (β, α)."""
  width: int = 128
  num_heads: int = 4
  head_dim: int | None = None          # default width // num_heads
  mlp_ratio: float = 4.0
  mlp_act: str = "gelu"
  order: str = "attn_first"           # attn_first: MHSA→FFN; ffn_first: FFN→MHSA
  operator: Any = "ATTN"
  learnable_operator: bool = False
  use_rope: bool = False
  qk_norm: bool = False
  qkv_bias: bool = False
  implementation: str | None = None
  dtype: str = "float32"              # compute dtype; parameters stay float32

  def validate(self):
    if self.order not in ORDERS:
      raise ValueError(f"order must be one of {ORDERS}; got {self.order!r}")
    if self.head_dim is None and self.width % self.num_heads:
      raise ValueError(f"num_heads={self.num_heads} does not divide width={self.width}")
    resolve_operator(self.operator)
    return self

  @property
  def dh(self) -> int:
    return self.head_dim or self.width // self.num_heads


class Block(nnx.Module):
  """Pre-norm residual block; with `cond_dim`, adaLN-Zero: `x + g ⊙ f((1 + s) ⊙ norm(x) + t)`.

  The modulation (t, s, g per sub-layer) is a zero-initialised linear map of `silu(cond)`, so the
  block is the identity at initialisation.
  """

  def __init__(self, cfg: BlockConfig, *, causal=False, cond_dim: int | None = None, rngs: nnx.Rngs):
    cfg.validate()
    dtype = jnp.dtype(cfg.dtype)
    self.order, self.adaln = cfg.order, cond_dim is not None
    norm = (lambda: nnx.LayerNorm(cfg.width, use_scale=False, use_bias=False, rngs=rngs)) if self.adaln else \
           (lambda: nnx.RMSNorm(cfg.width, rngs=rngs))
    self.norm_attn, self.norm_mlp = norm(), norm()
    self.attn = Attention(cfg.width, cfg.num_heads, cfg.dh, operator=cfg.operator,
                          learnable_operator=cfg.learnable_operator, causal=causal, use_rope=cfg.use_rope,
                          qk_norm=cfg.qk_norm, qkv_bias=cfg.qkv_bias, implementation=cfg.implementation,
                          dtype=dtype, rngs=rngs)
    self.mlp = Mlp(cfg.width, int(cfg.width * cfg.mlp_ratio), cfg.mlp_act, dtype, rngs=rngs)
    if self.adaln:
      self.ada_w = _param(rngs, (cond_dim, 6 * cfg.width), ("cond", "embed"), zero=True)
      self.ada_b = _param(rngs, (6 * cfg.width,), ("embed",), zero=True)

  def __call__(self, x, cond=None, mask=None):
    if self.adaln:
      mod = jax.nn.silu(cond) @ self.ada_w[...] + self.ada_b[...]       # [b, 6d]
      t1, s1, g1, t2, s2, g2 = (m[:, None, :] for m in jnp.split(mod, 6, -1))
    subs = {"attn": (self.norm_attn, lambda h: self.attn(h, mask=mask)), "mlp": (self.norm_mlp, self.mlp)}
    names = ("attn", "mlp") if self.order == "attn_first" else ("mlp", "attn")
    for name in names:
      norm, fn = subs[name]
      h = norm(x)
      if self.adaln:
        t, s, g = (t1, s1, g1) if name == "attn" else (t2, s2, g2)
        h = fn(h * (1 + s) + t) * g
      else:
        h = fn(h)
      x = x + h.astype(x.dtype)
    return x


def attention_modules(model) -> list[Attention]:
  """Every `Attention` in a model, in layer order."""
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, Attention)]


def graft(model, operator):
  """Run `model`'s weights under another operator (β, α): a pure swap, parameters untouched."""
  for m in attention_modules(model):
    m.set_operator(operator)
  return model


def capture_qk(model, fn):
  """Run `fn()` with every Attention sowing its q, k; returns (fn's result, [(q, k)] per layer)."""
  found = [(path, m) for path, m in nnx.iter_modules(model) if isinstance(m, Attention)]
  paths, mods = [path for path, _ in found], [m for _, m in found]
  for m in mods:
    m.capture = True
  try:
    out, inter = nnx.capture(lambda _: fn(), nnx.Intermediate)(model)
  finally:
    for m in mods:
      m.capture = False
  sown = dict(nnx.to_flat_state(inter))
  return out, [sown[path + ("qk",)].get_value()[0] for path in paths]


# ----------------------------------------------------------------------------- embeddings

def timestep_embedding(t, dim: int, max_period: float = 10_000.0):
  """Sinusoidal embedding of t [b] (t ∈ [0, 1] is scaled by 1000, as SiT does) -> [b, dim]."""
  half = dim // 2
  freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
  args = 1000.0 * t.astype(jnp.float32)[:, None] * freqs[None]
  return jnp.concatenate([jnp.cos(args), jnp.sin(args)], -1)


def sincos_2d(grid: int, dim: int) -> np.ndarray:
  """Fixed 2-D sin-cos position embedding [grid², dim] (MAE/DiT convention)."""
  def one_d(d, pos):
    omega = 1.0 / 10_000 ** (np.arange(d // 2, dtype=np.float64) / (d / 2))
    out = pos.reshape(-1)[:, None] * omega[None]
    return np.concatenate([np.sin(out), np.cos(out)], 1)
  gh, gw = np.meshgrid(np.arange(grid, dtype=np.float64), np.arange(grid, dtype=np.float64), indexing="ij")
  return np.concatenate([one_d(dim // 2, gh), one_d(dim // 2, gw)], 1).astype(np.float32)


class TimestepEmbedder(nnx.Module):
  """`MLP(sinusoid(t))`: t [b] -> [b, width]."""

  def __init__(self, width: int, freq_dim: int = 256, *, rngs: nnx.Rngs):
    self.freq_dim = freq_dim
    self.w1 = _param(rngs, (freq_dim, width), ("cond", "embed"), std=0.02)
    self.w2 = _param(rngs, (width, width), ("embed", "embed"), std=0.02)
    self.b1 = _param(rngs, (width,), ("embed",), zero=True)
    self.b2 = _param(rngs, (width,), ("embed",), zero=True)

  def __call__(self, t):
    h = jax.nn.silu(timestep_embedding(t, self.freq_dim) @ self.w1[...] + self.b1[...])
    return h @ self.w2[...] + self.b2[...]


class FinalLayer(nnx.Module):
  """adaLN-modulated norm + zero-initialised linear read-out: [b, n, d] -> [b, n, out]."""

  def __init__(self, width: int, out: int, *, rngs: nnx.Rngs):
    self.norm = nnx.LayerNorm(width, use_scale=False, use_bias=False, rngs=rngs)
    self.ada_w = _param(rngs, (width, 2 * width), ("cond", "embed"), zero=True)
    self.ada_b = _param(rngs, (2 * width,), ("embed",), zero=True)
    self.w = _param(rngs, (width, out), ("embed", None), zero=True)
    self.b = _param(rngs, (out,), (None,), zero=True)

  def __call__(self, x, cond):
    t, s = jnp.split(jax.nn.silu(cond) @ self.ada_w[...] + self.ada_b[...], 2, -1)
    h = self.norm(x) * (1 + s[:, None]) + t[:, None]
    return h.astype(jnp.float32) @ self.w[...] + self.b[...]


# ----------------------------------------------------------------------------- GPT

@dataclasses.dataclass(frozen=True)
class GPTConfig:
  """Decoder-only LM. Size knob `depth`: width = 64·depth rounded up to whole `head_dim` heads."""
  depth: int = 4
  vocab_size: int = 256
  seq_len: int = 256
  head_dim: int = 128
  width: int | None = None
  mlp_act: str = "relu2"
  operator: Any = "ATTN"
  learnable_operator: bool = False
  implementation: str | None = None
  dtype: str = "float32"

  @property
  def model_width(self) -> int:
    return self.width or -(-64 * self.depth // self.head_dim) * self.head_dim

  def block(self) -> BlockConfig:
    w = self.model_width
    if w % self.head_dim:
      raise ValueError(f"head_dim={self.head_dim} does not divide width={w}: heads must tile the width")
    return BlockConfig(width=w, num_heads=w // self.head_dim, head_dim=self.head_dim, mlp_act=self.mlp_act,
                       operator=self.operator, learnable_operator=self.learnable_operator, use_rope=True,
                       qk_norm=True, implementation=self.implementation, dtype=self.dtype).validate()


class GPT(nnx.Module):
  """tokens [b, n] int -> logits [b, n, vocab] (float32). Untied embedding and unembedding."""

  def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    bc = cfg.block()
    self.embed = _param(rngs, (cfg.vocab_size, bc.width), ("vocab", "embed"), std=1.0)
    self.blocks = nnx.List([Block(bc, causal=True, rngs=rngs) for _ in range(cfg.depth)])
    self.norm = nnx.RMSNorm(bc.width, rngs=rngs)
    self.unembed = _param(rngs, (bc.width, cfg.vocab_size), ("embed", "vocab"), std=0.001)

  def __call__(self, tokens):
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"tokens must be an integer array [b, n]; got {tokens.dtype} {tokens.shape}")
    if _checks.is_concrete(tokens) and tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size):
      raise ValueError(f"tokens must lie in [0, {self.cfg.vocab_size}); got [{int(tokens.min())}, {int(tokens.max())}]")
    x = self.embed[...][tokens]
    for blk in self.blocks:
      x = blk(x)
    return self.norm(x).astype(jnp.float32) @ self.unembed[...]


# ----------------------------------------------------------------------------- DiT

@dataclasses.dataclass(frozen=True)
class DiTConfig:
  """Diffusion transformer (DiT/SiT). `DiTConfig.preset("XL/2")` is SiT-XL/2 (28, 1152, 16 heads, patch 2)."""
  image_size: int = 32
  patch: int = 2
  channels: int = 4
  width: int = 384
  depth: int = 12
  num_heads: int = 6
  num_classes: int = 1000
  mlp_ratio: float = 4.0
  operator: Any = "ATTN"
  learnable_operator: bool = False
  order: str = "attn_first"
  implementation: str | None = None
  dtype: str = "float32"

  PRESETS = {"S/2": (384, 12, 6, 2), "B/2": (768, 12, 12, 2), "L/2": (1024, 24, 16, 2), "XL/2": (1152, 28, 16, 2)}

  @classmethod
  def preset(cls, name: str, **overrides) -> "DiTConfig":
    if name not in cls.PRESETS:
      raise ValueError(f"DiT preset must be one of {sorted(cls.PRESETS)}; got {name!r}")
    w, d, h, p = cls.PRESETS[name]
    return cls(width=w, depth=d, num_heads=h, patch=p, **overrides)

  def block(self) -> BlockConfig:
    if self.image_size % self.patch:
      raise ValueError(f"patch={self.patch} does not divide image_size={self.image_size}")
    return BlockConfig(width=self.width, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio, operator=self.operator,
                       learnable_operator=self.learnable_operator, qkv_bias=True, order=self.order,
                       implementation=self.implementation, dtype=self.dtype).validate()


class DiT(nnx.Module):
  """(x [b, H, W, C], t [b] ∈ [0, 1], y [b] int) -> velocity [b, H, W, C].

  Label `num_classes` is the null class (classifier-free guidance drops labels to it).
  """

  def __init__(self, cfg: DiTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    bc = cfg.block()
    p, c = cfg.patch, cfg.channels
    self.grid = cfg.image_size // p
    self.patch_w = _param(rngs, (p * p * c, cfg.width), (None, "embed"))
    self.patch_b = _param(rngs, (cfg.width,), ("embed",), zero=True)
    self.pos = nnx.Variable(jnp.asarray(sincos_2d(self.grid, cfg.width)))
    self.t_embed = TimestepEmbedder(cfg.width, rngs=rngs)
    self.y_embed = _param(rngs, (cfg.num_classes + 1, cfg.width), ("vocab", "embed"), std=0.02)
    self.blocks = nnx.List([Block(bc, cond_dim=cfg.width, rngs=rngs) for _ in range(cfg.depth)])
    self.final = FinalLayer(cfg.width, p * p * c, rngs=rngs)

  def patchify(self, x):
    b, hgt, wid, c = x.shape
    p, g = self.cfg.patch, self.grid
    if (hgt, wid, c) != (self.cfg.image_size, self.cfg.image_size, self.cfg.channels):
      raise ValueError(f"x must be [b, {self.cfg.image_size}, {self.cfg.image_size}, {self.cfg.channels}]; got {x.shape}")
    return x.reshape(b, g, p, g, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * g, p * p * c)

  def unpatchify(self, z):
    b = z.shape[0]
    p, g, c = self.cfg.patch, self.grid, self.cfg.channels
    return z.reshape(b, g, g, p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, g * p, g * p, c)

  def __call__(self, x, t, y):
    h = self.patchify(x) @ self.patch_w[...] + self.patch_b[...] + self.pos[...][None]
    cond = self.t_embed(t) + self.y_embed[...][y]
    for blk in self.blocks:
      h = blk(h, cond)
    return self.unpatchify(self.final(h, cond))


# ----------------------------------------------------------------------------- PointFlow

@dataclasses.dataclass(frozen=True)
class PointFlowConfig:
  """Set transformer over points (no positions: permutation-equivariant), conditioned on t."""
  dim: int = 3
  width: int = 64
  depth: int = 2
  num_heads: int = 2
  mlp_ratio: float = 2.0
  order: str = "ffn_first"
  operator: Any = "ATTN"
  learnable_operator: bool = False
  implementation: str | None = None
  dtype: str = "float32"

  def block(self) -> BlockConfig:
    return BlockConfig(width=self.width, num_heads=self.num_heads, mlp_ratio=self.mlp_ratio, order=self.order,
                       operator=self.operator, learnable_operator=self.learnable_operator,
                       implementation=self.implementation, dtype=self.dtype).validate()


class PointFlow(nnx.Module):
  """(x [b, n, dim], t [b] ∈ [0, 1]) -> velocity [b, n, dim]; bidirectional attention over the set."""

  def __init__(self, cfg: PointFlowConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    bc = cfg.block()
    self.in_w = _param(rngs, (cfg.dim, cfg.width), (None, "embed"))
    self.in_b = _param(rngs, (cfg.width,), ("embed",), zero=True)
    self.t_embed = TimestepEmbedder(cfg.width, rngs=rngs)
    self.blocks = nnx.List([Block(bc, cond_dim=cfg.width, rngs=rngs) for _ in range(cfg.depth)])
    self.final = FinalLayer(cfg.width, cfg.dim, rngs=rngs)

  def __call__(self, x, t):
    if x.ndim != 3 or x.shape[-1] != self.cfg.dim:
      raise ValueError(f"x must be [b, n, {self.cfg.dim}]; got {x.shape}")
    h = x @ self.in_w[...] + self.in_b[...]
    cond = self.t_embed(t)
    for blk in self.blocks:
      h = blk(h, cond)
    return self.final(h, cond)
