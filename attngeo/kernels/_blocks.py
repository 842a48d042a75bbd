"""What every kernel shares: the mask conventions, the einsum kernels' q·kᵀ (`logits_product`) and scaled queries
(`scale_queries`), and the blockwise kernels' tiling and online softmax.

Masks are boolean, broadcastable to `[b, h, t, s]` (True = attend); the causal order is top-left
aligned (key j ≤ query i). Masked logits are set to `NEG`, a finite "minus infinity", so a fully
masked row stays NaN-free; such a row has no distribution and every kernel returns 0 for it
(`zero_empty_rows`), not the mean of v.

The blockwise kernels work head-major, `[b, h, n, ·]`, on lengths padded to whole blocks (`tile`):
padded queries are dropped at the end, padded keys get the key bias `NEG`. Their forward is one
online softmax over key blocks (`online_softmax`): per query row a running max `m`, normaliser `l`
and output `o ← o·e^{m−m'} + Σ_j e^{s_j−m'}·(values)_j`, and the saved `lse = m + log l` from which
the backward recomputes each block of P. Never more than one block of P exists: O(n) memory.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

NEG = -1e30  # finite "minus infinity": fully masked rows stay NaN-free.


def apply_masks(s, mask, causal, q_offset=0, k_offset=0):
  """Logits s [..., t, n] with the masked entries (mask False, or key > query when causal) set to `NEG`."""
  if causal:
    t, n = s.shape[-2], s.shape[-1]
    qi = q_offset + jnp.arange(t)[:, None]
    kj = k_offset + jnp.arange(n)[None, :]
    s = jnp.where(kj <= qi, s, NEG)
  if mask is not None:
    s = jnp.where(mask, s, NEG)
  return s


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


def check_mask(mask):
  """A kernel's mask must be 4-D (broadcastable to [b, h, t, s]); one line otherwise."""
  if mask is not None and jnp.ndim(mask) != 4:
    raise ValueError(f"mask must be 4-D, broadcastable to [b, h, t, s]; got shape {jnp.shape(mask)}")


def check_block_size(block_size) -> int:
  """`block_size` as an int, or a one-line ValueError unless it is a whole number ≥ 1 (4 and 4.0 are; 16.5
  and True are not)."""
  number = isinstance(block_size, (int, float, np.integer, np.floating)) and not isinstance(block_size, (bool, np.bool_))
  if not (number and np.isfinite(block_size) and float(block_size).is_integer() and block_size >= 1):
    raise ValueError(f"block_size must be a positive integer; got {block_size!r}")
  return int(block_size)


def zero_empty_rows(out, mask, causal, s):
  """`out` [b, t, h, e] with the query rows that have none of the s keys (the mask and the causal order
  together leave none) set to 0: the kernels' common convention. A causal order alone leaves key 0."""
  if mask is None:
    return out
  valid = attended_rows(mask, causal, out.shape[1], s)
  return jnp.where(jnp.transpose(valid, (0, 2, 1))[..., None], out, jnp.zeros((), out.dtype))


# ---- the einsum kernels' logits

# Query × key entries per head up to which `logits_product` writes its cotangent's transpose on CPU: 384² (a
# 576 KiB float32 head). `jax.grad` of Σ w ⊙ attention on the einsum kernel, batch 8, 8 heads of 64, ATTN / DMTN's
# 2·d-wide heads, plain → transposed (one process each, interleaved): 128 keys 5.63 → 4.58 / 7.92 → 7.25 ms; 256
# keys 17.8–18.9 → 16.4–16.7 / 24.9–25.6 → 21.4–21.9 (three runs); 320 keys 32.8 → 27.9 / 42.0 → 41.5; 384 keys
# 48.9 → 45.0 / 60.0 → 59.5; 448 keys 64.0 → 64.8 and 63.2 → 59.6 / 82.5 → 87.1 and 81.8 → 82.8 (two runs); 1024
# keys (batch 4) 171 → 181 / 223 → 231: the pass over a larger head costs what the faster product saves.
TRANSPOSED_COTANGENT_UP_TO = 384 * 384


