"""Softmax attention `softmax(scale·q·kᵀ + bias_j, masked)·v` through interchangeable implementations.

This is the kernel every member of the transport family (`attngeo.operators`) and every matrix-free
geometry operator (`attngeo.geometry`) runs on: `attention` below. Layout of
`jax.nn.dot_product_attention`: q `[b, t, h, d]`, k `[b, s, h, d]`, v `[b, s, h, e]`; an optional
per-key logit bias `[b, s, h]`; masks broadcastable to `[b, h, t, s]` (True = attend). Logits and the
softmax accumulate in float32 whatever the input dtype. The kernel is chosen by
`attngeo.kernels.dispatch.choose` (kind "softmax").

Implementations:

* `"einsum"` — XLA einsum + softmax; materialises the `[b, h, t, s]` logits. Fastest on CPU below
  512 keys.
* `"xla"`, `"cudnn"` — `jax.nn.dot_product_attention`. cuDNN's fused kernel computes in bf16/fp16
  and takes no per-key bias cheaply: the bias is folded into one more head column
  (`[q, 1]·[k, bias/scale]`) and widths are padded to a multiple of 8.
* `"blockwise"` — flash-style pure JAX: an online softmax over key blocks (running max `m`,
  normaliser `l`, output `o ← o·e^{m−m'} + e^{s−m'}v`: `_blocks.online_softmax`) and a `custom_vjp`
  backward that recomputes each block of P from the saved log-normaliser `lse = m + log l`, using
  `dS = P ⊙ (dP − rowsum(dO ⊙ O))`; the key side's sums `dv = Pᵀ·dO`, `dk = dSᵀ·q` accumulate feature-major
  (`_blocks.column_sum`). Never more than one block of P exists: O(n) memory. Under the causal
  order both passes skip the blocks wholly above the diagonal (`_blocks.live_block`: 6 of 16 at 2048 keys).

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

from attngeo.kernels._blocks import (apply_masks, block_logits, check_block_size, check_mask, column_sum, join_blocks,
                                     live_block, logits_product, online_softmax, scale_queries, split_blocks, tile,
                                     untile, when_live, zero_empty_rows)
from attngeo.kernels.dispatch import TILE, choose, chosen_block
from attngeo.kernels.pallas import pallas_sdpa


def _einsum_sdpa(q, k, v, bias, mask, causal, scale):
  q, rest = scale_queries(q, scale)
  s = logits_product(q, k)
  s = s if rest is None else s * rest
  if bias is not None:
    s = s + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
  s = apply_masks(s, mask, causal)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhts,bshe->bthe", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)


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
  else:
    # the scale on q where that is exact (`scale_queries`): jitted on XLA:CPU, `logits·scale` is recomputed in the
    # softmax's max and its exp(· − max), one of them contracted into an FMA, so at the row's top logit the
    # difference is the product's rounding, not 0 — past e^88 once the logits reach ~2^31: NaN rows (ATTN from
    # |q| ≈ 1e14 at d = 8, DMTN's 2·d heads from 1e6; jax-ml/jax#37234). A logit without the multiply is immune;
    # bf16 at a scale that is not a power of two keeps it (rounding q·scale in bf16 is not free), and so does
    # the einsum kernel there: those rows still fail past 2^31, as blockwise's do not.
    q, rest = scale_queries(q, scale)
    scale = 1.0 if rest is None else rest
  width = q.shape[-1]
  vv = _pad_last(v, width) if dv < width else v
  if dv > width:
    q, k = _pad_last(q, dv), _pad_last(k, dv)
  b4 = None if bias is None else jnp.transpose(bias, (0, 2, 1))[:, :, None, :].astype(jnp.float32)
  out = jax.nn.dot_product_attention(q, k, vv, bias=b4, mask=mask, scale=scale, is_causal=causal,
                                     implementation=implementation)
  return out[..., :dv].astype(out_dtype)


# ---- blockwise (flash-style) attention with a recomputing backward: O(n) memory.

def _flash_fwd_impl(q, k, v, bias, mask, causal, scale, bq, bk):
  """q [b,h,T,d], k [b,h,S,d], v [b,h,S,e], bias [b,h,S] f32 -> out [b,h,T,e], lse [b,h,T]."""
  logits = lambda iq, ik, qb, kb: (block_logits(qb[0], kb[0], kb[2], mask, causal, scale, iq, ik, bq, bk), None)
  accumulate = lambda o, p, _, kb: o + jnp.einsum("bhqk,bhke->bhqe", p.astype(v.dtype), kb[1],
                                                  preferred_element_type=jnp.float32)
  out, lse = online_softmax((split_blocks(q, bq),), (split_blocks(k, bk), split_blocks(v, bk), split_blocks(bias, bk)),
                            logits, accumulate, v.shape[-1], v.dtype, causal)
  return join_blocks(out), join_blocks(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _flash(q, k, v, bias, mask, causal, scale, bq, bk, bias_grad):
  return _flash_fwd_impl(q, k, v, bias, mask, causal, scale, bq, bk)[0]


def _flash_fwd(q, k, v, bias, mask, causal, scale, bq, bk, bias_grad):
  out, lse = _flash_fwd_impl(q, k, v, bias, mask, causal, scale, bq, bk)
  return out, (q, k, v, bias, mask, out, lse)


def _flash_bwd(causal, scale, bq, bk, bias_grad, res, dout):
  """Recompute each block of P from the saved log-normaliser; never holds more than a block.

  The key side's sums `dk_j = s·Σ_i dS_ij q_i` and, where the bias is an input (`bias_grad`),
  `dbias_j = Σ_i dS_ij` are one product: q's transposed blocks, scaled by s, with a row of ones below them,
  `[s·qᵀ; 1ᵀ]·dS` [b, h, d + 1, bk]. No pass of its own reads dS for the bias: a separate `Σ_i dS_ij`
  read each [b, h, bq, bk] block once more, and made DMAP (whose key bias is learned through its heads)
  1.020× ATTN's time at 1024 keys against 1.003× this way (paired median of 40 interleaved calls; the
  65-row product costs what the 64-row one does).
  """
  q, k, v, bias, mask, out, lse = res
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1)          # [b,h,T]
  qbs, dobs, lses, deltas = (split_blocks(x, bq) for x in (q, dout, lse, delta))
  # the key side's sums run over a block's rows: accumulated feature-major ([b, h, d, bk]), their products
  # read the block untransposed ("bhfq,bhqk->bhfk", `_blocks.column_sum`)
  qbs_t, dobs_t = (jnp.swapaxes(x, -1, -2).astype(jnp.float32) for x in (qbs, dobs))
  qbs_t = qbs_t * scale
  if bias_grad:                                                    # [s·qᵀ; 1ᵀ]: dk and dbias in one product
    qbs_t = jnp.concatenate([qbs_t, jnp.ones(qbs_t.shape[:3] + (1, bq), jnp.float32)], 3)
  nq, d = qbs.shape[0], q.shape[-1]

  def per_key_block(dq_acc, args):
    ik, kb, vb, biasb = args

    def step(carry, iq):
      def update(carry):
        dk_t, dv_t = carry
        qb, dob = qbs[iq], dobs[iq]
        s = block_logits(qb, kb, biasb, mask, causal, scale, iq, ik, bq, bk)
        p = jnp.exp(s - lses[iq][..., None])
        dv_t = dv_t + column_sum(dobs_t[iq], p)
        dp = jnp.einsum("bhqe,bhke->bhqk", dob.astype(jnp.float32), vb.astype(jnp.float32))
        ds = p * (dp - deltas[iq][..., None])
        dq_blk = jnp.einsum("bhqk,bhkd->bhqd", ds, kb.astype(jnp.float32)) * scale
        return (dk_t + column_sum(qbs_t[iq], ds), dv_t), dq_blk
      skipped = lambda carry: (carry, jnp.zeros(qbs.shape[1:4] + (kb.shape[-1],), jnp.float32))
      return when_live(live_block(causal, iq, ik, bq, bk), update, skipped, carry)

    b, h = kb.shape[:2]
    init = (jnp.zeros((b, h, qbs_t.shape[3], bk), jnp.float32), jnp.zeros((b, h, vb.shape[-1], bk), jnp.float32))
    (dk_t, dv_t), dq_blocks = jax.lax.scan(step, init, jnp.arange(nq))
    dbias = dk_t[:, :, d] if bias_grad else jnp.zeros((b, h, bk), jnp.float32)
    return dq_acc + join_blocks(dq_blocks), (jnp.swapaxes(dk_t[:, :, :d], -1, -2), jnp.swapaxes(dv_t, -1, -2), dbias)

  dq, (dks, dvs, dbiases) = jax.lax.scan(
      per_key_block, jnp.zeros(q.shape, jnp.float32),
      (jnp.arange(k.shape[2] // bk), split_blocks(k, bk), split_blocks(v, bk), split_blocks(bias, bk)))
  return (dq.astype(q.dtype), join_blocks(dks).astype(k.dtype), join_blocks(dvs).astype(v.dtype),
          join_blocks(dbiases).astype(bias.dtype), None)


_flash.defvjp(_flash_fwd, _flash_bwd)


def _blockwise_sdpa(q, k, v, bias, mask, causal, scale, block_size):
  """Flash-style attention in pure JAX on lengths padded to whole blocks (`_blocks.tile`)."""
  tl = tile((q,), (k, v), bias, mask, block_size)
  (qt,), (kt, vt) = tl.queries, tl.keys
  return untile(_flash(qt, kt, vt, tl.bias, tl.mask, causal, scale, tl.bq, tl.bk, bias is not None), q.shape[1])


def attention(q, k, v, *, bias=None, mask=None, causal=False, scale=None, implementation=None, block_size=None):
  """Scaled-dot-product attention `softmax(scale·q·kᵀ + bias_j, masked)·v` through a chosen kernel.

  q: [b, t, h, d]; k: [b, s, h, d]; v: [b, s, h, e]; bias: [b, s, h] per-key logit bias or None;
  mask: bool, broadcastable to [b, h, t, s] (True = attend). implementation: "einsum" | "xla" |
  "cudnn" | "blockwise" | "pallas" (`attngeo.kernels.pallas`) | None (`dispatch.choose`: by backend and
  length). Returns [b, t, h, e] in v's dtype, with logits and softmax accumulated in float32. A query row
  whose keys are all masked (by the mask and the causal order together) returns 0 on every kernel. This is
  the one kernel every operator (and the matrix-free geometry) runs on. block_size: the blockwise and Pallas
  kernels' block bound, checked whatever the kernel; None: `dispatch.block_size_for(b·h)` on the blockwise kernel
  (512 from 17 heads a step, larger below), `TILE` (512) on Pallas. Under `jax.vmap` the rule sees one mapped
  call's b·h, not the whole batch's: name a block there.
  """
  chex.assert_rank([q, k, v], 4)
  chex.assert_equal_shape([q, k], dims=(0, 2, 3))
  chex.assert_equal_shape_prefix([k, v], 3)
  if bias is not None:
    chex.assert_shape(bias, (k.shape[0], k.shape[1], k.shape[2]))
  check_mask(mask)
  if block_size is not None:
    check_block_size(block_size)
  implementation = choose("softmax", implementation, k.shape[1])
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if implementation == "einsum":
    out = _einsum_sdpa(q, k, v, bias, mask, causal, scale)
  elif implementation in ("xla", "cudnn"):
    out = _sdpa_jax(q, k, v, bias, mask, causal, scale, implementation)
  elif implementation == "pallas":
    out = pallas_sdpa(q, k, v, bias, mask, causal, scale, check_block_size(TILE if block_size is None else block_size))
  else:
    out = _blockwise_sdpa(q, k, v, bias, mask, causal, scale, chosen_block(block_size, q.shape[0] * q.shape[2]))
  return zero_empty_rows(out, mask, causal, k.shape[1])


@functools.partial(jax.jit, static_argnames=("causal", "scale", "block_size"))
def log_normaliser(q, k, *, bias=None, mask=None, causal=False, scale=None, block_size=None):
  """`lse_i = log Σ_j exp(scale·q_i·k_j + bias_j)` over the unmasked keys: [b, t, h] float32.

  The softmax's log-normaliser, from the blockwise forward pass (online max and sum over key
  blocks, O(n) memory; `NEG`-scale values for fully masked rows). Shapes as in `attention`; block_size
  None: `dispatch.block_size_for(b·h)`.
  """
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  tl = tile((q,), (k,), bias, mask, chosen_block(block_size, q.shape[0] * q.shape[2]))
  (qh,), (kh,) = tl.queries, tl.keys
  b, h, npad = kh.shape[:3]
  _, lse = _flash_fwd_impl(qh, kh, jnp.zeros((b, h, npad, 1), jnp.float32), tl.bias, tl.mask, causal, scale,
                           tl.bq, tl.bk)
  return jnp.transpose(lse[:, :, :q.shape[1]], (0, 2, 1))
