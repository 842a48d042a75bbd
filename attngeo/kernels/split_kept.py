"""The family's split edges on two tiles, P kept: the forward keeps its four t × t tiles of P for the backward,
which then recomputes nothing.

Same logits as `attngeo.kernels.split_paired` (s the scale, bias a per-key column),

    L_ij = s·(w q_i·k_j + w_t k_i·q_j + c q_i·q_j) + bias_j,        P = rownorm(exp L),   y = P v,

on n = 2t tokens cut into tiles a (the first t) and b. The pair (a, b) is visited once, as there
(`split_paired.pair_logits`: L_ab and L_baᵀ laid out [a, b], from one shared product where w = ±w_t);
each diagonal tile is one product,

    L_cc = s·[q_c, k_c]·[w k_c + c q_c, w_t q_c]ᵀ + bias_c                 (d wide, s·q_c·(w k_c + c q_c)ᵀ, at w_t = 0).

Forward: the row maxima are taken over the pair's two orientations and each diagonal tile (the whole row is
in hand, so no running rescale), then P̃ = exp(L − m) per tile, l = Σ P̃, y = (P̃·v) / l. It returns y and keeps
P̃'s four tiles with r = 1/l, P = P̃·r row-wise (on L_baᵀ column-wise).

Backward (D_i = dy_i·y_i; the row factor r moves onto the n × e side, dy^r = r ⊙ dy, D^r = r ⊙ D):

    dL = P̃ ⊙ (dy^r vᵀ − D^r),     dv_b += P̃_abᵀ dy^r_a,   dv_a += P̃_baᵀ dy^r_b,   dbias_j = Σ_i dL_ij,

the pair's q and k cotangents as on the paired kernel, and a diagonal tile's, from its one product above,

    [dq_c, dk_c] = s·dL·[w k_c + c q_c, w_t q_c] + s·dLᵀ·[w_t k_c + c q_c, w q_c],

the second product taken feature-major, ([·]ᵀ·dL)ᵀ, so that no t × t array is transposed (two products 2·d wide); at
w = w_t (ATAP at α = 0, and DMAP's Gram alone) both are one product on the symmetric part, s·(dL + dLᵀ)·[w k_c + c q_c,
w q_c], for one transpose pass: 2·d wide at ATAP, d wide for the Gram. Each product reads its t × t operand row-major.
(DMTN on m and n, α = 1, took 1.54 × ATTN at 1024 keys with a transpose for each of the symmetric and antisymmetric
parts, 1.41 without: `bench_pairs --operator DMTN --seqs 1024 --batches 8 --repeats 8`, one run each.)

Cost, in t × t × d products (a quarter of an n × n × d unit; ATTN's blockwise kernel runs 7 units, forward 2 and
backward 5, since it recomputes P): ATAP's forward 10 (its pair's X + Y one 2·d-wide product, each diagonal tile one
2·d wide, P̃·v on four tiles), its backward 16 (dP and dv on four tiles, the diagonal tiles' [q̄, k̄] 2·d wide, the
pair's Z̄ products): 26, 6.5 units; at α ≠ 0 X and Y apart and the diagonal tiles' two products, 7.5. Memory:
the four tiles of P̃, n² floats per head (b·h·n² in all), alive from the forward to the backward — the einsum
kernel's P, where the blockwise kernels keep O(n) residuals (and one t × t tile a step) — so the dispatcher
(`dispatch.runs_split`, "kept") takes this kernel only up to `dispatch.KEPT_UP_TO` keys and `dispatch.KEPT_ENTRIES`
entries of P, for the β = 1 edge. DMTN (on m and n: its pair's Gram and X − Y, 33 t × t × d products to ATAP's 26) and DMAP
(its Gram alone) gain nothing here over their augmented heads (docs/benchmarks.md, "Two tiles, P kept").

Scope: self-attention, static float weights (w, w_t, c), no mask, not causal, n even; float32 throughout.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from attngeo.kernels._blocks import feature_major
from attngeo.kernels.split_paired import check_split_inputs, folded, pair_logits, stacked_heads, stacked_sign

_dot = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)


def _halves(x):
  """[B, n, ·] -> [2, B, t, ·]: the two tiles, one `lax.map` step each."""
  return jnp.swapaxes(x.reshape((x.shape[0], 2, x.shape[1] // 2) + x.shape[2:]), 0, 1)


def _key(qc, kc, w, c):
  """w·k_c + c·q_c, without the products by 0."""
  return w * kc + c * qc if w and c else (w * kc if w else c * qc)


def _diagonal_logits(qc, kc, bias_c, w, w_t, c, s):
  """L_cc [B, t, t] (module docstring): one product, 2·d wide, or d wide at w_t = 0."""
  if not (w or w_t or c):                       # no product: every logit its key's bias
    return jnp.broadcast_to(bias_c[:, None, :], qc.shape[:2] + bias_c.shape[1:])
  key = _key(qc, kc, w, c)
  lhs, rhs = (jnp.concatenate([qc, kc], -1), jnp.concatenate([key, w_t * qc], -1)) if w_t else (qc, key)
  return s * _dot("bid,bjd->bij", lhs, rhs) + bias_c[:, None, :]


def _forward(q, k, v, bias, w, w_t, c, s):
  """(y [B, n, e], (P̃ of the diagonal tiles [2, B, t, t], P̃_ab, P̃_baᵀ [B, t, t], r [B, n])), all float32."""
  t = q.shape[1] // 2
  sign = stacked_sign(w, w_t)
  stacked = None if sign is None else (sign, stacked_heads(q, k, sign))
  l_ab, l_ba_t = pair_logits(q, k, bias, w, w_t, c, s, t, 0, 1, stacked)
  pair_max = jnp.stack([jnp.max(l_ab, -1), jnp.max(l_ba_t, -2)])

  def diagonal(args):
    qc, kc, vc, bias_c, pair_max_c = args
    logits = _diagonal_logits(qc, kc, bias_c, w, w_t, c, s)
    mx = jnp.maximum(pair_max_c, jnp.max(logits, -1))
    p = jnp.exp(logits - mx[..., None])
    return p, mx, jnp.sum(p, -1), _dot("bij,bje->bie", p, vc)

  p_diag, mx, l, o = jax.lax.map(diagonal, tuple(_halves(x) for x in (q, k, v, bias)) + (pair_max,))
  p_ab, p_ba_t = jnp.exp(l_ab - mx[0][..., None]), jnp.exp(l_ba_t - mx[1][:, None, :])
  l = l + jnp.stack([jnp.sum(p_ab, -1), jnp.sum(p_ba_t, -2)])
  o_a = o[0] + _dot("bij,bje->bie", p_ab, v[:, t:])
  o_b = o[1] + feature_major(_dot("bei,bij->bej", feature_major(v[:, :t]), p_ba_t))
  r = 1.0 / jnp.concatenate([l[0], l[1]], 1)
  return jnp.concatenate([o_a, o_b], 1) * r[..., None], (p_diag, p_ab, p_ba_t, r)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _split_kept(q, k, v, bias, w, w_t, c, s):
  return _forward(q, k, v, bias, w, w_t, c, s)[0]


def _split_kept_fwd(q, k, v, bias, w, w_t, c, s):
  y, kept = _forward(q, k, v, bias, w, w_t, c, s)
  return y, (q, k, v, y) + kept


def _diagonal_cotangents(dl, qc, kc, w, w_t, c, s):
  """[dq_c, dk_c] [B, t, 2·d] of a diagonal tile from its logits' cotangent dl (module docstring): on its symmetric
  part S = dL + dLᵀ where w = w_t, else on dL and, feature-major, dLᵀ without a transpose."""
  if w == w_t:
    sym = s * (dl + jnp.swapaxes(dl, 1, 2))
    if w:
      return _dot("bij,bjf->bif", sym, jnp.concatenate([_key(qc, kc, w, c), w * qc], -1))
    dq = _dot("bij,bjf->bif", sym, c * qc) if c else jnp.zeros_like(qc)
    return jnp.concatenate([dq, jnp.zeros_like(kc)], -1)
  along = _dot("bij,bjf->bif", dl, jnp.concatenate([_key(qc, kc, w, c), w_t * qc], -1))
  across = _dot("bfi,bij->bfj", feature_major(jnp.concatenate([_key(qc, kc, w_t, c), w * qc], -1)), dl)
  return s * (along + feature_major(across))


def _pair_cotangents(q, k, dl_ab, dl_ba_t, w, w_t, c, s):
  """(dq, dk) [B, n, d] of the pair (a, b) from the cotangents of L_ab and L_baᵀ: `split_paired`'s pair backward
  (the shared Z̄, or X̄ and Ȳ, and the Gram's Ḡ) on its one pair; the key side b summed feature-major."""
  t, d = q.shape[1] // 2, q.shape[2]
  qa, ka, qb, kb = q[:, :t], k[:, :t], q[:, t:], k[:, t:]
  rows = lambda bar, x: _dot("bij,bjf->bif", bar, x)                        # tile a's rows
  keys = lambda x, bar: feature_major(_dot("bfi,bij->bfj", feature_major(x), bar))   # tile b's keys
  zero = jnp.zeros(qa.shape, jnp.float32)
  dq_a, dk_a, dq_b, dk_b = zero, zero, zero, zero
  sign = stacked_sign(w, w_t)
  if sign is not None:                          # Z = s·w·[q_a, k_a]·[k_b, sign·q_b]ᵀ in L_ab, sign·Z in L_baᵀ
    z_bar = (s * w) * (dl_ab + sign * dl_ba_t)
    d_a = rows(z_bar, jnp.concatenate([kb, sign * qb], -1))
    d_b = keys(jnp.concatenate([qa, ka], -1), z_bar)                         # d[k_b, sign·q_b]
    dq_a, dk_a, dk_b, dq_b = d_a[..., :d], d_a[..., d:], d_b[..., :d], sign * d_b[..., d:]
  elif w or w_t:                                # X = q_a·k_bᵀ, Y = k_a·q_bᵀ
    x_bar, y_bar = s * (w * dl_ab + w_t * dl_ba_t), s * (w_t * dl_ab + w * dl_ba_t)
    dq_a, dk_a, dk_b, dq_b = rows(x_bar, kb), rows(y_bar, qb), keys(qa, x_bar), keys(ka, y_bar)
  if c:                                         # G = q_a·q_bᵀ on both sides: Ḡ = s·c·(dL_ab + dL_baᵀ)
    g_bar = (s * c) * (dl_ab + dl_ba_t)
    dq_a, dq_b = dq_a + rows(g_bar, qb), dq_b + keys(qa, g_bar)
  return jnp.concatenate([dq_a, dq_b], 1), jnp.concatenate([dk_a, dk_b], 1)


def _split_kept_bwd(w, w_t, c, s, res, dy):
  """The module docstring's backward."""
  q, k, v, y, p_diag, p_ab, p_ba_t, r = res
  bb, n, d = q.shape
  t = n // 2
  dd = jnp.sum(dy * y, -1) * r
  dyr = dy * r[..., None]

  def diagonal(args):
    p, qc, kc, vc, dyc, ddc = args
    dl = p * (_dot("bie,bje->bij", dyc, vc) - ddc[..., None])
    dv_t = _dot("bei,bij->bej", feature_major(dyc), p)       # feature-major: the product reads P̃ row-major
    return _diagonal_cotangents(dl, qc, kc, w, w_t, c, s), dv_t, jnp.sum(dl, -2)

  dqk, dv_t, dbias = jax.lax.map(diagonal, (p_diag,) + tuple(_halves(x) for x in (q, k, v, dyr, dd)))
  joined = lambda x: jnp.swapaxes(x, 0, 1).reshape((bb, n) + x.shape[3:])   # [2, B, t, ·] -> [B, n, ·]
  dqk, dv, dbias = joined(dqk), joined(jnp.swapaxes(dv_t, 2, 3)), joined(dbias)
  dl_ab = p_ab * (_dot("bie,bje->bij", dyr[:, :t], v[:, t:]) - dd[:, :t, None])
  dl_ba_t = p_ba_t * (_dot("bie,bje->bij", v[:, :t], dyr[:, t:]) - dd[:, None, t:])
  dq, dk = _pair_cotangents(q, k, dl_ab, dl_ba_t, w, w_t, c, s)
  dv = dv + jnp.concatenate([_dot("bij,bje->bie", p_ba_t, dyr[:, t:]),
                             feature_major(_dot("bei,bij->bej", feature_major(dyr[:, :t]), p_ab))], 1)
  dbias = dbias + jnp.concatenate([jnp.sum(dl_ba_t, -1), jnp.sum(dl_ab, -2)], 1)
  return dqk[..., :d] + dq, dqk[..., d:] + dk, dv, dbias


_split_kept.defvjp(_split_kept_fwd, _split_kept_bwd)


def split_kept_attention(q, k, v, *, weights: tuple[float, float], gram: float = 0.0, bias=None, scale: float):
  """`softmax(s·(w q·kᵀ + w_t k·qᵀ + c q·qᵀ) + bias_j)·v` for self-attention on two tiles, P kept (module docstring).

  Args:
    q, k: [b, n, h, d] (the same n tokens, n even); v: [b, n, h, e].
    weights: (w, w_t) as Python floats (`split.split_weights` of a static α).
    gram: c, a Python float (0: no Gram term; the β = 0 edge is this form on m and n with c = ½, as
      `operators.beta0_paired` passes it to `split_paired_attention`; the dispatcher does not route it here).
    bias: [b, n, h] per-key logit bias (differentiable) or None.
    scale: the logit scale s.
  Returns:
    [b, n, h, e] in v's dtype: `split_paired.split_paired_attention` at two tiles, without recomputing P.
  """
  check_split_inputs(q, k, v, weights, gram, bias, scale)
  b, n, h, _ = q.shape
  if n % 2 or n < 2:
    raise ValueError(f"the kept split kernel cuts n tokens into two tiles: n must be even and at least 2; got n = {n}")
  w, w_t = weights
  y = _split_kept(*folded(q, k, v, bias), w, w_t, gram, float(scale))
  return jnp.transpose(y.reshape(b, h, n, v.shape[-1]), (0, 2, 1, 3)).astype(v.dtype)
