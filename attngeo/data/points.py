"""Point clouds: generated manifolds and a tensorflow-datasets builder of point sets (array_record, no TensorFlow).

* `swiss_roll(n, seed)` — the 3-D Swiss roll in standardised coordinates (zero mean, unit variance
  per axis): `t = 1.5π(1 + 2u)`, `(t cos t, 21 v, t sin t)`, `u, v ~ U[0, 1)` (scikit-learn's form);
  `return_t=True` also returns each point's roll parameter `t ∈ [1.5π, 4.5π)` (position along the roll).
* `swiss_roll_oracle(n, seed, like=(num_points, train_seed))` — fresh samples of the same generating
  distribution, standardised with the training set's mean and std (not their own): the oracle
  generator against which generated samples are judged (`attngeo.sample_metrics`).
* `PointSets` — a tfds `GeneratorBasedBuilder` whose records are point sets `{"points": [k, dim]}`
  drawn without replacement from a cloud (a generated one, or a local `.npy`/`.csv` file), built
  with `file_format="array_record"` and read back with `tfds.data_source` semantics
  (`builder.as_data_source`). The build is cached under a name keyed by the content of the cloud
  and the builder's parameters (`attngeo.runs.fingerprint`), so two different clouds never share it.
"""
from __future__ import annotations

import os
import re

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from attngeo.runs import fingerprint

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


class PointSets(tfds.core.GeneratorBasedBuilder):
  """Point sets drawn from one cloud: split `train` has `num_sets` records `{"points": [set_size, dim]}`."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Point sets sampled without replacement from a generated or local cloud."}

  def __init__(self, *, cloud: str = "swiss_roll", num_points: int = 4000, seed: int = 123, set_size: int = 256,
               num_sets: int = 1024, **kwargs):
    self.cloud_points = load_cloud(cloud, num_points, seed)
    if not 1 <= set_size <= len(self.cloud_points):
      raise ValueError(f"set_size must be in [1, {len(self.cloud_points)}]; got {set_size}")
    self.set_size, self.num_sets, self.seed = set_size, num_sets, seed
    tag = re.sub(r"[^a-z0-9]+", "_", os.path.splitext(os.path.basename(cloud))[0].lower()).strip("_") or "cloud"
    key = fingerprint(self.cloud_points,
                      dict(seed=seed, set_size=set_size, num_sets=num_sets, version=str(self.VERSION)))
    name = f"{tag}_{key}"   # keyed by content: the cloud's points and every parameter of the build
    super().__init__(config=tfds.core.BuilderConfig(name=name, version=self.VERSION), **kwargs)

  def _info(self):
    dim = self.cloud_points.shape[1]
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(
        {"points": tfds.features.Tensor(shape=(self.set_size, dim), dtype=np.float32)}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    rng = np.random.default_rng(self.seed + 1)
    for i in range(self.num_sets):
      idx = rng.choice(len(self.cloud_points), self.set_size, replace=False)
      yield i, {"points": self.cloud_points[idx]}


def point_sets(data_dir: str, **kwargs):
  """Build (once) and open `PointSets(**kwargs)` as a random-access tfds data source, plus the cloud."""
  tfds.disable_progress_bar()
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)   # tfds logs every custom config at WARNING
  try:
    builder = PointSets(data_dir=data_dir, **kwargs)
    builder.download_and_prepare(file_format="array_record")
  finally:
    absl_logging.set_verbosity(verbosity)
  return builder.as_data_source(split="train"), builder.cloud_points
