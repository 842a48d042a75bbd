"""attngeo.flow: the interpolant, the loss and the ODE samplers against closed forms."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo import flow


def test_interpolant_endpoints():
  x0, x1 = jnp.zeros((2, 3)), jnp.ones((2, 3))
  np.testing.assert_allclose(flow.interpolate(x0, x1, jnp.array([0.0, 1.0])), [[0, 0, 0], [1, 1, 1]])


def test_loss_of_the_zero_field_is_the_target_second_moment():
  """v = 0 gives E(x1 − x0)² per coordinate = x1² + E x0² = 1 + 1 for x1 = 1, x0 ~ N(0, 1)."""
  x1 = jnp.ones((4096, 4))
  zero = flow.loss(lambda x, t: jnp.zeros_like(x), x1, jax.random.PRNGKey(0))
  np.testing.assert_allclose(zero, 2.0, rtol=0.03)


@pytest.mark.parametrize("solver,tol", [("euler", 2e-2), ("heun", 1e-4)])
def test_samplers_integrate_a_linear_ode(solver, tol):
  """dx/dt = x has x(1) = e·x(0); Heun is second order."""
  x0 = jnp.ones((1, 2))
  x1, traj = flow.sample(lambda x, t: x, x0, steps=100, solver=solver, save_every=50)
  np.testing.assert_allclose(x1, np.e * x0, rtol=tol)
  assert traj.shape == (3, 1, 2)
  np.testing.assert_allclose(traj[1], np.exp(0.5) * x0, rtol=tol)


def test_optimal_field_transports_noise_to_a_point():
  target = jnp.array([[2.0, -1.0]])
  x1, _ = flow.sample(lambda x, t: (target - x) / (1 - t[:, None] + 1e-3), jnp.zeros((1, 2)), steps=200, solver="heun")
  np.testing.assert_allclose(x1, target, atol=2e-2)


def test_bad_sampler_arguments():
  with pytest.raises(ValueError, match="solver must be"):
    flow.sample(lambda x, t: x, jnp.ones((1, 2)), solver="rk4")
  with pytest.raises(ValueError, match="steps must be positive"):
    flow.sample(lambda x, t: x, jnp.ones((1, 2)), steps=0)
