"""Attention kernels: `softmax(scale·q·kᵀ + bias_j, masked)·v` through interchangeable implementations.

This is the one place where attention is computed; every member of the transport family
(`attngeo.operators`) and every matrix-free geometry operator (`attngeo.geometry`) calls
`attention` below. Layout of `jax.nn.dot_product_attention`: q `[b, t, h, d]`, k `[b, s, h, d]`,
v `[b, s, h, e]`; an optional per-key logit bias `[b, s, h]`; masks broadcastable to
`[b, h, t, s]` (True = attend). Logits and the softmax accumulate in float32 whatever the input
dtype.

Implementations:

* `"einsum"` — XLA einsum + softmax; materialises the `[b, h, t, s]` logits. Fastest on CPU below
  512 keys.
* `"xla"`, `"cudnn"` — `jax.nn.dot_product_attention`. cuDNN's fused kernel computes in bf16/fp16
  and takes no per-key bias cheaply: the bias is folded into one more head column
  (`[q, 1]·[k, bias/scale]`) and widths are padded to a multiple of 8.
* `"blockwise"` — flash-style pure JAX: an online softmax over key blocks (running max `m`,
  normaliser `l`, output `o ← o·e^{m−m'} + e^{s−m'}v`) and a `custom_vjp` backward that recomputes
  each block of P from the saved log-normaliser `lse = m + log l`, using
  `dS = P ⊙ (dP − rowsum(dO ⊙ O))`. Never more than one block of P exists: O(n) memory.

Edge case: a query row whose keys are all masked — by the mask and the causal order together, as
left padding does to the first rows — has no distribution; every kernel returns 0 for it (not the
mean of v).
"""
from __future__ import annotations

import functools
import math

import chex
import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "blockwise")

_NEG = -1e30  # finite "minus infinity": fully masked rows stay NaN-free.


def default_implementation(seq_len: int | None = None) -> str:
  """Default kernel per backend (see `attngeo bench`): cuDNN flash on GPU, XLA's fused SDPA on TPU;
  on CPU the einsum path below 512 keys and the blockwise path from 512 on: O(n) memory (361 MiB
  against einsum's 1,153 at 1024 keys, batch 8 × 8 heads), within 7 % of einsum's time at 1024
  keys and 4–17 % slower at 2048 (with the CLI's huge pages, docs/benchmarks.md; without them
  1.6× faster at 1024)."""
  backend = jax.default_backend()
  if backend in ("gpu", "cuda"):
    return "cudnn"
  if backend == "tpu":
    return "xla"
  return dense_or_blockwise(seq_len)


BLOCKWISE_FROM = 512   # keys: the portable kernels' switch from the dense einsum path to the blockwise one


def dense_or_blockwise(seq_len: int | None) -> str:
  """"einsum" below `BLOCKWISE_FROM` keys (or unknown length), else "blockwise": the choice between the
  two kernels every attention (plain and phase) has on every backend."""
  return "blockwise" if seq_len is not None and seq_len >= BLOCKWISE_FROM else "einsum"


def _einsum_sdpa(q, k, v, bias, mask, causal, scale):
  s = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    s = s + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
  s = apply_masks(s, mask, causal)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhts,bshe->bthe", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


def apply_masks(s, mask, causal, q_offset=0, k_offset=0):
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


def _pad_mask(mask, pad_t, pad_s):
  """A [b|1, h|1, t|1, s|1] mask padded (with False) to the padded lengths on its non-broadcast axes only:
  a key mask [b, 1, 1, s] stays O(s) (`_mask_block` slices size-1 axes as they are); padded keys are
  also excluded by their `_NEG` bias, padded queries dropped."""
  widths = (0, pad_t if mask.shape[2] > 1 else 0), (0, pad_s if mask.shape[3] > 1 else 0)
  return jnp.pad(mask, ((0, 0), (0, 0)) + widths)


def _block_logits(qb, kb, biasb, maskb, causal, scale, iq, ik, bq, bk):
  s = jnp.einsum("bhqd,bhkd->bhqk", qb, kb, preferred_element_type=jnp.float32) * scale
  s = s + biasb[:, :, None, :]
  return apply_masks(s, maskb, causal, iq * bq, ik * bk)


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
    mask = _pad_mask(mask, tp - t, npad - n)
  out = _flash(qt, kt, vt, bias_t, mask, causal, scale, bq, bk)
  return jnp.transpose(out[:, :, :t], (0, 2, 1, 3))


