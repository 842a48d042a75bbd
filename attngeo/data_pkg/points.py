"""Data: generated point clouds, a tensorflow-datasets builder (array_record, no TensorFlow) and grain loaders.

* `swiss_roll(n, seed)` — the 3-D Swiss roll in standardised coordinates (zero mean, unit variance
  per axis): `t = 1.5π(1 + 2u)`, `(t cos t, 21 v, t sin t)`, `u, v ~ U[0, 1)` (scikit-learn's form).
* `PointSets` — a tfds `GeneratorBasedBuilder` whose records are point sets `{"points": [k, dim]}`
  drawn without replacement from a cloud (a generated one, or a local `.npy`/`.csv` file), built
  with `file_format="array_record"` and read back with `tfds.data_source` semantics
  (`builder.as_data_source`).
* `loader(source, batch_size, seed)` — a grain `MapDataset` pipeline (shuffle → repeat → batch)
  whose iterator state (`get_state()/set_state()`) goes into training checkpoints.
"""
from __future__ import annotations

import os

import grain
import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

CLOUDS = ("swiss_roll", "sphere", "torus")


def swiss_roll(n: int = 4000, seed: int = 123, noise: float = 0.0, standardise: bool = True) -> np.ndarray:
  """[n, 3] float32 Swiss roll; standardised per coordinate unless `standardise=False`."""
  if n < 1:
    raise ValueError(f"n must be positive; got {n}")
  rng = np.random.default_rng(seed)
  t = 1.5 * np.pi * (1 + 2 * rng.random(n))
  x = np.stack([t * np.cos(t), 21.0 * rng.random(n), t * np.sin(t)], 1)
  x = x + noise * rng.standard_normal(x.shape)
  if standardise:
    x = (x - x.mean(0)) / x.std(0)
  return x.astype(np.float32)


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
  x = np.load(cloud) if cloud.endswith(".npy") else np.loadtxt(cloud, delimiter=",", dtype=np.float32)
  if x.ndim != 2 or not np.all(np.isfinite(x)):
    raise ValueError(f"{cloud} must hold a finite [n, dim] array; got shape {x.shape}")
  return x.astype(np.float32)


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
    tag = os.path.splitext(os.path.basename(cloud))[0]
    name = f"{tag}_n{len(self.cloud_points)}_seed{seed}_k{set_size}_m{num_sets}"
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


def loader(source, batch_size: int, seed: int = 0, *, shuffle: bool = True):
  """Infinite grain iterator of batches (dicts of stacked numpy arrays) with `get_state/set_state`."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive; got {batch_size}")
  ds = grain.MapDataset.source(source)
  if shuffle:
    ds = ds.seed(seed).shuffle()
  return iter(ds.repeat(None).batch(batch_size, drop_remainder=True))
