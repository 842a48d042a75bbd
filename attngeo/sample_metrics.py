"""Sample quality of a generated point cloud against the distribution it should come from.

Let `G` be the generated points `[m, D]`, `T` the training set `[n, D]`, `F` fresh samples of the
generating distribution (never seen in training) and `H` a held-out set of fresh samples as large
as `T`. With `d(x, Y) = min_{y ∈ Y} ‖x − y‖` (Euclidean):

* `d_nn` — precision: `d(g, T)` over `g ∈ G`, as mean and median. A model that copies training
  points scores 0, so it is read against its floor, the same number for fresh samples of the
  generating distribution (an oracle generator), and together with the next two.
* `coverage` — recall: `d(f, G)` over `f ∈ F`, mean and median. Large when the samples miss parts
  of the data; its floor is `d(f, O)` for an oracle set `O` of `m` fresh points.
* `energy` — the energy distance (V-statistic, all pairs including i = j)
  `E(G, F) = 2·mean‖g − f‖ − mean‖g − g'‖ − mean‖f − f'‖ ≥ 0`, zero iff the two empirical
  distributions coincide (Székely & Rizzo); for two independent true samples it is positive and
  of order `1/m + 1/|F|`, so it too is read against its floor `E(O, F)`.
* `memorisation` — `mean d(g, T) / mean d(g, H)`: about 1 for samples of the true distribution
  (training and held-out sets are exchangeable), well below 1 for samples sitting on training
  points.

All functions take numpy arrays and return floats or numpy arrays (scipy's k-d tree; distances in
float64).
"""
from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist


def _points(name: str, x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  if x.ndim != 2 or len(x) == 0:
    raise ValueError(f"{name} must be a non-empty [n, dim] array; got shape {x.shape}")
  if not np.all(np.isfinite(x)):
    raise ValueError(f"{name} holds {int(np.sum(~np.isfinite(x)))} non-finite values")
  return x


def nn_distance(points, reference) -> np.ndarray:
  """`d(x, reference)` for each of `points` [m, D]: distance to the nearest of `reference` [n, D]; [m]."""
  points, reference = _points("points", points), _points("reference", reference)
  if points.shape[1] != reference.shape[1]:
    raise ValueError(f"points and reference must have the same dim; got {points.shape[1]} and {reference.shape[1]}")
  return cKDTree(reference).query(points, k=1)[0]


def _mean_pairwise(x, y, chunk: int = 2048) -> float:
  """mean over all pairs of ‖x_i − y_j‖ (chunked so that memory stays O(chunk · n))."""
  total = sum(cdist(x[i:i + chunk], y).sum() for i in range(0, len(x), chunk))
  return float(total / (len(x) * len(y)))


def energy_distance(x, y) -> float:
  """Energy distance `2·E‖X − Y‖ − E‖X − X'‖ − E‖Y − Y'‖` of the empirical laws of x [m, D], y [n, D].

  V-statistic (pairs i = j included), so it is ≥ 0 and equals the squared form of
  `scipy.stats.energy_distance` in one dimension.
  """
  x, y = _points("x", x), _points("y", y)
  if x.shape[1] != y.shape[1]:
    raise ValueError(f"x and y must have the same dim; got {x.shape[1]} and {y.shape[1]}")
  return 2 * _mean_pairwise(x, y) - _mean_pairwise(x, x) - _mean_pairwise(y, y)


def memorisation_ratio(points, train, heldout) -> float:
  """`mean d(g, train) / mean d(g, heldout)` for g in `points`; ≈ 1 without memorisation.

  `heldout` must be as large as `train` (nearest-neighbour distances shrink with the set size).
  """
  if len(train) != len(heldout):
    raise ValueError(f"heldout must be as large as train; got {len(heldout)} and {len(train)}")
  return float(nn_distance(points, train).mean() / nn_distance(points, heldout).mean())


def sample_quality(generated, train, fresh, heldout) -> dict[str, float]:
  """Every read-out of the module for `generated` [m, D].

  Args:
    generated: the samples being judged, [m, D].
    train: the training set, [n, D].
    fresh: fresh samples of the true distribution for coverage and energy, [f, D].
    heldout: another fresh sample as large as `train`, for the memorisation ratio, [n, D].

  Returns:
    {"d_nn_mean", "d_nn_median", "coverage_mean", "coverage_median", "energy", "memorisation"}.
  """
  d = nn_distance(generated, train)
  c = nn_distance(fresh, generated)
  return dict(d_nn_mean=float(d.mean()), d_nn_median=float(np.median(d)), coverage_mean=float(c.mean()),
              coverage_median=float(np.median(c)), energy=energy_distance(generated, fresh),
              memorisation=memorisation_ratio(generated, train, heldout))
