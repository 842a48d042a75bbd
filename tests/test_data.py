"""attngeo.data: generated clouds, the array_record tfds builder read back, local files, grain batches."""
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


def test_point_sets_builder_roundtrip(tmp_path):
  src, cloud = data.point_sets(str(tmp_path), cloud="swiss_roll", num_points=500, seed=3, set_size=32, num_sets=20)
  assert len(src) == 20
  pts = np.stack([src[i]["points"] for i in range(20)])
  assert pts.shape == (20, 32, 3)
  # every record's points come from the cloud, without replacement within a set
  idx = [{tuple(p) for p in s} for s in pts]
  cloud_set = {tuple(p) for p in cloud}
  assert all(s <= cloud_set and len(s) == 32 for s in idx)
  assert list((tmp_path / "point_sets").glob("*/1.0.0/*.array_record*"))
  batch = next(data.loader(src, 4, seed=0))
  assert batch["points"].shape == (4, 32, 3)


def test_local_file_cloud(tmp_path):
  path = tmp_path / "cloud.csv"
  np.savetxt(path, np.random.default_rng(0).standard_normal((50, 2)), delimiter=",")
  src, cloud = data.point_sets(str(tmp_path / "tfds"), cloud=str(path), num_points=0, set_size=10, num_sets=3)
  assert cloud.shape == (50, 2) and src[0]["points"].shape == (10, 2)


def test_bad_data_arguments(tmp_path):
  with pytest.raises(ValueError, match="cloud must be one of"):
    data.load_cloud("nowhere.npy", 10, 0)
  with pytest.raises(ValueError, match="set_size must be in"):
    data.PointSets(data_dir=str(tmp_path), num_points=10, set_size=20)
  with pytest.raises(ValueError, match="batch_size must be positive"):
    data.loader([1, 2], 0)
