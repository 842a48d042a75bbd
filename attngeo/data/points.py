"""Point clouds: generated manifolds and in-memory point sets read by grain.

* `swiss_roll(n, seed)` — the 3-D Swiss roll in standardised coordinates (zero mean, unit variance
  per axis): `t = 1.5π(1 + 2u)`, `(t cos t, 21 v, t sin t)`, `u, v ~ U[0, 1)` (scikit-learn's form);
  `return_t=True` also returns each point's roll parameter `t ∈ [1.5π, 4.5π)` (position along the roll).
* `swiss_roll_oracle(n, seed, like=(num_points, train_seed))` — fresh samples of the same generating
  distribution, standardised with the training set's mean and std (not their own): the oracle
  generator against which generated samples are judged (`attngeo.sample_metrics`).
* `PointSets` — an in-memory random-access source (`len`, `[i]`) whose records are point sets
  `{"points": [k, dim]}` drawn without replacement from a cloud (a generated one, or a local
  `.npy`/`.csv` file); `attngeo.data.loader` reads it through `grain.MapDataset.source`, each
  process only its own rows. Record i is the i-th draw of `default_rng(seed + 1)` (no shuffled
  storage order). The sets of 2048 × 256 points are 6 MB and drawn in ≈ 0.1 s, so nothing is
  written to disk; `point_sets` keeps the few most recent sources in memory, keyed by the content
  of the cloud and the parameters (`attngeo.files.fingerprint`, also `PointSets.key`), so two
  different clouds never share one and repeated calls (protocols, tests) draw once.
"""
from __future__ import annotations

import collections
import os

import numpy as np

from attngeo.files import fingerprint

CLOUDS = ("swiss_roll", "sphere", "torus")


