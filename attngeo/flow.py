"""Flow matching with the linear interpolant (SiT's `transport/`), kept apart from any backbone.

Convention: noise at t = 0, data at t = 1. `x_t = (1 − t) x_0 + t x_1`, target velocity
`u = x_1 − x_0`; the loss is `E_t ‖v_θ(x_t, t) − u‖²` (mean over all coordinates), t ~ U[0, 1].
Sampling integrates `dx/dt = v_θ(x, t)` from Gaussian noise at t = 0 to t = 1 (Euler or Heun).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

SOLVERS = ("euler", "heun")


def interpolate(x0, x1, t):
  """`x_t` for x0, x1 [b, ...] and t [b]."""
  tt = t.reshape((-1,) + (1,) * (x1.ndim - 1))
  return (1 - tt) * x0 + tt * x1


def loss(velocity_fn, x1, rng):
  """Flow-matching loss for data x1 [b, ...]; `velocity_fn(x_t, t) -> [b, ...]`."""
  k0, kt = jax.random.split(rng)
  x0 = jax.random.normal(k0, x1.shape, x1.dtype)
  t = jax.random.uniform(kt, (x1.shape[0],))
  v = velocity_fn(interpolate(x0, x1, t), t)
  return jnp.mean(jnp.square(v.astype(jnp.float32) - (x1 - x0)))


def sample(velocity_fn, x0, *, steps: int = 50, solver: str = "heun", save_every: int | None = None):
  """Integrate from noise x0 at t = 0 to t = 1 with `steps` uniform steps.

  Returns (x at t = 1, trajectory [steps // save_every + 1, ...] at t = 0, save_every/steps, …, 1),
  the trajectory being None when `save_every` is None.
  """
  if solver not in SOLVERS:
    raise ValueError(f"solver must be one of {SOLVERS}; got {solver!r}")
  if steps < 1:
    raise ValueError(f"steps must be positive; got {steps}")
  dt = 1.0 / steps
  b = x0.shape[0]

  def step(x, i):
    t = jnp.full((b,), i * dt)
    v = velocity_fn(x, t)
    if solver == "heun":
      xe = x + dt * v
      v = 0.5 * (v + velocity_fn(xe, t + dt))
    x = x + dt * v
    return x, x

  x1, traj = jax.lax.scan(step, x0, jnp.arange(steps))
  if save_every is None:
    return x1, None
  traj = jnp.concatenate([x0[None], traj], 0)[::save_every]
  return x1, traj
