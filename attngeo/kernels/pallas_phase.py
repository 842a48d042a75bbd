"""Phase attention in Pallas: `y_i = Σ_j P_ij e^{iθ_ij} v_j`, forward and backward (CMAP's kernel, name "pallas").

The same call as the blockwise phase kernel (`pallas_phase_attention(q, k, v, bias, qt, kt, c, mask, causal,
scale, block_size)`), run by `phase_attention(implementation="pallas")` and so by
`operators.magnetic_transport(implementation="pallas")`; never a default (`dispatch`). The maths is
`attngeo.kernels.phase`'s (its module docstring derives the backward), in its value layout [re, im]:
`va = [v_re, v_im]`, `vb = [−v_im, v_re]`, `ga = [G_re, G_im]`, `gb = [G_im, −G_re]`. The kernels are
`attngeo.kernels.pallas`'s flash kernels with the phase in every tile:

* forward (grid batch × head × query block, a loop over key blocks): `s = scale·q·kᵀ + bias` (masked),
  `θ = c_h·qt·ktᵀ`, the online softmax's `p = e^{s−m'}`, and `o ← o·e^{m−m'} + (p cos θ)·va + (p sin θ)·vb`;
  `y = o/l` and `lse = m + log l` saved;
* dk/dv kernel (one per key block, a loop over query blocks): `P = e^{s − lse}` and θ recomputed,
  `dv += (P cos θ)ᵀ·ga + (P sin θ)ᵀ·gb`, `Re A = ga·vaᵀ`, `Im A = −ga·vbᵀ`,
  `dS = P (cos θ·Re A − sin θ·Im A − Δ)`, `dθ = −P (sin θ·Re A + cos θ·Im A)`, `dk += scale·dSᵀ·q`,
  `dbias += Σ_i dS`, `dkt_raw += dθᵀ·qt`;
* dq kernel (one per query block, a loop over key blocks): the same tile, `dq += scale·dS·k`,
  `dqt_raw += dθ·kt`.

Outside the kernels (O(n) each): `Δ = Σ_e dO ⊙ O`, `gb`, `vb`, `dqt = c·dqt_raw`, `dkt = c·dkt_raw` and the
coupling's `dc_h = Σ_i qt_i·dqt_raw_i` (`phase._coupling_grad`'s sum: `Σ_ij dθ_ij qt_i·kt_j` without
another pass over the tiles). Products take the operands' dtype (bf16 allowed) and accumulate in float32
(`preferred_element_type`); `P cos θ`, `P sin θ` are cast to the value dtype, dS to q's and dθ to qt's before
their products, as `pallas` casts P and dS. The phase is `jnp.sin`/`jnp.cos` (Triton has no lowering for
`round`, which `phase.sincos`'s range reduction uses): within `sincos`'s 5e-7 of it for |θ| ≤ 1e3. Masks, padding,
the causal skip and the fully masked rows (0, by the caller) are `pallas`'s.

Products per tile (bq × bk; widths D' of q/k, F' of qt/kt, E' of v in layout [re, im]), each 2·bq·bk·width
FLOPs, against the softmax kernel's D' + E' (forward), 2D' + 2E' (dk/dv) and 2D' + E' (dq):

    forward  D' + F' + 2E'     q·kᵀ, qt·ktᵀ, (P cos θ)·va, (P sin θ)·vb
    dk/dv    2D' + 2F' + 4E'   q·kᵀ, qt·ktᵀ, ga·vaᵀ, ga·vbᵀ, (P cos θ)ᵀ·ga, (P sin θ)ᵀ·gb, dSᵀ·q, dθᵀ·qt
    dq       2D' + 2F' + 2E'   q·kᵀ, qt·ktᵀ, ga·vaᵀ, ga·vbᵀ, dS·k, dθ·kt

The value products are complex (P e^{iθ} times complex v: two real products of the full width), the F-products
the price of a bilinear θ; each kernel also takes a sin and a cos of every tile entry. CMAP at head dim d and
β = 0 (`operators.augment`'s DMAP heads D = d; phase heads `[q, k]`, `[k, −q]`, F = 2d; E = d): forward 5d
against ATTN's 2d on `pallas`, dk/dv 10d against 4d, dq 8d against 3d — 23d against 9d over the three (2.6×).
A traced or per-head β takes D to 2d (float32) or 4d (16-bit). vb and gb are built outside the kernels and
read as inputs: one more value-sized read per kernel than swapping the halves in the kernel, which would slice
at e/2, not a power of two in general.

Padding each backend needs (`phase_layout`: `pallas.layout`'s blocks, D' and E', and its head-dim rule for F'):

* CPU (interpret): none beyond whole blocks — VERIFIED: tests/test_kernels_pallas_phase.py runs it against
  float64 and the blockwise kernel (values and gradients w.r.t. q, k, v, bias, qt, kt and c, ≤ 8e-7·max
  apart; key / full masks, causal, ragged lengths, bf16, an empty row, float32 running sums).
* GPU (Triton, named by `pl_triton.CompilerParams` as in `pallas`): blocks are powers of two from 16, within
  `PHASE_GPU_BLOCK` (32) and block·(D' + F' + E') ≤ `PHASE_GPU_TILE`, and D, F and E are zero-padded to
  `max(16, next_pow2)` — F is a head dim like D. VERIFIED on CPU: forward and backward LOWER to Triton MLIR (`jit(...).trace(...).lower(
  lowering_platforms=("cuda",))`, in the test file: bf16 and float32, key / full masks, causal) and compile to
  sm_90 code (`attngeo bench-triton --kernel phase`). NOT run: no GPU was lent.
* TPU (Mosaic): blocks multiples of 128 (the key bias and mask blocks), head dims and c's `[1, 1]` block
  whole-array blocks. VERIFIED on CPU as for `pallas`: forward and backward LOWER to Mosaic (sin and cos
  included; every block passes the (8, 128)-or-whole rule; bf16 and float32, key / full masks, causal). NOT
  compiled by Mosaic's compiler (libtpu) nor run.

FLOP cost of the padding: the D-, F- and E-products grow by D'/D, F'/F and E'/E (E' pads the [re, im] width
as a whole: zeros after both halves). CMAP at d = 64 (D = 64, F = 128, E = 64): powers of two, no cost on
Triton; at d = 48 (48 → 64, 96 → 128, 48 → 64) every product grows by 4/3 there. On TPU the lowering pads
nothing, but the MXU computes in 128-lane tiles (48 and 96 both cost 128), as for `pallas`. Ragged lengths
cost ⌈n/b⌉·b/n in every product; causal skips the blocks above the diagonal (≈ ½ of the work for n ≫ b).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from attngeo.kernels import pallas as flash
from attngeo.kernels._blocks import NEG

_F32 = jnp.float32


# GPU blocks are at most PHASE_GPU_BLOCK and hold block × (D' + F' + E') ≤ PHASE_GPU_TILE: the phase kernels keep
# more [bq, bk] float32 tiles than the softmax ones (θ, cos, sin, P and their cotangents) and dk, dkt, dv in
# registers. At 8 warps on sm_90 64-blocks spill at D' = 32 (152 B, F' = 64) and at CMAP's d = 64 (428 B, F' =
# 128); 32-blocks spill none up to D' = 128, F' = 256 (`attngeo bench-triton --kernel
# phase`).
PHASE_GPU_BLOCK = 32
PHASE_GPU_TILE = 16384


def phase_layout(backend: str, t: int, s: int, d: int, f: int, e: int, block_size: int, itemsize: int = 2):
  """`(bq, bk, D', F', E')`: `pallas.layout`'s blocks and widths, with the phase heads' width F padded as a head
  dim (Triton: `max(16, next_pow2)`; TPU and CPU: as it is); on GPU the blocks also within `PHASE_GPU_BLOCK`
  and `PHASE_GPU_TILE` (halved for 4-byte operands: `pallas.gpu_tile`)."""
  _, _, dp, ep = flash.layout(backend, t, s, d, e, block_size)
  fp = flash.layout(backend, t, s, f, e, block_size)[2]
  if backend == "gpu":
    bound = flash.tile_bound
    block_size = min(block_size, bound(PHASE_GPU_BLOCK), bound(flash.gpu_tile(PHASE_GPU_TILE, itemsize)) // (dp + fp + ep))
  bq, bk, _, _ = flash.layout(backend, t, s, d, e, block_size)
  return bq, bk, dp, fp, ep


def _rotate(x, half: int):
  """`[re, im, pad]` -> `[−im, re, pad]` on the last axis (`half` = the width of re): vb from va, −gb from ga."""
  return jnp.concatenate([-x[..., half:2 * half], x[..., :half], x[..., 2 * half:]], -1)


# ----------------------------------------------------------------------------- the kernels

def _tile(q, kb, bias, qt, ktb, c, m_ref, causal, scale, row0, col0, mask_rows, mask_keys, bq, bk, rows_at, cols_at):
  """The tile's masked logits s and phases θ = c·qt·ktᵀ, [bq, bk] float32."""
  s = jax.lax.dot_general(q, kb, flash.NT, preferred_element_type=_F32) * scale + bias
  s = flash.tile_masks(s, m_ref, causal, row0, col0, mask_rows, mask_keys, bq, bk, rows_at, cols_at)
  return s, jax.lax.dot_general(qt, ktb, flash.NT, preferred_element_type=_F32) * c


