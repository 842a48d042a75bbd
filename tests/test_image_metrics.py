"""attngeo.image_metrics: Fréchet distance and precision/recall against closed forms; the classifier
metric's scale on scikit-learn's digits (held-out real split near 0, noise large)."""
import numpy as np
import pytest
import scipy.linalg

from attngeo import data, image_metrics as im


def test_gaussian_frechet_closed_forms():
  mu1, mu2 = np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 0.0])
  a, b = np.array([1.0, 4.0, 0.25]), np.array([9.0, 1.0, 0.25])
  want = 5.0 + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2)                  # commuting (diagonal) covariances
  np.testing.assert_allclose(im.gaussian_frechet(mu1, np.diag(a), mu2, np.diag(b)), want, rtol=1e-12)
  rng = np.random.default_rng(0)
  m1, m2 = rng.normal(size=(4, 4)), rng.normal(size=(4, 4))
  s1, s2 = m1 @ m1.T, m2 @ m2.T                                         # non-commuting
  ref = np.trace(s1 + s2 - 2 * np.real(scipy.linalg.sqrtm(s1 @ s2)))
  np.testing.assert_allclose(im.gaussian_frechet(np.zeros(4), s1, np.zeros(4), s2), ref, rtol=1e-9)
  s_singular = np.diag([1.0, 0.0, 2.0, 0.0])                            # dead features: no NaN, no warning
  np.testing.assert_allclose(im.gaussian_frechet(np.zeros(4), s_singular, np.zeros(4), s_singular), 0.0, atol=1e-9)


def test_frechet_distance_of_samples_converges_to_the_gaussian_value():
  rng = np.random.default_rng(1)
  f1 = rng.normal(size=(40_000, 3))
  f2 = rng.normal(size=(40_000, 3)) * 2.0 + 1.0
  np.testing.assert_allclose(im.frechet_distance(f1, f2), 3.0 + 3.0 * (1 - 2) ** 2, rtol=0.02)   # 3·1² + 3·(1−2)²


def test_precision_recall_by_hand():
  real = np.array([[0.0], [1.0], [2.0], [3.0]])           # k = 1: every real ball has radius 1
  fake = np.array([[0.5], [10.0]])                        # fake balls: radius 9.5 each
  assert im.precision_recall(real, fake, k=1) == (0.5, 1.0)
  assert im.precision_recall(real, real, k=1) == (1.0, 1.0)
  assert im.precision_recall(real, real + 100.0, k=1) == (0.0, 0.0)
  with pytest.raises(ValueError, match="needs more than 3"):
    im.precision_recall(real, fake, k=3)


@pytest.fixture(scope="module")
def digits_classifier(tmp_path_factory):
  _, _, b = data.image_sets(str(tmp_path_factory.mktemp("data")), "digits")
  cfg = im.ClassifierConfig(image_size=8, channels=1, num_classes=10, conv=(16,), steps=300)
  model = im.train_classifier(b.images[b.train_idx], b.labels[b.train_idx], cfg)
  return model, b


def test_metric_scale_on_held_out_digits_and_noise(digits_classifier, tmp_path):
  model, b = digits_classifier
  test_x, test_y = b.images[b.test_idx], b.labels[b.test_idx]
  test_acc = float(np.mean(np.argmax(np.asarray(model(test_x)), -1) == test_y))
  assert test_acc > 0.9
  check = im.reference_check(model, b.images[b.train_idx], test_x, test_y)
  real, noise = check["real"], check["noise"]
  assert real["accuracy"] == test_acc                       # samples of the right class score the test accuracy
  assert real["fd"] < 0.05 * noise["fd"]
  assert real["precision"] > 0.8 and real["recall"] > 0.8
  assert noise["precision"] < 0.1 and noise["accuracy"] < 0.3
  im.save(model, str(tmp_path / "clf"), extra={"data": "digits"})
  loaded, meta = im.load(str(tmp_path / "clf"))
  assert meta["data"] == "digits"
  np.testing.assert_allclose(im.features(loaded, test_x[:16]), im.features(model, test_x[:16]), rtol=1e-6, atol=1e-6)


def test_nearest_images_are_the_brute_force_ones():
  rng = np.random.default_rng(0)
  ref = rng.uniform(-1, 1, (37, 4, 4, 1))
  x = rng.uniform(-1, 1, (11, 4, 4, 1))
  dist, idx = im.nearest_images(x, ref, chunk=4)                    # several chunks, one short
  full = np.linalg.norm(x.reshape(11, 1, -1) - ref.reshape(1, 37, -1), axis=-1)
  np.testing.assert_array_equal(idx, full.argmin(1))
  np.testing.assert_allclose(dist, full.min(1), rtol=1e-12)
  with pytest.raises(ValueError, match="one image shape"):
    im.nearest_images(x, ref[:, :2])


def test_memorisation_ratio_reads_copies_and_fresh_draws():
  """Copies of training images sit at distance 0 (ratio 0); fresh draws of the same distribution as the
  held-out set read about 1."""
  rng = np.random.default_rng(1)
  train, heldout, fresh = (rng.uniform(-1, 1, (n, 3, 3, 1)) for n in (400, 100, 100))
  copies = train[rng.choice(400, 50)] + 1e-9
  assert im.memorisation(copies, train, heldout)["nn_ratio"] < 1e-6
  out = im.memorisation(fresh, train, heldout)
  assert 0.9 < out["nn_ratio"] < 1.1 and out["nn_heldout"] > 0.5
