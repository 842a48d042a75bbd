"""Phase attention, the magnetic operator's one-sided kernels (`attngeo.operators.magnetic_transport`):

    y_i = Σ_j P_ij e^{iθ_ij} v_j,   P_ij = softmax_j(scale·q_i·k_j + bias_j, masked),   θ_ij = c_h·qt_i·kt_j,

with the value channel pairs (2c, 2c+1) of v read as complex numbers v_re + i·v_im. Inside the kernels
the pairs are split into the layout [re (e/2), im (e/2)]: `va = [v_re, v_im]`, `vb = [−v_im, v_re]`, so
`y = (P cos θ)·va + (P sin θ)·vb` in that layout (two real matmuls, float32 accumulation).
Backward, with G = dy = G_re + i·G_im, `ga = [G_re, G_im]`, `gb = [G_im, −G_re]`:
  A_ij = conj(G_i)·v_j:  Re A = ga·va,  Im A = −ga·vb;
  dP_ij = Re(e^{iθ_ij} A_ij) = cos·Re A − sin·Im A,   dL_ij = P_ij (dP_ij − δ_i),   δ_i = Re⟨G_i, y_i⟩;
  dθ_ij = Re(i P_ij e^{iθ_ij} A_ij) = −P_ij (sin·Re A + cos·Im A);
  dv_j = Σ_i P_ij e^{−iθ_ij} G_i = (P cos θ)ᵀ·ga + (P sin θ)ᵀ·gb   (layout [re, im]).
dL gives dq, dk, dbias exactly as in `softmax._flash_bwd`; dθ gives dqt = c·dθ·kt, dkt = c·dθᵀ·qt, dc = Σ dθ ⊙ (qt·kt) = Σ_i qt_i·(dθ·kt)_i.

Two kernels here (chosen by `attngeo.kernels.dispatch.choose`, kind "phase"): `"einsum"` (dense, a custom
VJP from the saved P, P cos θ and P sin θ) and `"blockwise"` (the online softmax of
`_blocks.online_softmax` with the phase in its accumulation, and a recomputing custom VJP: O(n) memory;
under the causal order both passes skip the blocks wholly above the diagonal, `_blocks.live_block`);
`"pallas"`, the blockwise kernel in Pallas, is `attngeo.kernels.pallas_phase` (run only when named).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from attngeo.kernels._blocks import (apply_masks, block_logits, check_block_size, check_mask, column_sum, join_blocks,
                                     live_block, online_softmax, split_blocks, tile, untile, when_live,
                                     zero_empty_rows)
from attngeo.kernels.dispatch import TILE, choose, chosen_block
from attngeo.kernels.pallas_phase import pallas_phase_attention

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


def split_pairs(v):
  """[..., e] with complex pairs (2c, 2c+1) -> (va, vb) = ([re, im], [−im, re]) in float layout [..., e]."""
  re, im = v[..., 0::2], v[..., 1::2]
  return jnp.concatenate([re, im], -1), jnp.concatenate([-im, re], -1)


def join_pairs(y):
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
  va, vb = split_pairs(v)
  pv = lambda w, x: jnp.einsum("bhts,bshe->bthe", w.astype(v.dtype), x, preferred_element_type=jnp.float32)
  out = join_pairs(pv(pc, va) + pv(ps, vb)).astype(v.dtype)
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
  ga, rot = split_pairs(f32(dout))
  gb = -rot                                                                     # [G_im, −G_re]
  va, vb = split_pairs(f32(v))
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
  return (dq.astype(q.dtype), dk.astype(k.dtype), join_pairs(dv).astype(v.dtype), dbias,
          (dqt_raw * ch).astype(qt.dtype), (dkt_raw * ch).astype(kt.dtype),
          _coupling_grad(qt, dqt_raw, head_axis=2).astype(c.dtype), None)


def _coupling_grad(qt, dqt_raw, head_axis):
  """dc_h = Σ_ij dθ_ij (qt_i·kt_j) = Σ_i qt_i·(Σ_j dθ_ij kt_j): O(n·F) from the query-side product
  `dqt_raw = dθ·kt` (any layout; `head_axis` is kept), where the direct sum reads every n × n block."""
  return jnp.sum(qt.astype(jnp.float32) * dqt_raw, tuple(a for a in range(qt.ndim) if a != head_axis))


_dense_phase.defvjp(_dense_phase_fwd, _dense_phase_bwd)
_einsum_phase = jax.jit(_dense_phase, static_argnums=(8, 9))


def _phase_block(qb, kb, biasb, qtb, ktb, c, mask, causal, scale, iq, ik, bq, bk):
  """Logits s and phases θ = c·qt·kt of one [b, h, bq, bk] block."""
  s = block_logits(qb, kb, biasb, mask, causal, scale, iq, ik, bq, bk)
  raw = jnp.einsum("bhqf,bhkf->bhqk", qtb, ktb, preferred_element_type=jnp.float32)
  return s, raw * c[None, :, None, None]


def _phase_fwd_impl(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk):
  """q [b,h,T,D], k [b,h,S,D], v [b,h,S,e] (layout [re, im]), bias [b,h,S], qt/kt [b,h,·,F], c [h]
  -> out [b,h,T,e] (layout [re, im]), lse [b,h,T]."""
  vr, vi = jnp.split(v, 2, -1)
  va, vb = v, jnp.concatenate([-vi, vr], -1)
  pv = lambda w, x: jnp.einsum("bhqk,bhke->bhqe", w.astype(v.dtype), x, preferred_element_type=jnp.float32)

  def logits(iq, ik, qb, kb):
    return _phase_block(qb[0], kb[0], kb[3], qb[1], kb[4], c, mask, causal, scale, iq, ik, bq, bk)

  def accumulate(o, p, theta, kb):
    sin, cos = sincos(theta)
    return o + pv(p * cos, kb[1]) + pv(p * sin, kb[2])

  out, lse = online_softmax((split_blocks(q, bq), split_blocks(qt, bq)),
                            tuple(split_blocks(x, bk) for x in (k, va, vb, bias, kt)),
                            logits, accumulate, v.shape[-1], v.dtype, causal)
  return join_blocks(out), join_blocks(lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10, 11, 12))
def _phase_flash(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk, bias_grad):
  return _phase_fwd_impl(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk)[0]


def _phase_flash_fwd(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk, bias_grad):
  out, lse = _phase_fwd_impl(q, k, v, bias, qt, kt, c, mask, causal, scale, bq, bk)
  return out, (q, k, v, bias, qt, kt, c, mask, out, lse)


def _phase_flash_bwd(causal, scale, bq, bk, bias_grad, res, dout):
  """Recompute each block of P and θ from the saved log-normaliser (see the derivation above). dk and, where
  the bias is an input, dbias are one product `[s·qᵀ; 1ᵀ]·dS`, as in `softmax._flash_bwd`."""
  q, k, v, bias, qt, kt, c, mask, out, lse = res
  f32 = lambda x: x.astype(jnp.float32)
  delta = jnp.sum(f32(dout) * f32(out), -1)                                          # [b,h,T]
  gr, gi = jnp.split(f32(dout), 2, -1)
  ga, gb = jnp.concatenate([gr, gi], -1), jnp.concatenate([gi, -gr], -1)
  vr, vi = jnp.split(f32(v), 2, -1)
  va, vb = jnp.concatenate([vr, vi], -1), jnp.concatenate([-vi, vr], -1)
  qbs, qtbs, lses, deltas = split_blocks(q, bq), split_blocks(qt, bq), split_blocks(lse, bq), split_blocks(delta, bq)
  gabs, gbbs = split_blocks(ga, bq), split_blocks(gb, bq)
  # key-side sums accumulate feature-major (`_blocks.column_sum`): the query side's blocks transposed once
  qbs_t, qtbs_t, gabs_t, gbbs_t = (jnp.swapaxes(x, -1, -2).astype(jnp.float32) for x in (qbs, qtbs, gabs, gbbs))
  qbs_t = qbs_t * scale
  if bias_grad:                                                    # [s·qᵀ; 1ᵀ]: dk and dbias in one product
    qbs_t = jnp.concatenate([qbs_t, jnp.ones(qbs_t.shape[:3] + (1, bq), jnp.float32)], 3)
  nq, d = qbs.shape[0], q.shape[-1]

  def per_key_block(carry, args):
    dq_acc, dqt_acc = carry
    ik, kb, ktb, vab, vbb, biasb = args

    def step(carry, iq):
      def update(carry):
        dk_t, dkt_t, dv_t = carry
        qb, qtb, gab = qbs[iq], qtbs[iq], gabs[iq]
        s, theta = _phase_block(qb, kb, biasb, qtb, ktb, c, mask, causal, scale, iq, ik, bq, bk)
        p = jnp.exp(s - lses[iq][..., None])
        sin, cos = sincos(theta)
        pc, ps = p * cos, p * sin
        dv_t = dv_t + column_sum(gabs_t[iq], pc) + column_sum(gbbs_t[iq], ps)
        are = jnp.einsum("bhqe,bhke->bhqk", gab, vab)
        aim = -jnp.einsum("bhqe,bhke->bhqk", gab, vbb)
        ds = p * (cos * are - sin * aim - deltas[iq][..., None])
        dtheta = -(ps * are + pc * aim)
        dq_blk = jnp.einsum("bhqk,bhkd->bhqd", ds, f32(kb)) * scale
        dk_t = dk_t + column_sum(qbs_t[iq], ds)
        dqt_blk = jnp.einsum("bhqk,bhkf->bhqf", dtheta, f32(ktb))                # without c: dc needs it raw
        dkt_t = dkt_t + column_sum(qtbs_t[iq], dtheta)
        return (dk_t, dkt_t, dv_t), (dq_blk, dqt_blk)
      zeros = lambda x: jnp.zeros(x.shape[1:], jnp.float32)
      skipped = lambda carry: (carry, (zeros(qbs), zeros(qtbs)))
      return when_live(live_block(causal, iq, ik, bq, bk), update, skipped, carry)

    b, h = kb.shape[:2]
    zeros_t = lambda x: jnp.zeros((b, h, x.shape[-1], bk), jnp.float32)
    init = (jnp.zeros((b, h, qbs_t.shape[3], bk), jnp.float32), zeros_t(ktb), zeros_t(vab))
    (dk_t, dkt_t, dv_t), (dq_blocks, dqt_blocks) = jax.lax.scan(step, init, jnp.arange(nq))
    dbias = dk_t[:, :, d] if bias_grad else jnp.zeros((b, h, bk), jnp.float32)
    dk_t = dk_t[:, :, :d]
    back = lambda x: jnp.swapaxes(x, -1, -2)
    return (dq_acc + join_blocks(dq_blocks), dqt_acc + join_blocks(dqt_blocks)), (back(dk_t), back(dkt_t), back(dv_t), dbias)

  (dq, dqt_raw), (dks, dkts_raw, dvs, dbiases) = jax.lax.scan(
      per_key_block, (jnp.zeros(q.shape, jnp.float32), jnp.zeros(qt.shape, jnp.float32)),
      (jnp.arange(k.shape[2] // bk), split_blocks(k, bk), split_blocks(kt, bk), split_blocks(va, bk), split_blocks(vb, bk),
       split_blocks(bias, bk)))
  ch = c[None, :, None, None]
  return (dq.astype(q.dtype), join_blocks(dks).astype(k.dtype), join_blocks(dvs).astype(v.dtype),
          join_blocks(dbiases).astype(bias.dtype), (dqt_raw * ch).astype(qt.dtype),
          (join_blocks(dkts_raw) * ch).astype(kt.dtype), _coupling_grad(qt, dqt_raw, head_axis=1).astype(c.dtype), None)


_phase_flash.defvjp(_phase_flash_fwd, _phase_flash_bwd)


@functools.partial(jax.jit, static_argnums=(8, 9, 10))
def _blockwise_phase(q, k, v, bias, qt, kt, c, mask, causal, scale, block_size):
  """Flash-style phase attention in pure JAX on lengths padded to whole blocks (`_blocks.tile`)."""
  vh = jnp.concatenate([v[..., 0::2], v[..., 1::2]], -1)                        # layout [re, im]
  tl = tile((q, qt), (k, vh, kt), bias, mask, block_size)
  (qh, qth), (kh, vh, kth) = tl.queries, tl.keys
  out = _phase_flash(qh, kh, vh, tl.bias, qth, kth, c, tl.mask, causal, scale, tl.bq, tl.bk, bias is not None)
  return join_pairs(untile(out, q.shape[1]))


def phase_attention(q, k, v, qt, kt, coupling, *, bias=None, mask=None, causal=False, scale=None,
                    implementation=None, block_size=None):
  """Attention with a U(1) phase on the values: `y_i = Σ_j P_ij e^{iθ_ij} v_j` (the magnetic operator's kernel).

  `P_ij = softmax_j(scale·q_i·k_j + bias_j, masked)` exactly as in `attention`; `θ_ij = c_h·qt_i·kt_j`
  with the per-head coupling `c`; value channel pairs `(v[..., 2c], v[..., 2c+1])` are the real and
  imaginary parts of complex values (the output uses the same pairing).

  q: [b, t, h, D]; k: [b, s, h, D]; v: [b, s, h, e], e even; qt: [b, t, h, F]; kt: [b, s, h, F];
  coupling: scalar or [h]; bias: [b, s, h] or None; mask: bool, broadcastable to [b, h, t, s].
  implementation: "einsum" (materialises [b, h, t, s]; custom VJP from the saved P, P cos θ and
  P sin θ, nothing recomputed) | "blockwise" (online softmax, recomputing custom VJP, O(n) memory) |
  "pallas" (`attngeo.kernels.pallas_phase`: the blockwise kernel as Pallas flash kernels; only when named) |
  None (`dispatch.choose`: einsum below 512 keys, else blockwise). block_size: the blockwise and Pallas
  kernels' block bound; None: `dispatch.block_size_for(b·h, "phase")` blockwise, `TILE` (512) on Pallas. All give
  gradients for q, k, v, bias, qt, kt and the coupling, in reverse mode only (custom VJPs: `jax.jvp` through them raises).
  Returns [b, t, h, e] in v's dtype, float32 accumulation; a query row whose keys are all masked (by
  the mask and the causal order together) returns 0.
  """
  check_mask(mask)
  if block_size is not None:
    check_block_size(block_size)
  implementation = choose("phase", implementation, k.shape[1])
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  c = jnp.broadcast_to(jnp.asarray(coupling, jnp.float32), (q.shape[2],))
  if implementation == "einsum":
    out = _einsum_phase(q, k, v, bias, qt, kt, c, mask, causal, scale)
  elif implementation == "pallas":
    out = pallas_phase_attention(q, k, v, bias, qt, kt, c, mask, causal, scale,
                                 check_block_size(TILE if block_size is None else block_size))
  else:
    block = chosen_block(block_size, q.shape[0] * q.shape[2], "phase")
    out = _blockwise_phase(q, k, v, bias, qt, kt, c, mask, causal, scale, block)
  return zero_empty_rows(out, mask, causal, k.shape[1])
