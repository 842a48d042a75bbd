"""The paired (Hermitian) kernel of the magnetic operator CMAP at β = 0: each unordered token pair once.

At β = 0 CMAP's magnitude is DMAP's Gaussian kernel (`operators` module docstring). With
`m = (q + k)/√2`, `n = (q − k)/√2`, `s` the logit scale and `c = γ s/2`:

    G_ij = exp(−¼ s ‖m_i − m_j‖²) = exp(½ s m_i·m_j − a_i − a_j),   a_i = ¼ s ‖m_i‖²,
    θ_ij = c (n_i·m_j − m_i·n_j)          (= c (q_i·k_j − k_i·q_j)),
    H = G ⊙ e^{iθ},   D_i = Σ_j G_ij,    y_i = (Σ_j H_ij v_j) / D_i,

which is `operators.magnetic_transport(..., beta=0)` (K = G/D is DMAP's rownorm(exp L)). G is symmetric
and θ antisymmetric, so H is Hermitian: one block of it between token sets A and B serves both sides —
rows A receive `H_AB v_B`, rows B receive `H_ABᴴ v_A`, and its row and column sums go to D_A and D_B.
The sequence is cut into T tiles of t tokens (halving while a part is even and longer than
`block_size`, `tiling`): each pair of distinct tiles (a < b) is one such block, visited once by a `lax.scan`, and each
diagonal tile is computed one-sided (all its entries, batched). Every unordered token pair is computed
once.

Cost, in units of one n × n product 64 wide (head dim 64): a pair tile costs 21 per unit of area (7
forward: G's Gram 1, θ 2, the two value products 4; 14 backward: B 4, dv 4, the m, n gradients 6), a
diagonal tile 15 (as `phase._dense_phase`), ATTN 6 (dense) or 7 (blockwise, recomputing). With T
tiles the pair tiles cover (T − 1)/(2T) of the n² entries and the diagonal tiles 1/T: 12.75 units at
T = 2 (1024 keys, tiles of 512); at T = 4 and 8 (2048, 4096 keys), where the backward recomputes the
pair tiles (3 more per unit of their area), 12.75 and 12.4 — against the one-sided kernels' 15
(einsum) and 18 (blockwise). Sums over a tile's row axis (the key side: `H_abᴴ v_a`, the key-side
gradients) accumulate feature-major, `[B, f, n]`, so their products read the n × n tile untransposed;
contracting its row axis instead runs 2.3× slower on XLA:CPU.

Backward, from cotangents (gY, gD) of the unnormalised sums (Y_i = Σ_j H_ij v_j, D_i), complex values
in the realified layout `[re, im]`:

    B_ij = conj(gY_i)·v_j + gY_j·conj(v_i)           (second term: pair tiles only)
    Φ_ij = ∂L/∂log G_ij = Re(B_ij H_ij) + G_ij (gD_i + gD_j)   (gD_j: pair tiles only)
    Θ_ij = ∂L/∂θ_ij = −Im(B_ij H_ij)
    dv_j += conj(H_ij) gY_i,   dv_i += H_ij gY_j       (second: pair tiles only)
    dm_A = ½ s (Φ m_B − (Φ 1) ⊙ m_A) − c Θ n_B,   dn_A = c Θ m_B,
    dm_B = ½ s (Φᵀ m_A − (Φᵀ 1) ⊙ m_B) + c Θᵀ n_A,  dn_B = −c Θᵀ m_A,
    dc = Σ_ij Θ_ij (n_i·m_j − m_i·n_j) = Σ_i n_i·(Θ m_B)_i − m_i·(Θ n_B)_i      (O(n·d)).

Numerics: G ≤ 1 and G_ii = 1 (enforced against rounding, `_block`), so D_i ≥ 1 — no stabiliser, no
overflow, no empty row. θ goes through `phase.sincos`, float32-accurate for |θ| ≤ 1e3. Everything runs
in float32 (16-bit inputs are upcast; the output is cast to v's dtype). Scope: β = 0, no mask, not
causal — a causal walk pairs nothing (its key j never sees query i > j); those calls take the
one-sided kernels. Memory is O(n·t): the diagonal tiles keep G, C = G cos θ and S = G sin θ for the
backward, the pair tiles too while they are no more (T ≤ 2), else the backward recomputes them. The
tile t is n halved while even and above `block_size`, so it exceeds `block_size` when n is not a
power-of-two multiple of one (n = 1025: one tile, no pairing, n² memory like the einsum kernel).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from attngeo.kernels._blocks import add_slab, check_block_size, feature_major, pair_tasks, slab, tiling
from attngeo.kernels.dispatch import TILE
from attngeo.kernels.phase import join_pairs, sincos, split_pairs

_dot = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


def _rotate(g):
  """[re, im] -> [im, −re] (multiplication by −i in the realified layout)."""
  half = g.shape[-1] // 2
  return jnp.concatenate([g[..., half:], -g[..., :half]], -1)


def _block(mA, mB, pA, qB, c, s, diagonal=False):
  """G, C = G cos θ, S = G sin θ of a block A × B, [B', i, j], from m and the phase heads
  p = [n, m], q = [m, −n] (θ = c p_i·q_j = c (n_i·m_j − m_i·n_j)), c [B'].

  log G = ½ s m_i·m_j − a_i − a_j is −¼ s‖m_i − m_j‖² ≤ 0 up to rounding, which grows with ‖m‖² (at
  |q|, |k| ~ 1e4 it put log G_ii anywhere in [−96, 160]: D underflowed or overflowed): it is clamped at
  0, and on a diagonal tile (A = B) its diagonal is 0 exactly, so G ≤ 1 and D_i ≥ G_ii = 1 hold."""
  aA = 0.25 * s * jnp.sum(mA * mA, -1)
  aB = 0.25 * s * jnp.sum(mB * mB, -1)
  log_g = 0.5 * s * _dot("bid,bjd->bij", mA, mB) - aA[:, :, None] - aB[:, None, :]
  if diagonal:
    log_g = jnp.where(jnp.eye(log_g.shape[-1], dtype=bool), 0.0, log_g)
  g = jnp.exp(jnp.minimum(log_g, 0.0))
  sin, cos = sincos(c[:, None, None] * _dot("bif,bjf->bij", pA, qB))
  return g, g * cos, g * sin


def _saves_pairs(tiles: int) -> bool:
  """Whether the pair tiles' (G, C, S) are kept for the backward: while they take no more memory than the
  diagonal tiles' (T(T − 1)/2 ≤ T: T ≤ 2, T being a power of two), so memory stays O(n·t); beyond, the
  backward recomputes them
  (3 of a pair tile's 24 product units; at 2048 and 4096 keys the two ways timed alike)."""
  return tiles * (tiles - 1) // 2 <= tiles


def _pair_block(m, p, q, c, s, t, a, b):
  """(G, C, S) of the pair tile (a, b): [B, t, t]."""
  return _block(slab(m, a, t), slab(m, b, t), slab(p, a, t), slab(q, b, t), c, s)


def _phase_heads(m, nn):
  """θ's heads `p = [n, m]`, `q = [m, −n]` [B, n, 2d]: θ_ij = c p_i·q_j."""
  return jnp.concatenate([nn, m], -1), jnp.concatenate([m, -nn], -1)


def _rows(cm, sm, x, y):
  """`C x + S y` [B', i, e]: a tile applied along its rows (H v is (C·va + S·vb), layout [re, im])."""
  return _dot("bij,bje->bie", cm, x) + _dot("bij,bje->bie", sm, y)


def _columns(cm, sm, x_t, y_t):
  """`xᵀC + yᵀS` [B', e, j], feature-major: a tile applied along its columns (see `_blocks.feature_major`)."""
  return _dot("bei,bij->bej", x_t, cm) + _dot("bei,bij->bej", y_t, sm)


def _cotangents(br, bi, g, cm, sm, wd):
  """(Φ, Θ) of a tile: `Φ = ∂L/∂log G = Re(B H) + G·wd`, `Θ = ∂L/∂θ = −Im(B H)`, B = br + i·bi, H = C + iS."""
  return br * cm - bi * sm + g * wd, -(br * sm + bi * cm)


def _row_grads(phi, th, mA, mB, nB, hs, cc):
  """The row side A of a tile: (dm_A, dn_A, Θ m_B, Θ n_B) — the last two also give dc."""
  th_m, th_n = _dot("bij,bjf->bif", th, mB), _dot("bij,bjf->bif", th, nB)
  dm = hs * (_dot("bij,bjf->bif", phi, mB) - jnp.sum(phi, -1)[..., None] * mA) - cc * th_n
  return dm, cc * th_m, th_m, th_n


def _column_grads(phi, th, mA_t, nA_t, mB_t, hs, cc):
  """The column side B of a tile, feature-major [B', d, j]: (dm_Bᵀ, dn_Bᵀ)."""
  dm = hs * (_dot("bfi,bij->bfj", mA_t, phi) - jnp.sum(phi, -2)[:, None, :] * mB_t) + cc * _dot("bfi,bij->bfj", nA_t, th)
  return dm, -cc * _dot("bfi,bij->bfj", mA_t, th)


def _tile_coupling_grad(mA, nA, th_m, th_n):
  """dc of a tile [B′]: Σ_ij Θ_ij (n_i·m_j − m_i·n_j) = Σ_i n_i·(Θ m_B)_i − m_i·(Θ n_B)_i (as `phase._coupling_grad`,
  from the products the gradients already made)."""
  return jnp.sum(nA * th_m - mA * th_n, (1, 2))


def _forward(m, nn, v, c, s, block_size):
  """y [B, n, e] (layout [re, im]), D [B, n], the diagonal tiles' (G, C, S) [B·T, t, t] and the pair
  tiles' [P, B, t, t], from m, nn [B, n, d], v [B, n, e] (interleaved pairs), c [B]."""
  bb, n, e = v.shape
  tiles, t = tiling(n, block_size)
  va, vb = split_pairs(v)
  p, q = _phase_heads(m, nn)
  diag = lambda x: x.reshape(bb * tiles, t, x.shape[-1])
  blocks = _block(diag(m), diag(m), diag(p), diag(q), jnp.repeat(c, tiles), s, diagonal=True)
  y = _rows(blocks[1], blocks[2], diag(va), diag(vb)).reshape(bb, n, e)
  den = jnp.sum(blocks[0], -1).reshape(bb, n)
  if tiles == 1:
    return y / den[..., None], den, blocks, None
  va_t, vb_t = feature_major(va), feature_major(-vb)   # Hᴴ v = (Cᵀ·va − Sᵀ·vb)

  def pair(carry, ab):
    y, yk, den = carry
    a, b = ab[0], ab[1]
    g, cm, sm = _pair_block(m, p, q, c, s, t, a, b)
    y = add_slab(y, a, t, _rows(cm, sm, slab(va, b, t), slab(vb, b, t)))
    yk = add_slab(yk, b, t, _columns(cm, sm, slab(va_t, a, t, 2), slab(vb_t, a, t, 2)), 2)
    den = add_slab(add_slab(den, a, t, jnp.sum(g, -1)), b, t, jnp.sum(g, -2))
    return (y, yk, den), ((g, cm, sm) if _saves_pairs(tiles) else None)

  (y, yk, den), pairs = jax.lax.scan(pair, (y, jnp.zeros((bb, e, n), jnp.float32), den), pair_tasks(tiles))
  y = y + feature_major(yk)
  return y / den[..., None], den, blocks, pairs


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _paired(m, nn, v, c, s, block_size):
  """y [B, n, e] (layout [re, im]) of CMAP at β = 0 from m, nn [B, n, d], v [B, n, e], c [B]."""
  return _forward(m, nn, v, c, s, block_size)[0]


def _paired_fwd(m, nn, v, c, s, block_size):
  y, den, blocks, pairs = _forward(m, nn, v, c, s, block_size)
  return y, (m, nn, v, c, y, den, blocks, pairs)


def _paired_bwd(s, block_size, res, dy):
  """The module docstring's backward, with gY = dy/D and gD = −Re⟨gY, y⟩ shared by every tile."""
  m, nn, v, c, y, den, (g, cm, sm), pairs = res
  bb, n, e = v.shape
  tiles, t = tiling(n, block_size)
  hs = 0.5 * s
  va, vb = split_pairs(v)
  gy = dy / den[..., None]
  gd = -jnp.sum(gy * y, -1)
  gr = _rotate(gy)
  # Diagonal tiles, one side: B_ij = conj(gY_i)·v_j; each tile is its own row and column side.
  diag = lambda x: x.reshape(bb * tiles, t, x.shape[-1])
  mD, nD, gD, rD = diag(m), diag(nn), diag(gy), diag(gr)
  cD = jnp.repeat(c, tiles)[:, None, None]
  br, bi = _dot("bif,bjf->bij", gD, diag(va)), -_dot("bif,bjf->bij", gD, diag(vb))
  phi, th = _cotangents(br, bi, g, cm, sm, gd.reshape(bb * tiles, t)[:, :, None])
  dm, dnn, th_m, th_n = _row_grads(phi, th, mD, mD, nD, hs, cD)
  mD_t = feature_major(mD)
  dm_t, dn_t = _column_grads(phi, th, mD_t, feature_major(nD), mD_t, hs, cD)
  dm, dnn = (dm + feature_major(dm_t)).reshape(m.shape), (dnn + feature_major(dn_t)).reshape(nn.shape)
  dv = feature_major(_columns(cm, sm, feature_major(gD), feature_major(rD))).reshape(bb, n, e)
  dc = _tile_coupling_grad(mD, nD, th_m, th_n).reshape(bb, tiles).sum(1)
  if tiles == 1:
    return dm, dnn, join_pairs(dv), dc
  # Pair tiles, both sides: B_ij = conj(gY_i)·v_j + gY_j·conj(v_i) as [g, va]·[va, g] + i [g, vb]·[−vb, g].
  lr, rr = jnp.concatenate([gy, va], -1), jnp.concatenate([va, gy], -1)
  li, ri = jnp.concatenate([gy, vb], -1), jnp.concatenate([-vb, gy], -1)
  m_t, n_t, gy_t, gr_t = feature_major(m), feature_major(nn), feature_major(gy), feature_major(gr)
  cc = c[:, None, None]
  p, q = (None, None) if _saves_pairs(tiles) else _phase_heads(m, nn)

  def pair(carry, task):
    dm, dnn, dv, dm_k, dn_k, dv_k, dc = carry
    ab, saved = task
    a, b = ab[0], ab[1]
    g, cm, sm = saved if _saves_pairs(tiles) else _pair_block(m, p, q, c, s, t, a, b)
    br = _dot("bif,bjf->bij", slab(lr, a, t), slab(rr, b, t))
    bi = _dot("bif,bjf->bij", slab(li, a, t), slab(ri, b, t))
    phi, th = _cotangents(br, bi, g, cm, sm, slab(gd, a, t)[:, :, None] + slab(gd, b, t)[:, None, :])
    mA, nA = slab(m, a, t), slab(nn, a, t)
    dm_a, dn_a, th_m, th_n = _row_grads(phi, th, mA, slab(m, b, t), slab(nn, b, t), hs, cc)
    dm_b, dn_b = _column_grads(phi, th, slab(m_t, a, t, 2), slab(n_t, a, t, 2), slab(m_t, b, t, 2), hs, cc)
    dm, dnn = add_slab(dm, a, t, dm_a), add_slab(dnn, a, t, dn_a)
    dm_k, dn_k = add_slab(dm_k, b, t, dm_b, 2), add_slab(dn_k, b, t, dn_b, 2)
    dv = add_slab(dv, a, t, _rows(cm, sm, slab(gy, b, t), -slab(gr, b, t)))
    dv_k = add_slab(dv_k, b, t, _columns(cm, sm, slab(gy_t, a, t, 2), slab(gr_t, a, t, 2)), 2)
    return (dm, dnn, dv, dm_k, dn_k, dv_k, dc + _tile_coupling_grad(mA, nA, th_m, th_n)), None

  zeros_t = lambda x: jnp.zeros((bb, x.shape[-1], n), jnp.float32)
  carry = (dm, dnn, dv, zeros_t(m), zeros_t(nn), zeros_t(dv), dc)
  (dm, dnn, dv, dm_k, dn_k, dv_k, dc), _ = jax.lax.scan(pair, carry, (pair_tasks(tiles), pairs))
  return dm + feature_major(dm_k), dnn + feature_major(dn_k), join_pairs(dv + feature_major(dv_k)), dc


_paired.defvjp(_paired_fwd, _paired_bwd)


def paired_magnetic(q, k, v, coupling, *, scale: float, block_size: int | None = None):
  """CMAP at β = 0 (no mask, not causal) on the Hermitian pairing of the module docstring.

  Args:
    q, k: [b, n, h, d] queries and keys; v: [b, n, h, e] values, e even (interleaved complex pairs).
    coupling: γ — a Python float or a float array broadcastable to [h] (differentiable).
    scale: the logit scale s.
    block_size: the largest tile (`tiling`: halving stops at it, or at an odd part); None: `dispatch.TILE` (512).
  Returns:
    [b, n, h, e] in v's dtype, equal to `operators.magnetic_transport(q, k, v, beta=0, coupling=γ)`.
  """
  block_size = TILE if block_size is None else check_block_size(block_size)
  b, n, h, d = q.shape
  e = v.shape[-1]
  folded = lambda x: jnp.transpose(x.astype(jnp.float32), (0, 2, 1, 3)).reshape(b * h, n, x.shape[-1])
  qf, kf, vf = folded(q), folded(k), folded(v)
  m, nn = (qf + kf) * (1 / math.sqrt(2)), (qf - kf) * (1 / math.sqrt(2))
  c = jnp.broadcast_to(jnp.asarray(coupling, jnp.float32) * (0.5 * scale), (h,))
  y = _paired(m, nn, vf, jnp.tile(c, b), scale, block_size)
  return jnp.transpose(join_pairs(y).reshape(b, h, n, e), (0, 2, 1, 3)).astype(v.dtype)
