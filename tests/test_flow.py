"""attngeo.flow: the interpolant, the loss, guidance and every sampler's order against exact flows."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo import flow

# Data N(MU, SIG²) (1-D): the linear interpolant's exact velocity is affine in x, and the exact flow
# from noise x0 is x(t) = t·MU + s_t·x0 with s_t² = t²·SIG² + (1 − t)², so x(1) = MU + SIG·x0.
MU, SIG = 1.5, 0.5


def gaussian_field(x, t):
  tt = t.reshape((-1,) + (1,) * (x.ndim - 1))
  s2 = tt ** 2 * SIG ** 2 + (1 - tt) ** 2
  return MU + (tt * SIG ** 2 - (1 - tt)) / s2 * (x - tt * MU)


X0 = jnp.linspace(-2.0, 2.0, 9)[:, None]
EXACT = MU + SIG * X0


def test_interpolant_endpoints():
  x0, x1 = jnp.zeros((2, 3)), jnp.ones((2, 3))
  np.testing.assert_allclose(flow.interpolate(x0, x1, jnp.array([0.0, 1.0])), [[0, 0, 0], [1, 1, 1]])


def test_loss_of_the_zero_field_is_the_target_second_moment():
  """v = 0 gives E(x1 − x0)² per coordinate = x1² + E x0² = 1 + 1 for x1 = 1, x0 ~ N(0, 1)."""
  x1 = jnp.ones((4096, 4))
  zero = flow.loss(lambda x, t: jnp.zeros_like(x), x1, jax.random.PRNGKey(0))
  np.testing.assert_allclose(zero, 2.0, rtol=0.03)


def test_loss_of_the_exact_field_is_the_conditional_variance():
  """For Gaussian data the exact field leaves E Var(x1 − x0 | x_t) = E_t[SIG²/s_t²]... > 0; the
  zero-mean residual of the exact field is smaller than any shifted field's (the loss is minimised)."""
  x1 = MU + SIG * jax.random.normal(jax.random.PRNGKey(1), (200_000, 1))
  rng = jax.random.PRNGKey(2)
  exact = flow.loss(gaussian_field, x1, rng)
  shifted = flow.loss(lambda x, t: gaussian_field(x, t) + 0.1, x1, rng)
  np.testing.assert_allclose(shifted - exact, 0.01, rtol=0.05)   # E(r + 0.1)² − E r² = 0.01 when E r = 0


def observed_order(solver, steps):
  errs = [float(jnp.abs(flow.sample(gaussian_field, X0, steps=n, solver=solver)[0] - EXACT).max()) for n in steps]
  return np.log2(np.array(errs[:-1]) / np.array(errs[1:])), errs


@pytest.mark.parametrize("solver,order", [("euler", 1.0), ("heun", 2.0)])
def test_fixed_step_samplers_have_their_order_on_a_time_dependent_exact_flow(solver, order):
  """Halving Δt divides the global error by 2^order. The field depends on t, so a Heun corrector
  evaluated at t instead of t + Δt drops to first order and fails here (an autonomous ODE cannot tell)."""
  orders, errs = observed_order(solver, (16, 32, 64))
  np.testing.assert_allclose(orders, order, atol=0.25)
  assert errs[-1] < (5e-2 if solver == "euler" else 1e-3)


@jax.jit
def dopri5_run(rtol):
  _, traj = flow.sample(gaussian_field, X0, solver="dopri5", steps=4, save_every=2, rtol=rtol, atol=rtol * 1e-2)
  _, accepted, _ = flow.adaptive_stats(gaussian_field, X0, rtol=rtol, atol=rtol * 1e-2)
  return traj, accepted


def test_dopri5_meets_its_tolerance_tightens_with_it_and_saves_the_exact_path():
  (loose, n_loose), (tight, n_tight) = dopri5_run(1e-3), dopri5_run(1e-5)
  assert loose.shape == (3, 9, 1)
  err_loose, err_tight = (float(jnp.abs(x[-1] - EXACT).max()) for x in (loose, tight))
  assert err_loose < 0.1 and err_tight < 2e-5 and err_loose > 100 * err_tight
  assert int(n_tight) > int(n_loose) >= 1
  t = 0.5
  np.testing.assert_allclose(tight[1], t * MU + np.sqrt(t ** 2 * SIG ** 2 + (1 - t) ** 2) * X0, atol=1e-4)


