"""Two edges of the family blockwise, on pairs of tiles: each unordered tile pair's products once — the β = 1
edge (ATAP) on two units, the β = 0 edge (DMTN) on three, and DMAP on its Gram alone, one (the Gram term below).

On the edge the logits are (`attngeo.kernels.split`, w = (1 + α)/2, w_t = (1 − α)/2, s the scale)

    L_ij = s·(w q_i·k_j + w_t k_i·q_j) + bias_j,        P = rownorm(exp L),   y = P v.

The augmented heads form them as one product 2·d wide; the dense split kernel as one d-wide product
A = q·kᵀ and its transpose, which it cannot tile. Here the sequence is cut into T tiles of t tokens
(`_blocks.tiling`), and a pair of distinct tiles a < b is visited once with two d-wide products,

    X = q_a·k_bᵀ,   Y = k_a·q_bᵀ                                       [t, t] each,
    L_ab   = s·(w X + w_t Y) + bias_b          (rows a, keys b),
    L_baᵀ = s·(w_t X + w Y) + bias_a          (rows b, keys a, laid out [a, b]),

so the two tiles' logits cost one product each, as ATTN's do; a diagonal tile (a, a) is X + its
transpose. The forward is an online softmax on both sides: rows a take a running row max, rows b a
running column max of L_baᵀ, each with its own normaliser and output (the key side feature-major,
`_blocks.feature_major`); the two are merged per token at the end, `lse = M + log(l e^{m − M} +
l_k e^{m_k − M})`, M = max(m, m_k), and y = (o e^{m−M} + o_k e^{m_k−M}) / (that sum).

Backward (recomputing each tile from q, k and the saved lse; D_i = dy_i·y_i):

    P_ab = exp(L_ab − lse_a),  P_baᵀ = exp(L_baᵀ − lse_b),
    dv_b += P_abᵀ dy_a,  dv_a += P_baᵀ dy_b,
    dL_ab = P_ab ⊙ (dy_a v_bᵀ − D_a),  dL_baᵀ = P_baᵀ ⊙ (v_a dy_bᵀ − D_b),
    X̄ = s(w dL_ab + w_t dL_baᵀ),  Ȳ = s(w_t dL_ab + w dL_baᵀ),
    dq_a += X̄ k_b,  dk_b += X̄ᵀ q_a,  dk_a += Ȳ q_b,  dq_b += Ȳᵀ k_a,
    dbias_b += Σ_rows dL_ab,  dbias_a += Σ_cols dL_baᵀ.

**Pairs that share their product part.** With u = (w + w_t)/2, v = (w − w_t)/2 the two sides are
s·(u(X + Y) ± v(X − Y)) + s·c·G. Where one of u, v is 0 the pair needs only

    Z = s·w·(X ± Y) = s·w·[q_a, k_a]·[k_b, ±q_b]ᵀ,     L_ab = S + Z + bias_b,   L_baᵀ = S ± Z + bias_a,   S = s·c·G,
    Z̄ = s·w·(dL_ab ± dL_baᵀ):   d[q_a, k_a] += Z̄·[k_b, ±q_b],   d[k_b, ±q_b] += Z̄ᵀ·[q_a, k_a],

one product 2·d wide for X and Y and two for their four gradients: "+" at w = w_t (ATAP at α = 0), "−" at
w = −w_t (the β = 0 edge, beside its Gram). The same units, but each elementwise pass of a pair
reads one t × t array (ATAP) or two (DMTN) where it read two or three, and the wide products run faster per
unit. Old kernel and new in one process, interleaved, ÷ ATTN blockwise, 8 heads of 64: ATAP 1.313 → 1.229 at
2048 keys (batch 8) and 1.205 → 1.119 at 4096 (batch 4), its elementwise passes moving 6896 → 5808 MiB at 2048
keys, batch 4 (`time_parts`' count); DMTN's pairs 1.570 → 1.550 at 2048 and 1.494 → 1.425 at 4096 (batch 4).
With one pair (1024 keys) the stacked heads' copies cost more than the pair saves.

Cost, in t × t × d products per pair of tiles (two tiles' area): forward 4 (X, Y, two value products),
backward 10 (X, Y again, two dv, two dP, four gradients) — 7 per tile, ATTN's blockwise count (its
forward 2, backward 5), against 11 on the augmented heads (logits and their two gradients 2·d wide).

**The Gram term** (`gram` = c ≠ 0): `L_ij = s·(w q_i·k_j + w_t k_i·q_j + c q_i·q_j) + bias_j`. G = q_a·q_bᵀ is
the same on both sides of a pair (G_ba = G_abᵀ), so it costs one more product in each pass and two gradients,
Ḡ = s·c(dL_ab + dL_baᵀ): dq_a += Ḡ q_b, dq_b += Ḡᵀ q_a. The β = 0 edge is this form on (q, k) := (m, n),
m = (q + k)/√2, n = (q − k)/√2, w = −α/2, w_t = α/2, c = ½ (`operators.beta0_paired`): a pair costs 5 + 13
= 18 units, a diagonal tile 10 (its Gram is its own), so 9 + 1/T per tile against the augmented heads' 11.
Its pairs take X − Y as one 2·d-wide product (above), its Gram and its diagonal tiles d wide, and the diagonal
tiles' passes read a tile and its transpose, so the pairing pays only on long sequences. DMTN ÷ ATTN blockwise,
fwd + bwd, 8 heads of 64, the routes interleaved on one set of inputs (`python -m attngeo.experiments.bench_pairs`,
2026-12-06, two runs, after the X − Y product):

| keys (batch) | 2048 (8) | 4096 (4) | 8192 (1) | 16 384 (1) |
|---|---:|---:|---:|---:|
| augmented heads | 1.40, 1.42 | 1.32, 1.34 | 1.36, 1.33 | 1.32, 1.33 |
| pairs of tiles | 1.78, 1.79 | 1.50, 1.48 | 1.31, 1.29 | 1.24, 1.26 |

so the dispatcher takes the pairs for DMTN from `dispatch.PAIRED_BETA0_FROM_TILES` = 16 tiles (8192 keys at
the default block size); `attngeo bench` prints the ratios it then runs at (docs/benchmarks.md).

**The Gram alone** (w = w_t = 0, c ≠ 0: DMAP, `L_ij = s·c m_i·m_j + bias_j` on its heads m = (q + k)/√2 with c = ½
and its key bias `operators.augment`'s): no X, Y and no k. A pair costs G_ab and two value products forward, G_ab,
two dP, two dv and the two gradients Ḡ·m_b, Ḡᵀ·m_a backward, 10 units; a diagonal tile 6; so 5 + 1/T units per
tile against ATTN's 7, which the heads (m, m/2) DMAP runs on below the crossover cost too. `operators.transport`
takes it from `dispatch.PAIRED_GRAM_FROM_TILES` = 4 tiles (2048 keys at the default block size): DMAP ÷ ATTN
blockwise 0.97–1.08 at 2048 keys (three runs), 0.88 at 4096, 0.81 at 16 384 (`bench_pairs --operator DMAP`,
docs/benchmarks.md).

Scope: static float weights (ATAP's α = 0, or any fixed α), no mask, not causal (a causal order keeps
one tile of each pair, which still needs both products: no saving), and n = T·t with t ≤ block_size
(`_blocks.tiles_in_pairs`). The dispatcher (`dispatch.runs_split`) sends it the blockwise calls in that
scope from `dispatch.PAIRED_FROM_TILES` tiles (the β = 0 edge from `PAIRED_BETA0_FROM_TILES`, DMAP from
`PAIRED_GRAM_FROM_TILES`); with fewer tiles the diagonal ones, each needing a transpose
in both passes, are too large a share. Everything runs in float32. The diagonal tiles and the pairs are
visited one at a time (`lax.map`, `lax.scan`), so memory is O(n·(d + e)) besides one pair of t × t tiles.

Measured (`attngeo bench --operators ATTN,DMAP,DMTN,ATAP --implementations blockwise --long 0 --repeats 2`,
batch 8, 8 heads of 64, two runs, ÷ ATTN blockwise): 0.98–1.02 at 4096 keys and 0.83–0.85 at 16 384
(batch 1), against the augmented heads' 1.32–1.39 and 1.33 (docs/benchmarks.md). Since ATTN's blockwise
backward sums its key side feature-major too (11–20 % faster), ATAP on pairs reads 1.17–1.31 at 4096 keys
(`bench_pairs --operator ATAP`, `attngeo bench`, docs/benchmarks.md); 1.13–1.17 since the diagonal tiles' key-side
sums stay feature-major (`bench_pairs`, `python -m attngeo.experiments.time_parts`, which also shows where the rest
goes: the products cost ATTN's, the elementwise passes 1.6–1.9× and the moves 1.7–1.9× ATTN's); 1.09–1.10 at 4096
keys and 1.21–1.33 at 2048 since a pair's X + Y is one product (`bench_pairs --operator ATAP`, three runs).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attngeo.kernels._blocks import (NEG, add_slab, check_block_size, feature_major, pair_tasks, slab, tiles_in_pairs,
                                     tiling)

_dot = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


def _tiles(x, tiles, t):
  """[B, n, ·] -> [T, B, t, ·]: the diagonal tiles, one `lax.map` step each (one t × t block in memory)."""
  return jnp.swapaxes(x.reshape((x.shape[0], tiles, t) + x.shape[2:]), 0, 1)


def _untiles(x):
  """[T, B, t, ·] -> [B, n, ·]."""
  x = jnp.swapaxes(x, 0, 1)
  return x.reshape((x.shape[0], -1) + x.shape[3:])


def _tiles_t(x_t, tiles, t):
  """Feature-major [B, f, n] -> [T, B, f, t]: `_tiles` of the `_blocks.feature_major` form."""
  return jnp.moveaxis(x_t.reshape(x_t.shape[:2] + (tiles, t)), 2, 0)


def _untiles_t(x):
  """[T, B, f, t] -> [B, f, n]."""
  return jnp.moveaxis(x, 0, 2).reshape(x.shape[1:3] + (-1,))


def _diagonal(qa, ka, bias_a, w, w_t, c, s):
  """A diagonal tile's logits [B, t, t]: s(w X + w_t Xᵀ + c G) + bias, X = q_a·k_aᵀ (w or w_t ≠ 0), G = q_a·q_aᵀ
  (c ≠ 0)."""
  logits = jnp.zeros(qa.shape[:2] + qa.shape[1:2], jnp.float32)
  if w or w_t:
    x = _dot("bid,bjd->bij", qa, ka)
    logits = w * x + w_t * jnp.swapaxes(x, 1, 2)
  if c:
    logits = logits + c * _dot("bid,bjd->bij", qa, qa)
  return s * logits + bias_a[:, None, :]


def stacked_sign(w, w_t):
  """+1 where both sides of a pair share their product part Z = s·w·(X + Y) (w = w_t ≠ 0: ATAP at α = 0); −1 where
  they take it with opposite signs, Z = s·w·(X − Y) (w = −w_t ≠ 0: the β = 0 edge); else None (X and Y apart)."""
  if w and w == w_t:
    return 1
  if w and w == -w_t:
    return -1
  return None


def stacked_heads(q, k, sign):
  """([q, k], [k, sign·q]): [B, n, 2·d] each, so that [q_a, k_a]·[k_b, sign·q_b]ᵀ = X + sign·Y in one product."""
  return jnp.concatenate([q, k], -1), jnp.concatenate([k, q if sign > 0 else -q], -1)


def pair_logits(q, k, bias, w, w_t, c, s, t, a, b, stacked=None):
  """(L_ab, L_baᵀ) of the pair (a, b): [B, t, t] each, rows a. With `stacked` (sign, heads: `stacked_heads`)
  from Z = s·w·[q_a, k_a]·[k_b, sign·q_b]ᵀ, one product 2·d wide: L_ab = S + Z + bias_b, L_baᵀ = S + sign·Z + bias_a,
  S = s·c·G."""
  gram = s * c * _dot("bid,bjd->bij", slab(q, a, t), slab(q, b, t)) if c else 0.0   # G = q_a·q_bᵀ: both sides'
  if stacked is not None:
    sign, (qk, other) = stacked
    z = (s * w) * _dot("bid,bjd->bij", slab(qk, a, t), slab(other, b, t))
    return gram + z + slab(bias, b, t)[:, None, :], gram + sign * z + slab(bias, a, t)[:, :, None]
  if not (w or w_t):                                                 # the Gram alone (DMAP): no X, Y
    gram = gram if c else jnp.zeros((q.shape[0], t, t), jnp.float32)
    return gram + slab(bias, b, t)[:, None, :], gram + slab(bias, a, t)[:, :, None]
  qa, ka, qb, kb = slab(q, a, t), slab(k, a, t), slab(q, b, t), slab(k, b, t)
  x, y = _dot("bid,bjd->bij", qa, kb), _dot("bid,bjd->bij", ka, qb)
  return (s * (w * x + w_t * y) + gram + slab(bias, b, t)[:, None, :],
          s * (w_t * x + w * y) + gram + slab(bias, a, t)[:, :, None])


def _forward(q, k, v, bias, w, w_t, c, s, block_size):
  """(y [B, n, e], lse [B, n]) from q, k [B, n, d], v [B, n, e], bias [B, n], all float32."""
  bb, n, e = v.shape
  tiles, t = tiling(n, block_size)

  def diagonal(args):
    qa, ka, va, bias_a = args
    logits = _diagonal(qa, ka, bias_a, w, w_t, c, s)
    mx = jnp.max(logits, -1)
    p = jnp.exp(logits - mx[..., None])
    return _dot("bij,bje->bie", p, va), mx, jnp.sum(p, -1)

  o, mx, l = map(_untiles, jax.lax.map(diagonal, tuple(_tiles(x, tiles, t) for x in (q, k, v, bias))))
  v_t = feature_major(v)
  sign = stacked_sign(w, w_t)
  stacked = None if sign is None else (sign, stacked_heads(q, k, sign))

  def pair(carry, ab):
    o, mx, l, ok, mk, lk = carry
    a, b = ab[0], ab[1]
    l_ab, l_ba_t = pair_logits(q, k, bias, w, w_t, c, s, t, a, b, stacked)
    m_a, m_b = slab(mx, a, t), slab(mk, b, t)
    new_a, new_b = jnp.maximum(m_a, jnp.max(l_ab, -1)), jnp.maximum(m_b, jnp.max(l_ba_t, -2))
    p_ab, p_ba_t = jnp.exp(l_ab - new_a[..., None]), jnp.exp(l_ba_t - new_b[:, None, :])
    ca, cb = jnp.exp(m_a - new_a), jnp.exp(m_b - new_b)
    o = jax.lax.dynamic_update_slice_in_dim(
        o, slab(o, a, t) * ca[..., None] + _dot("bij,bje->bie", p_ab, slab(v, b, t)), a * t, 1)
    ok = jax.lax.dynamic_update_slice_in_dim(
        ok, slab(ok, b, t, 2) * cb[:, None, :] + _dot("bei,bij->bej", slab(v_t, a, t, 2), p_ba_t), b * t, 2)
    l = jax.lax.dynamic_update_slice_in_dim(l, slab(l, a, t) * ca + jnp.sum(p_ab, -1), a * t, 1)
    lk = jax.lax.dynamic_update_slice_in_dim(lk, slab(lk, b, t) * cb + jnp.sum(p_ba_t, -2), b * t, 1)
    mx = jax.lax.dynamic_update_slice_in_dim(mx, new_a, a * t, 1)
    mk = jax.lax.dynamic_update_slice_in_dim(mk, new_b, b * t, 1)
    return (o, mx, l, ok, mk, lk), None

  init = (o, mx, l, jnp.zeros((bb, e, n), jnp.float32), jnp.full((bb, n), NEG, jnp.float32),
          jnp.zeros((bb, n), jnp.float32))
  (o, mx, l, ok, mk, lk), _ = jax.lax.scan(pair, init, pair_tasks(tiles))
  top = jnp.maximum(mx, mk)
  ca, cb = jnp.exp(mx - top), jnp.exp(mk - top)
  total = l * ca + lk * cb
  y = (o * ca[..., None] + feature_major(ok) * cb[..., None]) / total[..., None]
  return y, top + jnp.log(total)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _split_paired(q, k, v, bias, w, w_t, c, s, block_size):
  return _forward(q, k, v, bias, w, w_t, c, s, block_size)[0]


def _split_paired_fwd(q, k, v, bias, w, w_t, c, s, block_size):
  y, lse = _forward(q, k, v, bias, w, w_t, c, s, block_size)
  return y, (q, k, v, bias, y, lse)


def _split_paired_bwd(w, w_t, c, s, block_size, res, dy):
  """The module docstring's backward."""
  q, k, v, bias, y, lse = res
  bb, n, e = v.shape
  tiles, t = tiling(n, block_size)
  dd = jnp.sum(dy * y, -1)

  q_t, k_t, dy_t = feature_major(q), feature_major(k), feature_major(dy)

  def diagonal(args):
    """A diagonal tile: P and its cotangent, Ā = s(w dL + w_t dLᵀ) on the one product X = q_a·k_aᵀ (and
    Ḡ = s·c(dL + dLᵀ) on G = q_a·q_aᵀ); its key-side sums feature-major ([B, f, t]: the products read the tile
    untransposed), as the pairs' accumulators they start."""
    qa, ka, va, bias_a, lse_a, dy_a, dd_a, qa_t, dya_t = args
    p = jnp.exp(_diagonal(qa, ka, bias_a, w, w_t, c, s) - lse_a[..., None])
    dl = p * (_dot("bie,bje->bij", dy_a, va) - dd_a[..., None])
    dq_a, dk_a = jnp.zeros(qa.shape, jnp.float32), jnp.zeros(qa_t.shape, jnp.float32)
    if w or w_t:
      bar = s * (w * dl + w_t * jnp.swapaxes(dl, 1, 2))
      dq_a, dk_a = _dot("bij,bjf->bif", bar, ka), _dot("bfi,bij->bfj", qa_t, bar)
    if c:
      dq_a = dq_a + _dot("bij,bjf->bif", s * c * (dl + jnp.swapaxes(dl, 1, 2)), qa)
    return dq_a, dk_a, _dot("bei,bij->bej", dya_t, p), jnp.sum(dl, -2)

  dq, dk_k, dv_k, dbias = jax.lax.map(diagonal, tuple(_tiles(x, tiles, t) for x in (q, k, v, bias, lse, dy, dd))
                                      + (_tiles_t(q_t, tiles, t), _tiles_t(dy_t, tiles, t)))
  dq, dbias, dk_k, dv_k = _untiles(dq), _untiles(dbias), _untiles_t(dk_k), _untiles_t(dv_k)
  sign = stacked_sign(w, w_t)
  if sign is not None:
    return _stacked_pairs_bwd(s * w, sign, s * c, t, tiles, (q, k, v, bias, lse, dy, dd), (dq, dk_k, dv_k, dbias))

  def pair(carry, ab):
    dq, dk, dv, dq_k, dk_k, dv_k, dbias = carry
    a, b = ab[0], ab[1]
    l_ab, l_ba_t = pair_logits(q, k, bias, w, w_t, c, s, t, a, b)
    p_ab = jnp.exp(l_ab - slab(lse, a, t)[..., None])
    p_ba_t = jnp.exp(l_ba_t - slab(lse, b, t)[:, None, :])
    dy_a, dy_b, v_a, v_b = slab(dy, a, t), slab(dy, b, t), slab(v, a, t), slab(v, b, t)
    dl_ab = p_ab * (_dot("bie,bje->bij", dy_a, v_b) - slab(dd, a, t)[..., None])
    dl_ba_t = p_ba_t * (_dot("bie,bje->bij", v_a, dy_b) - slab(dd, b, t)[:, None, :])
    if w or w_t:
      x_bar, y_bar = s * (w * dl_ab + w_t * dl_ba_t), s * (w_t * dl_ab + w * dl_ba_t)
      dq = add_slab(dq, a, t, _dot("bij,bjf->bif", x_bar, slab(k, b, t)))
      dk = add_slab(dk, a, t, _dot("bij,bjf->bif", y_bar, slab(q, b, t)))
      dk_k = add_slab(dk_k, b, t, _dot("bfi,bij->bfj", slab(q_t, a, t, 2), x_bar), 2)
      dq_k = add_slab(dq_k, b, t, _dot("bfi,bij->bfj", slab(k_t, a, t, 2), y_bar), 2)
    dv = add_slab(dv, a, t, _dot("bij,bje->bie", p_ba_t, dy_b))
    dv_k = add_slab(dv_k, b, t, _dot("bei,bij->bej", slab(dy_t, a, t, 2), p_ab), 2)
    if c:                                                            # G = q_a·q_bᵀ: Ḡ = s·c(dL_ab + dL_baᵀ)
      g_bar = s * c * (dl_ab + dl_ba_t)
      dq = add_slab(dq, a, t, _dot("bij,bjf->bif", g_bar, slab(q, b, t)))
      dq_k = add_slab(dq_k, b, t, _dot("bfi,bij->bfj", slab(q_t, a, t, 2), g_bar), 2)
    dbias = add_slab(add_slab(dbias, b, t, jnp.sum(dl_ab, -2)), a, t, jnp.sum(dl_ba_t, -1))
    return (dq, dk, dv, dq_k, dk_k, dv_k, dbias), None

  carry = (dq, jnp.zeros_like(k), jnp.zeros_like(v), jnp.zeros_like(q_t), dk_k, dv_k, dbias)
  (dq, dk, dv, dq_k, dk_k, dv_k, dbias), _ = jax.lax.scan(pair, carry, pair_tasks(tiles))
  return dq + feature_major(dq_k), dk + feature_major(dk_k), dv + feature_major(dv_k), dbias


