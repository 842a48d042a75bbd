"""The layers every attngeo model is built from: attention under any operator, MLP, residual block.

Shapes use einsum letters: `b` batch, `n` tokens, `d` width (embed), `h` heads, `k` head dim,
`f` MLP hidden. Every parameter carries logical axis names in its `axes` metadata
(`embed`, `heads`, `kv`, `mlp`, `vocab`, `cond`); `attngeo.sharding` maps them to mesh axes.

* `Attention` — multi-head attention `y = Σ_h W_O^h · transport(q^h, k^h, v^h; β_h, α_h)` under
  operator (β, α) (a named corner, fixed floats, or learnable per-head values), optional rotary
  embedding, QK-norm and q/k/v biases, causal or not. With `capture=True` it sows its post-rotary
  q, k as `nnx.Intermediate` for geometry probes. `operator="CMAP"` is the magnetic (U(1)) operator
  (`operators.magnetic_transport`): magnitude DMAP's kernel on `m = W_+ x` (β, learnable or 0),
  phase `θ_ij = γ·½ s (q_i·k_j − k_i·q_j)` — the antisymmetric part of `W_Q W_Kᵀ` — with coupling γ
  (`coupling`; one learnable value per head when `learnable_operator`). Complex values: channels
  (2c, 2c+1) of each head's v (columns of `W_V^h`) are one complex number (Re, Im), and the output
  channels of each head pair the same way before `W_O^h`; the head dim must be even.
* `Block` — pre-norm residual block, sub-layer order `attn_first` (MHSA→FFN) or `ffn_first`
  (FFN→MHSA), optionally adaLN-Zero modulated by a conditioning vector; `BlockConfig` is the one
  config every model nests.
* `graft(model, operator)` — run the same weights under another (β, α) or CMAP (to and from the
  family: a pure swap); `capture_qk` — read every layer's q, k during a forward pass.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from attngeo import kernels, operators

ORDERS = ("attn_first", "ffn_first")


def param(rngs, shape, axes, *, std=None, zero=False, dtype=jnp.float32):
  if zero:
    value = jnp.zeros(shape, dtype)
  else:
    fan_in = shape[0] if std is None else None
    value = jax.random.normal(rngs.params(), shape, dtype) * (std if std is not None else fan_in ** -0.5)
  return nnx.Param(value, axes=axes)


def resolve_operator(operator) -> tuple[float, float]:
  """A corner name ('DMAP', …), 'CMAP' (its magnitude: (0, 0)) or a (β, α) pair of floats in [0, 1] -> (β, α)."""
  if operators.is_magnetic(operator):
    return operators.DMAP
  if isinstance(operator, str):
    try:
      return operators.corner(operator)
    except ValueError:
      raise ValueError(f"operator must be one of {sorted(operators.CORNERS) + list(operators.MAGNETIC)} "
                       f"or a (beta, alpha) pair; got {operator!r}") from None
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
  """Multi-head attention `y = Σ_h W_O^h · transport(q^h, k^h, v^h; β_h, α_h)` (or CMAP's magnetic transport).

  x: [b, n, d] -> [b, n, d]. Weights `wq, wk, wv`: [d, h, k]; `wo`: [h, k, d]. `coupling`: CMAP's γ
  (initial value when learnable; unused by the family).
  """

  def __init__(self, width: int, num_heads: int, head_dim: int, *, operator="ATTN", learnable_operator=False,
               causal=False, use_rope=False, qk_norm=False, qkv_bias=False, implementation=None,
               coupling: float = 1.0, dtype=jnp.float32, rngs: nnx.Rngs):
    self.num_heads, self.head_dim, self.causal = num_heads, head_dim, causal
    self.use_rope, self.qk_norm, self.qkv_bias = use_rope, qk_norm, qkv_bias
    self.implementation, self.dtype, self.capture = implementation, dtype, False
    for name in ("wq", "wk", "wv"):
      setattr(self, name, param(rngs, (width, num_heads, head_dim), ("embed", "heads", "kv")))
    self.wo = param(rngs, (num_heads, head_dim, width), ("heads", "kv", "embed"), std=(num_heads * head_dim) ** -0.5)
    if qkv_bias:
      for name in ("bq", "bk", "bv"):
        setattr(self, name, param(rngs, (num_heads, head_dim), ("heads", "kv"), zero=True))
    if qk_norm:
      self.q_norm = nnx.RMSNorm(head_dim, dtype=dtype, rngs=rngs)
      self.k_norm = nnx.RMSNorm(head_dim, dtype=dtype, rngs=rngs)
    self.learnable_operator, self.coupling_init = learnable_operator, float(coupling)
    self.set_operator(operator)

  def set_operator(self, operator):
    """Switch (β, α) — or to/from CMAP — in place; the weights are untouched (grafting)."""
    beta, alpha = resolve_operator(operator)
    self.magnetic = operators.is_magnetic(operator)
    if self.magnetic and self.head_dim % 2:
      raise ValueError(f"operator CMAP needs an even head_dim (channel pairs are complex values); got {self.head_dim}")
    per_head = lambda x: nnx.Param(jnp.full((self.num_heads,), x), axes=("heads",))
    if self.learnable_operator:            # learnable: per-head Params (CMAP: β and γ; its α is 0 by definition)
      self.beta = per_head(beta)
      self.alpha = nnx.data(None if self.magnetic else per_head(alpha))
      self.coupling = nnx.data(per_head(self.coupling_init) if self.magnetic else None)
    else:
      self.beta, self.alpha = beta, alpha
      self.coupling = self.coupling_init if self.magnetic else None

  def coefficients(self):
    """(β, α): floats, or per-head arrays [h] clipped to [0, 1] when learnable (CMAP: its magnitude's, α = 0)."""
    if self.learnable_operator:
      alpha = 0.0 if self.magnetic else jnp.clip(self.alpha[...], 0.0, 1.0)
      return jnp.clip(self.beta[...], 0.0, 1.0), alpha
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
    if self.magnetic:
      coupling = self.coupling[...] if self.learnable_operator else self.coupling
      impl = self.implementation if self.implementation in kernels.PHASE_IMPLEMENTATIONS else None
      y = operators.magnetic_transport(q, k, v, beta=beta, coupling=coupling, causal=self.causal, mask=mask,
                                       implementation=impl)
    else:
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
    self.w1 = param(rngs, (width, hidden), ("embed", "mlp"))
    self.b1 = param(rngs, (hidden,), ("mlp",), zero=True)
    self.w2 = param(rngs, (hidden, width), ("mlp", "embed"), std=hidden ** -0.5)
    self.b2 = param(rngs, (width,), ("embed",), zero=True)

  def __call__(self, x):
    x = x.astype(self.dtype)
    h = self.fn(x @ self.w1[...].astype(self.dtype) + self.b1[...].astype(self.dtype))
    return h @ self.w2[...].astype(self.dtype) + self.b2[...].astype(self.dtype)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  """What every transformer block shares. `operator`: corner name, (β, α), or 'CMAP' (coupling γ = `coupling`)."""
  width: int = 128
  num_heads: int = 4
  head_dim: int | None = None          # default width // num_heads
  mlp_ratio: float = 4.0
  mlp_act: str = "gelu"
  order: str = "attn_first"           # attn_first: MHSA→FFN; ffn_first: FFN→MHSA
  operator: Any = "ATTN"
  learnable_operator: bool = False
  coupling: float = 1.0               # CMAP's phase coupling γ (initial value when learnable); unused by the family
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
    if operators.is_magnetic(self.operator) and self.dh % 2:
      raise ValueError(f"operator CMAP needs an even head_dim (channel pairs are complex values); got {self.dh}")
    if isinstance(self.coupling, str) or not math.isfinite(float(self.coupling)):
      raise ValueError(f"coupling must be a finite number (CMAP's phase coupling); got {self.coupling!r}")
    return self

  @property
  def dh(self) -> int:
    return self.head_dim or self.width // self.num_heads


class NestsBlock:
  """Mixin for model configs that nest a `block: BlockConfig`.

  `create(**fields)` routes each keyword to the model config if it names one of its fields, else
  to its `BlockConfig` (`GPTConfig.create(depth=2, width=64, operator="DMTN")`), and validates.
  """

  @classmethod
  def create(cls, **fields):
    own = {f.name for f in dataclasses.fields(cls)}
    block_names = {f.name for f in dataclasses.fields(BlockConfig)}
    unknown = sorted(k for k in fields if k not in own and k not in block_names)
    if unknown:
      raise TypeError(f"{cls.__name__} has no field {unknown[0]!r} (nor has its BlockConfig)")
    top = {k: v for k, v in fields.items() if k in own}
    base = top.pop("block", None) or cls.__dataclass_fields__["block"].default_factory()
    block = dataclasses.replace(base, **{k: v for k, v in fields.items() if k not in own})
    return cls(**top, block=block.validate())

  def with_operator(self, operator, learnable: bool | None = None):
    """The same config under another operator (what `graft` does to a built model)."""
    blk = dataclasses.replace(self.block, operator=operator,
                              learnable_operator=self.block.learnable_operator if learnable is None else learnable)
    return dataclasses.replace(self, block=blk.validate())


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
                          coupling=cfg.coupling, dtype=dtype, rngs=rngs)
    self.mlp = Mlp(cfg.width, int(cfg.width * cfg.mlp_ratio), cfg.mlp_act, dtype, rngs=rngs)
    if self.adaln:
      self.ada_w = param(rngs, (cond_dim, 6 * cfg.width), ("cond", "embed"), zero=True)
      self.ada_b = param(rngs, (6 * cfg.width,), ("embed",), zero=True)

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
