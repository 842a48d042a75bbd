"""The magnetic operator's pair-scheduled blockwise kernel: blocks (I, J) and (J, I) computed together.

Self-attention whose magnitude logits are a SYMMETRIC Gram plus a key bias and whose phase is
ANTISYMMETRIC — exactly the magnetic operator CMAP (`operators.magnetic_transport`):

    L_ij = s·x_i·y_j + bias_j,   x_i·y_j = x_j·y_i        (the magnitude P(β, α = 0): `operators.augment`)
    θ_ij = c·(u_i·w_j − u_j·w_i) = −θ_ji                   (CMAP: u = q, w = k, c = γ s/2)
    y_i  = Σ_j softmax_j(L_i·)_j e^{iθ_ij} v_j              (v: complex channel pairs, layout [re, im])

The generic kernel (`kernels.phase_attention`, implementation "blockwise") treats every key block
of every query block on its own: per block 5 products with a 64-wide operand forward and 13
backward (θ is a rank-2d form). Here the n/B key blocks are visited in unordered pairs {I, J}: one
Gram block `G = x_I y_Jᵀ` gives the magnitude logits of both directions (`L_JI = s Gᵀ + bias_I`), the
two products `A = u_I w_Jᵀ`, `Ā = w_I u_Jᵀ` give `θ_IJ = c(A − Ā)` and `θ_JI = −θ_IJᵀ`, and one sincos
serves both. Per pair: 3 + 4 products forward, 3 + 14 backward — 12 per block instead of 18 (ATTN:
7). Diagonal blocks (I, I) are one block each (`θ_II = c(A − Aᵀ)`, one phase product).

Forward: diagonal blocks give each row its first online-softmax state (max m, normaliser l, output
o); a scan over the pairs I < J then updates rows I with block (I, J) and rows J with block (J, I)
(held in the [I, J] layout, transposed, never formed). Backward recomputes each block from the saved
`lse = m + log l` (as `kernels._flash_bwd`): with `G_a = dO` in layout [re, im], `G_b = [im, −re]`,

    dv_j += (P cos θ)ᵀ G_a + (P sin θ)ᵀ G_b,   a = G_a·v_aᵀ,  b = −G_a·v_bᵀ,
    dL = P ⊙ (cos θ·a − sin θ·b − rowsum(dO ⊙ O)),      dθ = −P ⊙ (sin θ·a + cos θ·b),

and the pair's shared blocks collect both directions: `dG = s(dL_IJ + dL_JIᵀ)`,
`dA = c(dθ_IJ − dθ_JIᵀ)`, `dĀ = −dA`.

Gradient convention: the function differentiated is the one computed — the (J, I) logits ARE
`s·(x_I y_Jᵀ)ᵀ` — so the separate gradients for x and y are those of the symmetric form; composed
with a map `(q, k) ↦ (x, y)` that keeps the Gram symmetric (every `augment(β, α = 0)`), the
gradients for q and k are exact (tested against the dense path). Do not call it with a
non-symmetric Gram. Causal: block (I, J), I < J, is entirely in the future and is skipped.
O(n) memory: the carries are [b, h, n, ·] arrays; no more than one [B, B] block exists.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attngeo.kernels import _NEG, _blocks, _unblocks, apply_masks, sincos

_F32 = jnp.float32


def _dot(spec, a, b):
  return jnp.einsum(spec, a, b, preferred_element_type=_F32)


def _pairs(nb: int):
  """Static (I, J) index arrays of the unordered block pairs I < J."""
  i, j = np.triu_indices(nb, 1)
  return jnp.asarray(i, jnp.int32), jnp.asarray(j, jnp.int32)


def _take(x, i, size):
  """Block i of [b, h, n, ...] along the token axis."""
  return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=2)


def _put(x, i, size, block):
  return jax.lax.dynamic_update_slice_in_dim(x, block.astype(x.dtype), i * size, axis=2)


def _mask_tile(mask, i, j, size):
  """Mask block rows i, columns j of a [mb, mh, n, n] mask (None passes through)."""
  if mask is None:
    return None
  return jax.lax.dynamic_slice(mask, (0, 0, i * size, j * size), mask.shape[:2] + (size, size))


def _split_values(v):
  """Layout [re, im] -> (v_a, v_b) = ([re, im], [−im, re])."""
  re, im = jnp.split(v, 2, -1)
  return v, jnp.concatenate([-im, re], -1)


def _pair_tiles(x, y, u, w, c, i, j, size, scale):
  """Shared blocks of the pair (I, J): s·Gram [I, J], θ_IJ, sin, cos and the raw phase A − Ā."""
  g = _dot("bhad,bhcd->bhac", _take(x, i, size), _take(y, j, size)) * scale
  raw = (_dot("bhad,bhcd->bhac", _take(u, i, size), _take(w, j, size))
         - _dot("bhad,bhcd->bhac", _take(w, i, size), _take(u, j, size)))
  theta = raw * c[None, :, None, None]
  sin, cos = sincos(theta)
  return g, raw, sin, cos


def _diag_tiles(x, y, u, w, bias, c, mask, causal, i, size, scale):
  """Logits L_II (masked), raw phase A − Aᵀ, sin, cos of the diagonal block I."""
  g = _dot("bhad,bhcd->bhac", _take(x, i, size), _take(y, i, size)) * scale
  a = _dot("bhad,bhcd->bhac", _take(u, i, size), _take(w, i, size))
  raw = a - jnp.swapaxes(a, -1, -2)
  logits = apply_masks(g + _take(bias, i, size)[:, :, None, :], _mask_tile(mask, i, i, size), causal, i * size,
                       i * size)
  sin, cos = sincos(raw * c[None, :, None, None])
  return logits, raw, sin, cos


def _fwd_impl(x, y, u, w, v, bias, c, mask, causal, scale, size):
  """x, y [b,h,n,D]; u, w [b,h,n,F]; v [b,h,n,e] layout [re, im]; bias [b,h,n] f32; c [h]
  -> out [b,h,n,e], lse [b,h,n]."""
  nb = x.shape[2] // size
  va, vb = _split_values(v)
  pv = lambda p, vals: _dot("bhqk,bhke->bhqe", p.astype(v.dtype), vals)
  pv_t = lambda p, vals: _dot("bhkq,bhke->bhqe", p.astype(v.dtype), vals)   # p held as [keys, queries]

  def diagonal(i):
    logits, _, sin, cos = _diag_tiles(x, y, u, w, bias, c, mask, causal, i, size, scale)
    mx = logits.max(-1)
    p = jnp.exp(logits - mx[..., None])
    o = pv(p * cos, _take(va, i, size)) + pv(p * sin, _take(vb, i, size))
    return o, mx, p.sum(-1)

  o, mx, l = (_unblocks(t) for t in jax.lax.map(diagonal, jnp.arange(nb)))

  def update(state, i, logits, axis, contrib):
    """Online-softmax update of rows i with a block of logits whose key axis is `axis`."""
    o, mx, l = state
    o_i, mx_i, l_i = _take(o, i, size), _take(mx, i, size), _take(l, i, size)
    mx_new = jnp.maximum(mx_i, logits.max(axis))
    p = jnp.exp(logits - jnp.expand_dims(mx_new, axis))
    corr = jnp.exp(mx_i - mx_new)
    o_i = o_i * corr[..., None] + contrib(p)
    return _put(o, i, size, o_i), _put(mx, i, size, mx_new), _put(l, i, size, l_i * corr + p.sum(axis))

  def pair(state, ij):
    i, j = ij
    g, _, sin, cos = _pair_tiles(x, y, u, w, c, i, j, size, scale)
    if not causal:                                  # rows I, keys J: entirely in the future when causal
      logits = apply_masks(g + _take(bias, j, size)[:, :, None, :], _mask_tile(mask, i, j, size), False)
      state = update(state, i, logits, -1,
                     lambda p: pv(p * cos, _take(va, j, size)) + pv(p * sin, _take(vb, j, size)))
    # rows J, keys I, held as [I, J]: θ_JI = −θ_IJᵀ, so sin flips sign and cos stays.
    mask_t = None if mask is None else jnp.swapaxes(_mask_tile(mask, j, i, size), -1, -2)
    logits_t = apply_masks(g + _take(bias, i, size)[:, :, :, None], mask_t, False)
    state = update(state, j, logits_t, -2,
                   lambda p: pv_t(p * cos, _take(va, i, size)) - pv_t(p * sin, _take(vb, i, size)))
    return state, None

  if nb > 1:
    (o, mx, l), _ = jax.lax.scan(pair, (o, mx, l), _pairs(nb))
  return (o / l[..., None]).astype(v.dtype), mx + jnp.log(l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(8, 9, 10))
def _pair_flash(x, y, u, w, v, bias, c, mask, causal, scale, size):
  return _fwd_impl(x, y, u, w, v, bias, c, mask, causal, scale, size)[0]


def _pair_flash_fwd(x, y, u, w, v, bias, c, mask, causal, scale, size):
  out, lse = _fwd_impl(x, y, u, w, v, bias, c, mask, causal, scale, size)
  return out, (x, y, u, w, v, bias, c, mask, out, lse)


def _direction_grads(p, sin, cos, ga_r, gb_r, va_k, vb_k, delta_r, transposed):
  """One direction of a block: (dv of its keys, dL, dθ), every [·,·] array in the block's layout.

  `transposed=False`: p is [rows, keys]. `True`: p is [keys, rows] and (sin, cos) are the other
  direction's (θ here = −θ_thereᵀ), so sin enters with its sign flipped.
  """
  sin = -sin if transposed else sin
  pc, ps = p * cos, p * sin
  if transposed:
    dv = _dot("bhkq,bhqe->bhke", pc, ga_r) + _dot("bhkq,bhqe->bhke", ps, gb_r)
    a = _dot("bhke,bhqe->bhkq", va_k, ga_r)
    b = -_dot("bhke,bhqe->bhkq", vb_k, ga_r)
    dl = p * (cos * a - sin * b - delta_r[:, :, None, :])
  else:
    dv = _dot("bhqk,bhqe->bhke", pc, ga_r) + _dot("bhqk,bhqe->bhke", ps, gb_r)
    a = _dot("bhqe,bhke->bhqk", ga_r, va_k)
    b = -_dot("bhqe,bhke->bhqk", ga_r, vb_k)
    dl = p * (cos * a - sin * b - delta_r[..., None])
  dtheta = -(ps * a + pc * b)
  return dv, dl, dtheta


def _pair_flash_bwd(causal, scale, size, res, dout):
  x, y, u, w, v, bias, c, mask, out, lse = res
  f32 = lambda t: t.astype(_F32)
  xf, yf, uf, wf = f32(x), f32(y), f32(u), f32(w)
  nb = x.shape[2] // size
  delta = jnp.sum(f32(dout) * f32(out), -1)                                           # [b,h,n]
  gr, gi = jnp.split(f32(dout), 2, -1)
  ga, gb = jnp.concatenate([gr, gi], -1), jnp.concatenate([gi, -gr], -1)
  va, vb = _split_values(f32(v))
  cb = c[None, :, None, None]
  blk = lambda t, i: _take(t, i, size)

  def diagonal(i):
    logits, raw, sin, cos = _diag_tiles(x, y, u, w, bias, c, mask, causal, i, size, scale)
    p = jnp.exp(logits - blk(lse, i)[..., None])
    dv, dl, dth = _direction_grads(p, sin, cos, blk(ga, i), blk(gb, i), blk(va, i), blk(vb, i), blk(delta, i),
                                   False)
    d = (dth - jnp.swapaxes(dth, -1, -2)) * cb                       # dA for A = u_I w_Iᵀ (θ = c(A − Aᵀ))
    return (_dot("bhqk,bhkd->bhqd", dl, blk(yf, i)) * scale, _dot("bhqk,bhqd->bhkd", dl, blk(xf, i)) * scale,
            _dot("bhqk,bhkd->bhqd", d, blk(wf, i)), _dot("bhqk,bhqd->bhkd", d, blk(uf, i)),
            dv, dl.sum(2), jnp.sum(dth * raw, (0, 2, 3)))

  dx, dy, du, dw, dv, dbias, dcs = jax.lax.map(diagonal, jnp.arange(nb))
  grads = tuple(_unblocks(t) for t in (dx, dy, du, dw, dv, dbias)) + (dcs.sum(0),)

  def pair(carry, ij):
    i, j = ij
    dx, dy, du, dw, dv, dbias, dc = carry
    g, raw, sin, cos = _pair_tiles(x, y, u, w, c, i, j, size, scale)
    add = lambda t, k, block: _put(t, k, size, _take(t, k, size) + block)
    # rows J, keys I (held as [I, J])
    mask_t = None if mask is None else jnp.swapaxes(_mask_tile(mask, j, i, size), -1, -2)
    p_t = jnp.exp(apply_masks(g + blk(bias, i)[:, :, :, None], mask_t, False) - blk(lse, j)[:, :, None, :])
    dv_i, dl, dth_t = _direction_grads(p_t, sin, cos, blk(ga, j), blk(gb, j), blk(va, i), blk(vb, i),
                                       blk(delta, j), True)
    dv = add(dv, i, dv_i)
    dbias = add(dbias, i, dl.sum(-1))
    dth = -dth_t                                                      # dθ_IJ from θ_JI = −θ_IJᵀ
    if not causal:                                                    # rows I, keys J
      p = jnp.exp(apply_masks(g + blk(bias, j)[:, :, None, :], _mask_tile(mask, i, j, size), False)
                  - blk(lse, i)[..., None])
      dv_j, dl_ij, dth_ij = _direction_grads(p, sin, cos, blk(ga, i), blk(gb, i), blk(va, j), blk(vb, j),
                                             blk(delta, i), False)
      dv = add(dv, j, dv_j)
      dbias = add(dbias, j, dl_ij.sum(2))
      dl, dth = dl + dl_ij, dth + dth_ij
    dg = dl * scale                                                   # G = x_I y_Jᵀ serves both directions
    da = dth * cb                                                     # A = u_I w_Jᵀ; Ā = w_I u_Jᵀ gets −da
    dx = add(dx, i, _dot("bhac,bhcd->bhad", dg, blk(yf, j)))
    dy = add(dy, j, _dot("bhac,bhad->bhcd", dg, blk(xf, i)))
    du = add(add(du, i, _dot("bhac,bhcd->bhad", da, blk(wf, j))), j, -_dot("bhac,bhad->bhcd", da, blk(wf, i)))
    dw = add(add(dw, j, _dot("bhac,bhad->bhcd", da, blk(uf, i))), i, -_dot("bhac,bhcd->bhad", da, blk(uf, j)))
    return (dx, dy, du, dw, dv, dbias, dc + jnp.sum(dth * raw, (0, 2, 3))), None

  if nb > 1:
    grads, _ = jax.lax.scan(pair, grads, _pairs(nb))
  dx, dy, du, dw, dv, dbias, dc = grads
  return (dx.astype(x.dtype), dy.astype(y.dtype), du.astype(u.dtype), dw.astype(w.dtype), dv.astype(v.dtype),
          dbias.astype(bias.dtype), dc.astype(c.dtype), None)


_pair_flash.defvjp(_pair_flash_fwd, _pair_flash_bwd)


@functools.partial(jax.jit, static_argnums=(8, 9, 10))
def pair_phase_attention(x, y, u, w, v, bias, c, mask, causal, scale, block_size):
  """`y_i = Σ_j softmax_j(s·x_i·y_j + bias_j) e^{iθ_ij} v_j`, `θ_ij = c_h(u_i·w_j − u_j·w_i)` (module doc).

  x, y: [b, n, h, D] with x_i·y_j symmetric in (i, j); u, w: [b, n, h, F]; v: [b, n, h, e], e even,
  complex pairs (2c, 2c+1); bias: [b, n, h] or None; c: [h] float32; mask: bool [b|1, h|1, n, n] or
  None; causal: bool; scale: float; block_size: B. Pads n to a multiple of B (padded keys get bias
  −∞). Returns [b, n, h, e] in v's dtype (float32 accumulation; a fully masked row is garbage here —
  the caller zeroes it, as `kernels.phase_attention` does).
  """
  b, n, h, _ = x.shape
  size = min(block_size, n)
  npad = -(-n // size) * size
  head_major = lambda t: jnp.pad(jnp.transpose(t, (0, 2, 1, 3)), ((0, 0), (0, 0), (0, npad - n), (0, 0)))
  vh = jnp.concatenate([v[..., 0::2], v[..., 1::2]], -1)                       # layout [re, im]
  bias_t = jnp.zeros((b, h, n), _F32) if bias is None else jnp.transpose(bias, (0, 2, 1)).astype(_F32)
  bias_t = jnp.pad(bias_t, ((0, 0), (0, 0), (0, npad - n)), constant_values=_NEG)
  if mask is not None:
    mb = jnp.broadcast_to(mask, (mask.shape[0], mask.shape[1], n, n))
    mask = jnp.pad(mb, ((0, 0), (0, 0), (0, npad - n), (0, npad - n)))
  out = _pair_flash(*(head_major(t) for t in (x, y, u, w, vh)), bias_t, c, mask, causal, scale, size)
  out = jnp.transpose(out[:, :, :n], (0, 2, 1, 3))
  half = out.shape[-1] // 2
  return jnp.stack([out[..., :half], out[..., half:]], -1).reshape(out.shape)