@jax.custom_jvp
def logits_product(q, k):
  """q·kᵀ: [b, h, t, s] float32 from q [b, t, h, d], k [b, s, h, d] — `einsum("bthd,bshd->bhts")`, whose reverse
  mode on CPU reads the cotangent's transpose from memory.

  Tangent dL = dq·kᵀ + (dk·qᵀ)ᵀ; transposed, k̄ = (L̄ᵀ)·q with L̄ᵀ written once (an `optimization_barrier` keeps
  XLA from folding the transpose into the product). Differentiated as written, k̄ = L̄ᵀ·q is a product contracting
  L̄'s row axis, which XLA:CPU runs on Eigen, not YNNPACK (4.1–5.3 ms of a 20 ms ATTN or DMTN program at 256 keys).
  Only up to `TRANSPOSED_COTANGENT_UP_TO` entries per head (measured beside it), and only on CPU: cuBLAS and the
  TPU take a transposed operand for free. Forward and reverse mode both work (a custom JVP, not a custom VJP).
  """
  return jnp.einsum("bthd,bshd->bhts", q, k, preferred_element_type=jnp.float32)


@logits_product.defjvp
def _logits_product_jvp(primals, tangents):
  q, k = primals
  dq, dk = tangents
  along_k = jnp.einsum("bthd,bshd->bhts", dq, k, preferred_element_type=jnp.float32)
  if jax.default_backend() == "cpu" and q.shape[1] * k.shape[1] <= TRANSPOSED_COTANGENT_UP_TO:
    along_q = jnp.einsum("bshd,bthd->bhst", dk, q, preferred_element_type=jnp.float32)
    along_q = jnp.swapaxes(jax.lax.optimization_barrier(along_q), -1, -2)
  else:
    along_q = jnp.einsum("bthd,bshd->bhts", q, dk, preferred_element_type=jnp.float32)
  return logits_product(q, k), along_k + along_q


def scale_queries(q, scale):
  """(q·scale, None) where rounding q·scale in q's dtype costs nothing — float32 and wider, or bfloat16 (float32's
  exponent range) at a power-of-two scale such as 1/√64; not float16, whose range a scaled q can leave — else
  (q, scale), the scale still to apply to the logits (a traced scale too). The logits' scale then sits on the
  n × d queries, not on the n × n logits, whose VJP is one more n × n pass (ds·scale, read by both of the
  backward's products; XLA does not fold it into them). `jax.grad` of Σ transport on the einsum kernel, 256 keys,
  batch 8, 8 heads of 64, fastest of 40 interleaved: ATTN 21.1 → 20.4 ms, DMAP 23.9 → 22.5, DMTN 27.8 → 26.2,
  gradients unchanged (bitwise, at a scale of 1/8)."""
  if not isinstance(scale, (int, float)) or isinstance(scale, bool):
    return q, scale
  if jnp.finfo(q.dtype).bits >= 32 or (q.dtype == jnp.bfloat16 and math.frexp(scale)[0] == 0.5):
    return q * jnp.asarray(scale, q.dtype), None
  return q, scale


# ---- the blockwise kernels' layout