def attended_rows(mask, causal, t, s):
  """[b|1, h|1, t] bool: query rows left with at least one key by `mask` (rank 4, broadcastable to
  [b, h, t, s]) and, when causal, by `j ≤ i`. O(s) work for a key mask of shape [·, ·, 1, s]."""
  if mask.shape[2] == 1:
    seen = jnp.cumsum(jnp.broadcast_to(mask[:, :, 0, :], mask.shape[:2] + (s,)), -1) > 0   # a key ≤ j attended
    rows = jnp.minimum(jnp.arange(t), s - 1) if causal else jnp.full((t,), s - 1)
    return seen[..., rows]
  m = jnp.broadcast_to(mask, mask.shape[:2] + (t, s))
  if causal:
    m = m & (jnp.arange(s)[None, :] <= jnp.arange(t)[:, None])
  return jnp.any(m, -1)


def _check_kernel_mask(mask):
  if mask is not None and jnp.ndim(mask) != 4:
    raise ValueError(f"mask must be 4-D, broadcastable to [b, h, t, s]; got shape {jnp.shape(mask)}")


def _zero_empty_rows(out, mask, causal, s):
  """`out` [b, t, h, e] with the query rows that have none of the s keys (the mask and the causal order
  together leave none) set to 0: the kernels' common convention. A causal order alone leaves key 0."""
  if mask is None:
    return out
  valid = attended_rows(mask, causal, out.shape[1], s)
  return jnp.where(jnp.transpose(valid, (0, 2, 1))[..., None], out, jnp.zeros((), out.dtype))


def attention(q, k, v, *, bias=None, mask=None, causal=False, scale=None, implementation=None, block_size=512):
  """Scaled-dot-product attention `softmax(scale·q·kᵀ + bias_j, masked)·v` through a chosen kernel.

  q: [b, t, h, d]; k: [b, s, h, d]; v: [b, s, h, e]; bias: [b, s, h] per-key logit bias or None;
  mask: bool, broadcastable to [b, h, t, s] (True = attend). Returns [b, t, h, e] in v's dtype,
  with logits and softmax accumulated in float32. A query row whose keys are all masked (by the
  mask and the causal order together) returns 0 on every kernel. This is the one kernel every operator (and the matrix-free geometry) runs on.
  """
  chex.assert_rank([q, k, v], 4)
  chex.assert_equal_shape([q, k], dims=(0, 2, 3))
  chex.assert_equal_shape_prefix([k, v], 3)
  if bias is not None:
    chex.assert_shape(bias, (k.shape[0], k.shape[1], k.shape[2]))
  _check_kernel_mask(mask)
  implementation = implementation or default_implementation(k.shape[1])
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if implementation == "einsum":
    out = _einsum_sdpa(q, k, v, bias, mask, causal, scale)
  elif implementation in ("xla", "cudnn"):
    out = _sdpa_jax(q, k, v, bias, mask, causal, scale, implementation)
  elif implementation == "blockwise":
    if int(block_size) < 1:
      raise ValueError(f"block_size must be a positive integer; got {block_size}")
    out = _blockwise_sdpa(q, k, v, bias, mask, causal, scale, int(block_size))
  else:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS} or None; got {implementation!r}")
  return _zero_empty_rows(out, mask, causal, k.shape[1])


