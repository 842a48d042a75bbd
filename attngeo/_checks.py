"""Argument validation shared by the package: clear errors that name the argument.

Value checks (finiteness, ranges, stochasticity) raise at once on concrete arrays. Under
`jax.jit` the arguments are tracers: the same checks are staged as `checkify.debug_check`s,
which cost nothing and do nothing in plain jitted code, and become errors in checked mode —
`checked(fn)` runs `fn` under `jax.experimental.checkify` (user checks, NaN and division checks)
and raises the first failed check as one `ValueError` naming the argument.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from attngeo import errors


def checked(fn):
  """`fn` in checked mode: staged value checks, NaN production and division by zero raise `ValueError`.

  Works on jitted and plain functions; the checks run inside the compiled program (one flag read
  back per call, no per-check host sync).
  """
  cfn = checkify.checkify(fn, errors=checkify.user_checks | checkify.nan_checks | checkify.div_checks)

  @functools.wraps(fn)
  def run(*args, **kwargs):
    err, out = cfn(*args, **kwargs)
    msg = err.get()
    if msg is not None:
      raise ValueError(msg.splitlines()[0].replace(" (`check` failed)", ""))
    return out
  return run


def is_concrete(x) -> bool:
  """True when `x` holds values now (not a tracer inside jit/grad/vmap)."""
  return not isinstance(x, jax.core.Tracer)


def check_rank(name: str, x, rank: int, layout: str) -> None:
  if jnp.ndim(x) != rank:
    raise ValueError(f"{name} must have rank {rank} with layout {layout}; got shape {jnp.shape(x)}")


def check_floating(name: str, x) -> None:
  if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    raise errors.InputTypeError(f"{name} must be a floating-point array; got dtype {jnp.result_type(x)}")


def check_finite(name: str, x) -> None:
  if not is_concrete(x):
    checkify.debug_check(jnp.all(jnp.isfinite(x)), f"{name} must be finite; it contains NaN or Inf")
  elif not bool(np.all(np.isfinite(np.asarray(x)))):
    raise ValueError(f"{name} must be finite; it contains NaN or Inf")


def check_unit_interval(name: str, x) -> None:
  if not is_concrete(x):
    checkify.debug_check(jnp.all((x >= 0) & (x <= 1)), f"{name} must lie in [0, 1]")
    return
  a = np.asarray(x, dtype=np.float64)
  if not np.all(np.isfinite(a)) or np.any(a < 0.0) or np.any(a > 1.0):
    raise ValueError(f"{name} must lie in [0, 1]; got {a if a.size <= 8 else f'values in [{a.min()}, {a.max()}]'}")


def check_positive(name: str, x) -> None:
  if is_concrete(x):
    a = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(a)) or np.any(a <= 0.0):
      raise ValueError(f"{name} must be positive and finite; got {a if a.size <= 8 else 'values <= 0'}")


def check_square(name: str, x) -> None:
  if jnp.ndim(x) < 2 or jnp.shape(x)[-1] != jnp.shape(x)[-2]:
    raise ValueError(f"{name} must be [..., n, n] (square in its last two axes); got shape {jnp.shape(x)}")


def check_stochastic(name: str, p, atol: float = 1e-4) -> None:
  """`p` [..., n, n] must be entrywise >= 0 with rows summing to 1 (within `atol`)."""
  check_square(name, p)
  check_floating(name, p)
  if not is_concrete(p):
    checkify.debug_check(jnp.all(jnp.isfinite(p)), f"{name} must be finite; it contains NaN or Inf")
    checkify.debug_check(jnp.all(p >= -atol) & jnp.all(jnp.abs(p.sum(-1) - 1) <= atol),
                         f"{name} must be row-stochastic (entries >= 0, rows summing to 1)")
    return
  a = np.asarray(p, dtype=np.float64)
  if not np.all(np.isfinite(a)):
    raise ValueError(f"{name} must be finite; it contains NaN or Inf")
  if np.any(a < -atol):
    raise ValueError(f"{name} must be row-stochastic: it has negative entries (min {a.min():.3g})")
  err = np.max(np.abs(a.sum(-1) - 1.0))
  if err > atol:
    raise ValueError(f"{name} must be row-stochastic: row sums deviate from 1 by up to {err:.3g}")
