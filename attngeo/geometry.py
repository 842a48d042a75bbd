"""Bakry–Émery calculus of a Markov operator: Γ, Γ₂, metric and curvature, dense and matrix-free.

Conventions. A Markov operator `P` acts on values `f` `[..., n, m]` (m test functions at once;
`P` is `[..., n, n]` when dense). With time scale `τ` the generator is `L = (P − I)/τ` and

    Γ(f, g)_i  = ½[L(fg) − f Lg − g Lf]_i = (1/2τ) Σ_j P_ij (f_j − f_i)(g_j − g_i),
    Γ₂(f, g)_i = ½[L Γ(f, g) − Γ(f, Lg) − Γ(Lf, g)]_i,

pairwise over the m columns of f and g. Matrix-free, `Γ(f, g) = (1/2τ)[P(fg) − f Pg − g Pf + fg]`
needs ONE application of P to the stacked values `[f, g, fg]` and Γ₂ TWO sequential ones, so any
`MarkovOperator` (`attngeo.walks`) — a dense matrix, an attention operator (q, k, β, α, mask) or a Gaussian kernel on
a point cloud — gives Γ and Γ₂ through the fused/blockwise kernels of `attngeo.operators` at O(n)
memory, differentiably. Values are centred per column first (Γ ignores constants), which keeps
the float32 cancellation in `P(fg) − f Pg − …` small.

Continuum limit. For the Gaussian kernel `exp(−‖x − y‖²/ε)` with Coifman–Lafon α-normalisation,
`(P_α − I)/ε → ¼[Δ + 2(1 − α)∇log p·∇]`; with α = 1 and `τ = ε/4`, `L → Δ` (Laplace–Beltrami),
`Γ(f, g) → ⟨∇f, ∇g⟩` and `Γ₂(f) → |Hess f|² + Ric(∇f, ∇f)` (Bochner). On the unit sphere S² and
`f = a·x`, `|a| = 1`: `Γ(f) = 1 − f²`, `Γ₂(f) = 1 + f²`.

Two curvatures, kept apart:
* `graph_curvature` — the discrete Bakry–Émery bound of the operator itself: the largest `K_i`
  with `Γ₂(f)_i ≥ K Γ(f)_i + (1/n)(Lf)_i²` for all f (n = ∞ by default), a semidefinite
  condition solved exactly on the 2-ball of i (small or sparsified graphs).
* `ricci` — a continuum read-out for sampled manifolds: Hessian from Γ alone,
  `Hess f(∇g, ∇h) = ½[Γ(g, Γ(f, h)) + Γ(h, Γ(f, g)) − Γ(f, Γ(g, h))]`, co-metric
  `G^{ab} = Γ(x^a, x^b)`, `Ric(∇f, ∇f) = Γ₂(f) − |Hess f|²_G`; nested Γ's are badly biased on
  samples, so every intermediate function is kept on the operator's leading eigenfunctions
  (`spectral`), which is also the variance-reduced pointwise Γ₂.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks, linalg, markov, walks

def _check_values(name, f, g=None):
  """Test functions f (and g): floating `[..., n, m]`, finite — refused eagerly, NaN-propagating under jit."""
  _checks.check_floating(name, f)
  _checks.check_finite(name, f)
  if jnp.ndim(f) < 2:
    raise ValueError(f"{name} must be [..., n, m] (m test functions as columns); got shape {jnp.shape(f)}")
  if g is not None:
    if jnp.shape(g) != jnp.shape(f):
      raise ValueError(f"g must have f's shape {jnp.shape(f)}; got {jnp.shape(g)}")
    _checks.check_floating("g", g)
    _checks.check_finite("g", g)


def _check_rows(p, f) -> None:
  """f holds one row per state of a dense P (a `MarkovOperator` carries no size to compare with)."""
  if not isinstance(p, walks.MarkovOperator) and jnp.ndim(p) >= 2 and jnp.shape(f)[-2] != jnp.shape(p)[-1]:
    raise ValueError(f"f must have one row per state of P: P is [..., {jnp.shape(p)[-1]}, {jnp.shape(p)[-1]}], "
                     f"f has shape {jnp.shape(f)}")


def _split(x, parts):
  m = x.shape[-1] // parts
  return [x[..., i * m:(i + 1) * m] for i in range(parts)]


def _prepare(op, f, g):
  """Centre (Γ ignores constants; this limits float32 cancellation) and project the inputs."""
  f = op.project(f - f.mean(-2, keepdims=True))
  return f, None if g is None else op.project(g - g.mean(-2, keepdims=True))


def generator(p, f, tau=None):
  """`Lf = (Pf − f)/τ` for f `[..., n, m]` (p: dense `[..., n, n]` P with `tau`, or a `MarkovOperator`)."""
  op = walks.as_operator(p, tau)
  _check_values("f", f)
  _check_rows(p, f)
  return op.generator(f)


def _gamma_parts(op, f, g):
  """Γ(f, g), Lf, Lg from ONE application of L to the stacked values `[f, g, fg]`."""
  lf, lg, lfg = _split(op.generator(jnp.concatenate([f, g, f * g], -1)), 3)
  return op.project(0.5 * (lfg - f * lg - g * lf)), lf, lg


def _gamma(op, f, g=None):
  f, g = _prepare(op, f, g)
  if g is None:
    lf, lff = _split(op.generator(jnp.concatenate([f, f * f], -1)), 2)
    return op.project(0.5 * lff - f * lf)
  return _gamma_parts(op, f, g)[0]


def gamma(p, f, g=None, tau=None):
  """Carré du champ `Γ(f, g)` `[..., n, m]` (column-wise pairs); `Γ(f) = Γ(f, f)` when g is None.

  p: a dense `[..., n, n]` P (with `tau`, default 1) or a `MarkovOperator`. One application of P.
  A non-finite f or g is a one-line error on concrete values; traced (under jit) it is not checked
  and its columns come out NaN (column c of Γ depends on f_c and g_c only).
  """
  op = walks.as_operator(p, tau)
  _check_values("f", f, g)
  _check_rows(p, f)
  return _gamma(op, f, g)


def _gamma2(op, f, g=None):
  f, g = _prepare(op, f, g)
  g = f if g is None else g
  gam, lf, lg = _gamma_parts(op, f, g)
  l_gam, l_flg, l_lfg, llf, llg = _split(op.generator(jnp.concatenate([gam, f * lg, lf * g, lf, lg], -1)), 5)
  g_f_lg = 0.5 * (l_flg - f * llg - lg * lf)
  g_lf_g = 0.5 * (l_lfg - lf * lg - g * llf)
  return op.project(0.5 * (l_gam - g_f_lg - g_lf_g))


def gamma2(p, f, g=None, tau=None):
  """Iterated carré du champ `Γ₂(f, g)` `[..., n, m]`; two sequential applications of P. Non-finite
  f or g as in `gamma`: refused eagerly, NaN columns under jit."""
  op = walks.as_operator(p, tau)
  _check_values("f", f, g)
  _check_rows(p, f)
  return _gamma2(op, f, g)


def _cometric(op, x):
  d = x.shape[-1]
  a, b = np.triu_indices(d)
  vals = _gamma(op, x[..., a], x[..., b])                                   # [..., n, pairs]
  g = jnp.zeros(x.shape[:-1] + (d, d), vals.dtype).at[..., a, b].set(vals)
  return g + jnp.swapaxes(g, -1, -2) - g * jnp.eye(d)


def cometric(p, x, tau=None):
  """Co-metric field `G^{ab}_i = Γ(x^a, x^b)_i` `[..., n, D, D]` of coordinate functions x `[..., n, D]`."""
  op = walks.as_operator(p, tau)
  _check_values("x", x)
  return _cometric(op, x)


# ----------------------------------------------------------------------------- curvature

def graph_curvature(p, dimension: float = math.inf, tau: float = 1.0, iters: int = 60) -> np.ndarray:
  """Discrete Bakry–Émery curvature `K_i` [n] of a dense operator P `[n, n]` (τ = 1: `L = P − I`).

  Γ₂(·)_i, Γ(·)_i and (L·)_i² are quadratic forms `A_i`, `B_i`, `c_i c_iᵀ` on the 2-ball of i, and
  `K_i = max{K : A_i − c_i c_iᵀ/n − K B_i ⪰ 0}`, found by bisection on the smallest eigenvalue.
  Normalisation: for the simple random walk on a D-regular graph (P = A/D), K_i is the
  unnormalised-Laplacian curvature divided by D, e.g. K_n: (1 + n/2)/(n − 1), Q_d: 2/d, C_n (n ≥ 5): 0.
  """
  markov.check_chain(p)
  if p.ndim != 2:
    raise ValueError(f"P must be a single [n, n] operator; got shape {p.shape}")
  p = np.asarray(p, np.float64)
  n = p.shape[0]
  lap = (p - np.eye(n)) / tau
  eye = np.eye(n)
  diff = eye[None, :, :] - eye[:, None, :]                                  # diff[i, j] = e_j − e_i
  b = np.einsum("ij,ija,ijb->iab", p, diff, diff) / (2 * tau)             # B_i [n, n, n]
  a = 0.5 * (np.einsum("ij,jab->iab", lap, b) - b @ lap - np.einsum("ca,icb->iab", lap, b))
  a = 0.5 * (a + np.swapaxes(a, 1, 2))
  adj = (p > 0) | (p.T > 0)
  two_ball = (adj.astype(int) @ adj.astype(int) + adj + np.eye(n, dtype=bool)) > 0
  out = np.empty(n)
  for i in range(n):
    idx = np.flatnonzero(two_ball[i])
    ai, bi, ci = a[i][np.ix_(idx, idx)], b[i][np.ix_(idx, idx)], lap[i, idx]
    if math.isfinite(dimension):
      ai = ai - np.outer(ci, ci) / dimension
    scale = max(np.abs(ai).max(), np.abs(bi).max(), 1e-30)
    psd = lambda kk: np.linalg.eigvalsh(ai - kk * bi).min() >= -1e-10 * scale
    lo, hi = -1.0, 1.0
    while psd(hi) and hi < 1e6:
      hi *= 2
    while not psd(lo) and lo > -1e6:
      lo *= 2
    for _ in range(iters):
      mid = 0.5 * (lo + hi)
      lo, hi = (mid, hi) if psd(mid) else (lo, mid)
    out[i] = lo
  return out


def family_curvature(p, f, dimension: float = math.inf, tau=None):
  """Bakry–Émery bound over a chosen family f `[..., n, m]`: `min_c (Γ₂(f_c) − (Lf_c)²/n)/Γ(f_c)` [..., n].

  An upper bound on `graph_curvature` (the min runs over m functions, not all), usable at scale.
  """
  op = walks.as_operator(p, tau)
  _check_values("f", f)
  lf = op.generator(_prepare(op, f, None)[0])
  num = _gamma2(op, f) - (lf * lf / dimension if math.isfinite(dimension) else 0.0)
  return jnp.min(num / jnp.maximum(_gamma(op, f), 1e-12), -1)


class Ricci(NamedTuple):
  """Continuum Ricci read-out: `ricci_tensor` [n, D, D] (`Ric(∇x^a, ∇x^b)`), `scalar` [n]
  (`tr(G⁺ Ric)`), `mean_ricci` [n] (`scalar / d`: 1/r² on a sphere of radius r, 0 when flat)."""
  ricci_tensor: jax.Array
  scalar: jax.Array
  mean_ricci: jax.Array
  cometric: jax.Array


def _pinv_rank(g, rank: int):
  """Pseudo-inverse of the symmetric [.., D, D] co-metric keeping its `rank` largest eigenvalues."""
  w, u = linalg.eigh(g)
  keep = jnp.arange(g.shape[-1]) >= g.shape[-1] - rank
  inv = jnp.where(keep, 1.0 / jnp.where(keep, w, 1.0), 0.0)
  return jnp.einsum("...ab,...b,...cb->...ac", u, inv, u)


def ricci(p, x, dimension: int, tau=None) -> Ricci:
  """Ricci curvature of the manifold sampled by x `[n, D]`, read from the operator p by Γ-calculus.

  `H^f_{ab} = ½[Γ(x^a, Γ(f, x^b)) + Γ(x^b, Γ(f, x^a)) − Γ(f, Γ(x^a, x^b))]` (Hessian of f on the
  coordinate gradients), `|Hess f|² = tr(G⁺ H^f G⁺ H^f)` with `G = Γ(x, x)` kept at rank
  `dimension`, `Ric(∇f, ∇f) = Γ₂(f) − |Hess f|²`, for f = x^a and x^a + x^b (polarisation gives
  the tensor). With a dense or matrix-free p this is the plain, badly biased nested-Γ estimate;
  with `spectral(P, k)` every intermediate function lives on the leading eigenfunctions, which is
  the estimator to use (see experiments/curvature.py for errors against N).
  """
  op = walks.as_operator(p, tau)
  x = jnp.asarray(x, jnp.float32)
  _check_values("x", x)
  n, dd = x.shape
  x = _prepare(op, x, None)[0]
  a_idx, b_idx = np.triu_indices(dd, 1)
  fs = jnp.concatenate([x, x[:, a_idx] + x[:, b_idx]], -1)                  # [n, F]
  nf = fs.shape[-1]
  g = _cometric(op, x)                                                        # [n, D, D]
  ginv = _pinv_rank(g, dimension)
  gfx = _gamma(op, jnp.repeat(fs, dd, -1), jnp.tile(x, (1, nf)))             # Γ(f, x^b): [n, F·D]
  t1 = _gamma(op, jnp.repeat(x, nf * dd, -1), jnp.tile(gfx, (1, dd)))        # Γ(x^a, Γ(f, x^b))
  t1 = jnp.transpose(t1.reshape(n, dd, nf, dd), (0, 2, 1, 3))                # [n, F, a, b]
  t2 = _gamma(op, jnp.repeat(fs, dd * dd, -1), jnp.tile(g.reshape(n, dd * dd), (1, nf)))
  hess = 0.5 * (t1 + jnp.swapaxes(t1, -1, -2) - t2.reshape(n, nf, dd, dd))
  ric_f = _gamma2(op, fs) - jnp.einsum("nab,nfbc,ncd,nfda->nf", ginv, hess, ginv, hess)
  diag = ric_f[:, :dd]
  off = 0.5 * (ric_f[:, dd:] - diag[:, a_idx] - diag[:, b_idx])
  ric = jnp.zeros((n, dd, dd)).at[:, jnp.arange(dd), jnp.arange(dd)].set(diag)
  ric = ric.at[:, a_idx, b_idx].set(off).at[:, b_idx, a_idx].set(off)
  scalar = jnp.einsum("nab,nba->n", ginv, ric)
  return Ricci(ric, scalar, scalar / dimension, g)


# ----------------------------------------------------------------------------- bandwidth
