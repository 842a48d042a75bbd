"""Flash attention for the augmented family in Pallas: `softmax(s·q·kᵀ + bias_j, masked)·v`, forward and backward.

Every operator DMAP/DMTN/ATAP/ATTN is one augmented SDPA with a per-key logit bias (`operators.augment`);
this is that SDPA as a Pallas kernel (Triton on GPU, Mosaic on TPU, `interpret=True` on CPU, where the
tests run it), the same call as the blockwise kernel (`pallas_sdpa(q, k, v, bias, mask, causal, scale,
block_size)`), selected as implementation "pallas" by `dispatch.choose`.

Forward (grid: batch × head × query block; a loop over key blocks, float32 accumulation): with
`s_ij = scale·q_i·k_j + bias_j` (masked entries `NEG`), per query row a running max `m`, normaliser `l`
and output `o`,

    m' = max(m, max_j s_ij),   l ← l·e^{m−m'} + Σ_j e^{s_ij−m'},   o ← o·e^{m−m'} + Σ_j e^{s_ij−m'} v_j,

and at the end `y = o/l`, `lse = m + log l` (saved for the backward). Causal: key blocks wholly above the
diagonal are not visited (the loop stops at block ⌈(iq+1)·bq/bk⌉).

Backward (the flash backward, P recomputed from the saved lse, never stored): `P_ij = e^{s_ij − lse_i}`,
`y_i = Σ_j P_ij v_j`, so with `dP_ij = dy_i·v_j` and `Δ_i = Σ_j P_ij dP_ij = dy_i·y_i`,

    dv_j = Σ_i P_ij dy_i,    dS_ij = P_ij (dP_ij − Δ_i),
    dq_i = scale Σ_j dS_ij k_j,    dk_j = scale Σ_i dS_ij q_i,    dbias_j = Σ_i dS_ij

(the softmax Jacobian `∂P_ij/∂s_il = P_ij(δ_jl − P_il)`; the bias enters every row's logit of key j with
coefficient 1, hence a column sum of dS). Δ is one O(n·e) row sum in plain JAX; two kernels follow: one
per key block (loop over query blocks: dk, dv, dbias — no atomics) and one per query block (loop over key
blocks: dq). Products take the inputs' dtype (bf16 operands) and accumulate in float32
(`preferred_element_type`); P and dS are cast to the operand dtype before their products, as flash
kernels do.

Masks: a key mask (shape `[b|1, h|1, 1, s]`, padding) is folded into the key bias (`NEG` where False);
any other mask broadcastable to `[b, h, t, s]` is an int8 kernel input, blocked on its non-broadcast axes.
Padded keys get bias `NEG`, padded queries are dropped; a fully masked row is zeroed by the caller
(`attention`, `_blocks.zero_empty_rows`), as on every kernel. The bias is an input added to the logit
tile, not a head column `[q, 1]·[k, bias/scale]` (cuDNN's way): a column would take D to D + 1 and, on
Triton, to the next power of two (128 → 256: twice the q·kᵀ FLOPs for DMTN/ATAP at head dim 64).

Padding each backend needs (`layout`; D = augmented head dim, E = value dim, n = length):

* CPU (interpret): none beyond whole blocks, `bq = min(block_size, t)`, `bk = min(block_size, s)` —
  VERIFIED (the tests run it).
* GPU (Triton, asked for by `pl_triton.CompilerParams`: jax 0.10's default GPU lowering is Mosaic GPU,
  which has no `dot_general` here): block sizes are powers of two (Pallas' Triton lowering rejects loads
  whose size is not a power of two, `jax/_src/pallas/triton/lowering.py`; tl.dot wants ≥ 16 per dim), so D
  and E are zero-padded to `max(16, next_pow2)` and blocks are `pow2 ≤ min(block_size, GPU_BLOCK)`, ≥ 16,
  with block·(D' + E') ≤ `GPU_TILE` (halved for float32 operands; registers: see there) unless that leaves
  less than 16 (D' + E' > 768 in bf16), at 8 warps and 2 stages (`TRITON`).
  VERIFIED on CPU: forward and backward LOWER to Triton MLIR (`jit(...).trace(...).lower(lowering_platforms=
  ("cuda",))`, the test file; bf16 and float32, key / full masks, causal, D = 16…256), and that Triton IR
  COMPILES to sm_90 code with pip's Triton and ptxas (`attngeo bench-triton`:
  shared memory, registers, spills per layout; at the default layout none spills and all fit). NOT run: no
  GPU was lent. float32 operands run as TF32 there (`lax.Precision.DEFAULT`, as XLA's own GPU dots do); pass
  bf16 for the tensor cores' full rate.
* TPU (Mosaic): the last two dims of every block must be multiples of (8, 128) or equal the whole array
  dims (`jax/_src/pallas/mosaic/lowering.py`). Head dims are whole-array blocks (no padding required by
  the lowering; the MXU still computes in 128-lane tiles), the bias / dbias blocks `[1, bk]` and the mask
  blocks need bk a multiple of 128, lse `[bq, 1]` needs bq a multiple of 8: blocks are multiples of 128.
  VERIFIED on CPU: forward and backward LOWER to Mosaic (`tpu_custom_call`; the test names the chip "TPU v5
  lite", whose kind the lowering reads): every op, the products with a transposed operand (`Pᵀ·dO`, `dSᵀ·q`:
  `dot_general` contracting axis 0) included, has a Mosaic lowering, and every block passes the lowering's
  (8, 128)-or-whole rule (blocks of 64 fail it in the backward: the test checks that too); bf16 and float32,
  key / full masks, causal, head dims 16, 48, 64. NOT compiled by Mosaic's own compiler (libtpu) nor run.

FLOP cost (per batch × head, t queries, s keys, padded widths D', E'): forward 2ts(D' + E') (q·kᵀ, P·v);
backward 2ts(2D' + 2E') in the dk/dv kernel (q·kᵀ, dO·vᵀ, Pᵀ·dO, dSᵀ·q) plus 2ts(2D' + E') in the dq
kernel (q·kᵀ, dO·vᵀ, dS·k: the recomputations are the price of no atomics, 2ts(D' + E') more than one fused
backward). Padding multiplies the D-products by D'/D and the E-products by E'/E. The family at head dim
d = 64: ATTN/DMAP D = 64, DMTN/ATAP D = 128 (float32) or 256 (16-bit, `augment`'s hi/lo pair) — all
powers of two, no cost on Triton; at d = 48, D = 96 → 128 on Triton (4/3× the D-products; E = 48 → 64,
4/3× the E-products), on TPU D = 96 is one 128-lane tile either way (the MXU's own padding, the same 4/3×).
Ragged lengths cost ⌈n/b⌉·b/n in every product; causal skips the blocks above the diagonal (≈ ½ the work
for n ≫ b).
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from attngeo.kernels._blocks import NEG, pad_mask

NT = (((1,), (1,)), ((), ()))   # a·bᵀ
TN = (((0,), (0,)), ((), ()))   # aᵀ·b


def _next_pow2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def round_up(n: int, m: int) -> int:
  return -(-int(n) // m) * m


# GPU blocks are at most GPU_BLOCK and hold block × (D' + E') ≤ GPU_TILE, so that no kernel spills registers on
# sm_90 at 8 warps (compiled here without a GPU: `attngeo bench-triton`). The dk/dv
# kernel keeps its float32 [bq, bk] tiles (logits, P, dP, dS) and accumulators dk [bk, D'], dv [bk, E'] in
# registers: 128-blocks spill at every width tried (24 B at D' = E' = 16, 648 B at D' = E' = 64), 64-blocks at
# none up to D' + E' = 192; D' = 256 spills 540 B at 64-blocks and none at 32. At D' = 256 the 128-blocks' dq
# kernel also asks for 240 KiB of shared memory, past the 227 KiB a block may have: it would not launch. These
# are bf16 figures; float32 operands halve the tile (`gpu_tile`): in float32, 64-blocks spill 32 B at
# D' = E' = 64 and 296 B at D' = 128 (DMTN/ATAP), 32-blocks none (`attngeo bench-triton --dtype float32`).
GPU_BLOCK = 64
GPU_TILE = 12288
_TILE_BOUNDED = [True]


@contextlib.contextmanager
def unbounded_tiles():
  """Within the block, GPU layouts take `block_size` as asked (a power of two, 16…128) past `GPU_BLOCK`,
  `GPU_TILE` and the phase kernel's bounds: the tuning sweeps compile and time the layouts the bounds rule out.
  Nested blocks keep the outer one's setting; only functions traced inside see it (as `triton_params`)."""
  saved = _TILE_BOUNDED[0]
  _TILE_BOUNDED[0] = False
  try:
    yield
  finally:
    _TILE_BOUNDED[0] = saved