# ---- phase attention (the magnetic operator, `attngeo.operators.magnetic_transport`).
#
#   y_i = Σ_j P_ij e^{iθ_ij} v_j,   P_ij = softmax_j(scale·q_i·k_j + bias_j, masked),   θ_ij = c_h·qt_i·kt_j,
#
# with the value channel pairs (2c, 2c+1) of v read as complex numbers v_re + i·v_im. Inside the kernels
# the pairs are split into the layout [re (e/2), im (e/2)]: `va = [v_re, v_im]`, `vb = [−v_im, v_re]`, so
# `y = (P cos θ)·va + (P sin θ)·vb` in that layout (two real matmuls, float32 accumulation).
# Backward, with G = dy = G_re + i·G_im, `ga = [G_re, G_im]`, `gb = [G_im, −G_re]`:
#   A_ij = conj(G_i)·v_j:  Re A = ga·va,  Im A = −ga·vb;
#   dP_ij = Re(e^{iθ_ij} A_ij) = cos·Re A − sin·Im A,   dL_ij = P_ij (dP_ij − δ_i),   δ_i = Re⟨G_i, y_i⟩;
#   dθ_ij = Re(i P_ij e^{iθ_ij} A_ij) = −P_ij (sin·Re A + cos·Im A);
#   dv_j = Σ_i P_ij e^{−iθ_ij} G_i = (P cos θ)ᵀ·ga + (P sin θ)ᵀ·gb   (layout [re, im]).
# dL gives dq, dk, dbias exactly as in `_flash_bwd`; dθ gives dqt = c·dθ·kt, dkt = c·dθᵀ·qt, dc = Σ dθ ⊙ (qt·kt) = Σ_i qt_i·(dθ·kt)_i.

_TWO_PI_HI = 6.28125                     # 2π = HI + LO, HI exact in 9 bits: n·HI is exact (Cody–Waite)
_TWO_PI_LO = 2 * math.pi - _TWO_PI_HI


def sincos(x):
  """(sin x, cos x) of a float32 array in one fused elementwise pass.

  XLA's CPU sin and cos cost about four exponentials each; this costs about one. x is reduced to
  r ∈ [−π, π] (Cody–Waite, two-word 2π), sin and cos of h = r/2 are Taylor polynomials of degree
  11 and 12 (truncation < 6e-8 on |h| ≤ π/2), and `sin r = 2 sin h cos h`, `cos r = cos²h − sin²h`.
  Absolute error ≤ 5e-7 for |x| ≤ 1e3 (a few float32 ulps; float64 inputs get the same float32-grade
  accuracy). Beyond ~1e5 the reduction loses r (float32 cannot hold x to 2π there anyway); h is clamped to
  [−2, 2] (|h| ≤ π/2 + |x|·u before it), so |sin|, |cos| ≤ 1 + 1e-6 for every finite x (before, |x| ≳ 1e10
  overflowed the polynomials to NaN).
  """
  n = jnp.round(x * (1 / (2 * math.pi)))
  h = jnp.clip(0.5 * ((x - n * _TWO_PI_HI) - n * _TWO_PI_LO), -2.0, 2.0)
  h2 = h * h
  s = h * (1 + h2 * (-1 / 6 + h2 * (1 / 120 + h2 * (-1 / 5040 + h2 * (1 / 362880 + h2 * (-1 / 39916800))))))
  c = 1 + h2 * (-1 / 2 + h2 * (1 / 24 + h2 * (-1 / 720 + h2 * (1 / 40320 + h2 * (-1 / 3628800 + h2 / 479001600)))))
  return 2 * s * c, c * c - s * s


def _split_pairs(v):
  """[..., e] with complex pairs (2c, 2c+1) -> (va, vb) = ([re, im], [−im, re]) in float layout [..., e]."""
  re, im = v[..., 0::2], v[..., 1::2]
  return jnp.concatenate([re, im], -1), jnp.concatenate([-im, re], -1)


def _join_pairs(y):
  """Layout [..., re (e/2), im (e/2)] -> interleaved complex pairs [..., e]."""
  half = y.shape[-1] // 2
  return jnp.stack([y[..., :half], y[..., half:]], -1).reshape(y.shape)


def _dense_phase_fwd(q, k, v, bias, qt, kt, c, mask, causal, scale):
  """Dense forward: (out [b, t, h, e], residuals). Materialises the [b, h, t, s] logits and phases;
  the backward reads only P, C = P cos θ and S = P sin θ."""
  s = jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    s = s + jnp.transpose(bias, (0, 2, 1)).astype(jnp.float32)[:, :, None, :]
  s = apply_masks(s, mask, causal)
  p = jax.nn.softmax(s, axis=-1)
  raw = jnp.einsum("bthf,bshf->bhts", qt, kt, preferred_element_type=jnp.float32)
  sin, cos = sincos(raw * c[None, :, None, None])
  pc, ps = p * cos, p * sin
  va, vb = _split_pairs(v)
  pv = lambda w, x: jnp.einsum("bhts,bshe->bthe", w.astype(v.dtype), x, preferred_element_type=jnp.float32)
  out = _join_pairs(pv(pc, va) + pv(ps, vb)).astype(v.dtype)
  return out, (q, k, v, bias, qt, kt, c, p, pc, ps, out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9))
