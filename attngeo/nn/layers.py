"""The layers every attngeo model is built from: attention under any operator, MLP, residual block.

Shapes use einsum letters: `b` batch, `n` tokens, `d` width (embed), `h` heads, `k` head dim,
`f` MLP hidden. Every parameter carries logical axis names in its `axes` metadata
(`embed`, `heads`, `kv`, `mlp`, `vocab`, `cond`); `attngeo.sharding` maps them to mesh axes.

* `Attention` — multi-head attention `y = Σ_h W_O^h · transport(q^h, k^h, v^h; β_h, α_h)` under
  operator (β, α) (a named corner, fixed floats, or learnable per-head values), optional rotary
  embedding, QK-norm and q/k/v biases, causal or not. With `capture=True` it sows its post-rotary
  q, k as `nnx.Intermediate` for geometry probes. Options that public checkpoints need (GPT-2,
  nanochat; see `attngeo.interop`): grouped key/value heads (GQA), an output bias, rotary base /
  direction / pairing, parameter-free QK-norm with a q/k gain, and a gated value embedding.
  `operator="CMAP"` is the magnetic (U(1)) operator (`operators.magnetic_transport`): magnitude
  DMAP's kernel on `m = W_+ x` (β, learnable or 0), phase `θ_ij = γ·½ s (q_i·k_j − k_i·q_j)` — the
  antisymmetric part of `W_Q W_Kᵀ` — with coupling γ (`coupling`; one learnable value per head when
  `learnable_operator`). Complex values: channels (2c, 2c+1) of each head's v (columns of `W_V^h`)
  are one complex number (Re, Im), and the output channels of each head pair the same way before
  `W_O^h`; the head dim must be even.
* `Block` — pre-norm residual block, sub-layer order `attn_first` (MHSA→FFN) or `ffn_first`
  (FFN→MHSA), optionally adaLN-Zero modulated by a conditioning vector; `BlockConfig` is the one
  config every model nests (it lives, JAX-free, in `attngeo.nn.config`).
* `graft(model, operator)` — run the same weights under another (β, α) or CMAP (to and from the
  family: a pure swap); `capture_qk` — read every layer's q, k during a forward pass.
* Distance form (`distance_form=True`): DMAP parametrised by `W_+ = (W_Q + W_K)/√2` alone (`wp`, with
  bias `b_+ = (b_Q + b_K)/√2`), half of attention's query–key parameters; `m = W_+ x + b_+` and
  `P_ij ∝ exp(−¼ s ‖m_i − m_j‖²)`. `fold_distance(model)` rewrites a model's q/k weights into it
  exactly (same outputs as `graft(model, "DMAP")`).
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attngeo import kernels, operator_names, operators
from attngeo.nn.config import (NORMS, ORDERS, ROPE_STYLES, BlockConfig, NestsBlock,  # noqa: F401  (their old home)
                               check_distance_form)


def param(rngs, shape, axes, *, std=None, zero=False, dtype=jnp.float32):
  if zero:
    value = jnp.zeros(shape, dtype)
  else:
    fan_in = shape[0] if std is None else None
    value = jax.random.normal(rngs.params(), shape, dtype) * (std if std is not None else fan_in ** -0.5)
  return nnx.Param(value, axes=axes)


def resolve_operator(operator) -> tuple[float, float]:
  """A corner name ('DMAP', …), 'CMAP' (its magnitude: (0, 0)) or a (β, α) pair of floats in [0, 1] -> (β, α).

  The JAX-free `attngeo.operator_names.resolve` (the CLI checks names with it before importing JAX)."""
  return operator_names.resolve(operator)


VALUE_GATE_RANGE = 3.0   # value-embedding gate 3·σ(·) ∈ (0, 3) (nanochat's ResFormer gate)


def rope_angles(positions, half: int, base: float):
  """The rotary angles p·θ_i [n, half], θ_i = 1 / base^(2i/k), k = 2·half, in float32.

  Computed as nanochat and Hugging Face compute them — `inv_freq = 1 / base ** (arange(0, k, 2) / k)`
  and one float32 product per (p, i) — on the host when the positions are known at trace time (None:
  0…n−1, or concrete values), so the cos/sin tables are numpy's float32 ones, not XLA's (under jit
  they differ by an ulp at large angles, which bf16 tables turn into 1e-3 logit errors at head dim 64);
  on the device, from the same host θ, when the positions are traced (decoding with a cache).
  """
  inv_freq = (1.0 / np.float32(base) ** (np.arange(0, 2 * half, 2, dtype=np.float32) / np.float32(2 * half)))
  inv_freq = inv_freq.astype(np.float32)
  if not isinstance(positions, jax.core.Tracer):
    return np.outer(np.asarray(positions, np.float32), inv_freq), np
  return positions[:, None].astype(jnp.float32) * inv_freq[None], jnp


def rope(x, positions, base: float = 10_000.0, *, sign: int = 1, style: str = "half", table_dtype=None):
  """Rotary embedding of x [b, n, h, k] at integer positions [n] (None: 0…n−1).

  Channel pair i < k/2 turns by the angle sign·p·θ_i, θ_i = base^(−2i/k) (`rope_angles`). `style="half"`
  pairs channel i with i + k/2 (rotate-half: GPT-NeoX, nanochat); `"interleaved"` pairs 2i with 2i + 1
  (GPT-J, Meta's LLaMA). sign = +1 is the textbook rotation `(x₁ cos − x₂ sin, x₁ sin + x₂ cos)`;
  nanochat turns by −θ (sign = −1). Only the relative angle of q and k enters q·k, but a trained
  checkpoint fixes base, sign and pairing. `table_dtype` rounds the float32 cos/sin tables to that
  dtype (nanochat keeps them in bfloat16 on GPUs) before rotating in float32.
  """
  if sign not in (1, -1) or style not in ROPE_STYLES:
    raise ValueError(f"rope needs sign in (1, -1) and style in {ROPE_STYLES}; got sign={sign!r}, style={style!r}")
  half = x.shape[-1] // 2
  ang, xp = rope_angles(np.arange(x.shape[1]) if positions is None else positions, half, base)
  cos, sin = jnp.asarray(xp.cos(ang), jnp.float32)[None, :, None], jnp.asarray(xp.sin(ang), jnp.float32)[None, :, None]
  if table_dtype is not None:
    cos, sin = cos.astype(table_dtype).astype(jnp.float32), sin.astype(table_dtype).astype(jnp.float32)
  if sign < 0:
    sin = -sin
  if style == "half":
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).astype(x.dtype)
  x1, x2 = x[..., 0::2].astype(jnp.float32), x[..., 1::2].astype(jnp.float32)
  return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape(x.shape).astype(x.dtype)


class Attention(nnx.Module):
  """Multi-head attention `y = Σ_h W_O^h · transport(q^h, k^h, v^h; β_h, α_h)` (or CMAP's magnetic transport).

  x: [b, n, d] -> [b, n, d]. Weights `wq`: [d, h, k]; `wk, wv`: [d, g, k] (g = `num_kv_heads`,
  default h; each group of h/g query heads shares one key/value head, as `repeat_interleave`);
  `wo`: [h, k, d]. Optional biases `bq` [h, k], `bk, bv` [g, k], `bo` [d]. `coupling`: CMAP's γ
  (initial value when learnable; unused by the family).

  QK-norm with a learned scale comes before the rotation; a parameter-free one after it
  (nanochat's order — the two agree for an exact rotation, which preserves each head vector's
  norm, but not once the cos/sin tables are rounded to bfloat16); then q, k are multiplied by
  `qk_gain`. With `value_gate = C > 0` a value
  embedding `e` [b, n, g, k] passed to the call is added to v through the gate
  `v ← v + 3·σ(x[..., :C] · ve_gate) e`, `ve_gate` [C, g] (nanochat's ResFormer value residual).

  With `distance_form`, one projection `wp` [d, h, k] (bias `bp`) replaces `wq, wk`: `m = x·wp + bp`
  and the layer is DMAP on m (q = k = m/√2, so that (q + k)/√2 = m for the kernels and probes).
  """

  def __init__(self, cfg: BlockConfig, *, causal: bool = False, value_gate: int = 0, rngs: nnx.Rngs):
    """One attention layer of `cfg` (a `BlockConfig`: sizes, operator, kernel and the checkpoint options;
    `attngeo.nn.presets` names the combinations real checkpoints use). `causal` and `value_gate` belong to
    the model around the block (a GPT is causal; nanochat's value embeddings gate some layers only)."""
    cfg.validate()
    width, num_heads, head_dim, operator = cfg.width, cfg.num_heads, cfg.dh, cfg.operator
    learnable_operator, qk_norm, qkv_bias, distance_form = (cfg.learnable_operator, cfg.qk_norm, cfg.qkv_bias,
                                                            cfg.distance_form)
    dtype, norm_eps = jnp.dtype(cfg.dtype), cfg.norm_eps
    kv_heads = cfg.num_kv_heads or num_heads
    self.distance_form = distance_form
    self.num_heads, self.head_dim, self.causal = num_heads, head_dim, causal
    self.use_rope, self.qk_norm, self.qkv_bias = cfg.use_rope, qk_norm, qkv_bias
    self.implementation, self.dtype, self.capture = cfg.implementation, dtype, False
    self.num_kv_heads, self.out_bias, self.qk_gain, self.value_gate = kv_heads, cfg.out_bias, cfg.qk_gain, value_gate
    self.rope_base, self.rope_sign, self.rope_style = cfg.rope_base, cfg.rope_sign, cfg.rope_style
    self.rope_dtype = None if cfg.rope_dtype is None else jnp.dtype(cfg.rope_dtype)
    qk = (("wp", num_heads),) if distance_form else (("wq", num_heads), ("wk", kv_heads))
    for name, heads in qk + (("wv", kv_heads),):
      setattr(self, name, param(rngs, (width, heads, head_dim), ("embed", "heads", "kv")))
    self.wo = param(rngs, (num_heads, head_dim, width), ("heads", "kv", "embed"), std=(num_heads * head_dim) ** -0.5)
    if qkv_bias:
      qk = (("bp", num_heads),) if distance_form else (("bq", num_heads), ("bk", kv_heads))
      for name, heads in qk + (("bv", kv_heads),):
        setattr(self, name, param(rngs, (heads, head_dim), ("heads", "kv"), zero=True))
    if qk_norm:
      self.q_norm = nnx.RMSNorm(head_dim, dtype=dtype, epsilon=norm_eps, use_scale=cfg.qk_norm_scale, rngs=rngs)
      self.k_norm = nnx.RMSNorm(head_dim, dtype=dtype, epsilon=norm_eps, use_scale=cfg.qk_norm_scale, rngs=rngs)
    if cfg.out_bias:
      self.bo = param(rngs, (width,), ("embed",), zero=True)
    if value_gate:
      self.ve_gate = param(rngs, (value_gate, kv_heads), (None, "heads"), zero=True)
    self.learnable_operator, self.coupling_init = learnable_operator, float(cfg.coupling)
    self.set_operator(operator)

  def set_operator(self, operator):
    """Switch (β, α) — or to/from CMAP — in place; the weights are untouched (grafting)."""
    beta, alpha = resolve_operator(operator)
    if self.distance_form and ((beta, alpha) != (0.0, 0.0) or operators.is_magnetic(operator)):
      raise ValueError(f"a distance-form Attention (W_+ only) runs DMAP only; got operator {operator!r}")
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

  def qkv(self, x, value_embed=None, positions=None):
    """Projections (with biases, value embedding, QK-norm, gain and rotary at `positions` [n], default
    0…n−1, applied): three [b, n, h, k] arrays (grouped key/value heads repeated to h)."""
    x = x.astype(self.dtype)
    proj = lambda w: jnp.einsum("bnd,dhk->bnhk", x, w[...].astype(self.dtype))
    if self.distance_form:                    # q = k = m/√2 with m = x·W_+ + b_+
      m = proj(self.wp) + (self.bp[...].astype(self.dtype) if self.qkv_bias else 0)
      q = k = m * (1 / math.sqrt(2))
      v = proj(self.wv) + (self.bv[...].astype(self.dtype) if self.qkv_bias else 0)
    else:
      q, k, v = proj(self.wq), proj(self.wk), proj(self.wv)
      if self.qkv_bias:
        q, k, v = q + self.bq[...].astype(self.dtype), k + self.bk[...].astype(self.dtype), v + self.bv[...].astype(self.dtype)
    if value_embed is not None:
      if not self.value_gate:
        raise ValueError("a value embedding was passed to an Attention built without value_gate")
      gate = VALUE_GATE_RANGE * jax.nn.sigmoid(x[..., :self.value_gate] @ self.ve_gate[...].astype(self.dtype))
      v = v + gate[..., None] * value_embed.astype(self.dtype)
    learned_norm = self.qk_norm and self.q_norm.scale is not None
    if learned_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    if self.use_rope:
      opts = dict(sign=self.rope_sign, style=self.rope_style, table_dtype=self.rope_dtype)
      q, k = rope(q, positions, self.rope_base, **opts), rope(k, positions, self.rope_base, **opts)
    if self.qk_norm and not learned_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    if self.qk_gain != 1.0:
      q, k = q * self.qk_gain, k * self.qk_gain
    if self.num_kv_heads != self.num_heads:
      reps = self.num_heads // self.num_kv_heads
      k, v = jnp.repeat(k, reps, axis=2), jnp.repeat(v, reps, axis=2)
    return q, k, v

  def __call__(self, x, mask=None, value_embed=None):
    q, k, v = self.qkv(x, value_embed)
    if self.capture:
      self.sow(nnx.Intermediate, "qk", (q, k))
    beta, alpha = self.coefficients()
    # The layer's kernel setting outlives a graft across the family/CMAP line: the dispatcher keeps it where
    # it names a kernel of this operator's kind and takes its default otherwise (strict=False).
    impl = kernels.choose("magnetic" if self.magnetic else "softmax", self.implementation, k.shape[1], strict=False)
    if self.magnetic:
      coupling = self.coupling[...] if self.learnable_operator else self.coupling
      y = operators.magnetic_transport(q, k, v, beta=beta, coupling=coupling, causal=self.causal, mask=mask,
                                       implementation=impl)
    else:
      y = operators.transport(q, k, v, beta=beta, alpha=alpha, causal=self.causal, mask=mask, implementation=impl)
    out = jnp.einsum("bnhk,hkd->bnd", y, self.wo[...].astype(self.dtype))
    return out + self.bo[...].astype(self.dtype) if self.out_bias else out

  # -- incremental decoding: a cache of the augmented keys (`operators.augment`), so each new token
  # costs one row of attention under any operator of the family. The augmented key, value and key
  # bias of token j depend on (q_j, k_j, v_j) alone, and the query-only terms the augmentation drops
  # are row shifts.

  def _check_decodable(self):
    if self.distance_form or not self.causal or self.magnetic:
      raise ValueError("KV-cache decoding needs a causal attention of the (β, α) family in the (q, k) form "
                       "(not distance_form, not CMAP)")

  def init_cache(self, batch: int, length: int) -> dict:
    """Zero cache for `length` positions: augmented keys `k` [b, T, h, D], values `v` [b, T, h, k],
    key bias `bias` [b, T, h] (absent when the operator has none)."""
    self._check_decodable()
    probe = jnp.zeros((batch, length, self.num_heads, self.head_dim), self.dtype)
    beta, alpha = self.coefficients()
    aug = jax.eval_shape(lambda q: operators.augment(q, q, beta=beta, alpha=alpha, scale=1.0), probe)
    cache = {"k": jnp.zeros(aug.k.shape, aug.k.dtype), "v": jnp.zeros(probe.shape, self.dtype)}
    if aug.bias is not None:
      cache["bias"] = jnp.zeros(aug.bias.shape, jnp.float32)
    return cache

  def decode(self, x, cache: dict, pos, value_embed=None, window: int | None = None):
    """x [b, n, d] holding positions pos…pos+n−1 → (y [b, n, d], cache with those positions written).

    Each query attends causally to the cached positions ≤ its own (and ≥ its own − `window`);
    equal to `__call__` (causal, same window) on the whole prefix, row by row.
    """
    self._check_decodable()
    n, length = x.shape[1], cache["k"].shape[1]
    q, k, v = self.qkv(x, value_embed, pos + jnp.arange(n))
    beta, alpha = self.coefficients()
    scale = 1.0 / math.sqrt(self.head_dim)
    aug = operators.augment(q, k, beta=beta, alpha=alpha, scale=scale)
    write = lambda c, new: jax.lax.dynamic_update_slice(c, new.astype(c.dtype), (0, pos) + (0,) * (c.ndim - 2))
    cache = dict(cache, k=write(cache["k"], aug.k), v=write(cache["v"], v))
    if aug.bias is not None:
      cache["bias"] = write(cache["bias"], aug.bias)
    offset = (pos + jnp.arange(n))[:, None] - jnp.arange(length)[None, :]                  # query − key position
    mask = (offset >= 0) if window is None else (offset >= 0) & (offset <= window)
    y = kernels.attention(aug.q, cache["k"], cache["v"], bias=cache.get("bias"), mask=mask[None, None], scale=scale,
                          implementation="einsum")
    out = jnp.einsum("bnhk,hkd->bnd", y, self.wo[...].astype(self.dtype))
    return (out + self.bo[...].astype(self.dtype) if self.out_bias else out), cache


class Mlp(nnx.Module):
  """`W_2 act(W_1 x + b_1) + b_2` (biases optional), act ∈ {relu2, gelu, gelu_erf, silu}; x: [b, n, d].

  `gelu` is the tanh approximation (`jax.nn.gelu`'s default; GPT-2's `gelu_new`); `gelu_erf` the exact
  `z·Φ(z)` (BERT's `gelu`); `relu2` is `relu(z)²` (nanochat).
  """

  def __init__(self, width: int, hidden: int, act: str = "gelu", dtype=jnp.float32, *, bias: bool = True,
               rngs: nnx.Rngs):
    acts = {"relu2": lambda z: jnp.square(jax.nn.relu(z)), "gelu": jax.nn.gelu, "silu": jax.nn.silu,
            "gelu_erf": lambda z: jax.nn.gelu(z, approximate=False)}
    if act not in acts:
      raise ValueError(f"mlp activation must be one of {sorted(acts)}; got {act!r}")
    self.act, self.fn, self.dtype, self.bias = act, acts[act], dtype, bias
    self.w1 = param(rngs, (width, hidden), ("embed", "mlp"))
    if bias:
      self.b1 = param(rngs, (hidden,), ("mlp",), zero=True)
    self.w2 = param(rngs, (hidden, width), ("mlp", "embed"), std=hidden ** -0.5)
    if bias:
      self.b2 = param(rngs, (width,), ("embed",), zero=True)

  def __call__(self, x):
    x = x.astype(self.dtype)
    h = x @ self.w1[...].astype(self.dtype)
    h = self.fn(h + self.b1[...].astype(self.dtype) if self.bias else h)
    y = h @ self.w2[...].astype(self.dtype)
    return y + self.b2[...].astype(self.dtype) if self.bias else y


def make_norm(cfg: BlockConfig, features: int, rngs: nnx.Rngs):
  """The norm `cfg` asks for over `features` channels: RMSNorm or LayerNorm, scale/bias optional."""
  if cfg.norm == "rms":
    return nnx.RMSNorm(features, epsilon=cfg.norm_eps, use_scale=cfg.norm_scale, rngs=rngs)
  return nnx.LayerNorm(features, epsilon=cfg.norm_eps, use_scale=cfg.norm_scale, use_bias=cfg.norm_bias,
                       use_fast_variance=False, rngs=rngs)


class Block(nnx.Module):
  """Pre-norm residual block; with `cond_dim`, adaLN-Zero: `x + g ⊙ f((1 + s) ⊙ norm(x) + t)`.

  The modulation (t, s, g per sub-layer) is a zero-initialised linear map of `silu(cond)`, so the
  block is the identity at initialisation. `value_gate` > 0 gives the attention a gated value
  embedding (passed per call as `value_embed` [b, n, g, k]).
  """

  def __init__(self, cfg: BlockConfig, *, causal=False, cond_dim: int | None = None, value_gate: int = 0,
               rngs: nnx.Rngs):
    cfg.validate()
    dtype = jnp.dtype(cfg.dtype)
    self.order, self.adaln = cfg.order, cond_dim is not None
    norm = (lambda: nnx.LayerNorm(cfg.width, use_scale=False, use_bias=False, rngs=rngs)) if self.adaln else \
           (lambda: make_norm(cfg, cfg.width, rngs))
    self.norm_attn, self.norm_mlp = norm(), norm()
    self.attn = Attention(cfg, causal=causal, value_gate=value_gate, rngs=rngs)
    self.mlp = Mlp(cfg.width, int(cfg.width * cfg.mlp_ratio), cfg.mlp_act, dtype, bias=cfg.mlp_bias, rngs=rngs)
    if self.adaln:
      self.ada_w = param(rngs, (cond_dim, 6 * cfg.width), ("cond", "embed"), zero=True)
      self.ada_b = param(rngs, (6 * cfg.width,), ("embed",), zero=True)

  def __call__(self, x, cond=None, mask=None, value_embed=None):
    if self.adaln:
      mod = jax.nn.silu(cond) @ self.ada_w[...] + self.ada_b[...]       # [b, 6d]
      t1, s1, g1, t2, s2, g2 = (m[:, None, :] for m in jnp.split(mod, 6, -1))
    subs = {"attn": (self.norm_attn, lambda h: self.attn(h, mask=mask, value_embed=value_embed)),
            "mlp": (self.norm_mlp, self.mlp)}
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

  def decode(self, x, cache: dict, pos, cond=None, value_embed=None, window: int | None = None):
    """`__call__` for positions pos…pos+n−1 of a causal model, attention through `Attention.decode`'s cache."""
    if self.adaln:
      mod = jax.nn.silu(cond) @ self.ada_w[...] + self.ada_b[...]
      t1, s1, g1, t2, s2, g2 = (m[:, None, :] for m in jnp.split(mod, 6, -1))
    for name in (("attn", "mlp") if self.order == "attn_first" else ("mlp", "attn")):
      h = (self.norm_attn if name == "attn" else self.norm_mlp)(x)
      if self.adaln:
        t, s, g = (t1, s1, g1) if name == "attn" else (t2, s2, g2)
        h = h * (1 + s) + t
      if name == "attn":
        h, cache = self.attn.decode(h, cache, pos, value_embed=value_embed, window=window)
      else:
        h = self.mlp(h)
      if self.adaln:
        h = h * g
      x = x + h.astype(x.dtype)
    return x, cache


def attention_modules(model) -> list[Attention]:
  """Every `Attention` in a model, in layer order."""
  return [m for _, m in nnx.iter_modules(model) if isinstance(m, Attention)]


def graft(model, operator):
  """Run `model`'s weights under another operator (β, α): a pure swap, parameters untouched."""
  for m in attention_modules(model):
    m.set_operator(operator)
  return model


def fold_distance(model):
  """Fold every Attention of `model` into DMAP's distance form, in place: `wp = (wq + wk)/√2`.

  q/k biases fold the same way (`bp = (bq + bk)/√2`), so `m = wp·x + bp = (q + k)/√2` exactly and the
  folded model computes what `graft(model, "DMAP")` computes, with half the query–key parameters
  (`wq`, `wk` are removed). `model.cfg` (if any) is updated to `distance_form=True, operator="DMAP"`
  so run folders rebuild the folded shape. Rotary embeddings commute with the fold; QK-norm does not
  (an error). Returns `model`.
  """
  mods = [m for m in attention_modules(model) if not m.distance_form]
  for m in mods:
    if m.qk_norm:
      raise ValueError("fold_distance: QK-norm is not a function of W_+ x; a model with qk_norm cannot be folded")
    if m.num_kv_heads != m.num_heads:
      raise ValueError("fold_distance: grouped key heads (GQA) have no per-head W_+ = (W_Q + W_K)/√2")
  for m in mods:
    m.learnable_operator = False
    m.set_operator("DMAP")
    m.wp = nnx.Param((m.wq[...] + m.wk[...]) * (1 / math.sqrt(2)), axes=("embed", "heads", "kv"))
    del m.wq, m.wk
    if m.qkv_bias:
      m.bp = nnx.Param((m.bq[...] + m.bk[...]) * (1 / math.sqrt(2)), axes=("heads", "kv"))
      del m.bq, m.bk
    m.distance_form = True
  cfg = getattr(model, "cfg", None)
  if cfg is not None and isinstance(getattr(cfg, "block", None), BlockConfig):
    blk = dataclasses.replace(cfg.block, operator="DMAP", learnable_operator=False, distance_form=True)
    model.cfg = dataclasses.replace(cfg, block=blk.validate())
  return model


def param_count(model, *, blocks_only: bool = False) -> int:
  """The number of parameters (`nnx.Param` entries) of `model`; `blocks_only`: of its transformer blocks only
  (`model.layers`, or `model.blocks`: embeddings, read-in/out and time embedding excluded; an ALBERT's one
  shared layer counted once)."""
  part = (model.layers if hasattr(model, "layers") else model.blocks) if blocks_only else model
  return int(sum(x.size for x in jax.tree.leaves(nnx.state(part, nnx.Param))))


def capture_qk(model, fn, *, every_call: bool = False):
  """Run `fn()` with every Attention sowing its q, k; returns (fn's result, [(q, k)] per layer).

  every_call: one entry per call of each Attention (a layer shared across depth — ALBERT's — is called
  L times), returned as (fn's result, [(q, k)], [the Attention of each entry]).
  """
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
  if every_call:
    calls = [(qk, m) for path, m in found for qk in sown[path + ("qk",)].get_value()]
    return out, [qk for qk, _ in calls], [m for _, m in calls]
  return out, [sown[path + ("qk",)].get_value()[0] for path in paths]
