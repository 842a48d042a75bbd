"""attngeo.markov: diagnostics against closed forms, known chains and the operator theorems."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from attngeo import markov, operators as op

SETTINGS = settings(max_examples=15, deadline=None)


def random_qk(seed, n=24, h=2, d=6, spread=1.0):
  kq, kk = jax.random.split(jax.random.PRNGKey(seed))
  return spread * jax.random.normal(kq, (1, n, h, d)), spread * jax.random.normal(kk, (1, n, h, d))


@SETTINGS
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["DMAP", "ATAP"]))
def test_exact_a_operators_are_reversible_with_no_skew(seed, name):
  q, k = random_qk(seed)
  beta, alpha = op.corner(name)
  p = op.markov_matrix(q, k, beta=beta, alpha=alpha)
  assert float(markov.reversibility(p).max()) < 1e-5
  assert float(markov.skew_share(p=p).max()) < 1e-5
  assert float(markov.skew_share(op.logits(q, k, beta=beta, alpha=alpha).full).max()) < 1e-5


@SETTINGS
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["DMTN", "ATTN"]))
def test_free_a_operators_have_skew(seed, name):
  q, k = random_qk(seed)
  beta, alpha = op.corner(name)
  p = op.markov_matrix(q, k, beta=beta, alpha=alpha)
  assert float(markov.reversibility(p).min()) > 1e-2
  assert float(markov.skew_share(p=p).min()) > 1e-2


@SETTINGS
@given(seed=st.integers(0, 10_000))
def test_diagnostics_invariant_under_row_shifts(seed):
  q, k = random_qk(seed)
  lg = op.logits(q, k, beta=0.3, alpha=0.8).full
  shift = 10 * jax.random.normal(jax.random.PRNGKey(seed + 1), lg.shape[:-1] + (1,))
  p1, p2 = jax.nn.softmax(lg, -1), jax.nn.softmax(lg + shift, -1)
  for fn in (markov.entropy, markov.reversibility, lambda p: markov.skew_share(p=p)):
    np.testing.assert_allclose(fn(p1), fn(p2), atol=1e-4)
  np.testing.assert_allclose(markov.skew_share(lg), markov.skew_share(lg + shift), atol=1e-5)


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(3, 30))
def test_pi_is_stationary(seed, n):
  p = jax.nn.softmax(3 * jax.random.normal(jax.random.PRNGKey(seed), (n, n)), -1)
  res = markov.stationary(p, tol=1e-7)
  assert bool(res.converged)
  np.testing.assert_allclose(res.pi @ p, res.pi, atol=1e-6)
  np.testing.assert_allclose(res.pi.sum(), 1.0, atol=1e-6)


@SETTINGS
@given(seed=st.integers(0, 10_000), n=st.integers(3, 30))
def test_symmetric_kernel_is_reversible(seed, n):
  a = jax.random.uniform(jax.random.PRNGKey(seed), (n, n))
  w = a + a.T
  p = w / w.sum(-1, keepdims=True)
  assert float(markov.reversibility(p)) < 1e-6
  assert float(markov.entropy_production(p)) < 1e-5
  # π of a symmetric kernel is its degree distribution (closed form).
  np.testing.assert_allclose(markov.stationary(p).pi, w.sum(-1) / w.sum(), atol=1e-6)


def test_directed_cycle_values():
  """Deterministic n-cycle: π uniform, H̄ = 0, ε_rev = 1, eigenvalues the n-th roots of unity."""
  n = 5
  p = jnp.roll(jnp.eye(n), 1, axis=1)
  np.testing.assert_allclose(markov.stationary(p).pi, np.full(n, 1 / n), atol=1e-6)
  assert float(markov.entropy(p)) == 0.0
  np.testing.assert_allclose(markov.reversibility(p), 1.0, atol=1e-6)
  np.testing.assert_allclose(np.sort(np.angle(markov.spectrum(p))), np.sort(np.angle(np.exp(2j * np.pi * np.arange(n) / n))), atol=1e-4)


def test_entropy_uniform_and_skew_of_pure_rotation():
  n = 7
  p = jnp.full((n, n), 1 / n)
  np.testing.assert_allclose(markov.effective_neighbours(p), n, rtol=1e-6)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n))
  skew = markov.double_centre(a - a.T)
  np.testing.assert_allclose(markov.skew_share(skew), 1.0, atol=1e-6)
  np.testing.assert_allclose(markov.skew_share(skew.T + skew), 0.0, atol=1e-6)


def test_entropy_production_of_biased_cycle():
  """Ring walk stepping +1 w.p. a and −1 w.p. 1−a: σ = (2a − 1) log(a/(1−a)) (closed form)."""
  n, a = 6, 0.8
  p = a * jnp.roll(jnp.eye(n), 1, 1) + (1 - a) * jnp.roll(jnp.eye(n), -1, 1)
  np.testing.assert_allclose(markov.entropy_production(p), (2 * a - 1) * np.log(a / (1 - a)), rtol=1e-5)
  np.testing.assert_allclose(markov.reversibility(p), 2 * a - 1, rtol=1e-5)  # ½·n·(1/n)·2|a−(1−a)|


def test_diffusion_coordinates_of_two_state_chain():
  """Two-state chain: λ₁ = 1 − a − b; coordinates are right eigenvectors scaled by λ₁^t."""
  a, b = 0.2, 0.3
  p = jnp.array([[1 - a, a], [b, 1 - b]])
  coords, lam = markov.diffusion_coordinates(p, k=1, t=2)
  np.testing.assert_allclose(lam, [1 - a - b], atol=1e-6)
  psi = coords[:, 0] / lam[0] ** 2
  np.testing.assert_allclose(p @ psi, lam[0] * psi, atol=1e-6)
  np.testing.assert_allclose(markov.spectral_gap(p), a + b, atol=1e-6)


def test_heat_semigroups():
  p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(3), (8, 8)), -1)
  f = jax.random.normal(jax.random.PRNGKey(4), (8, 2))
  np.testing.assert_allclose(markov.heat(p, f, 3), p @ p @ p @ f, atol=1e-5)
  np.testing.assert_allclose(markov.heat(p, f, 0.0, tau=1.0), f, atol=1e-6)
  pi = markov.stationary(p).pi
  far = markov.heat(p, f, 200.0, tau=1.0)   # converges to the π-average of f
  np.testing.assert_allclose(far, jnp.broadcast_to(pi @ f, f.shape), atol=1e-4)


def test_diagnostics_are_jittable_and_batched():
  q, k = random_qk(1, h=3)
  p = op.markov_matrix(q, k, beta=0.0, alpha=1.0)
  eps = jax.jit(markov.reversibility)(p)
  assert eps.shape == (1, 3)
  np.testing.assert_allclose(eps, markov.reversibility(p), atol=1e-6)


@pytest.mark.parametrize("bad,match", [
    (np.ones((3, 4)), "square"),
    (np.ones((3, 3)), "row sums"),
    (-np.eye(3) + 2 * np.roll(np.eye(3), 1, 1), "negative"),
    (np.full((3, 3), np.nan), "finite"),
    (np.eye(3, dtype=np.int32), "floating"),
])
def test_bad_markov_matrix(bad, match):
  with pytest.raises((ValueError, TypeError), match=match):
    markov.reversibility(jnp.asarray(bad))


def test_skew_share_argument_errors():
  p = jnp.tril(jnp.ones((4, 4)))
  p = p / p.sum(-1, keepdims=True)
  with pytest.raises(ValueError, match="pass the parametric `logits`"):
    markov.skew_share(p=p)
  with pytest.raises(ValueError, match="exactly one"):
    markov.skew_share()
  with pytest.raises(ValueError, match="tau must be positive"):
    markov.heat(p, jnp.ones((4, 1)), 1.0, tau=0.0)


def test_propagate_is_the_adjoint_of_heat():
  p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(5), (6, 6)), -1)
  mu = jnp.zeros(6).at[2].set(1.0)
  f = jax.random.normal(jax.random.PRNGKey(6), (6, 1))
  np.testing.assert_allclose(markov.propagate(p, mu, 4) @ f, (mu @ markov.heat(p, f, 4)), atol=1e-5)
  with pytest.raises(ValueError, match="non-negative integer"):
    markov.propagate(p, mu, 1.5)
