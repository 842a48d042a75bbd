"""attngeo.data: generated clouds, in-memory point sets read by grain (per process), local files, grain batches."""
import numpy as np
import pytest

from attngeo import data


def test_swiss_roll_is_standardised_and_seeded():
  x = data.swiss_roll(4000, seed=123)
  assert x.shape == (4000, 3) and x.dtype == np.float32
  np.testing.assert_allclose(x.mean(0), 0, atol=1e-5)
  np.testing.assert_allclose(x.std(0), 1, atol=1e-4)
  np.testing.assert_array_equal(x, data.swiss_roll(4000, seed=123))
  assert not np.array_equal(x, data.swiss_roll(4000, seed=124))


def test_sphere_and_torus_lie_on_their_manifolds():
  np.testing.assert_allclose(np.linalg.norm(data.sphere(100, radius=2.0), axis=1), 2.0, rtol=1e-6)
  t = data.flat_torus(100)
  np.testing.assert_allclose(t[:, 0] ** 2 + t[:, 1] ** 2, 1.0, rtol=1e-6)


def test_point_sets_in_memory(tmp_path):
  src, cloud = data.point_sets(cloud="swiss_roll", num_points=500, seed=3, set_size=32, num_sets=20)
  assert len(src) == 20 and src.points.shape == (20, 32, 3) and src.points.dtype == np.float32
  pts = np.stack([src[i]["points"] for i in range(20)])
  np.testing.assert_array_equal(pts, src.points)
  # every record's points come from the cloud, without replacement within a set
  idx = [{tuple(p) for p in s} for s in pts]
  cloud_set = {tuple(p) for p in cloud}
  assert all(s <= cloud_set and len(s) == 32 for s in idx)
  # record i is the i-th draw of default_rng(seed + 1): no storage order between the draw and the reader
  rng = np.random.default_rng(4)
  np.testing.assert_array_equal(src[0]["points"], cloud[rng.choice(500, 32, replace=False)])
  np.testing.assert_array_equal(src[1]["points"], cloud[rng.choice(500, 32, replace=False)])
  with pytest.raises(IndexError):
    src[20]
  assert not list(tmp_path.iterdir())                  # nothing written anywhere: no build
  batch = next(data.loader(src, 4, seed=0))
  assert batch["points"].shape == (4, 32, 3)


def test_point_sets_each_process_reads_only_its_rows():
  """Two processes of a global batch of 4: each reads its 2 rows, together exactly the single process's batch."""
  src, _ = data.point_sets(cloud="swiss_roll", num_points=300, seed=5, set_size=8, num_sets=12)

  class Counting:
    def __init__(self):
      self.read = []

    def __len__(self):
      return len(src)

    def __getitem__(self, i):
      self.read.append(int(i))
      return src[i]
  whole = data.loader(src, 4, seed=1, num_processes=1, process_index=0, prefetch=0, threads=0)
  parts = [Counting(), Counting()]
  its = [data.loader(p, 4, seed=1, num_processes=2, process_index=i, prefetch=0, threads=0)
         for i, p in enumerate(parts)]
  for _ in range(5):                                    # past one epoch (12 records, 3 batches)
    both = np.concatenate([next(it)["points"] for it in its])
    np.testing.assert_array_equal(both, next(whole)["points"])
  assert [len(p.read) for p in parts] == [10, 10]       # 2 rows × 5 steps each, never the other's


def test_local_file_cloud(tmp_path):
  path = tmp_path / "cloud.csv"
  np.savetxt(path, np.random.default_rng(0).standard_normal((50, 2)), delimiter=",")
  src, cloud = data.point_sets(cloud=str(path), num_points=0, set_size=10, num_sets=3)
  assert cloud.shape == (50, 2) and src[0]["points"].shape == (10, 2)


def test_bad_data_arguments(tmp_path):
  with pytest.raises(ValueError, match="cloud must be one of"):
    data.load_cloud("nowhere.npy", 10, 0)
  with pytest.raises(ValueError, match="set_size must be in"):
    data.point_sets(num_points=10, set_size=20)
  with pytest.raises(ValueError, match="num_sets must be positive"):
    data.point_sets(num_points=10, set_size=5, num_sets=0)
  with pytest.raises(ValueError, match="batch_size must be positive"):
    data.loader([1, 2], 0)


def test_roll_parameter_and_oracle_lie_on_the_training_rolls_coordinates():
  raw, t = data.swiss_roll(300, seed=5, standardise=False, return_t=True)
  np.testing.assert_allclose(raw[:, 0], t * np.cos(t), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(raw[:, 2], t * np.sin(t), rtol=1e-5, atol=1e-5)
  assert t.min() >= 1.5 * np.pi and t.max() < 4.5 * np.pi
  train_raw = data.swiss_roll(400, seed=7, standardise=False).astype(np.float64)
  x, s = data.swiss_roll_oracle(500, seed=8, like=(400, 7))
  back = x * train_raw.std(0) + train_raw.mean(0)                       # undo the TRAINING set's scaling
  np.testing.assert_allclose(back[:, 0], s * np.cos(s), atol=2e-4)
  np.testing.assert_allclose(back[:, 2], s * np.sin(s), atol=2e-4)
  assert not np.allclose(x.mean(0), 0, atol=1e-6)                       # not standardised by its own moments
  with pytest.raises(ValueError, match="seed must differ"):
    data.swiss_roll_oracle(10, seed=7, like=(400, 7))


def test_point_set_cache_is_keyed_by_content(tmp_path):
  rng = np.random.default_rng(0)
  (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
  for sub in "ab":
    np.save(tmp_path / sub / "cloud.npy", rng.standard_normal((40, 3)).astype(np.float32))
  src_a, cloud_a = data.point_sets(cloud=str(tmp_path / "a" / "cloud.npy"), num_points=0, set_size=8, num_sets=2)
  src_b, cloud_b = data.point_sets(cloud=str(tmp_path / "b" / "cloud.npy"), num_points=0, set_size=8, num_sets=2)
  rows = lambda src, cloud: {tuple(p) for p in src[0]["points"]} <= {tuple(p) for p in cloud}
  assert rows(src_a, cloud_a) and rows(src_b, cloud_b) and not rows(src_b, cloud_a)
  assert src_a.key != src_b.key
  # the same content under the same name: drawn once; changed content under the same name: drawn anew
  again, _ = data.point_sets(cloud=str(tmp_path / "a" / "cloud.npy"), num_points=0, set_size=8, num_sets=2)
  assert again is src_a
  np.save(tmp_path / "a" / "cloud.npy", rng.standard_normal((40, 3)).astype(np.float32))
  changed, cloud_c = data.point_sets(cloud=str(tmp_path / "a" / "cloud.npy"), num_points=0, set_size=8, num_sets=2)
  assert changed is not src_a and changed.key != src_a.key and rows(changed, cloud_c)


def test_values_beyond_float32_are_refused(tmp_path):
  x = np.ones((5, 3))
  x[2, 1] = 1e39                              # finite in float64, inf after the float32 cast
  np.save(tmp_path / "big.npy", x)
  with pytest.raises(ValueError, match=r"big.npy must hold values finite in float32 .* 1 are not"):
    data.load_cloud(str(tmp_path / "big.npy"), 0, 0)
  np.save(tmp_path / "nan.npy", np.full((3, 2), np.nan))
  with pytest.raises(ValueError, match="finite in float32"):
    data.load_cloud(str(tmp_path / "nan.npy"), 0, 0)
