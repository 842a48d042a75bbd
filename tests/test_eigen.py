"""attngeo.eigen: matrix-free eigensolvers against float64 LAPACK, and the honesty of their bounds and flags."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo import eigen


def symmetric_with_spectrum(values, seed):
  """Q diag(values) Qᵀ in float64 with a random orthogonal Q (the spectrum is known exactly)."""
  n = len(values)
  q = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))[0]
  return (q * values) @ q.T, q


def reversible_chain(n, conductance, seed):
  """Symmetric conjugate A = D^{-1/2} K D^{-1/2} of a reversible walk P = D⁻¹K on a path: K = S^{1/2} W S^{1/2}
  with W the lazy walk of random conductances and S random weights (π ∝ d non-uniform); the gap
  shrinks like conductance/n². Returns (A, √π)."""
  rng = np.random.default_rng(seed)
  c = rng.uniform(0.5, 1.5, n - 1) * conductance
  w = np.diag(c, 1) + np.diag(c, -1)
  w += np.diag(1.0 - w.sum(1))
  s = rng.uniform(0.5, 2.0, n)
  k = w * np.sqrt(s[:, None] * s[None, :])
  d = k.sum(1)
  return k / np.sqrt(d[:, None] * d[None, :]), np.sqrt(d / d.sum())


@functools.partial(jax.jit, static_argnames=("k", "tol", "max_matvecs", "shift"))
def dense_eigsh(a, k, tol, max_matvecs=3000, deflate=None, shift=None):
  """`eigen.eigsh` on a dense matrix, jitted once per (shape, k, tol, …) for the whole module."""
  return eigen.eigsh(lambda v: a @ v, a.shape[0], k, tol=tol, max_matvecs=max_matvecs, deflate=deflate, shift=shift)


@functools.partial(jax.jit, static_argnames=("k", "krylov", "tol", "max_cycles"))
def dense_eig(p, k, krylov, tol, max_cycles=100):
  return eigen.eig(lambda v: p @ v, p.shape[0], k, krylov=krylov, tol=tol, max_cycles=max_cycles)


def angles(u, ref):
  u = np.asarray(u, np.float64)
  return np.arccos(np.minimum(1.0, np.abs(np.sum(u * ref, 0)) / np.linalg.norm(u, axis=0)))


@pytest.mark.parametrize("gap", [1e-1, 1e-2, 1e-3, 1e-4])
def test_eigsh_bounds_hold_for_small_gaps(gap):
  """Eigenvalues 1, 1 − gap, 1 − 2·gap, … on top of a bulk in [−1, 0.5]: values and vectors agree
  with the exact ones within the reported bounds; `converged` ⇒ every residual ≤ tol."""
  n, k = 300, 4
  top = 1.0 - gap * np.arange(k + 2)
  bulk = np.random.default_rng(1).uniform(-1.0, 0.5, n - k - 2)
  a, q = symmetric_with_spectrum(np.concatenate([top, bulk]), seed=2)
  aj = jnp.asarray(a, jnp.float32)
  res = dense_eigsh(aj, k, 1e-5)
  assert bool(res.converged) and np.all(np.asarray(res.residuals) <= 1e-5)
  err = np.abs(np.asarray(res.values, np.float64) - top[:k])
  assert np.all(err <= np.asarray(res.value_bounds))
  assert np.all(angles(res.vectors, q[:, :k]) <= np.arcsin(np.minimum(1.0, np.asarray(res.vector_bounds))) + 1e-4)
  # the residual computed by the solver is the residual of what it returns
  v = np.asarray(res.vectors, np.float64)
  np.testing.assert_allclose(np.linalg.norm(a @ v - v * np.asarray(res.values), axis=0), res.residuals, atol=2e-6)


def test_eigsh_deflation_and_shift_on_a_reversible_walk():
  """A slowly mixing reversible walk (gap ~ 1e-4): with √π deflated, the next pairs match float64
  `eigh`, and `shifted` = 1 − λ is accurate relative to itself."""
  a, sqrt_pi = reversible_chain(200, 0.2, seed=3)
  w, u = np.linalg.eigh(a)
  w, u = w[::-1], u[:, ::-1]
  assert abs(w[0] - 1) < 1e-12 and 1e-5 < 1 - w[1] < 1e-3
  np.testing.assert_allclose(np.abs(u[:, 0]), sqrt_pi, atol=1e-10)
  aj = jnp.asarray(a, jnp.float32)
  res = dense_eigsh(aj, 3, 1e-6, 4000, deflate=jnp.asarray(sqrt_pi, jnp.float32)[:, None], shift=1.0)
  assert bool(res.converged)
  np.testing.assert_allclose(np.asarray(res.shifted), 1 - w[1:4], rtol=1e-3)
  assert np.all(np.degrees(angles(res.vectors, u[:, 1:4])) < 0.5)


def test_eigsh_reports_failure_honestly():
  """Out of budget: converged is False and the residuals show why."""
  top = 1.0 - 1e-3 * np.arange(6)
  a, _ = symmetric_with_spectrum(np.concatenate([top, np.linspace(-1, 0.99, 194)]), seed=4)
  aj = jnp.asarray(a, jnp.float32)
  res = dense_eigsh(aj, 4, 1e-6, 12)
  assert not bool(res.converged)
  assert float(res.residuals.max()) > 1e-6 and int(res.matvecs) <= 12


def test_eigsh_is_jittable_and_checks_arguments():
  a, _ = symmetric_with_spectrum(np.linspace(-1, 1, 50), seed=5)
  aj = jnp.asarray(a, jnp.float32)
  res = jax.jit(lambda m: eigen.eigsh(lambda v: m @ v, 50, 3, tol=1e-5))(aj)
  np.testing.assert_allclose(res.values, [1.0, 1 - 2 / 49, 1 - 4 / 49], atol=1e-5)
  with pytest.raises(ValueError, match="k must be in"):
    eigen.eigsh(lambda v: v, 10, 11)
  with pytest.raises(ValueError, match="x0 must be"):
    eigen.eigsh(lambda v: v, 10, 2, block=4, x0=jnp.ones((10, 3)))


@pytest.mark.parametrize("krylov", [12, 40])
def test_eig_matches_lapack_on_non_normal_chains(krylov):
  """Largest-modulus eigenvalues of a non-reversible Markov matrix (complex pairs) against float64 eigvals."""
  rng = np.random.default_rng(6)
  p = rng.random((120, 120)) ** 6
  p /= p.sum(1, keepdims=True)
  ref = np.linalg.eigvals(p)
  ref = ref[np.argsort(-np.abs(ref))]
  pj = jnp.asarray(p, jnp.float32)
  res = dense_eig(pj, 4, krylov, 1e-5)
  assert bool(res.converged) and np.all(np.asarray(res.residuals) <= 1e-5)
  np.testing.assert_allclose(np.abs(res.values), np.abs(ref[:4]), atol=1e-5)
  assert max(np.min(np.abs(ref - v)) for v in np.asarray(res.values)) < 1e-5
  x = np.asarray(res.vectors)
  np.testing.assert_allclose(np.linalg.norm(p @ x - x * np.asarray(res.values), axis=0), res.residuals, atol=1e-6)


def test_eig_out_of_cycles_is_not_converged():
  rng = np.random.default_rng(7)
  p = rng.random((150, 150)) ** 2
  p /= p.sum(1, keepdims=True)
  pj = jnp.asarray(p, jnp.float32)
  res = dense_eig(pj, 6, 8, 1e-7, 1)
  assert not bool(res.converged) and float(res.residuals.max()) > 1e-7


def test_eig_full_krylov_is_exact():
  """krylov = n: one Hessenberg reduction gives every eigenvalue (the n-cycle: roots of unity)."""
  n = 7
  p = jnp.roll(jnp.eye(n), 1, axis=1)
  res = dense_eig(p, n, n, 1e-5)
  assert bool(res.converged)
  np.testing.assert_allclose(np.sort(np.angle(res.values)), np.sort(np.angle(np.exp(2j * np.pi * np.arange(n) / n))), atol=1e-5)


def test_eigsh_value_bounds_in_float64_are_kato_temple_tight():
  """In float64 with a loose tol the residuals are large and the value bounds are Kato–Temple's r²/δ:
  the true errors stay below them, and within two orders of magnitude of them (a bound that is not slack)."""
  with jax.enable_x64(True):
    top = 1.0 - 1e-2 * np.arange(8)
    a, _ = symmetric_with_spectrum(np.concatenate([top, np.random.default_rng(8).uniform(-1.0, 0.5, 192)]), seed=9)
    res = dense_eigsh(jnp.asarray(a), 4, 1e-3)
    err = np.abs(np.asarray(res.values) - top[:4])
    bounds = np.asarray(res.value_bounds)
    assert np.all(err <= bounds) and np.all(bounds < np.asarray(res.residuals))      # Kato–Temple, not Weyl
    assert np.max(err / bounds) > 1e-2


# ----------------------------------------------------------------------------- fixed-size Krylov (lanczos)

def _lanczos(a, steps, seed=0):
  a = jnp.asarray(a, jnp.float32)
  v0 = jnp.asarray(np.random.default_rng(seed).standard_normal(a.shape[:-1]), jnp.float32)
  return jax.jit(lambda a, v0: eigen.lanczos(lambda v: jnp.einsum("...ij,...j->...i", a, v), v0, steps))(a, v0)


def test_lanczos_with_a_full_krylov_space_is_every_eigenpair():
  values = np.linspace(-1.0, 2.0, 12) ** 3
  a, _ = symmetric_with_spectrum(values, 0)
  ritz = _lanczos(a, 12)
  np.testing.assert_allclose(ritz.values, np.sort(values), atol=2e-5)
  assert float(ritz.residuals.max()) < 1e-4
  np.testing.assert_allclose(np.asarray(ritz.vectors) @ np.asarray(ritz.vectors).T, np.eye(12), atol=1e-5)


def test_lanczos_extremes_never_overshoot_and_each_value_is_within_its_residual():
  """A short Krylov space (12 of 200 dimensions): Cauchy interlacing keeps θ in [λ_min, λ_max]; each Ritz
  value lies within its residual of some eigenvalue; well-separated extremes converge."""
  values = np.concatenate([[-0.9, 0.95], np.linspace(-0.5, 0.5, 198)])
  a, _ = symmetric_with_spectrum(values, 1)
  ritz = _lanczos(a, 12)
  theta, res = np.asarray(ritz.values, np.float64), np.asarray(ritz.residuals, np.float64)
  assert theta.min() >= -0.9 - 1e-5 and theta.max() <= 0.95 + 1e-5
  dist = np.abs(theta[:, None] - values[None, :]).min(1)
  assert np.all(dist <= res + 1e-5), (dist, res)
  np.testing.assert_allclose(theta[[0, -1]], [-0.9, 0.95], atol=1e-4)
  # the Ritz vectors' residuals are what they say: ‖Ax − θx‖ recomputed in float64
  x = np.asarray(ritz.vectors, np.float64)
  np.testing.assert_allclose(np.linalg.norm(x @ a - theta[:, None] * x, axis=1), res, atol=2e-5)


def test_lanczos_past_an_invariant_subspace_keeps_interlacing():
  """diag(1, 2, 3, 4) from e₁: K_1 is invariant at once. The basis goes on from fresh directions, so the
  three Ritz values are eigenvalue-like (≥ λ_min = 1, each within its residual of an eigenvalue), not the
  zeros a zero-padded basis would report; a zero start vector is replaced, not kept."""
  a = jnp.diag(jnp.arange(1.0, 5.0))
  for v0 in (jnp.eye(4)[0], jnp.zeros(4)):
    ritz = jax.jit(lambda v0: eigen.lanczos(lambda v: a @ v, v0, 3))(v0)
    theta, res = np.asarray(ritz.values), np.asarray(ritz.residuals)
    assert theta.min() >= 1 - 1e-5 and theta.max() <= 4 + 1e-5, theta
    assert np.all(np.abs(theta[:, None] - np.arange(1.0, 5.0)).min(1) <= res + 1e-5), (theta, res)
    np.testing.assert_allclose(np.asarray(ritz.vectors) @ np.asarray(ritz.vectors).T, np.eye(3), atol=1e-5)


def test_lanczos_on_an_invariant_subspace_stops_cleanly_and_batches():
  """A of rank 2 from a start inside its range: K_2 is invariant, the two nonzero eigenvalues are exact
  and the other Ritz values are A's zero eigenvalue; a batch of two agrees with one call each."""
  rng = np.random.default_rng(2)
  u = np.linalg.qr(rng.standard_normal((9, 2)))[0]
  a = (u * [1.5, -0.7]) @ u.T
  v0 = u @ [1.0, 2.0]
  ritz = jax.jit(lambda a, v0: eigen.lanczos(lambda v: a @ v, v0, 6))(jnp.asarray(a, jnp.float32),
                                                                       jnp.asarray(v0, jnp.float32))
  assert np.all(np.isfinite(ritz.values)) and np.all(np.isfinite(ritz.vectors))
  np.testing.assert_allclose(np.sort(np.asarray(ritz.values))[[0, -1]], [-0.7, 1.5], atol=1e-5)
  np.testing.assert_allclose(np.sort(np.abs(np.asarray(ritz.values)))[:4], 0.0, atol=1e-5)
  both = np.stack([symmetric_with_spectrum(np.linspace(-1, 1, 7) * s, 3)[0] for s in (1.0, 2.0)])
  batched = _lanczos(both, 4)
  for i in range(2):
    one = jax.jit(lambda a, v0: eigen.lanczos(lambda v: a @ v, v0, 4))(
        jnp.asarray(both[i], jnp.float32), jnp.asarray(np.random.default_rng(0).standard_normal((2, 7))[i], jnp.float32))
    np.testing.assert_allclose(batched.values[i], one.values, atol=1e-5)


@pytest.mark.parametrize("steps", [0, -1, 4, 2.0, True])
def test_lanczos_refuses_a_bad_step_count(steps):
  with pytest.raises(ValueError, match=r"steps must be an integer in \[1, n = 3\]"):
    eigen.lanczos(lambda v: v, jnp.ones(3), steps)
  with pytest.raises(ValueError, match="v0 must be a floating array"):
    eigen.lanczos(lambda v: v, jnp.ones(3, jnp.int32), 2)