def _stacked_pairs_bwd(sw, sign, sc, t, tiles, inputs, diagonal):
  """The pairs' backward where `stacked_sign` is ±1 (sw = s·w, sc = s·c): Z = sw·[q_a, k_a]·[k_b, sign·q_b]ᵀ enters
  L_ab and sign × it L_baᵀ, so Z̄ = sw·(dL_ab + sign·dL_baᵀ) gives d[q_a, k_a] += Z̄·[k_b, sign·q_b] and, feature-major,
  d[k_b, sign·q_b] += [q_a, k_a]ᵀ·Z̄: two products 2·d wide in place of four d wide; the Gram's Ḡ = sc·(dL_ab +
  dL_baᵀ) as in `_split_paired_bwd`. `inputs`: (q, k, v, bias, lse, dy, D); `diagonal`: the diagonal tiles'
  (dq, dk feature-major, dv feature-major, dbias), which the pairs add to."""
  q, k, v, bias, lse, dy, dd = inputs
  dq, dk_k, dv_k, dbias = diagonal
  qk, other = stacked_heads(q, k, sign)
  qk_t, dy_t, q_t = feature_major(qk), feature_major(dy), feature_major(q)

  def pair(carry, ab):
    dqk, dv, do_k, dv_k, dbias, dq, dq_k = carry
    a, b = ab[0], ab[1]
    z = sw * _dot("bid,bjd->bij", slab(qk, a, t), slab(other, b, t))
    gram = sc * _dot("bid,bjd->bij", slab(q, a, t), slab(q, b, t)) if sc else 0.0
    p_ab = jnp.exp(gram + z + slab(bias, b, t)[:, None, :] - slab(lse, a, t)[..., None])
    p_ba_t = jnp.exp(gram + sign * z + slab(bias, a, t)[:, :, None] - slab(lse, b, t)[:, None, :])
    dy_a, dy_b, v_a, v_b = slab(dy, a, t), slab(dy, b, t), slab(v, a, t), slab(v, b, t)
    dl_ab = p_ab * (_dot("bie,bje->bij", dy_a, v_b) - slab(dd, a, t)[..., None])
    dl_ba_t = p_ba_t * (_dot("bie,bje->bij", v_a, dy_b) - slab(dd, b, t)[:, None, :])
    z_bar = sw * (dl_ab + sign * dl_ba_t)
    dqk = add_slab(dqk, a, t, _dot("bij,bjf->bif", z_bar, slab(other, b, t)))
    dv = add_slab(dv, a, t, _dot("bij,bje->bie", p_ba_t, dy_b))
    do_k = add_slab(do_k, b, t, _dot("bfi,bij->bfj", slab(qk_t, a, t, 2), z_bar), 2)
    dv_k = add_slab(dv_k, b, t, _dot("bei,bij->bej", slab(dy_t, a, t, 2), p_ab), 2)
    if sc:                                                           # G = q_a·q_bᵀ: Ḡ = sc·(dL_ab + dL_baᵀ)
      g_bar = sc * (dl_ab + dl_ba_t)
      dq = add_slab(dq, a, t, _dot("bij,bjf->bif", g_bar, slab(q, b, t)))
      dq_k = add_slab(dq_k, b, t, _dot("bfi,bij->bfj", slab(q_t, a, t, 2), g_bar), 2)
    dbias = add_slab(add_slab(dbias, b, t, jnp.sum(dl_ab, -2)), a, t, jnp.sum(dl_ba_t, -1))
    return (dqk, dv, do_k, dv_k, dbias, dq, dq_k), None

  d = q.shape[-1]
  carry = (jnp.zeros_like(qk), jnp.zeros_like(v), jnp.zeros_like(qk_t), dv_k, dbias, dq, jnp.zeros_like(q_t))
  (dqk, dv, do_k, dv_k, dbias, dq, dq_k), _ = jax.lax.scan(pair, carry, pair_tasks(tiles))
  d_other = feature_major(do_k)                                      # d[k, sign·q]
  dq = dq + dqk[..., :d] + sign * d_other[..., d:] + feature_major(dq_k)
  return dq, dqk[..., d:] + d_other[..., :d] + feature_major(dk_k), dv + feature_major(dv_k), dbias