def test_euler_maruyama_has_the_exact_marginal_at_weak_order_one():
  """The SDE shares the ODE's marginals: samples from N(0, 1) end N(MU, SIG²); the variance error
  shrinks at least linearly in Δt (Monte-Carlo standard error of the variance ≈ 8e-4)."""
  z = jax.random.normal(jax.random.PRNGKey(0), (200_000, 1))
  errs = []
  for n in (8, 16, 32):
    x1, _ = flow.sample(gaussian_field, z, steps=n, solver="sde", rng=jax.random.PRNGKey(1))
    np.testing.assert_allclose(float(x1.mean()), MU, atol=5e-3)
    errs.append(abs(float(x1.var()) - SIG ** 2))
  assert errs[-1] < 0.012
  assert errs[0] / errs[1] > 1.7 and errs[1] / errs[2] > 1.7


def test_sde_without_diffusion_is_euler():
  z = jax.random.normal(jax.random.PRNGKey(0), (16, 1))
  sde, _ = flow.sample(gaussian_field, z, steps=10, solver="sde", rng=jax.random.PRNGKey(1), diffusion_norm=0.0)
  euler, _ = flow.sample(gaussian_field, z, steps=10, solver="euler")
  np.testing.assert_allclose(sde, euler, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("solver,tol", [("euler", 2e-2), ("heun", 1e-4)])
def test_samplers_integrate_a_linear_ode(solver, tol):
  """dx/dt = x has x(1) = e·x(0)."""
  x0 = jnp.ones((1, 2))
  x1, traj = flow.sample(lambda x, t: x, x0, steps=100, solver=solver, save_every=50)
  np.testing.assert_allclose(x1, np.e * x0, rtol=tol)
  assert traj.shape == (3, 1, 2)
  np.testing.assert_allclose(traj[1], np.exp(0.5) * x0, rtol=tol)


def test_guidance_mixes_conditional_and_null_fields():
  def field(x, t, y):
    return x * 0 + y[:, None].astype(jnp.float32) + t[:, None]
  x, t, y = jnp.zeros((3, 2)), jnp.full((3,), 0.25), jnp.array([1, 2, 3])
  v = flow.guided(field, 3.0, null_label=10)(x, t, y)
  # v_∅ = 10.25, v_y = y + 0.25: v_∅ + 3 (v_y − v_∅) = 3y − 20 + 0.25
  np.testing.assert_allclose(v, np.repeat((3 * np.array([1, 2, 3]) - 20 + 0.25)[:, None], 2, 1))
  assert flow.guided(field, 1.0, null_label=None) is field
  part = flow.guided(field, 3.0, null_label=10, channels=1)(x, t, y)
  np.testing.assert_allclose(part[:, 0], v[:, 0])
  np.testing.assert_allclose(part[:, 1], np.array([1, 2, 3]) + 0.25)


def test_label_dropout_rate():
  y = jnp.zeros((20_000,), jnp.int32)
  dropped = flow.drop_labels(y, jax.random.PRNGKey(0), 0.1, null_label=7)
  assert set(np.unique(dropped)) == {0, 7}
  np.testing.assert_allclose(float(jnp.mean(dropped == 7)), 0.1, atol=0.01)
  assert flow.drop_labels(y, jax.random.PRNGKey(0), 0.0, None) is y


def test_optimal_field_transports_noise_to_a_point():
  target = jnp.array([[2.0, -1.0]])
  x1, _ = flow.sample(lambda x, t: (target - x) / (1 - t[:, None] + 1e-3), jnp.zeros((1, 2)), steps=200, solver="heun")
  np.testing.assert_allclose(x1, target, atol=2e-2)


@pytest.mark.parametrize("call,message", [
    (lambda: flow.sample(lambda x, t: x, jnp.ones((1, 2)), solver="rk4"), "sampler must be one of"),
    (lambda: flow.sample(lambda x, t: x, jnp.ones((1, 2)), steps=0), "steps must be positive"),
    (lambda: flow.sample(lambda x, t: x, jnp.ones((1, 2)), solver="sde"), "needs rng"),
    (lambda: flow.guided(lambda x, t, y: x, 0.5, null_label=3), "guidance scale must be >= 1"),
    (lambda: flow.guided(lambda x, t, y: x, float("inf"), null_label=3), "guidance scale must be finite"),  # NaNs
    (lambda: flow.guided(lambda x, t, y: x, 2.0, null_label=None), "needs a null label"),
    (lambda: flow.drop_labels(jnp.zeros(3, jnp.int32), jax.random.PRNGKey(0), 0.1, None), "needs a null label"),
])
def test_bad_sampler_arguments(call, message):
  with pytest.raises(ValueError, match=message):
    call()
