"""Multi-head attention as one connection walk (seed "From Self-Attention to Connection Laplacian").

Column convention: tokens x_j ∈ R^d, head h has attention `P^h` `[n, n]` and transport
`T^h = W_O^h W_V^h` `[d, d]` (rank ≤ d_h). The layer output is

    y_i = Σ_h Σ_j P^h_ij T^h x_j = H Σ_j W_ij T_ij x_j,
    W_ij = (1/H) Σ_h P^h_ij                       (the walk: row-stochastic),
    T_ij = Σ_h g^h_ij T^h,  g^h_ij = P^h_ij / Σ_h' P^h'_ij   (attention-gated mixture of transports).

A single head has the constant transport T_ij = T^1. The random-walk connection Laplacian is
`(Δ F)_i = F_i − Σ_j W_ij T_ij F_j` for vector fields F `[n, d]` — `I − (W ⊗ T)` — applied here
as `F − (1/H) Σ_h P^h F T^hᵀ` without forming any per-edge T_ij.

Diagnostics: scaled-isometry defect `δ(T) = min_c ‖TᵀT − cI‖_F / ‖TᵀT‖_F` on T's row space (T
has rank ≤ d_h, so isometry is judged where it acts); walk reversibility (`markov.reversibility`);
layer-to-layer stability of walks (relative Frobenius change, mean row Jensen–Shannon divergence,
spectral distance). Layouts follow `attngeo.nn`: `wv` `[d, h, k]` (v = x·wv), `wo` `[h, k, d]`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks, markov


def _check_heads(p, transports):
  _checks.check_stochastic("P", p)
  if p.ndim != 3:
    raise ValueError(f"P must be [heads, n, n]; got shape {p.shape}")
  if transports.ndim != 3 or transports.shape[-1] != transports.shape[-2]:
    raise ValueError(f"transports must be [heads, d, d]; got shape {transports.shape}")
  if transports.shape[0] != p.shape[0]:
    raise ValueError(f"P has {p.shape[0]} heads but transports has {transports.shape[0]}")


def head_transports(wv, wo) -> jax.Array:
  """`T^h = W_O^h W_V^h` `[h, d, d]` (column convention) from `wv` `[d, h, k]`, `wo` `[h, k, d]`."""
  if wv.ndim != 3 or wo.ndim != 3 or wv.shape[1:] != wo.shape[:2] or wv.shape[0] != wo.shape[2]:
    raise ValueError(f"wv must be [d, h, k] and wo [h, k, d] with matching h, k, d; got {wv.shape}, {wo.shape}")
  return jnp.einsum("dhk,hke->hed", wv, wo)


def walk(p) -> jax.Array:
  """`W = (1/H) Σ_h P^h` `[..., n, n]` from per-head P `[..., h, n, n]`."""
  _checks.check_stochastic("P", p)
  return p.mean(-3)


def gates(p, eps: float = 1e-30) -> jax.Array:
  """`g^h_ij = P^h_ij / Σ_h' P^h'_ij` `[h, n, n]` (0 where no head attends)."""
  return p / jnp.maximum(p.sum(0, keepdims=True), eps)


def edge_transports(p, transports, rows=None) -> jax.Array:
  """Per-edge `T_ij` `[len(rows), n, d, d]` for the given query rows (all rows: n²·d² memory)."""
  _check_heads(p, transports)
  g = gates(p)
  if rows is not None:
    g = g[:, rows]
  return jnp.einsum("hij,hde->ijde", g, transports)


def isometry_defect(t, rtol: float = 1e-6) -> jax.Array:
  """`min_c ‖TᵀT − cI‖_F / ‖TᵀT‖_F` on the row space of T `[..., d, d]`: 0 iff T is a scaled isometry there.

  With the nonzero eigenvalues λ of TᵀT (those above `rtol`·max), c = mean λ and the defect is
  `sqrt(Σ (λ − mean λ)² / Σ λ²)`. Returns (defect [...], scale c [...]).
  """
  lam = jnp.linalg.eigvalsh(jnp.swapaxes(t, -1, -2) @ t)
  keep = lam > rtol * jnp.max(lam, -1, keepdims=True)
  r = jnp.maximum(keep.sum(-1), 1)
  mean = jnp.sum(jnp.where(keep, lam, 0.0), -1) / r
  num = jnp.sum(jnp.where(keep, (lam - mean[..., None]) ** 2, 0.0), -1)
  den = jnp.maximum(jnp.sum(jnp.where(keep, lam**2, 0.0), -1), 1e-30)
  return jnp.sqrt(num / den), mean


def effective_isometry_defect(p, transports, chunk: int = 64) -> jax.Array:
  """W-weighted mean over edges of `isometry_defect(T_ij)`: `Σ_ij W_ij δ(T_ij) / n`.

  Computed in chunks of `chunk` query rows, so at most chunk·n·d² transports exist at once.
  """
  _check_heads(p, transports)
  n = p.shape[-1]
  w = p.mean(0)
  total = 0.0
  for start in range(0, n, chunk):
    rows = np.arange(start, min(start + chunk, n))
    d, _ = isometry_defect(edge_transports(p, transports, rows))
    total = total + jnp.sum(w[rows] * d)
  return total / n


def connection_laplacian_apply(p, transports, f) -> jax.Array:
  """`(ΔF)_i = F_i − Σ_j W_ij T_ij F_j = F − (1/H) Σ_h P^h F T^hᵀ` for F `[n, d]`; no T_ij formed."""
  _check_heads(p, transports)
  if f.shape != (p.shape[-1], transports.shape[-1]):
    raise ValueError(f"F must be [n, d] = {(p.shape[-1], transports.shape[-1])}; got {f.shape}")
  return f - jnp.einsum("hij,hde,je->id", p, transports, f) / p.shape[0]


def connection_laplacian_matrix(p, transports) -> jax.Array:
  """Dense block matrix `I − [W_ij T_ij]` `[n·d, n·d]` (block (i, j) is d×d): small n only."""
  _check_heads(p, transports)
  n, d = p.shape[-1], transports.shape[-1]
  blocks = jnp.einsum("hij,hde->idje", p, transports) / p.shape[0]
  return jnp.eye(n * d) - blocks.reshape(n * d, n * d)


def relative_change(w1, w2) -> jax.Array:
  """`‖W₂ − W₁‖_F / ‖W₁‖_F` [...]."""
  return jnp.linalg.norm(w2 - w1, axis=(-2, -1)) / jnp.linalg.norm(w1, axis=(-2, -1))


def row_js_divergence(w1, w2, eps: float = 1e-30) -> jax.Array:
  """Mean over rows of the Jensen–Shannon divergence (nats, ≤ log 2) between the rows of two walks."""
  m = 0.5 * (w1 + w2)
  kl = lambda a, b: jnp.sum(jnp.where(a > 0, a * (jnp.log(jnp.maximum(a, eps)) - jnp.log(jnp.maximum(b, eps))), 0.0), -1)
  return (0.5 * kl(w1, m) + 0.5 * kl(w2, m)).mean(-1)


def spectral_distance(w1, w2, k: int = 16) -> jax.Array:
  """ℓ² distance between the k largest eigenvalue moduli of two walks (CPU eigensolver)."""
  return jnp.linalg.norm(_moduli(w1, k) - _moduli(w2, k), axis=-1)


def _moduli(w, k):
  return jnp.abs(markov.spectrum(w, k).values)


def stability(walks: list, k: int = 16) -> list[dict[str, float]]:
  """Per consecutive layer pair: relative Frobenius change, row JS divergence, spectral distance
  (each walk's spectrum computed once)."""
  moduli = [_moduli(w, k) for w in walks]
  out = []
  for (w1, w2), (m1, m2) in zip(zip(walks[:-1], walks[1:]), zip(moduli[:-1], moduli[1:])):
    out.append(dict(relative_change=float(jnp.mean(relative_change(w1, w2))),
                    js_divergence=float(jnp.mean(row_js_divergence(w1, w2))),
                    spectral_distance=float(jnp.mean(jnp.linalg.norm(m1 - m2, axis=-1)))))
  return out