_split_paired.defvjp(_split_paired_fwd, _split_paired_bwd)


def split_paired_attention(q, k, v, *, weights: tuple[float, float], gram: float = 0.0, bias=None, scale: float,
                           block_size: int = 512):
  """`softmax(s·(w q·kᵀ + w_t k·qᵀ + c q·qᵀ) + bias_j)·v` for self-attention, on pairs of tiles (module docstring).

  Args:
    q, k: [b, n, h, d] (the same n tokens); v: [b, n, h, e].
    weights: (w, w_t) as Python floats (`split.split_weights` of a static α).
    gram: c, a Python float: the weight of the symmetric Gram q·qᵀ (0: none, and no product for it; the
      β = 0 edge passes q := m, k := n, c = ½: `operators.beta0_paired`).
    bias: [b, n, h] per-key logit bias (differentiable) or None.
    scale: the logit scale s.
    block_size: the largest tile; n must cut into ≥ 2 tiles of at most it (`_blocks.tiles_in_pairs`).
  Returns:
    [b, n, h, e] in v's dtype; at gram = 0 equal to `split.split_attention` without mask or causal order.
  """
  block_size = check_block_size(block_size)
  check_split_inputs(q, k, v, weights, gram, bias, scale)
  b, n, h, _ = q.shape
  if not tiles_in_pairs(n, block_size):
    raise ValueError(f"the paired split kernel needs n = T·t keys in T ≥ 2 tiles of t ≤ block_size = "
                     f"{block_size}; got n = {n}")
  w, w_t = weights
  y = _split_paired(*folded(q, k, v, bias), w, w_t, gram, float(scale), int(block_size))
  return jnp.transpose(y.reshape(b, h, n, v.shape[-1]), (0, 2, 1, 3)).astype(v.dtype)