def _dense_phase(q, k, v, bias, qt, kt, c, mask, causal, scale):
  return _dense_phase_fwd(q, k, v, bias, qt, kt, c, mask, causal, scale)[0]


def _dense_phase_bwd(causal, scale, res, dout):
  """The derivation above on whole matrices from the saved P, C = P cos θ, S = P sin θ (no exponential
  or sincos recomputed): dL = C·Re A − S·Im A − P δ, dθ = −(S·Re A + C·Im A). Accuracy on near-one-hot
  rows, where dL = P (dP − δ) cancels: P is saved rather than read back as |C + iS| (the float32
  sincos pair has norm 1 ± 4e-7; dq's error at 8× the logit spread: autodiff 2.2e-4, saved P 3.4e-4,
  |C + iS| 5.2e-4), and the forward normalises by the max-subtracted softmax — `exp(s − logsumexp s)`
  rounds a large log-normaliser and cost dq 56× at 4× the spread (3.6e-4 against 6.4e-6)."""
  q, k, v, bias, qt, kt, c, p, pc, ps, out = res
  f32 = lambda x: x.astype(jnp.float32)
  ga, rot = _split_pairs(f32(dout))
  gb = -rot                                                                     # [G_im, −G_re]
  va, vb = _split_pairs(f32(v))
  re_a = jnp.einsum("bthe,bshe->bhts", ga, va)
  im_a = -jnp.einsum("bthe,bshe->bhts", ga, vb)
  delta = jnp.transpose(jnp.sum(f32(dout) * f32(out), -1), (0, 2, 1))[..., None]          # [b, h, t, 1]
  dl = pc * re_a - ps * im_a - p * delta
  dtheta = -(ps * re_a + pc * im_a)
  dv = jnp.einsum("bhts,bthe->bshe", pc, ga) + jnp.einsum("bhts,bthe->bshe", ps, gb)
  dq = jnp.einsum("bhts,bshd->bthd", dl, f32(k)) * scale
  dk = jnp.einsum("bhts,bthd->bshd", dl, f32(q)) * scale
  dqt_raw = jnp.einsum("bhts,bshf->bthf", dtheta, f32(kt))                      # Σ_j dθ_ij kt_j
  dkt_raw = jnp.einsum("bhts,bthf->bshf", dtheta, f32(qt))
  dbias = None if bias is None else jnp.transpose(dl.sum(2), (0, 2, 1)).astype(bias.dtype)
  ch = c[None, None, :, None]
  return (dq.astype(q.dtype), dk.astype(k.dtype), _join_pairs(dv).astype(v.dtype), dbias,
          (dqt_raw * ch).astype(qt.dtype), (dkt_raw * ch).astype(kt.dtype),
          _coupling_grad(qt, dqt_raw, head_axis=2).astype(c.dtype), None)


def _coupling_grad(qt, dqt_raw, head_axis):
  """dc_h = Σ_ij dθ_ij (qt_i·kt_j) = Σ_i qt_i·(Σ_j dθ_ij kt_j): O(n·F) from the query-side product
  `dqt_raw = dθ·kt` (any layout; `head_axis` is kept), where the direct sum reads every n × n block."""
  return jnp.sum(qt.astype(jnp.float32) * dqt_raw, tuple(a for a in range(qt.ndim) if a != head_axis))


_dense_phase.defvjp(_dense_phase_fwd, _dense_phase_bwd)
_einsum_phase = jax.jit(_dense_phase, static_argnums=(8, 9))


def _phase_block(qb, kb, biasb, qtb, ktb, c, maskb, causal, scale, iq, ik, bq, bk):
  """Logits s and phases θ = c·qt·kt of one [b, h, bq, bk] block."""
  s = _block_logits(qb, kb, biasb, maskb, causal, scale, iq, ik, bq, bk)
  raw = jnp.einsum("bhqf,bhkf->bhqk", qtb, ktb, preferred_element_type=jnp.float32)
  return s, raw * c[None, :, None, None]