def _swiss_roll_raw(n: int, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
  """Unstandardised roll [n, 3] (float64) and its parameter t [n]."""
  if n < 1:
    raise ValueError(f"n must be positive; got {n}")
  rng = np.random.default_rng(seed)
  t = 1.5 * np.pi * (1 + 2 * rng.random(n))
  x = np.stack([t * np.cos(t), 21.0 * rng.random(n), t * np.sin(t)], 1)
  return x + noise * rng.standard_normal(x.shape), t


def swiss_roll(n: int = 4000, seed: int = 123, noise: float = 0.0, standardise: bool = True,
               return_t: bool = False):
  """[n, 3] float32 Swiss roll; standardised per coordinate unless `standardise=False`.

  With `return_t`, returns (points, t [n] float32), t the roll parameter of each point.
  """
  x, t = _swiss_roll_raw(n, seed, noise)
  if standardise:
    x = (x - x.mean(0)) / x.std(0)
  x = x.astype(np.float32)
  return (x, t.astype(np.float32)) if return_t else x


def swiss_roll_oracle(n: int, seed: int, like: tuple[int, int] = (4000, 123), noise: float = 0.0):
  """Fresh samples of the Swiss-roll distribution in the coordinates of a standardised training set.

  Args:
    n: number of fresh points.
    seed: their seed (use one that differs from the training set's: seeds give independent draws).
    like: (num_points, seed) of the training set `swiss_roll(num_points, seed)` whose mean and std
      standardise the fresh points (so both live in the same coordinates).
    noise: the training set's noise level.

  Returns:
    (points [n, 3] float32, t [n] float32) — t the roll parameter of each point.
  """
  num_points, train_seed = like
  if seed == train_seed:
    raise ValueError(f"seed must differ from the training set's seed {train_seed} (else the samples are not fresh)")
  ref, _ = _swiss_roll_raw(num_points, train_seed, noise)
  x, t = _swiss_roll_raw(n, seed, noise)
  return ((x - ref.mean(0)) / ref.std(0)).astype(np.float32), t.astype(np.float32)


def sphere(n: int, seed: int = 0, radius: float = 1.0, dim: int = 3) -> np.ndarray:
  """[n, dim] uniform samples on the sphere of `radius` in R^dim."""
  x = np.random.default_rng(seed).standard_normal((n, dim))
  return (radius * x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def flat_torus(n: int, seed: int = 0) -> np.ndarray:
  """[n, 4] uniform samples on the flat torus (cos θ, sin θ, cos φ, sin φ) ⊂ R⁴ (zero curvature)."""
  a = 2 * np.pi * np.random.default_rng(seed).random((n, 2))
  return np.stack([np.cos(a[:, 0]), np.sin(a[:, 0]), np.cos(a[:, 1]), np.sin(a[:, 1])], 1).astype(np.float32)


def load_cloud(cloud: str, num_points: int, seed: int) -> np.ndarray:
  """A named generated cloud (`swiss_roll`, `sphere`, `torus`) or a local `.npy`/`.csv` file of [n, dim]."""
  if cloud == "swiss_roll":
    return swiss_roll(num_points, seed)
  if cloud == "sphere":
    return sphere(num_points, seed)
  if cloud == "torus":
    return flat_torus(num_points, seed)
  if not os.path.exists(cloud):
    raise ValueError(f"cloud must be one of {CLOUDS} or an existing .npy/.csv file; got {cloud!r}")
  x = np.load(cloud) if cloud.endswith(".npy") else np.loadtxt(cloud, delimiter=",", dtype=np.float64)
  if x.ndim != 2 or len(x) == 0 or not np.issubdtype(x.dtype, np.number):
    raise ValueError(f"{cloud} must hold a numeric [n, dim] array; got {x.dtype} of shape {x.shape}")
  with np.errstate(over="ignore", invalid="ignore"):
    x32 = x.astype(np.float32)
  if not np.all(np.isfinite(x32)):   # checked after the cast: 1e39 is finite in float64, inf in float32
    raise ValueError(f"{cloud} must hold values finite in float32 (|x| < 3.4e38); "
                     f"{int(np.sum(~np.isfinite(x32)))} are not")
  return x32


class PointSets:
  """`num_sets` point sets `{"points": [set_size, dim]}` drawn from `cloud_points` [n, dim], held in memory.

  A random-access source (`len`, `[i]`, and `points` [num_sets, set_size, dim] float32); record i
  is the i-th set drawn by `default_rng(seed + 1)`, each without replacement from the cloud.
  `key` is the content key of the cloud and the parameters.
  """

  VERSION = "2.0.0"   # 1.0.0: the same draws, as a tfds array_record build (stored in hashed order)

  def __init__(self, cloud_points: np.ndarray, *, seed: int = 123, set_size: int = 256, num_sets: int = 1024):
    self.cloud_points = np.asarray(cloud_points, np.float32)
    if self.cloud_points.ndim != 2 or len(self.cloud_points) == 0:
      raise ValueError(f"cloud_points must be a non-empty [n, dim] array; got shape {self.cloud_points.shape}")
    if not 1 <= set_size <= len(self.cloud_points):
      raise ValueError(f"set_size must be in [1, {len(self.cloud_points)}]; got {set_size}")
    if num_sets < 1:
      raise ValueError(f"num_sets must be positive; got {num_sets}")
    self.set_size, self.num_sets, self.seed = set_size, num_sets, seed
    self.key = content_key(self.cloud_points, seed, set_size, num_sets)
    rng = np.random.default_rng(seed + 1)
    n = len(self.cloud_points)
    self.points = np.stack([self.cloud_points[rng.choice(n, set_size, replace=False)] for _ in range(num_sets)])
    self.points.flags.writeable = False     # shared by every reader (and by the in-memory cache)

  def __len__(self) -> int:
    return self.num_sets

  def __getitem__(self, i):
    i = int(i)
    if not -self.num_sets <= i < self.num_sets:
      raise IndexError(f"record {i} of {self.num_sets}")
    return {"points": self.points[i]}

  def __repr__(self) -> str:
    return f"PointSets({self.num_sets} × {self.set_size} × {self.cloud_points.shape[1]}, key={self.key})"


def content_key(cloud_points: np.ndarray, seed: int, set_size: int, num_sets: int) -> str:
  """Key of a `PointSets`: the cloud's content and every parameter of the draw."""
  return fingerprint(cloud_points, dict(seed=seed, set_size=set_size, num_sets=num_sets, version=PointSets.VERSION))


_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_SIZE = 4


def point_sets(*, cloud: str = "swiss_roll", num_points: int = 4000, seed: int = 123, set_size: int = 256,
               num_sets: int = 1024):
  """(`PointSets` of the named or local cloud — a random-access source for `attngeo.data.loader` —, the cloud).

  The few most recent sources stay in memory under their content key (`content_key`): a repeated
  call with the same cloud and parameters returns the same source without drawing again.
  """
  cloud_points = load_cloud(cloud, num_points, seed)
  key = content_key(cloud_points, seed, set_size, num_sets)
  source = _CACHE.pop(key, None)
  if source is None:
    source = PointSets(cloud_points, seed=seed, set_size=set_size, num_sets=num_sets)
  _CACHE[key] = source
  while len(_CACHE) > _CACHE_SIZE:
    _CACHE.popitem(last=False)
  return source, source.cloud_points
