"""The attention transport family: DMAP, DMTN, ATAP, ATTN and the continuous square between them.

Every operator is a row-stochastic Markov matrix built from attention's own queries and keys
(layout of `jax.nn.dot_product_attention`: `q, k` are `[b, n, h, d]` — batch, tokens, heads, head
dim). With `m = (q + k)/√2`, `n = (q − k)/√2`, `s = scale` (default `1/√d`) and `β, α ∈ [0, 1]`:

    L_ij = s·[ ½ m_i·m_j − β·½ n_i·n_j                (S: symmetric; PSD Gram minus β·NSD Gram)
             + α·½ (q_i·k_j − k_i·q_j)                (free antisymmetric part)
             + (1 − α)·½ (g_i − g_j) ],               (exact antisymmetric part, a potential)
    g_i = ½‖m_i‖² − β·½‖n_i‖²,
    P = rownorm(exp(L) ⊙ mask).

Corners `(β, α)`: ATTN = (1, 1) is standard attention `exp(s q_i·k_j)`; DMTN = (0, 1) keeps the
definite core and a free skew part; ATAP = (1, 0) is `exp(−½ s (q_i − q_j)·(k_i − k_j))`
(reversible); DMAP = (0, 0) is the Gaussian kernel `exp(−¼ s ‖m_i − m_j‖²)` on `m` (reversible,
depends on `W_+ = (W_Q + W_K)/√2` only).

A logit matters only up to row shifts `L_ij + c_i`, so every member is ONE scaled-dot-product
attention on augmented heads plus a per-key bias (`c = (1 − β)/4`, `c' = (1 + β)/4`):

    L_ij ≡ s·[q_i, k_i] · [c q_j + (c' + α/2) k_j, (c' − α/2) q_j + c k_j] − s·(1 − α)/2 · g_j.

DMAP needs only `m_i · ½ m_j − ¼ s‖m_j‖²` (head dim d), ATTN is plain attention, the general
member needs 2·d. `transport` runs that single attention through an interchangeable kernel:
`"einsum"` (XLA einsum + softmax; fastest on CPU), `"xla"` / `"cudnn"` (`jax.nn.dot_product_attention`),
or `"blockwise"` (flash-style pure JAX with O(n) memory and a recomputing backward).
`logits` and `markov_matrix` are the dense reference, written from the formula above.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks

# Named corners (β, α) of the operator square.
ATTN = (1.0, 1.0)
DMTN = (0.0, 1.0)
ATAP = (1.0, 0.0)
DMAP = (0.0, 0.0)
CORNERS = {"ATTN": ATTN, "DMTN": DMTN, "ATAP": ATAP, "DMAP": DMAP}
IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "blockwise")

_NEG = -1e30  # finite "minus infinity": fully masked rows stay NaN-free.


def corner(name: str) -> tuple[float, float]:
  """(β, α) of a named operator: one of ATTN, DMTN, ATAP, DMAP (case-insensitive)."""
  try:
    return CORNERS[name.upper()]
  except (KeyError, AttributeError):
    raise ValueError(f"operator must be one of {sorted(CORNERS)}; got {name!r}") from None


def default_implementation(seq_len: int | None = None) -> str:
  """Fastest kernel per backend (see `attngeo bench`): cuDNN flash on GPU, XLA's fused SDPA on TPU;
  on CPU the einsum path below 512 keys and the blockwise path from 512 on (1.6× faster than
  einsum at 1024 keys, 3× at 4096, and O(n) memory)."""
  backend = jax.default_backend()
  if backend in ("gpu", "cuda"):
    return "cudnn"
  if backend == "tpu":
    return "xla"
  return "blockwise" if seq_len is not None and seq_len >= 512 else "einsum"


# ----------------------------------------------------------------------------- validation

def _check_qk(q, k):
  _checks.check_rank("q", q, 4, "[batch, seq, heads, head_dim]")
  _checks.check_rank("k", k, 4, "[batch, seq, heads, head_dim]")
  _checks.check_floating("q", q)
  _checks.check_floating("k", k)
  if q.shape != k.shape:
    raise ValueError(f"q and k must have the same shape [b, n, h, d]; got q {q.shape}, k {k.shape}")
  _checks.check_finite("q", q)
  _checks.check_finite("k", k)


def _coefficient(name: str, x, heads: int):
  """β or α as a Python float (static corner) or an array broadcastable to [h]."""
  if isinstance(x, (int, float, np.floating, np.integer)):
    x = float(x)
    _checks.check_unit_interval(name, x)
    return x
  x = jnp.asarray(x)
  if x.ndim > 1 or (x.ndim == 1 and x.shape[0] not in (1, heads)):
    raise ValueError(f"{name} must be a scalar or a per-head array of shape [{heads}]; got shape {x.shape}")
  _checks.check_unit_interval(name, x)
  return x


def _check_mask(mask, b, h, t, s):
  if mask is None:
    return None
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise TypeError(f"mask must be boolean (True = attend); got dtype {mask.dtype}")
  if mask.ndim != 4:
    raise ValueError(f"mask must be 4-D, broadcastable to [batch, heads, q_len, k_len]; got {mask.shape}")
  try:
    jnp.broadcast_shapes(mask.shape, (b, h, t, s))
  except ValueError:
    raise ValueError(f"mask shape {mask.shape} does not broadcast to [b, h, t, s] = {(b, h, t, s)}") from None
  return mask


# ----------------------------------------------------------------------------- augmentation

class Augmented(NamedTuple):
  """One SDPA that realises operator (β, α): `L_ij = scale·q_i·k_j + bias_j`.

  q: [b, n, h, D]; k: [b, n, h, D]; bias: [b, n, h] per-key logit bias or None.
  D is d (ATTN, DMAP, or β = 0 with α = 0) or 2·d (any other member).
  """
  q: jax.Array
  k: jax.Array
  bias: jax.Array | None


def augment(q, k, *, beta, alpha, scale: float) -> Augmented:
  """Rewrite operator (β, α) on (q, k) as augmented heads plus a key bias (see module doc).

  Static Python-float corners take the narrowest form; traced or per-head (β, α) the general
  2·d form. Exactly equal to `logits(...)` up to a per-row constant.
  """
  if isinstance(beta, float) and isinstance(alpha, float):
    if beta == 1.0 and alpha == 1.0:
      return Augmented(q, k, None)
    if beta == 0.0 and alpha == 0.0:
      m = (q + k) * (1 / math.sqrt(2))
      g = 0.5 * jnp.sum(jnp.square(m.astype(jnp.float32)), -1)
      return Augmented(m, 0.5 * m, -scale * 0.5 * g)
  b_ = jnp.asarray(beta, jnp.float32)[..., None]   # [] or [h] -> broadcast over [b, n, h, 1]
  a_ = jnp.asarray(alpha, jnp.float32)[..., None]
  c, cp = (1 - b_) / 4, (1 + b_) / 4
  dt = q.dtype
  qa = jnp.concatenate([q, k], -1)
  ka = jnp.concatenate([(c * q + (cp + a_ / 2) * k).astype(dt), ((cp - a_ / 2) * q + c * k).astype(dt)], -1)
  if isinstance(alpha, float) and alpha == 1.0:
    return Augmented(qa, ka, None)
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  g = 0.25 * jnp.sum(jnp.square(qf + kf), -1) - 0.25 * b_[..., 0] * jnp.sum(jnp.square(qf - kf), -1)
  bias = -scale * 0.5 * (1 - a_[..., 0]) * g
  return Augmented(qa, ka, bias)


# ----------------------------------------------------------------------------- kernels

def _einsum_sdpa(q, k, v, bias, mask, causal, scale):
  s = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    s = s + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
  s = _apply_masks(s, mask, causal)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhts,bshe->bthe", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


def _apply_masks(s, mask, causal, q_offset=0, k_offset=0):
  if causal:
    t, n = s.shape[-2], s.shape[-1]
    qi = q_offset + jnp.arange(t)[:, None]
    kj = k_offset + jnp.arange(n)[None, :]
    s = jnp.where(kj <= qi, s, _NEG)
  if mask is not None:
    s = jnp.where(mask, s, _NEG)
  return s


def _pad_last(x, width):
  return x if x.shape[-1] == width else jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - x.shape[-1])])


def _sdpa_jax(q, k, v, bias, mask, causal, scale, implementation):
  """`jax.nn.dot_product_attention`; value heads padded to the augmented width it requires."""
  dv, out_dtype = v.shape[-1], v.dtype
  if implementation == "cudnn":
    # cuDNN's fused kernel runs in bf16/fp16 (float32 inputs are computed in bf16, accumulating in
    # float32) and takes no per-key bias cheaply: fold it into one more column, pad widths to 8.
    if q.dtype == jnp.float32:
      q, k, v = q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    if bias is not None:
      ones = jnp.ones(q.shape[:-1] + (1,), q.dtype)
      q = jnp.concatenate([q, ones], -1)
      k = jnp.concatenate([k, (bias / scale)[..., None].astype(k.dtype)], -1)
      bias = None
    width = -(-max(q.shape[-1], dv) // 8) * 8
    q, k = _pad_last(q, width), _pad_last(k, width)
  width = q.shape[-1]
  vv = _pad_last(v, width) if dv < width else v
  if dv > width:
    q, k = _pad_last(q, dv), _pad_last(k, dv)
  b4 = None if bias is None else jnp.transpose(bias, (0, 2, 1))[:, :, None, :].astype(jnp.float32)
  out = jax.nn.dot_product_attention(q, k, vv, bias=b4, mask=mask, scale=scale, is_causal=causal,
                                     implementation=implementation)
  return out[..., :dv].astype(out_dtype)


# ---- blockwise (flash-style) attention with a recomputing backward: O(n) memory.

def _blocks(x, size):
  """[b, h, n, ...] -> [n/size, b, h, size, ...]."""
  b, h, n = x.shape[:3]
  return jnp.moveaxis(x.reshape((b, h, n // size, size) + x.shape[3:]), 2, 0)


def _unblocks(x):
  nb, b, h, size = x.shape[:4]
  return jnp.moveaxis(x, 0, 2).reshape((b, h, nb * size) + x.shape[4:])


def _block_logits(qb, kb, biasb, maskb, causal, scale, iq, ik, bq, bk):
  s = jnp.einsum("bhqd,bhkd->bhqk", qb, kb, preferred_element_type=jnp.float32) * scale
  s = s + biasb[:, :, None, :]
  return _apply_masks(s, maskb, causal, iq * bq, ik * bk)


def _mask_block(mask, iq, ik, bq, bk):
  if mask is None:
    return None
  sq = bq if mask.shape[2] > 1 else 1
  sk = bk if mask.shape[3] > 1 else 1
  return jax.lax.dynamic_slice(mask, (0, 0, iq * sq if sq > 1 else 0, ik * sk if sk > 1 else 0),
                               mask.shape[:2] + (sq, sk))


def _flash_fwd_impl(q, k, v, bias, mask, causal, scale, bq, bk):
  """q [b,h,T,d], k [b,h,S,d], v [b,h,S,e], bias [b,h,S] f32 -> out [b,h,T,e], lse [b,h,T]."""
  kblocks, vblocks, biasblocks = _blocks(k, bk), _blocks(v, bk), _blocks(bias, bk)
  nk = kblocks.shape[0]

  def per_query_block(args):
    iq, qb = args
    b, h = qb.shape[:2]
    init = (jnp.zeros((b, h, bq, v.shape[-1]), jnp.float32),
            jnp.full((b, h, bq), _NEG, jnp.float32), jnp.zeros((b, h, bq), jnp.float32))

    def step(carry, ik):
      o, mx, l = carry
      s = _block_logits(qb, kblocks[ik], biasblocks[ik], _mask_block(mask, iq, ik, bq, bk), causal, scale, iq, ik, bq, bk)
      mx_new = jnp.maximum(mx, s.max(-1))
      p = jnp.exp(s - mx_new[..., None])
      corr = jnp.exp(mx - mx_new)
      o = o * corr[..., None] + jnp.einsum("bhqk,bhke->bhqe", p.astype(v.dtype), vblocks[ik],
                                           preferred_element_type=jnp.float32)
      return (o, mx_new, l * corr + p.sum(-1)), None

    (o, mx, l), _ = jax.lax.scan(step, init, jnp.arange(nk))
    return (o / l[..., None]).astype(v.dtype), mx + jnp.log(l)

  nq = q.shape[2] // bq
  out, lse = jax.lax.map(per_query_block, (jnp.arange(nq), _blocks(q, bq)))
  return _unblocks(out), _unblocks(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _flash(q, k, v, bias, mask, causal, scale, bq, bk):
  return _flash_fwd_impl(q, k, v, bias, mask, causal, scale, bq, bk)[0]


def _flash_fwd(q, k, v, bias, mask, causal, scale, bq, bk):
  out, lse = _flash_fwd_impl(q, k, v, bias, mask, causal, scale, bq, bk)
  return out, (q, k, v, bias, mask, out, lse)


def _flash_bwd(causal, scale, bq, bk, res, dout):
  """Recompute each block of P from the saved log-normaliser; never holds more than a block."""
  q, k, v, bias, mask, out, lse = res
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1)          # [b,h,T]
  qbs, dobs, lses, deltas = _blocks(q, bq), _blocks(dout, bq), _blocks(lse, bq), _blocks(delta, bq)
  nq = qbs.shape[0]

  def per_key_block(dq_acc, args):
    ik, kb, vb, biasb = args

    def step(carry, iq):
      dk, dv, dbias = carry
      qb, dob = qbs[iq], dobs[iq]
      s = _block_logits(qb, kb, biasb, _mask_block(mask, iq, ik, bq, bk), causal, scale, iq, ik, bq, bk)
      p = jnp.exp(s - lses[iq][..., None])
      dv = dv + jnp.einsum("bhqk,bhqe->bhke", p, dob.astype(jnp.float32))
      dp = jnp.einsum("bhqe,bhke->bhqk", dob.astype(jnp.float32), vb.astype(jnp.float32))
      ds = p * (dp - deltas[iq][..., None])
      dq_blk = jnp.einsum("bhqk,bhkd->bhqd", ds, kb.astype(jnp.float32)) * scale
      dk = dk + jnp.einsum("bhqk,bhqd->bhkd", ds, qb.astype(jnp.float32)) * scale
      return (dk, dv, dbias + ds.sum(2)), dq_blk

    b, h = kb.shape[:2]
    init = (jnp.zeros(kb.shape, jnp.float32), jnp.zeros(vb.shape, jnp.float32), jnp.zeros((b, h, bk), jnp.float32))
    (dk, dv, dbias), dq_blocks = jax.lax.scan(step, init, jnp.arange(nq))
    return dq_acc + _unblocks(dq_blocks), (dk, dv, dbias)

  dq, (dks, dvs, dbiases) = jax.lax.scan(
      per_key_block, jnp.zeros(q.shape, jnp.float32),
      (jnp.arange(k.shape[2] // bk), _blocks(k, bk), _blocks(v, bk), _blocks(bias, bk)))
  return (dq.astype(q.dtype), _unblocks(dks).astype(k.dtype), _unblocks(dvs).astype(v.dtype),
          _unblocks(dbiases).astype(bias.dtype), None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _blockwise_sdpa(q, k, v, bias, mask, causal, scale, block_size):
  """Flash-style attention in pure JAX; pads n to a multiple of the block size."""
  b, t, h, _ = q.shape
  n = k.shape[1]
  bq = min(block_size, t)
  bk = min(block_size, n)
  tp, npad = -(-t // bq) * bq, -(-n // bk) * bk
  tr = lambda x: jnp.transpose(x, (0, 2, 1, 3))
  qt, kt, vt = tr(q), tr(k), tr(v)
  bias_t = jnp.zeros((b, h, n), jnp.float32) if bias is None else jnp.transpose(bias, (0, 2, 1)).astype(jnp.float32)
  if tp != t:
    qt = jnp.pad(qt, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
  if npad != n:
    kt = jnp.pad(kt, ((0, 0), (0, 0), (0, npad - n), (0, 0)))
    vt = jnp.pad(vt, ((0, 0), (0, 0), (0, npad - n), (0, 0)))
    bias_t = jnp.pad(bias_t, ((0, 0), (0, 0), (0, npad - n)), constant_values=_NEG)
  if mask is not None:
    mb = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], t, n))
    mask = jnp.pad(mb, ((0, 0), (0, 0), (0, tp - t), (0, npad - n)))
  out = _flash(qt, kt, vt, bias_t, mask, causal, scale, bq, bk)
  return jnp.transpose(out[:, :, :t], (0, 2, 1, 3))


def attention(q, k, v, *, bias=None, mask=None, causal=False, scale=None, implementation=None, block_size=512):
  """Scaled-dot-product attention `softmax(scale·q·kᵀ + bias_j, masked)·v` through a chosen kernel.

  q: [b, t, h, d]; k: [b, s, h, d]; v: [b, s, h, e]; bias: [b, s, h] per-key logit bias or None;
  mask: bool, broadcastable to [b, h, t, s] (True = attend). Returns [b, t, h, e] in v's dtype,
  with logits and softmax accumulated in float32. This is the one kernel every operator (and the
  matrix-free geometry) runs on.
  """
  implementation = implementation or default_implementation(k.shape[1])
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if implementation == "einsum":
    return _einsum_sdpa(q, k, v, bias, mask, causal, scale)
  if implementation in ("xla", "cudnn"):
    return _sdpa_jax(q, k, v, bias, mask, causal, scale, implementation)
  if implementation == "blockwise":
    return _blockwise_sdpa(q, k, v, bias, mask, causal, scale, block_size)
  raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")


# ----------------------------------------------------------------------------- public API

def transport(q, k, v, *, beta=1.0, alpha=1.0, causal: bool = False, mask=None, scale=None,
              implementation: str | None = None, block_size: int = 512):
  """Attention output `y_i = Σ_j P_ij v_j` under operator (β, α), as one fused SDPA.

  Args:
    q, k: [b, n, h, d] queries and keys (rotary, QK-norm, biases already applied).
    v: [b, n, h, e] values.
    beta, alpha: scalars or per-head arrays [h] in [0, 1]; (1, 1) is standard attention.
    causal: lower-triangular mask (i attends to j ≤ i).
    mask: optional bool, broadcastable to [b, h, n, n]; True = attend.
    scale: logit scale s; default 1/√d.
    implementation: "einsum" | "xla" | "cudnn" | "blockwise" | None (fastest for the backend).
  Returns:
    [b, n, h, e], `P` never materialised on the fused/blockwise paths.
  """
  _check_qk(q, k)
  _checks.check_rank("v", v, 4, "[batch, seq, heads, value_dim]")
  if v.shape[:3] != k.shape[:3]:
    raise ValueError(f"v must be [b, n, h, e] matching k's {k.shape[:3]}; got {v.shape}")
  b, n, h, d = q.shape
  mask = _check_mask(mask, b, h, n, n)
  beta, alpha = _coefficient("beta", beta, h), _coefficient("alpha", alpha, h)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  aug = augment(q, k, beta=beta, alpha=alpha, scale=scale)
  return attention(aug.q, aug.k, v, bias=aug.bias, mask=mask, causal=causal, scale=scale,
                   implementation=implementation, block_size=block_size)


class Logits(NamedTuple):
  """Dense logits [b, h, n, n]: `full = sym + skew`, `sym = Sᵀ`, `skew = −Aᵀ` (exact + free parts)."""
  full: jax.Array
  sym: jax.Array
  skew: jax.Array


def logits(q, k, *, beta=1.0, alpha=1.0, scale=None) -> Logits:
  """Dense reference logits `L = S + A` of DESIGN §1, written term by term from (m, n, g).

  q, k: [b, n, h, d]. Returns `Logits` of [b, h, n, n] float32 arrays (not row-shifted: this is
  the parametric logit itself, so `S` is symmetric and `A` antisymmetric exactly).
  """
  _check_qk(q, k)
  h, d = q.shape[2], q.shape[3]
  beta, alpha = _coefficient("beta", beta, h), _coefficient("alpha", alpha, h)
  scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  m, nn = (qf + kf) / math.sqrt(2), (qf - kf) / math.sqrt(2)
  bvec, avec = jnp.asarray(beta, jnp.float32), jnp.asarray(alpha, jnp.float32)   # [] or [h]
  bb, aa = bvec[..., None, None], avec[..., None, None]                          # broadcast to [b,h,n,n]
  gram = lambda x, y: jnp.einsum("bihd,bjhd->bhij", x, y)
  sym = 0.5 * gram(m, m) - bb * 0.5 * gram(nn, nn)
  qk = gram(qf, kf)
  g = 0.5 * jnp.sum(m * m, -1) - bvec * 0.5 * jnp.sum(nn * nn, -1)               # [b, n, h]
  g = jnp.transpose(g, (0, 2, 1))                                    # [b, h, n]
  exact = 0.5 * (g[..., :, None] - g[..., None, :])
  skew = aa * 0.5 * (qk - jnp.swapaxes(qk, -1, -2)) + (1 - aa) * exact
  return Logits(scale * (sym + skew), scale * sym, scale * skew)


def markov_matrix(q, k, *, beta=1.0, alpha=1.0, causal: bool = False, mask=None, scale=None):
  """Dense reference `P = rownorm(exp(L) ⊙ mask)`: [b, h, n, n] float32, rows sum to 1.

  Materialises n² entries per head: for tests and small-n diagnostics only.
  """
  return rownorm(logits(q, k, beta=beta, alpha=alpha, scale=scale).full, causal=causal, mask=mask)


def rownorm(full, *, causal: bool = False, mask=None):
  """`P = rownorm(exp(L) ⊙ mask)` from dense logits L `[b, h, n, n]` (e.g. `logits(...).full`)."""
  b, h, n, _ = full.shape
  mask = _check_mask(mask, b, h, n, n)
  return jax.nn.softmax(_apply_masks(full, mask, causal), axis=-1)
