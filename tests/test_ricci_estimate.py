"""attngeo.ricci_estimate: the Ricci read-out's basis-size rule on spheres and a torus of revolution against closed-form curvature."""
import numpy as np
import pytest
from attngeo import ricci_estimate, surfaces


@pytest.mark.parametrize("name,make,k", [
    ("sphere r = 2", lambda: surfaces.sphere(1500, 0, radius=2.0), 16),
    pytest.param("S^3", lambda: surfaces.sphere(1500, 0, dim=4), 36, marks=pytest.mark.slow)])
def test_ricci_estimate_on_spheres(name, make, k):
  """S^d(r): mean_ricci = (d − 1)/r² within ±15 %; the closure rule picks the harmonics of degree ≤ 3
  (16 on S², 30 on S³). The unit sphere is in `test_spectral_ricci_cometric_is_the_tangent_projector`."""
  s = make()
  est = ricci_estimate.ricci_estimate(s.points, s.dimension)
  truth = (s.dimension - 1) * s.curvature[0]
  assert est.k == k and est.resolved
  assert abs(est.mean_ricci.mean() / truth - 1) < 0.15
  assert np.median(np.abs(est.mean_ricci - truth)) < 0.25 * truth


def test_ricci_estimate_gets_the_sign_on_a_torus_of_revolution():
  """K = cos θ / (r (R + r cos θ)) changes sign; k = 16 (right for spheres) reads the inner region
  positive, the closure rule's k reads both signs, with median error ≤ 25 % of max|K| and a mean near
  the Gauss–Bonnet value 0."""
  s = surfaces.torus(2000, 0)
  est = ricci_estimate.ricci_estimate(s.points, 2)
  k, ric = s.curvature, est.mean_ricci
  strong = np.abs(k) > 0.2
  assert est.k > 24 and est.resolved
  assert np.mean(np.sign(ric[strong]) == np.sign(k[strong])) > 0.9
  assert np.median(np.abs(ric - k)) < 0.25
  assert abs(ric.mean()) < 0.2 and ric[k < -0.2].mean() < -0.2 and ric[k > 0.2].mean() > 0.1
  fixed = ricci_estimate.ricci_estimate(s.points, 2, eps=est.eps, ks=(16,))
  assert fixed.mean_ricci[k < -0.2].mean() > 0                  # the wrong sign the rule avoids


@pytest.mark.slow
def test_ricci_estimate_mean_on_a_torus_of_revolution_is_gauss_bonnet():
  """N = 4000: the mean read-out is within its reported uncertainty of the Gauss–Bonnet value 0 and
  within 0.06 (the closure k alone, 36, reads +0.10); sign and pointwise targets hold at the chosen k."""
  s = surfaces.torus(4000, 0)
  est = ricci_estimate.ricci_estimate(s.points, 2, ks=(16, 24, 36, 54, 81))
  k, ric = s.curvature, est.mean_ricci
  assert est.window == (36, 54, 81) and est.k == 54
  assert abs(ric.mean()) <= est.mean_uncertainty and abs(ric.mean()) < 0.06
  assert est.window_means[0] > 0.08                              # the closure k's bias, seen by the window
  strong = np.abs(k) > 0.2
  assert np.mean(np.sign(ric[strong]) == np.sign(k[strong])) > 0.95
  assert np.median(np.abs(ric - k)) < 0.25