def _phase_fwd_impl(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk):
  """q [b,h,T,D], k [b,h,S,D], v [b,h,S,e] (layout [re, im]), bias [b,h,S], qt/kt [b,h,·,F], c [h]
  -> out [b,h,T,e] (layout [re, im]), lse [b,h,T]."""
  vr, vi = jnp.split(v, 2, -1)
  va, vb = v, jnp.concatenate([-vi, vr], -1)
  kblocks, vablocks, vbblocks = _blocks(k, bk), _blocks(va, bk), _blocks(vb, bk)
  biasblocks, ktblocks = _blocks(bias, bk), _blocks(kt, bk)
  nk = kblocks.shape[0]

  def per_query_block(args):
    iq, qb, qtb = args
    b, h = qb.shape[:2]
    init = (jnp.zeros((b, h, bq, v.shape[-1]), jnp.float32),
            jnp.full((b, h, bq), _NEG, jnp.float32), jnp.zeros((b, h, bq), jnp.float32))

    def step(carry, ik):
      o, mx, l = carry
      s, theta = _phase_block(qb, kblocks[ik], biasblocks[ik], qtb, ktblocks[ik], c,
                                 _mask_block(mask, iq, ik, bq, bk), causal, scale, iq, ik, bq, bk)
      mx_new = jnp.maximum(mx, s.max(-1))
      p = jnp.exp(s - mx_new[..., None])
      corr = jnp.exp(mx - mx_new)
      pv = lambda w, x: jnp.einsum("bhqk,bhke->bhqe", w.astype(v.dtype), x, preferred_element_type=jnp.float32)
      sin, cos = sincos(theta)
      o = o * corr[..., None] + pv(p * cos, vablocks[ik]) + pv(p * sin, vbblocks[ik])
      return (o, mx_new, l * corr + p.sum(-1)), None

    (o, mx, l), _ = jax.lax.scan(step, init, jnp.arange(nk))
    return (o / l[..., None]).astype(v.dtype), mx + jnp.log(l)

  nq = q.shape[2] // bq
  out, lse = jax.lax.map(per_query_block, (jnp.arange(nq), _blocks(q, bq), _blocks(qt, bq)))
  return _unblocks(out), _unblocks(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11))
def _phase_flash(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk):
  return _phase_fwd_impl(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk)[0]


def _phase_flash_fwd(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk):
  out, lse = _phase_fwd_impl(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk)
  return out, (q, k, v, bias, qt, kt, c, mask, out, lse)