def check_split_inputs(q, k, v, weights, gram, bias, scale):
  """One line unless q, k are [b, n, h, d] alike, v [b, n, h, e], bias None or [b, n, h], the weights (w, w_t) and
  gram c static floats, and the scale a real number known at trace time."""
  if jnp.ndim(q) != 4 or jnp.ndim(v) != 4:
    raise ValueError(f"q, k and v must be 4-D, [b, n, h, ·]; got shapes {jnp.shape(q)}, {jnp.shape(k)}, {jnp.shape(v)}")
  b, n, h, _ = q.shape
  if q.shape != k.shape:
    raise ValueError(f"split attention is self-attention: q and k must have the same shape; got {q.shape}, {k.shape}")
  if v.shape[:3] != (b, n, h):
    raise ValueError(f"v must be [b, n, h, e] = [{b}, {n}, {h}, e] like q; got {v.shape}")
  if bias is not None and jnp.shape(bias) != (b, n, h):
    raise ValueError(f"bias must be None or [b, n, h] = [{b}, {n}, {h}] (a key's logit bias); got {jnp.shape(bias)}")
  if not (isinstance(weights, tuple) and len(weights) == 2 and all(isinstance(x, float) for x in weights)):
    raise ValueError(f"the split kernels on tiles take static float weights (w, w_t); got {weights!r}")
  if not isinstance(gram, float):
    raise ValueError(f"the split kernels on tiles take a static float gram weight; got {gram!r}")
  try:
    finite = not isinstance(scale, (bool, np.bool_)) and bool(np.isfinite(float(scale)))
  except TypeError:                             # None, a tracer (ConcretizationTypeError), an array of several
    finite = False
  if not finite:
    raise ValueError(f"scale must be a finite real number known at trace time (the logit scale); got "
                     f"{type(scale).__name__}")


def folded(q, k, v, bias):
  """(q, k, v, bias) head-folded in float32: [b, n, h, ·] -> [b·h, n, ·], bias [b, n, h] (None: 0) -> [b·h, n]."""
  b, n, h, _ = q.shape
  fold = lambda x: jnp.transpose(x.astype(jnp.float32), (0, 2, 1, 3)).reshape(b * h, n, x.shape[-1])
  bias_f = (jnp.zeros((b * h, n), jnp.float32) if bias is None else
            jnp.transpose(bias.astype(jnp.float32), (0, 2, 1)).reshape(b * h, n))
  return fold(q), fold(k), fold(v), bias_f