def _grad_tile(p, theta, ga, vab, vbb, delta):
  """From P and θ of a tile: dS = P (cos θ·Re A − sin θ·Im A − Δ), dθ = −P (sin θ·Re A + cos θ·Im A), and
  (P cos θ, P sin θ); `Re A = ga·vaᵀ`, `Im A = −ga·vbᵀ` (float32)."""
  sin, cos = jnp.sin(theta), jnp.cos(theta)
  pc, ps = p * cos, p * sin
  re_a = jax.lax.dot_general(ga, vab, flash.NT, preferred_element_type=_F32)
  im_a = -jax.lax.dot_general(ga, vbb, flash.NT, preferred_element_type=_F32)
  return pc * re_a - ps * im_a - p * delta, -(ps * re_a + pc * im_a), pc, ps


def _fwd_kernel(*refs, causal, scale, bq, bk, nk, has_mask, mask_keys):
  q_ref, k_ref, va_ref, vb_ref, b_ref, qt_ref, kt_ref, c_ref, *rest = refs
  m_ref = rest.pop(0) if has_mask else None
  o_ref, lse_ref = rest
  iq = pl.program_id(2)
  q, qt, c = q_ref[...], qt_ref[...], c_ref[...]
  dtype = va_ref.dtype

  def body(ik, carry):
    o, mx, l = carry
    start = pl.multiple_of(ik * bk, bk)
    cols = pl.ds(start, bk)
    s, theta = _tile(q, k_ref[cols, :], b_ref[:, cols], qt, kt_ref[cols, :], c, m_ref, causal, scale, iq * bq,
                     start, False, mask_keys, bq, bk, None, cols)
    mx_new = jnp.maximum(mx, s.max(-1, keepdims=True))
    p = jnp.exp(s - mx_new)
    corr = jnp.exp(mx - mx_new)
    pv = lambda w, x: jnp.dot(w.astype(dtype), x, preferred_element_type=_F32)
    o = o * corr + pv(p * jnp.cos(theta), va_ref[cols, :]) + pv(p * jnp.sin(theta), vb_ref[cols, :])
    return o, mx_new, l * corr + p.sum(-1, keepdims=True)

  init = (jnp.zeros((bq, va_ref.shape[-1]), _F32), jnp.full((bq, 1), NEG, _F32), jnp.zeros((bq, 1), _F32))
  upper = jnp.minimum(nk, ((iq + 1) * bq + bk - 1) // bk) if causal else nk
  o, mx, l = jax.lax.fori_loop(0, upper, body, init)
  o_ref[...] = (o / l).astype(o_ref.dtype)
  lse_ref[...] = mx + jnp.log(l)


def _dkv_kernel(*refs, causal, scale, bq, bk, nq, has_mask, mask_rows):
  q_ref, k_ref, va_ref, vb_ref, b_ref, qt_ref, kt_ref, c_ref, *rest = refs
  m_ref = rest.pop(0) if has_mask else None
  ga_ref, gb_ref, lse_ref, delta_ref, dk_ref, dv_ref, db_ref, dkt_ref = rest
  ik = pl.program_id(2)
  kb, vab, vbb, bias, ktb, c = k_ref[...], va_ref[...], vb_ref[...], b_ref[...], kt_ref[...], c_ref[...]

  def body(iq, carry):
    dk, dv, db, dkt = carry
    start = pl.multiple_of(iq * bq, bq)
    rows = pl.ds(start, bq)
    qb, qtb, gab = q_ref[rows, :], qt_ref[rows, :], ga_ref[rows, :]
    s, theta = _tile(qb, kb, bias, qtb, ktb, c, m_ref, causal, scale, start, ik * bk, mask_rows, False, bq, bk,
                     rows, None)
    p = jnp.exp(s - lse_ref[rows, :])
    ds, dtheta, pc, ps = _grad_tile(p, theta, gab, vab, vbb, delta_ref[rows, :])
    tn = lambda w, x: jax.lax.dot_general(w.astype(x.dtype), x, flash.TN, preferred_element_type=_F32)
    dv = dv + tn(pc, gab) + tn(ps, gb_ref[rows, :])
    return dk + tn(ds, qb), dv, db + ds.sum(0, keepdims=True), dkt + tn(dtheta, qtb)

  init = (jnp.zeros(kb.shape, _F32), jnp.zeros(vab.shape, _F32), jnp.zeros((1, bk), _F32), jnp.zeros(ktb.shape, _F32))
  lower = (ik * bk) // bq if causal else 0
  dk, dv, db, dkt = jax.lax.fori_loop(lower, nq, body, init)
  dk_ref[...], dv_ref[...], db_ref[...], dkt_ref[...] = dk * scale, dv, db, dkt


def _dq_kernel(*refs, causal, scale, bq, bk, nk, has_mask, mask_keys):
  q_ref, k_ref, va_ref, vb_ref, b_ref, qt_ref, kt_ref, c_ref, *rest = refs
  m_ref = rest.pop(0) if has_mask else None
  ga_ref, lse_ref, delta_ref, dq_ref, dqt_ref = rest
  iq = pl.program_id(2)
  q, qt, c, ga, lse, delta = q_ref[...], qt_ref[...], c_ref[...], ga_ref[...], lse_ref[...], delta_ref[...]

  def body(ik, carry):
    dq, dqt = carry
    start = pl.multiple_of(ik * bk, bk)
    cols = pl.ds(start, bk)
    kb, ktb = k_ref[cols, :], kt_ref[cols, :]
    s, theta = _tile(q, kb, b_ref[:, cols], qt, ktb, c, m_ref, causal, scale, iq * bq, start, False, mask_keys,
                     bq, bk, None, cols)
    ds, dtheta, _, _ = _grad_tile(jnp.exp(s - lse), theta, ga, va_ref[cols, :], vb_ref[cols, :], delta)
    nn = lambda w, x: jnp.dot(w.astype(x.dtype), x, preferred_element_type=_F32)
    return dq + nn(ds, kb), dqt + nn(dtheta, ktb)

  upper = jnp.minimum(nk, ((iq + 1) * bq + bk - 1) // bk) if causal else nk
  dq, dqt = jax.lax.fori_loop(0, upper, body, (jnp.zeros(q.shape, _F32), jnp.zeros(qt.shape, _F32)))
  dq_ref[...], dqt_ref[...] = dq * scale, dqt


# ----------------------------------------------------------------------------- pallas_call wiring

def _specs(q, k, va, qt, mask, query_block, key_block, bq, bk):
  """BlockSpecs and arguments of (q, k, va, vb, bias, qt, kt, c[, mask]): the query side in blocks of bq
  (`query_block`) or whole, the key side in blocks of bk (`key_block`) or whole."""
  tp, sp = q.shape[2], k.shape[2]
  rows, row_at = (bq, lambda i: i) if query_block else (tp, lambda i: 0)
  cols, col_at = (bk, lambda i: i) if key_block else (sp, lambda i: 0)
  qside = lambda width: flash.block_spec((None, None, rows, width), lambda bb, hh, i: (bb, hh, row_at(i), 0))
  kside = lambda width: flash.block_spec((None, None, cols, width), lambda bb, hh, i: (bb, hh, col_at(i), 0))
  specs = [qside(q.shape[-1]), kside(k.shape[-1]), kside(va.shape[-1]), kside(va.shape[-1]),
           flash.block_spec((None, None, 1, cols), lambda bb, hh, i: (bb, hh, 0, col_at(i))),
           qside(qt.shape[-1]), kside(qt.shape[-1]), flash.block_spec((None, 1, 1), lambda bb, hh, i: (hh, 0, 0))]
  if mask is not None:
    specs.append(flash.mask_spec(mask, rows, cols, row_at, col_at))
  return specs, qside, kside


def _forward(q, k, v, bias, qt, kt, c, mask, causal, scale, half, bq, bk, target):
  """Head-major padded q [b,h,T,D], k [b,h,S,D], v [b,h,S,E] (layout [re, im, pad]), bias [b,h,1,S] f32,
  qt [b,h,T,F], kt [b,h,S,F], c [h] f32, mask int8 or None -> (out [b,h,T,E] in v's dtype, lse [b,h,T,1])."""
  b, h, tp, _ = q.shape
  e = v.shape[-1]
  specs, qside, _ = _specs(q, k, v, qt, mask, True, False, bq, bk)
  args = [q, k, v, _rotate(v, half), bias, qt, kt, c.reshape(-1, 1, 1)] + ([] if mask is None else [mask])
  kernel = functools.partial(_fwd_kernel, causal=causal, scale=scale, bq=bq, bk=bk, nk=k.shape[2] // bk,
                             has_mask=mask is not None, mask_keys=mask is not None and mask.shape[3] > 1)
  return flash.pallas_call(
      kernel, target, grid=(b, h, tp // bq), in_specs=specs, out_specs=[qside(e), qside(1)],
      out_shape=[jax.ShapeDtypeStruct((b, h, tp, e), v.dtype), jax.ShapeDtypeStruct((b, h, tp, 1), _F32)],
      name="attngeo_phase_fwd")(*args)


def _backward(q, k, v, bias, qt, kt, c, mask, out, lse, dout, causal, scale, half, bq, bk, target):
  """(dq, dk, dv, dbias, dqt_raw, dkt_raw), float32, `_raw`: without the factor c."""
  b, h, tp, _ = q.shape
  sp, e = k.shape[2], v.shape[-1]
  delta = jnp.sum(dout.astype(_F32) * out.astype(_F32), -1, keepdims=True)              # [b,h,T,1]
  ga = dout.astype(v.dtype)
  inputs = [q, k, v, _rotate(v, half), bias, qt, kt, c.reshape(-1, 1, 1)] + ([] if mask is None else [mask])
  has_mask = mask is not None

  specs, qside, kside = _specs(q, k, v, qt, mask, False, True, bq, bk)
  kernel = functools.partial(_dkv_kernel, causal=causal, scale=scale, bq=bq, bk=bk, nq=tp // bq, has_mask=has_mask,
                             mask_rows=has_mask and mask.shape[2] > 1)
  dk, dv, dbias, dkt = flash.pallas_call(
      kernel, target, grid=(b, h, sp // bk), in_specs=specs + [qside(e), qside(e), qside(1), qside(1)],
      out_specs=[kside(k.shape[-1]), kside(e), flash.block_spec((None, None, 1, bk), lambda bb, hh, i: (bb, hh, 0, i)),
                 kside(kt.shape[-1])],
      out_shape=[jax.ShapeDtypeStruct(k.shape, _F32), jax.ShapeDtypeStruct(v.shape, _F32),
                 jax.ShapeDtypeStruct(bias.shape, _F32), jax.ShapeDtypeStruct(kt.shape, _F32)],
      name="attngeo_phase_dkv")(*inputs, ga, -_rotate(ga, half), lse, delta)

  specs, qside, _ = _specs(q, k, v, qt, mask, True, False, bq, bk)
  kernel = functools.partial(_dq_kernel, causal=causal, scale=scale, bq=bq, bk=bk, nk=sp // bk, has_mask=has_mask,
                             mask_keys=has_mask and mask.shape[3] > 1)
  dq, dqt = flash.pallas_call(
      kernel, target, grid=(b, h, tp // bq), in_specs=specs + [qside(e), qside(1), qside(1)],
      out_specs=[qside(q.shape[-1]), qside(qt.shape[-1])],
      out_shape=[jax.ShapeDtypeStruct(q.shape, _F32), jax.ShapeDtypeStruct(qt.shape, _F32)],
      name="attngeo_phase_dq")(*inputs, ga, lse, delta)
  return dq, dk, dv, dbias, dqt, dkt


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11, 12, 13))
def _phase_flash(q, k, v, bias, qt, kt, c, mask, causal, scale, half, bq, bk, target):
  return _forward(q, k, v, bias, qt, kt, c, mask, causal, scale, half, bq, bk, target)[0]


def _phase_flash_fwd(q, k, v, bias, qt, kt, c, mask, causal, scale, half, bq, bk, target):
  out, lse = _forward(q, k, v, bias, qt, kt, c, mask, causal, scale, half, bq, bk, target)
  return out, (q, k, v, bias, qt, kt, c, mask, out, lse)


def _phase_flash_bwd(causal, scale, half, bq, bk, target, res, dout):
  q, k, v, bias, qt, kt, c, mask, out, lse = res
  dq, dk, dv, dbias, dqt_raw, dkt_raw = _backward(q, k, v, bias, qt, kt, c, mask, out, lse, dout, causal, scale,
                                                  half, bq, bk, target)
  ch = c[None, :, None, None]
  dc = jnp.sum(qt.astype(_F32) * dqt_raw, (0, 2, 3))              # Σ_ij dθ_ij qt_i·kt_j = Σ_i qt_i·(dθ·kt)_i
  return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dbias, (dqt_raw * ch).astype(qt.dtype),
          (dkt_raw * ch).astype(kt.dtype), dc.astype(c.dtype), None)


_phase_flash.defvjp(_phase_flash_fwd, _phase_flash_bwd)


def pallas_phase_attention(q, k, v, bias, qt, kt, c, mask, causal, scale, block_size, *, interpret=None):
  """`y_i = Σ_j P_ij e^{iθ_ij} v_j` by the Pallas flash kernels; the blockwise phase kernel's call.

  q: [b, t, h, d]; k: [b, s, h, d]; v: [b, s, h, e], e even, complex pairs (2c, 2c+1); bias: [b, s, h] or
  None; qt: [b, t, h, f]; kt: [b, s, h, f]; c: [h] float32 (θ_ij = c_h·qt_i·kt_j); mask: bool broadcastable
  to [b, h, t, s] or None; causal: top-left aligned; block_size: the bound on both blocks (`phase_layout`).
  interpret: None = interpret mode unless the backend is GPU or TPU. Returns [b, t, h, e] in v's dtype
  (fully masked rows are left to the caller: `phase_attention` zeroes them). Reverse-mode gradients for
  q, k, v, bias, qt, kt and c (a custom VJP).
  """
  backend = flash.backend()
  if interpret is None:
    interpret = backend not in ("gpu", "tpu")
  b, t, h, d = q.shape
  s, e, f = k.shape[1], v.shape[-1], qt.shape[-1]
  target = "cpu" if interpret else backend
  bq, bk, dp, fp, ep = phase_layout(target, t, s, d, f, e, int(block_size), jnp.dtype(q.dtype).itemsize)
  tp, sp = flash.round_up(t, bq), flash.round_up(s, bk)
  head_major = lambda x, n, width: jnp.pad(jnp.transpose(x, (0, 2, 1, 3)),
                                           ((0, 0), (0, 0), (0, n - x.shape[1]), (0, width - x.shape[-1])))
  v_ri = jnp.concatenate([v[..., 0::2], v[..., 1::2]], -1)                      # layout [re, im]
  bias_t, mask = flash.key_bias_and_mask(bias, mask, b, h, t, s, tp, sp)
  out = _phase_flash(head_major(q, tp, dp), head_major(k, sp, dp), head_major(v_ri, sp, ep), bias_t,
                     head_major(qt, tp, fp), head_major(kt, sp, fp), jnp.asarray(c, _F32), mask, bool(causal),
                     float(scale), e // 2, bq, bk, target)
  out = jnp.transpose(out[:, :, :t, :e], (0, 2, 1, 3))
  return jnp.stack([out[..., :e // 2], out[..., e // 2:]], -1).reshape(out.shape)        # interleaved pairs