def _phase_flash_bwd(causal, scale, bq, bk, res, dout):
  """Recompute each block of P and θ from the saved log-normaliser (see the derivation above)."""
  q, k, v, bias, qt, kt, c, mask, out, lse = res
  f32 = lambda x: x.astype(jnp.float32)
  delta = jnp.sum(f32(dout) * f32(out), -1)                                          # [b,h,T]
  gr, gi = jnp.split(f32(dout), 2, -1)
  ga, gb = jnp.concatenate([gr, gi], -1), jnp.concatenate([gi, -gr], -1)
  vr, vi = jnp.split(f32(v), 2, -1)
  va, vb = jnp.concatenate([vr, vi], -1), jnp.concatenate([-vi, vr], -1)
  qbs, qtbs, lses, deltas = _blocks(q, bq), _blocks(qt, bq), _blocks(lse, bq), _blocks(delta, bq)
  gabs, gbbs = _blocks(ga, bq), _blocks(gb, bq)
  nq = qbs.shape[0]

  def per_key_block(carry, args):
    dq_acc, dqt_acc = carry
    ik, kb, ktb, vab, vbb, biasb = args

    def step(carry, iq):
      dk, dkt, dv, dbias = carry
      qb, qtb, gab, gbb = qbs[iq], qtbs[iq], gabs[iq], gbbs[iq]
      s, theta = _phase_block(qb, kb, biasb, qtb, ktb, c, _mask_block(mask, iq, ik, bq, bk),
                                   causal, scale, iq, ik, bq, bk)
      p = jnp.exp(s - lses[iq][..., None])
      sin, cos = sincos(theta)
      pc, ps = p * cos, p * sin
      dv = dv + jnp.einsum("bhqk,bhqe->bhke", pc, gab) + jnp.einsum("bhqk,bhqe->bhke", ps, gbb)
      are = jnp.einsum("bhqe,bhke->bhqk", gab, vab)
      aim = -jnp.einsum("bhqe,bhke->bhqk", gab, vbb)
      ds = p * (cos * are - sin * aim - deltas[iq][..., None])
      dtheta = -(ps * are + pc * aim)
      dq_blk = jnp.einsum("bhqk,bhkd->bhqd", ds, f32(kb)) * scale
      dk = dk + jnp.einsum("bhqk,bhqd->bhkd", ds, f32(qb)) * scale
      dqt_blk = jnp.einsum("bhqk,bhkf->bhqf", dtheta, f32(ktb))                  # without c: dc needs it raw
      dkt = dkt + jnp.einsum("bhqk,bhqf->bhkf", dtheta, f32(qtb))
      return (dk, dkt, dv, dbias + ds.sum(2)), (dq_blk, dqt_blk)

    b, h = kb.shape[:2]
    init = (jnp.zeros(kb.shape, jnp.float32), jnp.zeros(ktb.shape, jnp.float32), jnp.zeros(vab.shape, jnp.float32),
            jnp.zeros((b, h, bk), jnp.float32))
    (dk, dkt, dv, dbias), (dq_blocks, dqt_blocks) = jax.lax.scan(step, init, jnp.arange(nq))
    return (dq_acc + _unblocks(dq_blocks), dqt_acc + _unblocks(dqt_blocks)), (dk, dkt, dv, dbias)

  (dq, dqt_raw), (dks, dkts_raw, dvs, dbiases) = jax.lax.scan(
      per_key_block, (jnp.zeros(q.shape, jnp.float32), jnp.zeros(qt.shape, jnp.float32)),
      (jnp.arange(k.shape[2] // bk), _blocks(k, bk), _blocks(kt, bk), _blocks(va, bk), _blocks(vb, bk),
       _blocks(bias, bk)))
  ch = c[None, :, None, None]
  return (dq.astype(q.dtype), _unblocks(dks).astype(k.dtype), _unblocks(dvs).astype(v.dtype),
          _unblocks(dbiases).astype(bias.dtype), (dqt_raw * ch).astype(qt.dtype),
          (_unblocks(dkts_raw) * ch).astype(kt.dtype), _coupling_grad(qt, dqt_raw, head_axis=1).astype(c.dtype), None)


_phase_flash.defvjp(_phase_flash_fwd, _phase_flash_bwd)


@functools.partial(jax.jit, static_argnums=(8, 9, 10))
def _blockwise_phase(q, k, v, bias, qt, kt, c, mask, causal, scale, block_size):
  """Flash-style phase attention in pure JAX; pads n to a multiple of the block size."""
  b, t, h, _ = q.shape
  n = k.shape[1]
  bq, bk = min(block_size, t), min(block_size, n)
  tp, npad = -(-t // bq) * bq, -(-n // bk) * bk
  tr = lambda x: jnp.transpose(x, (0, 2, 1, 3))
  qh, kh, qth, kth = tr(q), tr(k), tr(qt), tr(kt)
  vh = tr(jnp.concatenate([v[..., 0::2], v[..., 1::2]], -1))                    # layout [re, im]
  bias_t = jnp.zeros((b, h, n), jnp.float32) if bias is None else jnp.transpose(bias, (0, 2, 1)).astype(jnp.float32)
  padq = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, tp - t), (0, 0)))
  padk = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, npad - n), (0, 0)))
  if tp != t:
    qh, qth = padq(qh), padq(qth)
  if npad != n:
    kh, kth, vh = padk(kh), padk(kth), padk(vh)
    bias_t = jnp.pad(bias_t, ((0, 0), (0, 0), (0, npad - n)), constant_values=_NEG)
  if mask is not None:
    mask = _pad_mask(mask, tp - t, npad - n)
  out = _phase_flash(qh, kh, vh, bias_t, qth, kth, c, mask, causal, scale, bq, bk)
  return _join_pairs(jnp.transpose(out[:, :, :t], (0, 2, 1, 3)))


