"""Flow matching with the linear interpolant (SiT's `transport/`), kept apart from any backbone.

Convention (SiT's `ICPlan` with velocity prediction): noise `x_0 ~ N(0, I)` at t = 0, data `x_1` at
t = 1, `x_t = (1 − t) x_0 + t x_1`, target velocity `u = x_1 − x_0`; the loss is
`E_t ‖v_θ(x_t, t) − u‖²` (mean over all coordinates), t ~ U[0, 1].

Sampling integrates from noise at t = 0 to t = 1 (`sample`, `SAMPLERS`):

* `euler` — `x ← x + Δt·v(x, t)` (first order);
* `heun` — predictor `x̃ = x + Δt·v(x, t)`, corrector `x ← x + ½Δt·[v(x, t) + v(x̃, t + Δt)]`
  (second order);
* `dopri5` — Dormand–Prince 5(4) with a PID step-size controller (diffrax), `rtol`/`atol` as SiT's
  defaults (1e-3, 1e-6); `steps` only sets where a trajectory is saved;
* `sde` — Euler–Maruyama for SiT's SDE `dx = [v + w(t)·s(x, t)] dt + √(2 w(t)) dW` with the score
  of the linear path `s = (t·v − x)/(1 − t)` and SiT's default diffusion `w(t) = norm·(1 − t)`
  (`diffusion_form="sigma"`), i.e. drift `v + norm·(t·v − x)`; the last step is drift-only (SiT's
  `last_step="Mean"`). Same marginals as the ODE for the exact field (weak order one).

Classifier-free guidance (`guided`): `v = v(x, t, ∅) + s·[v(x, t, y) − v(x, t, ∅)]`, s ≥ 1 (s = 1 is the
conditional field); the null label ∅ is the one `drop_labels` substitutes with probability p in training.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from attngeo.sampler_names import SAMPLERS, check_guidance, check_sampler  # noqa: F401  (JAX-free)


def interpolate(x0, x1, t):
  """`x_t = (1 − t) x0 + t x1` for x0, x1 [b, ...] and t [b]."""
  tt = t.reshape((-1,) + (1,) * (x1.ndim - 1))
  return (1 - tt) * x0 + tt * x1


def matching_loss(velocity_fn, x0, x1, t):
  """`mean ‖v(x_t, t) − (x1 − x0)‖²` for given noise x0, data x1 [b, ...] and times t [b] (float32)."""
  v = velocity_fn(interpolate(x0, x1, t), t)
  return jnp.mean(jnp.square(v.astype(jnp.float32) - (x1 - x0)))


def loss(velocity_fn, x1, rng):
  """Flow-matching loss for data x1 [b, ...] with fresh N(0, I) noise and uniform t; `velocity_fn(x_t, t) -> [b, ...]`."""
  k0, kt = jax.random.split(rng)
  x0 = jax.random.normal(k0, x1.shape, x1.dtype)
  return matching_loss(velocity_fn, x0, x1, jax.random.uniform(kt, (x1.shape[0],)))


def drop_labels(y, rng, prob: float, null_label: int | None):
  """Labels y [b] with each replaced by `null_label` with probability `prob` (label dropout for guidance)."""
  if prob <= 0:
    return y
  if null_label is None:
    raise ValueError("label dropout needs a null label (a model built with class_dropout_prob > 0)")
  return jnp.where(jax.random.uniform(rng, y.shape) < prob, null_label, y)


def guided(velocity_fn, scale: float, null_label: int | None, channels: int | None = None):
  """Classifier-free guidance of `velocity_fn(x, t, y)`: `v_∅ + scale·(v_y − v_∅)`, one batched call.

  Args:
    velocity_fn: (x [b, ...], t [b], y [b] int) -> [b, ...].
    scale: guidance scale s ≥ 1; 1 returns `velocity_fn` itself.
    null_label: the label of the unconditional field.
    channels: guide only the first `channels` entries of the last axis (SiT's and DiT's `sample.py`
      guide 3 of the 4 latent channels, "for exact reproducibility"); None guides all.
  Returns:
    a function (x, t, y) -> guided velocity.
  """
  check_guidance(scale, null_label)
  if scale == 1.0:
    return velocity_fn

  def fn(x, t, y):
    b = x.shape[0]
    null = jnp.full_like(y, null_label)
    v = velocity_fn(jnp.concatenate([x, x]), jnp.concatenate([t, t]), jnp.concatenate([y, null]))
    cond, uncond = v[:b], v[b:]
    mix = uncond + scale * (cond - uncond)
    if channels is None:
      return mix
    return jnp.concatenate([mix[..., :channels], cond[..., channels:]], -1)

  return fn


def sample(velocity_fn, x0, *, steps: int = 50, solver: str = "heun", save_every: int | None = None,
           rng=None, diffusion_norm: float = 1.0, rtol: float = 1e-3, atol: float = 1e-6, max_steps: int = 4096):
  """Integrate `velocity_fn(x, t)` from noise x0 [b, ...] at t = 0 to t = 1.

  Args:
    velocity_fn: (x [b, ...], t [b]) -> [b, ...].
    x0: the noise at t = 0.
    steps: uniform steps (euler, heun, sde); for dopri5 only the trajectory grid.
    solver: one of `SAMPLERS`.
    save_every: keep every `save_every`-th grid point of the trajectory (None: no trajectory).
    rng: PRNG key, required by `sde`.
    diffusion_norm: `norm` of the SDE's diffusion `w(t) = norm·(1 − t)`.
    rtol, atol, max_steps: dopri5's tolerances and step budget.
  Returns:
    (x at t = 1, trajectory [steps // save_every + 1, b, ...] at t = 0, save_every/steps, …, 1, or None).
  """
  check_sampler(solver, steps)
  if solver == "sde" and rng is None:
    raise ValueError("the sde sampler needs rng (a PRNG key)")
  if solver == "dopri5":
    return _sample_dopri5(velocity_fn, x0, steps, save_every, rtol, atol, max_steps)
  dt = 1.0 / steps
  b = x0.shape[0]
  keys = jax.random.split(rng, steps) if solver == "sde" else jnp.zeros((steps, 2), jnp.uint32)

  def step(x, inputs):
    i, key = inputs
    t = jnp.full((b,), i * dt, x.dtype)
    v = velocity_fn(x, t)
    if solver == "heun":
      xe = x + dt * v
      v = 0.5 * (v + velocity_fn(xe, t + dt))
    elif solver == "sde":
      tt = t.reshape((-1,) + (1,) * (x.ndim - 1))
      drift = v + diffusion_norm * (tt * v - x)
      noise = jnp.sqrt(2 * diffusion_norm * (1 - tt) * dt) * jax.random.normal(key, x.shape, x.dtype)
      x = x + dt * drift + jnp.where(i < steps - 1, 1.0, 0.0) * noise
      return x, x
    x = x + dt * v
    return x, x

  x1, traj = jax.lax.scan(step, x0, (jnp.arange(steps), keys))
  if save_every is None:
    return x1, None
  traj = jnp.concatenate([x0[None], traj], 0)[::save_every]
  return x1, traj


def _dopri5(velocity_fn, x0, ts, rtol, atol, max_steps):
  import diffrax
  b = x0.shape[0]
  term = diffrax.ODETerm(lambda t, x, args: velocity_fn(x, jnp.full((b,), t, x.dtype)))
  return diffrax.diffeqsolve(term, diffrax.Dopri5(), t0=0.0, t1=1.0, dt0=None, y0=x0,
                             stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
                             saveat=diffrax.SaveAt(ts=ts), max_steps=max_steps)


def _sample_dopri5(velocity_fn, x0, steps, save_every, rtol, atol, max_steps):
  ts = jnp.linspace(0.0, 1.0, steps + 1)[::save_every] if save_every else jnp.array([1.0])
  sol = _dopri5(velocity_fn, x0, ts, rtol, atol, max_steps)
  return sol.ys[-1], (sol.ys if save_every else None)


def adaptive_stats(velocity_fn, x0, *, rtol: float = 1e-3, atol: float = 1e-6, max_steps: int = 4096):
  """(x at t = 1, accepted dopri5 steps, all dopri5 steps) of `sample(..., solver="dopri5")`."""
  sol = _dopri5(velocity_fn, x0, jnp.array([1.0]), rtol, atol, max_steps)
  return sol.ys[-1], sol.stats["num_accepted_steps"], sol.stats["num_steps"]
