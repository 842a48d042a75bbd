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

Edge case: a query row whose keys are all masked has no distribution; every kernel returns 0 for
it (not the mean of v).
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
  """Fastest kernel per backend (see `attngeo bench`): cuDNN flash on GPU, XLA's fused SDPA on TPU;
  on CPU the einsum path below 512 keys and the blockwise path from 512 on (1.6× faster than
  einsum at 1024 keys, 3× at 4096, and O(n) memory)."""
  backend = jax.default_backend()
  if backend in ("gpu", "cuda"):
    return "cudnn"
  if backend == "tpu":
    return "xla"
  return "blockwise" if seq_len is not None and seq_len >= 512 else "einsum"


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
    mb = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], t, n))
    mask = jnp.pad(mb, ((0, 0), (0, 0), (0, tp - t), (0, npad - n)))
  out = _flash(qt, kt, vt, bias_t, mask, causal, scale, bq, bk)
  return jnp.transpose(out[:, :, :t], (0, 2, 1, 3))


def attention(q, k, v, *, bias=None, mask=None, causal=False, scale=None, implementation=None, block_size=512):
  """Scaled-dot-product attention `softmax(scale·q·kᵀ + bias_j, masked)·v` through a chosen kernel.

  q: [b, t, h, d]; k: [b, s, h, d]; v: [b, s, h, e]; bias: [b, s, h] per-key logit bias or None;
  mask: bool, broadcastable to [b, h, t, s] (True = attend). Returns [b, t, h, e] in v's dtype,
  with logits and softmax accumulated in float32. A query row whose keys are all masked returns 0
  on every kernel. This is the one kernel every operator (and the matrix-free geometry) runs on.
  """
  chex.assert_rank([q, k, v], 4)
  chex.assert_equal_shape([q, k], dims=(0, 2, 3))
  chex.assert_equal_shape_prefix([k, v], 3)
  if bias is not None:
    chex.assert_shape(bias, (k.shape[0], k.shape[1], k.shape[2]))
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
  if mask is None:
    return out
  b, t, h, _ = q.shape
  valid = jnp.any(jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], t, k.shape[1])), -1)   # [b|1, h|1, t]
  return jnp.where(jnp.transpose(valid, (0, 2, 1))[..., None], out, jnp.zeros((), out.dtype))