PHASE_IMPLEMENTATIONS = ("einsum", "blockwise")


def phase_attention(q, k, v, qt, kt, coupling, *, bias=None, mask=None, causal=False, scale=None,
                    implementation=None, block_size=512):
  """Attention with a U(1) phase on the values: `y_i = Σ_j P_ij e^{iθ_ij} v_j` (the magnetic operator's kernel).

  `P_ij = softmax_j(scale·q_i·k_j + bias_j, masked)` exactly as in `attention`; `θ_ij = c_h·qt_i·kt_j`
  with the per-head coupling `c`; value channel pairs `(v[..., 2c], v[..., 2c+1])` are the real and
  imaginary parts of complex values (the output uses the same pairing).

  q: [b, t, h, D]; k: [b, s, h, D]; v: [b, s, h, e], e even; qt: [b, t, h, F]; kt: [b, s, h, F];
  coupling: scalar or [h]; bias: [b, s, h] or None; mask: bool, broadcastable to [b, h, t, s].
  implementation: "einsum" (materialises [b, h, t, s]; custom VJP from the saved P, P cos θ and
  P sin θ, nothing recomputed) | "blockwise" (online softmax, recomputing custom VJP, O(n) memory) |
  None (einsum below 512 keys, else blockwise). Both give gradients for q, k, v, bias, qt, kt and
  the coupling, in reverse mode only (custom VJPs: `jax.jvp` through them raises).
  Returns [b, t, h, e] in v's dtype, float32 accumulation; a query row whose keys are all masked (by
  the mask and the causal order together) returns 0.
  """
  _check_kernel_mask(mask)
  implementation = implementation or dense_or_blockwise(k.shape[1])
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  c = jnp.broadcast_to(jnp.asarray(coupling, jnp.float32), (q.shape[2],))
  if implementation == "einsum":
    out = _einsum_phase(q, k, v, bias, qt, kt, c, mask, causal, scale)
  elif implementation == "blockwise":
    if int(block_size) < 1:
      raise ValueError(f"block_size must be a positive integer; got {block_size}")
    out = _blockwise_phase(q, k, v, bias, qt, kt, c, mask, causal, scale, int(block_size))
  else:
    raise ValueError(f"implementation must be one of {PHASE_IMPLEMENTATIONS} or None for phase attention; "
                     f"got {implementation!r}")
  return _zero_empty_rows(out, mask, causal, k.shape[1])


@functools.partial(jax.jit, static_argnames=("causal", "scale", "block_size"))
def log_normaliser(q, k, *, bias=None, mask=None, causal=False, scale=None, block_size=512):
  """`lse_i = log Σ_j exp(scale·q_i·k_j + bias_j)` over the unmasked keys: [b, t, h] float32.

  The softmax's log-normaliser, from the blockwise forward pass (online max and sum over key
  blocks, O(n) memory; `_NEG`-scale values for fully masked rows). Shapes as in `attention`.
  """
  b, t, h, _ = q.shape
  n = k.shape[1]
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  bq, bk = min(int(block_size), t), min(int(block_size), n)
  tp, npad = -(-t // bq) * bq, -(-n // bk) * bk
  tr = lambda x: jnp.transpose(x, (0, 2, 1, 3))
  qh = jnp.pad(tr(q), ((0, 0), (0, 0), (0, tp - t), (0, 0)))
  kh = jnp.pad(tr(k), ((0, 0), (0, 0), (0, npad - n), (0, 0)))
  bias_t = jnp.zeros((b, h, n), jnp.float32) if bias is None else jnp.transpose(bias, (0, 2, 1)).astype(jnp.float32)
  bias_t = jnp.pad(bias_t, ((0, 0), (0, 0), (0, npad - n)), constant_values=_NEG)
  if mask is not None:
    mask = _pad_mask(mask, tp - t, npad - n)
  _, lse = _flash_fwd_impl(qh, kh, jnp.zeros((b, h, npad, 1), jnp.float32), bias_t, mask, causal, scale, bq, bk)
  return jnp.transpose(lse[:, :, :t], (0, 2, 1))
