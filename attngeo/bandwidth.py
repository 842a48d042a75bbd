"""Bandwidth rules for the Gaussian walk of a point cloud: ε from the sheet rule (`bandwidth`: the
largest ε whose walk does not leak across the gaps of a folded sheet) or from a target neighbour
count e^{H̄} (`neighbour_bandwidth`: the rule of the curvature read-out, `attngeo.ricci_estimate`)."""
from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from attngeo import _checks, walks

class Bandwidth(NamedTuple):
  """eps: the chosen ε; dimension: intrinsic dimension `2·d log S'/d log ε` at eps (S' the
  off-diagonal kernel sum); rule: the rule that set eps (`"max_slope"` or `"sheet"`); leak: the
  estimated walk mass on short-circuit pairs at eps; eps_max_slope: the max-slope ε."""
  eps: float
  dimension: float
  rule: str
  leak: float
  eps_max_slope: float


def _short_circuits(x, knn: int, ratio: float):
  """[n, n] bool: pairs whose k-NN-graph geodesic exceeds `ratio` × their straight-line distance
  (or that the graph does not connect): the chord leaves the sampled manifold."""
  from scipy.sparse import csr_matrix
  from scipy.sparse.csgraph import shortest_path
  from scipy.spatial import cKDTree
  n = len(x)
  knn = min(knn, n - 1)
  dist, idx = cKDTree(x).query(x, knn + 1)
  graph = csr_matrix((dist[:, 1:].ravel(), (np.repeat(np.arange(n), knn), idx[:, 1:].ravel())), shape=(n, n))
  geodesic = shortest_path(graph, directed=False)
  chord = np.sqrt(np.sum((x[:, None] - x[None]) ** 2, -1))
  return geodesic > ratio * chord + 1e-12


def bandwidth(x, eps_grid=None, *, rule: str = "sheet", leak: float = 1e-3, sample: int = 2000, seed: int = 0,
              knn: int = 10, ratio: float = 3.0) -> Bandwidth:
  """Gaussian-kernel bandwidth ε for a cloud x `[n, D]` by a stated rule (on ≤ `sample` points).

  `"max_slope"`: `S(ε) = Σ_ij exp(−‖x_i − x_j‖²/ε)` scales like ε^{d/2} on a d-manifold; pick ε
  at the steepest `d log S / d log ε` (the kernel-sum rule of Coifman et al. / Berry–Harlim). It
  sits where S turns from the manifold to the ambient scaling, so on a rolled sheet it bridges
  layers (ε ≈ 0.67 on the standardised Swiss roll: 17 % of the walk crosses between turns).
  `"sheet"` (default): the largest grid ε ≤ the max-slope ε whose walk `P = rownorm(K_ε)` puts at
  most `leak` of its mass (mean over rows) on short-circuit pairs — pairs whose geodesic in the
  `knn`-nearest-neighbour graph is more than `ratio` × their straight-line distance. Then the walk
  stays on the sheet. `rule` in the result says which constraint set ε.

  Returns:
    `Bandwidth(eps, dimension, rule, leak, eps_max_slope)`; `dimension = 2·d log S'/d log ε` at
    the chosen ε, S' the off-diagonal kernel sum (flat at d/2 across the manifold regime).
  """
  if rule not in ("sheet", "max_slope"):
    raise ValueError(f"rule must be 'sheet' or 'max_slope'; got {rule!r}")
  _checks.check_positive("leak", leak)
  x = np.asarray(walks.centre(jnp.asarray(x, jnp.float32)), np.float64)
  if len(x) > sample:
    x = x[np.random.default_rng(seed).choice(len(x), sample, replace=False)]
  d2 = np.sum((x[:, None] - x[None]) ** 2, -1)
  if eps_grid is None:
    med = np.median(d2[d2 > 0])
    eps_grid = med * np.logspace(-5, 1, 61)
  eps_grid = np.asarray(eps_grid, np.float64)
  off = d2 + np.diag(np.full(len(x), np.inf))
  s_off = np.array([np.exp(-off / e).sum() for e in eps_grid])          # S' (the diagonal's exp(0) = 1 apart)
  log_s, log_off = np.log(s_off + len(x)), np.log(np.maximum(s_off, 1e-300))          # S = S' + n
  slope, slope_off = np.gradient(log_s, np.log(eps_grid)), np.gradient(log_off, np.log(eps_grid))
  i_max = int(np.argmax(slope))
  i, chosen, leak_i = i_max, "max_slope", float("nan")
  if rule == "sheet":
    bad = _short_circuits(x, knn, ratio)
    for j in range(i_max, -1, -1):            # the largest grid ε ≤ the max-slope ε within `leak`: from the top down
      lk = -d2 / eps_grid[j]
      p = np.exp(lk - lk.max(1, keepdims=True))
      p /= p.sum(1, keepdims=True)
      leak_j = float((p * bad).sum(1).mean())
      if leak_j <= leak:
        break
    else:
      raise ValueError(f"no ε on the grid keeps the walk's short-circuit mass ≤ leak = {leak}; pass a finer eps_grid")
    leak_i = leak_j
    if j < i_max:
      i, chosen = j, "sheet"
  return Bandwidth(float(eps_grid[i]), float(2 * slope_off[i]), chosen, leak_i, float(eps_grid[i_max]))


def neighbour_bandwidth(x, neighbours: float = 64.0, *, rows: int = 500, seed: int = 0) -> float:
  """The ε at which the Gaussian walk `P = rownorm(exp(−‖x_i − x_j‖²/ε))` on the whole cloud has
  `neighbours` effective neighbours per row (`e^{H̄}`, mean row entropy H̄), by bisection in log ε.

  H̄ is averaged over `rows` random rows (each against every point); `e^{H̄}` grows monotonically
  with ε, like ε^{d/2} in the manifold regime. A bandwidth that fixes the neighbourhood size, not
  the geometry: the curvature read-out's rule (`ricci_estimate`).
  """
  _checks.check_positive("neighbours", neighbours)
  x = np.asarray(walks.centre(jnp.asarray(x, jnp.float32)), np.float64)
  if not 1.0 < neighbours < len(x):
    raise ValueError(f"neighbours must be in (1, n = {len(x)}); got {neighbours}")
  idx = np.random.default_rng(seed).choice(len(x), min(rows, len(x)), replace=False)
  d2 = np.sum(x[idx] ** 2, 1)[:, None] + np.sum(x**2, 1)[None, :] - 2.0 * x[idx] @ x.T
  d2 = np.maximum(d2, 0.0)

  def count(eps):
    lk = -d2 / eps
    p = np.exp(lk - lk.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return float(np.exp(np.mean(-np.sum(p * np.log(np.maximum(p, 1e-300)), 1))))

  lo, hi = np.log(1e-6 * np.median(d2)), np.log(10.0 * np.median(d2))
  for _ in range(40):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if count(np.exp(mid)) < neighbours else (lo, mid)
  return float(np.exp(0.5 * (lo + hi)))
