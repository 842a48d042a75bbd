"""attngeo.walks: spectral operators, dense against matrix-free, and their residuals against float64."""
import jax.numpy as jnp
import numpy as np

from attngeo import data, geometry as geo, walks

A = np.array([0.3, -0.5, 0.81]) / np.linalg.norm([0.3, -0.5, 0.81])


def test_matrix_free_spectral_matches_dense_spectral():
  x = jnp.asarray(data.sphere(400, seed=3))          # the shapes of the float64-reference test below: one compile
  f = (x @ A)[:, None]
  dense_op = walks.spectral(walks.gaussian_markov(x, 0.1), 9, 0.025)
  free_op = walks.gaussian_spectral(x, 0.1, 9, block_size=256)
  assert bool(dense_op.spectrum.converged) and bool(free_op.spectrum.converged)
  np.testing.assert_allclose(free_op.spectrum.values, dense_op.spectrum.values, atol=1e-5)
  np.testing.assert_allclose(geo.gamma2(free_op, f), geo.gamma2(dense_op, f), rtol=2e-2, atol=2e-2)


def test_gaussian_spectral_residuals_are_those_of_a_float64_reference():
  """The eigenpairs behind `gaussian_spectral` against dense float64 numpy: eigenvalues within the reported
  bounds; the reported residuals are the float64 residuals of the returned vectors."""
  x = data.sphere(400, seed=4).astype(np.float64)
  eps = 0.1
  k = np.exp(-np.sum((x[:, None] - x[None]) ** 2, -1) / eps)
  q = k.sum(1)
  ka = k / np.outer(q, q)
  d = ka.sum(1)
  a = ka / np.sqrt(np.outer(d, d))
  w = np.linalg.eigvalsh(a)[::-1][:9]
  spec = walks.gaussian_spectral(x, eps, 9, block_size=256).spectrum
  err = np.abs(np.asarray(spec.values, np.float64) - w)
  assert np.all(err <= np.asarray(spec.value_bounds) + 1e-6)            # + the float32 kernel's own rounding
  u = np.asarray(spec.vectors, np.float64)
  r64 = np.linalg.norm(a @ u - u * np.asarray(spec.values, np.float64), axis=0)
  np.testing.assert_allclose(r64, spec.residuals, atol=2e-6)