def split_blocks(x, size):
  """[b, h, n, ...] -> [n/size, b, h, size, ...]."""
  b, h, n = x.shape[:3]
  return jnp.moveaxis(x.reshape((b, h, n // size, size) + x.shape[3:]), 2, 0)


def join_blocks(x):
  """[n/size, b, h, size, ...] -> [b, h, n, ...]."""
  nb, b, h, size = x.shape[:4]
  return jnp.moveaxis(x, 0, 2).reshape((b, h, nb * size) + x.shape[4:])


def pad_mask(mask, pad_t, pad_s):
  """A [b|1, h|1, t|1, s|1] mask padded (with False) to the padded lengths on its non-broadcast axes only:
  a key mask [b, 1, 1, s] stays O(s) (`mask_block` slices size-1 axes as they are); padded keys are
  also excluded by their `NEG` bias, padded queries dropped."""
  widths = (0, pad_t if mask.shape[2] > 1 else 0), (0, pad_s if mask.shape[3] > 1 else 0)
  return jnp.pad(mask, ((0, 0), (0, 0)) + widths)


class Tiled(NamedTuple):
  """Head-major arrays padded to whole blocks: `queries` [b, h, T, ·] and `keys` [b, h, S, ·] (as given),
  `bias` [b, h, S] float32 (padded keys `NEG`), `mask` padded (`pad_mask`) or None; blocks of bq × bk."""
  queries: tuple
  keys: tuple
  bias: jax.Array
  mask: jax.Array | None
  bq: int
  bk: int


def tile(queries, keys, bias, mask, block_size: int) -> Tiled:
  """The blockwise kernels' setup: `queries` [b, t, h, ·] and `keys` [b, s, h, ·] (tuples) transposed to
  [b, h, ·, ·] and padded to multiples of the blocks `min(block_size, t)`, `min(block_size, s)`; the key
  bias [b, s, h] (None: zeros) likewise, its padded keys `NEG`; the mask padded on its non-broadcast axes."""
  b, t, h = queries[0].shape[:3]
  n = keys[0].shape[1]
  bq, bk = min(block_size, t), min(block_size, n)
  tp, npad = -(-t // bq) * bq, -(-n // bk) * bk
  tr = lambda x: jnp.transpose(x, (0, 2, 1, 3))
  pad = lambda x, width: x if width == 0 else jnp.pad(x, ((0, 0), (0, 0), (0, width), (0, 0)))
  bias_t = jnp.zeros((b, h, n), jnp.float32) if bias is None else jnp.transpose(bias, (0, 2, 1)).astype(jnp.float32)
  if npad != n:
    bias_t = jnp.pad(bias_t, ((0, 0), (0, 0), (0, npad - n)), constant_values=NEG)
  if mask is not None:
    mask = pad_mask(mask, tp - t, npad - n)
  return Tiled(tuple(pad(tr(x), tp - t) for x in queries), tuple(pad(tr(x), npad - n) for x in keys),
               bias_t, mask, bq, bk)


def untile(out, t):
  """[b, h, T, e] (padded queries) -> [b, t, h, e]."""
  return jnp.transpose(out[:, :, :t], (0, 2, 1, 3))


def mask_block(mask, iq, ik, bq, bk):
  """The [b|1, h|1, bq|1, bk|1] block (iq, ik) of a padded mask (size-1 axes as they are), or None."""
  if mask is None:
    return None
  sq = bq if mask.shape[2] > 1 else 1
  sk = bk if mask.shape[3] > 1 else 1
  return jax.lax.dynamic_slice(mask, (0, 0, iq * sq if sq > 1 else 0, ik * sk if sk > 1 else 0),
                               mask.shape[:2] + (sq, sk))


def block_logits(qb, kb, biasb, mask, causal, scale, iq, ik, bq, bk):
  """`scale·q·kᵀ + bias_j`, masked, of the block (iq, ik): [b, h, bq, bk] float32."""
  s = jnp.einsum("bhqd,bhkd->bhqk", qb, kb, preferred_element_type=jnp.float32) * scale
  s = s + biasb[:, :, None, :]
  return apply_masks(s, mask_block(mask, iq, ik, bq, bk), causal, iq * bq, ik * bk)


def live_block(causal: bool, iq, ik, bq: int, bk: int):
  """Whether block (iq, ik) holds an entry the causal order keeps (key ≤ query), as a traced bool; None when
  not causal (every block is live).

  A block wholly above the diagonal (first key `ik·bk` > last query `iq·bq + bq − 1`) contributes exactly
  nothing. For query block iq the live key blocks are a prefix holding every key j ≤ i of its rows, and the
  scans visit them first: a row with a kept key has a finite running max when the dead blocks come, so their
  P (all `NEG` logits) is 0, and so are their cotangents. A row with no kept key at all (a mask on top of the
  order) would read e^{NEG − NEG} = 1 there; it is empty either way, its output 0 and its cotangent 0
  (`zero_empty_rows`), and its log-normaliser stays at `NEG` scale. The kernels skip dead blocks (`lax.cond`):
  at n keys in blocks of b, (n/b)(n/b − 1)/2 of the (n/b)² blocks, 6 of 16 at 2048 keys in blocks of 512."""
  return None if not causal else ik * bk <= iq * bq + bq - 1


def column_sum(x_t, block):
  """`Σ_q x_q ⊗ block_qk` feature-major: x_t [b, h, f, bq] (x's block transposed) and block [b, h, bq, bk] ->
  [b, h, f, bk] float32. A blockwise backward's key-side sums (dv = Pᵀ·dO, dk = dSᵀ·q) run over a block's
  rows; written "bhqk,bhqf->bhkf" the product contracts the block's row axis, which XLA:CPU runs 1.8× slower
  than this form, which reads the block untransposed (`[8, 8, 512, 512]` blocks, f = 64: 16 against 8.7 ms).
  The accumulators are transposed back once, at the end."""
  return jnp.einsum("bhfq,bhqk->bhfk", x_t, block, preferred_element_type=jnp.float32)


def when_live(live, update, skipped, carry):
  """`update(carry)` where `live` is None or true, else `skipped(carry)` (same structure): one branch runs."""
  return update(carry) if live is None else jax.lax.cond(live, update, skipped, carry)


def online_softmax(query_blocks, key_blocks, logits, accumulate, width: int, out_dtype, causal: bool = False):
  """The blockwise forward: per query block, an online softmax over the key blocks.

  query_blocks: arrays [nq, b, h, bq, ·]; key_blocks: arrays [nk, b, h, bk, ·].
  `logits(iq, ik, qb, kb) -> (s, extra)`: the block's masked logits [b, h, bq, bk] float32 and whatever
  `accumulate` needs; `accumulate(o, p, extra, kb) -> o + Σ_j p_ij·(values)_j` [b, h, bq, width]
  float32, with p = e^{s − m'} (o already rescaled by e^{m − m'}). `causal`: skip the blocks wholly above
  the diagonal (`live_block`; `logits` still masks the diagonal blocks).
  Returns (out [nq, b, h, bq, width] in out_dtype, normalised by l; lse = m + log l [nq, b, h, bq]).
  """
  nk = key_blocks[0].shape[0]
  bq, bk = query_blocks[0].shape[3], key_blocks[0].shape[3]

  def per_query_block(args):
    iq, qb = args[0], args[1:]
    b, h = qb[0].shape[:2]
    init = (jnp.zeros((b, h, bq, width), jnp.float32),
            jnp.full((b, h, bq), NEG, jnp.float32), jnp.zeros((b, h, bq), jnp.float32))

    def step(carry, ik):
      def update(carry):
        o, mx, l = carry
        kb = tuple(x[ik] for x in key_blocks)
        s, extra = logits(iq, ik, qb, kb)
        mx_new = jnp.maximum(mx, s.max(-1))
        p = jnp.exp(s - mx_new[..., None])
        corr = jnp.exp(mx - mx_new)
        o = accumulate(o * corr[..., None], p, extra, kb)
        return o, mx_new, l * corr + p.sum(-1)
      return when_live(live_block(causal, iq, ik, bq, bk), update, lambda c: c, carry), None

    (o, mx, l), _ = jax.lax.scan(step, init, jnp.arange(nk))
    return (o / l[..., None]).astype(out_dtype), mx + jnp.log(l)

  nq = query_blocks[0].shape[0]
  return jax.lax.map(per_query_block, (jnp.arange(nq),) + tuple(query_blocks))


# ---- the paired kernels' tiles (`paired`, `split_paired`): the tiling, its pairs, and token slabs

def levels(n: int, block_size: int) -> int:
  """How many times the sequence is halved into tiles: while a part is even and longer than `block_size`."""
  out, size = 0, n
  while size > block_size and size % 2 == 0:
    out, size = out + 1, size // 2
  return out


def tiling(n: int, block_size: int) -> tuple[int, int]:
  """(T, t): n = T·t tokens in T tiles of t ≤ block_size (or one tile when halving stops at an odd part)."""
  tiles = 2 ** levels(n, block_size)
  return tiles, n // tiles


def pair_tasks(tiles: int) -> np.ndarray:
  """[P, 2] int32: the tile pairs (a, b), a < b — each unordered pair of distinct tiles once."""
  return np.array([(a, b) for a in range(tiles) for b in range(a + 1, tiles)], np.int32).reshape(-1, 2)


def tiles_in_pairs(n: int, block_size: int) -> bool:
  """Whether n tokens cut into T ≥ 2 tiles of at most `block_size` (`tiling`): the paired kernels' O(n·t)
  memory (one tile of n would be an n × n block)."""
  tiles, t = tiling(n, block_size)
  return tiles >= 2 and t <= block_size


# Token slabs of a [B, n, f] array (axis 1), or of its feature-major [B, f, n] form.

def slab(x, i, t, axis=1):
  """Tokens i·t … i·t + t − 1 of x along `axis` (a traced i)."""
  return jax.lax.dynamic_slice_in_dim(x, i * t, t, axis)


def add_slab(x, i, t, update, axis=1):
  """x with `update` added to its slab i (`slab`)."""
  return jax.lax.dynamic_update_slice_in_dim(x, slab(x, i, t, axis) + update, i * t, axis)


def feature_major(x):
  """[B, n, f] <-> [B, f, n]. Sums over a tile's row axis (the key side of a pair tile) accumulate
  feature-major, so their products read the n × n tile untransposed (`"bfi,bij->bfj"`) instead of
  contracting its row axis, which runs 2.3× slower on XLA:CPU."""
  return jnp.swapaxes(x, 1, 2)
