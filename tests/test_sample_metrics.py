"""attngeo.sample_metrics against dense formulas, scipy's 1-D energy distance and hand-computed cases."""
import numpy as np
import pytest
from scipy import stats

from attngeo import sample_metrics as sm


def test_nn_distance_matches_dense_minimum():
  rng = np.random.default_rng(0)
  x, ref = rng.standard_normal((50, 3)), rng.standard_normal((80, 3))
  dense = np.sqrt(((x[:, None] - ref[None]) ** 2).sum(-1)).min(1)
  np.testing.assert_allclose(sm.nn_distance(x, ref), dense, rtol=1e-12)


def test_energy_distance_is_scipys_squared_in_one_dimension():
  rng = np.random.default_rng(1)
  u, v = rng.standard_normal(300), 0.5 + 2 * rng.standard_normal(200)
  assert sm.energy_distance(u[:, None], v[:, None]) == pytest.approx(stats.energy_distance(u, v) ** 2, rel=1e-9)


def test_energy_distance_matches_the_dense_v_statistic_across_chunks(monkeypatch):
  rng = np.random.default_rng(2)
  x, y = rng.standard_normal((70, 3)), rng.standard_normal((40, 3)) + 0.3
  dist = lambda a, b: np.sqrt(((a[:, None] - b[None]) ** 2).sum(-1)).mean()
  dense = 2 * dist(x, y) - dist(x, x) - dist(y, y)
  assert sm.energy_distance(x, y) == pytest.approx(dense, rel=1e-10)
  chunked = sm._mean_pairwise(x, y, chunk=16)            # several partial chunks, last one short
  assert chunked == pytest.approx(dist(x, y), rel=1e-12)
  assert sm.energy_distance(x, x) == pytest.approx(0.0, abs=1e-12)


def test_hand_computed_coverage_and_memorisation():
  fresh, gen = np.array([[0.], [1.], [2.], [3.]]), np.array([[0.], [1.]])
  train, heldout = np.array([[0.], [10.]]), np.array([[1.], [11.]])
  q = sm.sample_quality(np.array([[2.], [10.]]), train, fresh, heldout)
  assert q["d_nn_mean"] == 1.0 and q["d_nn_median"] == 1.0          # d to train: 2, 0
  assert q["memorisation"] == pytest.approx(1.0 / 1.0)              # d to heldout: 1, 1
  c = sm.nn_distance(fresh, gen)
  np.testing.assert_array_equal(c, [0, 0, 1, 2])
  q = sm.sample_quality(gen, train, fresh, heldout)                 # coverage: fresh → generated, not back
  assert q["coverage_mean"] == 0.75 and q["coverage_median"] == 0.5
  assert sm.memorisation_ratio(train, train, heldout) == 0.0        # copies of the training set
  assert sm.memorisation_ratio(np.array([[2.]]), train, heldout) == 2.0


def test_true_samples_are_not_memorised_and_copies_are():
  rng = np.random.default_rng(3)
  train, heldout = rng.random((2000, 2)), rng.random((2000, 2))
  assert sm.memorisation_ratio(rng.random((1000, 2)), train, heldout) == pytest.approx(1.0, abs=0.05)
  copies = train[:1000] + 1e-4 * rng.standard_normal((1000, 2))
  assert sm.memorisation_ratio(copies, train, heldout) < 0.05


def test_bad_inputs_name_the_argument():
  with pytest.raises(ValueError, match="points must be a non-empty"):
    sm.nn_distance(np.zeros(3), np.zeros((2, 3)))
  with pytest.raises(ValueError, match="same dim"):
    sm.energy_distance(np.zeros((2, 3)), np.zeros((2, 2)))
  with pytest.raises(ValueError, match="x holds 1 non-finite"):
    sm.energy_distance(np.array([[np.nan]]), np.zeros((2, 1)))
  with pytest.raises(ValueError, match="heldout must be as large as train"):
    sm.memorisation_ratio(np.zeros((1, 2)), np.zeros((3, 2)), np.zeros((2, 2)))