def tile_bound(limit: int) -> int:
  """`limit`, or no bound inside `unbounded_tiles`."""
  return limit if _TILE_BOUNDED[0] else 1 << 30


def gpu_tile(limit: int, itemsize: int) -> int:
  """A tile bound measured with 2-byte operands (bf16), for operands of `itemsize` bytes: 4-byte (float32)
  operand tiles take twice the registers and shared memory, so half the bound."""
  return limit * 2 // max(int(itemsize), 2)


def layout(backend: str, t: int, s: int, d: int, e: int, block_size: int, itemsize: int = 2):
  """`(bq, bk, D', E')`: the blocks and padded head / value widths the kernel uses on `backend`
  ("cpu" = interpret mode, "gpu" = Triton, "tpu" = Mosaic) for operands of `itemsize` bytes; see the module
  docstring."""
  if backend == "gpu":
    width = lambda x: max(16, _next_pow2(x))
    tile = tile_bound(gpu_tile(GPU_TILE, itemsize))
    cap = min(128, int(block_size), tile_bound(GPU_BLOCK), tile // (width(d) + width(e)))
    cap = max(16, 1 << (max(cap, 1).bit_length() - 1))                # the largest power of two ≤ all three
    blk = lambda n: max(16, min(cap, _next_pow2(n)))
    return blk(t), blk(s), width(d), width(e)
  if backend == "tpu":
    blk = lambda n: min(round_up(max(block_size, 128), 128), round_up(n, 128))
    return blk(t), blk(s), d, e
  return min(block_size, t), min(block_size, s), d, e


# ----------------------------------------------------------------------------- the kernels

def tile_masks(s, m_ref, causal, row0, col0, mask_rows: bool, mask_keys: bool, bq: int, bk: int, rows_at, cols_at):
  """The logit tile s [bq, bk] with the causal order (key > query) and the int8 mask (0) set to NEG."""
  if causal:
    rows = row0 + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    cols = col0 + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    s = jnp.where(cols <= rows, s, NEG)
  if m_ref is not None:
    m = m_ref[rows_at if mask_rows else slice(None), cols_at if mask_keys else slice(None)]
    s = jnp.where(m != 0, s, NEG)
  return s


def _fwd_kernel(*refs, causal, scale, bq, bk, nk, has_mask, mask_keys):
  q_ref, k_ref, v_ref, b_ref, *rest = refs
  m_ref = rest.pop(0) if has_mask else None
  o_ref, lse_ref = rest
  iq = pl.program_id(2)
  q = q_ref[...]

  def body(ik, carry):
    o, mx, l = carry
    start = pl.multiple_of(ik * bk, bk)
    cols = pl.ds(start, bk)
    s = jax.lax.dot_general(q, k_ref[cols, :], NT, preferred_element_type=jnp.float32) * scale
    s = s + b_ref[:, cols]
    s = tile_masks(s, m_ref, causal, iq * bq, start, False, mask_keys, bq, bk, None, cols)
    mx_new = jnp.maximum(mx, s.max(-1, keepdims=True))
    p = jnp.exp(s - mx_new)
    corr = jnp.exp(mx - mx_new)
    o = o * corr + jnp.dot(p.astype(v_ref.dtype), v_ref[cols, :], preferred_element_type=jnp.float32)
    return o, mx_new, l * corr + p.sum(-1, keepdims=True)

  init = (jnp.zeros((bq, v_ref.shape[-1]), jnp.float32), jnp.full((bq, 1), NEG, jnp.float32),
          jnp.zeros((bq, 1), jnp.float32))
  upper = jnp.minimum(nk, ((iq + 1) * bq + bk - 1) // bk) if causal else nk
  o, mx, l = jax.lax.fori_loop(0, upper, body, init)
  o_ref[...] = (o / l).astype(o_ref.dtype)
  lse_ref[...] = mx + jnp.log(l)


def _dkv_kernel(*refs, causal, scale, bq, bk, nq, has_mask, mask_rows):
  q_ref, k_ref, v_ref, b_ref, *rest = refs
  m_ref = rest.pop(0) if has_mask else None
  do_ref, lse_ref, delta_ref, dk_ref, dv_ref, db_ref = rest
  ik = pl.program_id(2)
  kb, vb, bias = k_ref[...], v_ref[...], b_ref[...]

  def body(iq, carry):
    dk, dv, db = carry
    start = pl.multiple_of(iq * bq, bq)
    rows = pl.ds(start, bq)
    qb, dob = q_ref[rows, :], do_ref[rows, :]
    s = jax.lax.dot_general(qb, kb, NT, preferred_element_type=jnp.float32) * scale + bias
    s = tile_masks(s, m_ref, causal, start, ik * bk, mask_rows, False, bq, bk, rows, None)
    p = jnp.exp(s - lse_ref[rows, :])
    dv = dv + jax.lax.dot_general(p.astype(dob.dtype), dob, TN, preferred_element_type=jnp.float32)
    dp = jax.lax.dot_general(dob, vb, NT, preferred_element_type=jnp.float32)
    ds = p * (dp - delta_ref[rows, :])
    dk = dk + jax.lax.dot_general(ds.astype(qb.dtype), qb, TN, preferred_element_type=jnp.float32)
    return dk, dv, db + ds.sum(0, keepdims=True)

  init = (jnp.zeros(kb.shape, jnp.float32), jnp.zeros(vb.shape, jnp.float32), jnp.zeros((1, bk), jnp.float32))
  lower = (ik * bk) // bq if causal else 0
  dk, dv, db = jax.lax.fori_loop(lower, nq, body, init)
  dk_ref[...], dv_ref[...], db_ref[...] = dk * scale, dv, db


def _dq_kernel(*refs, causal, scale, bq, bk, nk, has_mask, mask_keys):
  q_ref, k_ref, v_ref, b_ref, *rest = refs
  m_ref = rest.pop(0) if has_mask else None
  do_ref, lse_ref, delta_ref, dq_ref = rest
  iq = pl.program_id(2)
  q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]

  def body(ik, dq):
    start = pl.multiple_of(ik * bk, bk)
    cols = pl.ds(start, bk)
    kb = k_ref[cols, :]
    s = jax.lax.dot_general(q, kb, NT, preferred_element_type=jnp.float32) * scale + b_ref[:, cols]
    s = tile_masks(s, m_ref, causal, iq * bq, start, False, mask_keys, bq, bk, None, cols)
    p = jnp.exp(s - lse)
    dp = jax.lax.dot_general(do, v_ref[cols, :], NT, preferred_element_type=jnp.float32)
    ds = p * (dp - delta)
    return dq + jnp.dot(ds.astype(kb.dtype), kb, preferred_element_type=jnp.float32)

  upper = jnp.minimum(nk, ((iq + 1) * bq + bk - 1) // bk) if causal else nk
  dq = jax.lax.fori_loop(0, upper, body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = dq * scale


# ----------------------------------------------------------------------------- pallas_call wiring

# Triton's launch parameters on GPU (warps per program, software-pipelining stages). A module setting, not a
# kernel argument: `triton_params` changes it for a tuning sweep (`attngeo bench-pallas`). 8 warps:
# at 4, the dk/dv kernel spills at D' = 128 with 64-blocks (344 B) where 8 warps spill none; 2 stages: 3 ask
# for 40–50 % more shared memory and save no registers (`attngeo bench-triton`; times need a GPU).
TRITON = {"num_warps": 8, "num_stages": 2}


def check_triton(*, num_warps: int | None = None, num_stages: int | None = None, block: int | None = None):
  """One ValueError naming a value Triton cannot take: `num_warps` a power of two from 1 to 32 (at most 1024
  threads), `num_stages` from 1 to 8, a `block` a power of two from 16 to 128 (tl.dot's least, `layout`'s most)."""
  pow2 = lambda x: x >= 1 and not x & (x - 1)
  if num_warps is not None and not (pow2(num_warps) and num_warps <= 32):
    raise ValueError(f"num_warps must be a power of two from 1 to 32; got {num_warps}")
  if num_stages is not None and not 1 <= num_stages <= 8:
    raise ValueError(f"num_stages must be from 1 to 8; got {num_stages}")
  if block is not None and not (pow2(block) and 16 <= block <= 128):
    raise ValueError(f"blocks must be powers of two from 16 to 128; got {block}")


@contextlib.contextmanager
def triton_params(**params):
  """Within the block, programs traced for GPU use these Triton parameters (`num_warps`, `num_stages`; checked by
  `check_triton`). Only functions traced inside it see them: jit's cache does not key on this setting, so a
  jitted function traced before keeps its first trace (build a fresh closure, as the sweeps do)."""
  unknown = set(params) - set(TRITON)
  if unknown:
    raise ValueError(f"triton_params: unknown {sorted(unknown)}; expected a subset of {sorted(TRITON)}")
  check_triton(**params)
  saved = dict(TRITON)
  TRITON.update(params)
  try:
    yield
  finally:
    TRITON.clear()
    TRITON.update(saved)


def pallas_call(kernel, target, **kw):
  """`pl.pallas_call` for `target`: "cpu" (interpret mode), "gpu" (Triton, named: jax 0.10's default GPU
  lowering is Mosaic GPU, which has no `dot_general` on this kernel's lane semantics) or "tpu" (Mosaic)."""
  params = pl_triton.CompilerParams(**TRITON) if target == "gpu" else None
  return pl.pallas_call(kernel, interpret=target == "cpu", compiler_params=params, **kw)


def block_spec(shape, index_map):
  return pl.BlockSpec(shape, index_map)


def mask_spec(mask, rows, cols, row_index, col_index):
  """The int8 mask's block: batch / head squeezed, query and key axes blocked where not broadcast."""
  mb, mh, mt, ms = mask.shape
  return block_spec((None, None, rows if mt > 1 else 1, cols if ms > 1 else 1),
               lambda b, h, i: (b if mb > 1 else 0, h if mh > 1 else 0, row_index(i) if mt > 1 else 0,
                                col_index(i) if ms > 1 else 0))


def _forward(q, k, v, bias, mask, causal, scale, bq, bk, target):
  """q [b,h,T,D], k [b,h,S,D], v [b,h,S,E], bias [b,h,1,S] f32, mask int8 or None -> (out, lse [b,h,T,1])."""
  b, h, tp, dd = q.shape
  sp, e = k.shape[2], v.shape[-1]
  whole = lambda width: block_spec((None, None, sp, width), lambda bb, hh, i: (bb, hh, 0, 0))
  in_specs = [block_spec((None, None, bq, dd), lambda bb, hh, i: (bb, hh, i, 0)), whole(dd), whole(e),
              block_spec((None, None, 1, sp), lambda bb, hh, i: (bb, hh, 0, 0))]
  args = [q, k, v, bias]
  if mask is not None:
    in_specs.append(mask_spec(mask, bq, sp, lambda i: i, lambda i: 0))
    args.append(mask)
  kernel = functools.partial(_fwd_kernel, causal=causal, scale=scale, bq=bq, bk=bk, nk=sp // bk,
                             has_mask=mask is not None, mask_keys=mask is not None and mask.shape[3] > 1)
  return pallas_call(
      kernel, target, grid=(b, h, tp // bq), in_specs=in_specs,
      out_specs=[block_spec((None, None, bq, e), lambda bb, hh, i: (bb, hh, i, 0)),
                 block_spec((None, None, bq, 1), lambda bb, hh, i: (bb, hh, i, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, h, tp, e), v.dtype), jax.ShapeDtypeStruct((b, h, tp, 1), jnp.float32)],
      name="attngeo_flash_fwd")(*args)


def _backward(q, k, v, bias, mask, out, lse, dout, causal, scale, bq, bk, target):
  b, h, tp, dd = q.shape
  sp, e = k.shape[2], v.shape[-1]
  delta = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1, keepdims=True)   # [b,h,T,1]
  has_mask = mask is not None
  full_q = lambda width: block_spec((None, None, tp, width), lambda bb, hh, i: (bb, hh, 0, 0))
  blk_k = lambda width: block_spec((None, None, bk, width), lambda bb, hh, i: (bb, hh, i, 0))
  in_specs = [full_q(dd), blk_k(dd), blk_k(e), block_spec((None, None, 1, bk), lambda bb, hh, i: (bb, hh, 0, i))]
  args = [q, k, v, bias]
  if has_mask:
    in_specs.append(mask_spec(mask, tp, bk, lambda i: 0, lambda i: i))
    args.append(mask)
  in_specs += [full_q(e), full_q(1), full_q(1)]
  args += [dout, lse, delta]
  kernel = functools.partial(_dkv_kernel, causal=causal, scale=scale, bq=bq, bk=bk, nq=tp // bq,
                             has_mask=has_mask, mask_rows=has_mask and mask.shape[2] > 1)
  dk, dv, dbias = pallas_call(
      kernel, target, grid=(b, h, sp // bk), in_specs=in_specs,
      out_specs=[blk_k(dd), blk_k(e), block_spec((None, None, 1, bk), lambda bb, hh, i: (bb, hh, 0, i))],
      out_shape=[jax.ShapeDtypeStruct(k.shape, jnp.float32), jax.ShapeDtypeStruct(v.shape, jnp.float32),
                 jax.ShapeDtypeStruct(bias.shape, jnp.float32)],
      name="attngeo_flash_dkv")(*args)

  whole = lambda width: block_spec((None, None, sp, width), lambda bb, hh, i: (bb, hh, 0, 0))
  blk_q = lambda width: block_spec((None, None, bq, width), lambda bb, hh, i: (bb, hh, i, 0))
  in_specs = [blk_q(dd), whole(dd), whole(e), block_spec((None, None, 1, sp), lambda bb, hh, i: (bb, hh, 0, 0))]
  args = [q, k, v, bias]
  if has_mask:
    in_specs.append(mask_spec(mask, bq, sp, lambda i: i, lambda i: 0))
    args.append(mask)
  in_specs += [blk_q(e), blk_q(1), blk_q(1)]
  args += [dout, lse, delta]
  kernel = functools.partial(_dq_kernel, causal=causal, scale=scale, bq=bq, bk=bk, nk=sp // bk,
                             has_mask=has_mask, mask_keys=has_mask and mask.shape[3] > 1)
  dq = pallas_call(
      kernel, target, grid=(b, h, tp // bq), in_specs=in_specs, out_specs=blk_q(dd),
      out_shape=jax.ShapeDtypeStruct(q.shape, jnp.float32), name="attngeo_flash_dq")(*args)
  return dq, dk, dv, dbias


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _flash(q, k, v, bias, mask, causal, scale, bq, bk, target):
  return _forward(q, k, v, bias, mask, causal, scale, bq, bk, target)[0]


def _flash_fwd(q, k, v, bias, mask, causal, scale, bq, bk, target):
  out, lse = _forward(q, k, v, bias, mask, causal, scale, bq, bk, target)
  return out, (q, k, v, bias, mask, out, lse)


def _flash_bwd(causal, scale, bq, bk, target, res, dout):
  q, k, v, bias, mask, out, lse = res
  dq, dk, dv, dbias = _backward(q, k, v, bias, mask, out, lse, dout, causal, scale, bq, bk, target)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dbias, None


_flash.defvjp(_flash_fwd, _flash_bwd)


_TARGET: list[str | None] = [None]


def _backend() -> str:
  if _TARGET[0] is not None:
    return _TARGET[0]
  backend = jax.default_backend()
  return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


@contextlib.contextmanager
def lowering_target(backend: str):
  """Within the block, the Pallas kernels are traced for `backend` ("gpu": Triton, "tpu": Mosaic) whatever the
  default backend is: to lower them here for a device this machine lacks
  (`jax.jit(f).trace(...).lower(lowering_platforms=("cuda",))`; `attngeo bench-triton`). As with
  `triton_params`, only functions traced inside the block see it."""
  if backend not in ("gpu", "tpu"):
    raise ValueError(f"lowering_target: backend must be 'gpu' or 'tpu'; got {backend!r}")
  saved = _TARGET[0]
  _TARGET[0] = backend
  try:
    yield
  finally:
    _TARGET[0] = saved


# ----------------------------------------------------------------------------- shared with `pallas_phase`

# The phase kernel's Pallas twin (`attngeo.kernels.pallas_phase`) also builds on the dot layouts `NT`/`TN`,
# `round_up`, `tile_masks`, `block_spec`, `mask_spec` and `pallas_call` above.


def backend() -> str:
  """The lowering target of the default backend: "gpu" (CUDA, ROCm), "tpu" or "cpu" (tests patch `_backend`)."""
  return _backend()


def key_bias_and_mask(bias, mask, b, h, t, s, tp, sp):
  """The kernels' key bias `[b, h, 1, sp]` float32 and int8 mask (padded to tp × sp, or None) from a bias
  `[b, s, h]` (None: zeros) and a bool mask broadcastable to `[b, h, t, s]` (or None): a key mask
  `[b|1, h|1, 1, s]` is folded into the bias (`NEG` where False), padded keys get `NEG`, any other mask is
  padded on its non-broadcast axes (`pad_mask`) and cast to int8."""
  bias_t = jnp.zeros((b, h, s), jnp.float32) if bias is None else jnp.transpose(bias, (0, 2, 1)).astype(jnp.float32)
  if mask is not None and mask.shape[2] == 1:          # a key mask: folded into the key bias
    bias_t = jnp.where(jnp.broadcast_to(mask[:, :, 0, :], (b, h, s)), bias_t, NEG)
    mask = None
  bias_t = jnp.pad(bias_t, ((0, 0), (0, 0), (0, sp - s)), constant_values=NEG)[:, :, None, :]
  if mask is not None:
    mask = pad_mask(jnp.asarray(mask), tp - t, sp - s).astype(jnp.int8)
  return bias_t, mask


def pallas_sdpa(q, k, v, bias, mask, causal, scale, block_size, *, interpret=None):
  """`softmax(scale·q·kᵀ + bias_j, masked)·v` by the Pallas flash kernel; the blockwise kernel's call.

  q: [b, t, h, d]; k: [b, s, h, d]; v: [b, s, h, e]; bias: [b, s, h] or None; mask: bool broadcastable to
  [b, h, t, s] or None; causal: top-left aligned (key j ≤ query i); block_size: the bound on both blocks
  (`layout`). interpret: None = interpret mode unless the backend is GPU or TPU. Returns [b, t, h, e] in
  v's dtype (fully masked rows are left to the caller: `attention` zeroes them).
  """
  backend = _backend()
  if interpret is None:
    interpret = backend not in ("gpu", "tpu")
  b, t, h, d = q.shape
  s, e = k.shape[1], v.shape[-1]
  target = "cpu" if interpret else backend
  bq, bk, dp, ep = layout(target, t, s, d, e, int(block_size), jnp.dtype(q.dtype).itemsize)
  tp, sp = round_up(t, bq), round_up(s, bk)
  head_major = lambda x, n, width: jnp.pad(jnp.transpose(x, (0, 2, 1, 3)),
                                           ((0, 0), (0, 0), (0, n - x.shape[1]), (0, width - x.shape[-1])))
  qt, kt, vt = head_major(q, tp, dp), head_major(k, sp, dp), head_major(v, sp, ep)
  bias_t, mask = key_bias_and_mask(bias, mask, b, h, t, s, tp, sp)
  out = _flash(qt, kt, vt, bias_t, mask, bool(causal), float(scale), bq, bk, target)
  return jnp.transpose(out[:, :, :t, :e], (0, 2, 1, 3))
