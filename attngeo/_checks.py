"""Argument validation shared by the package: clear errors that name the argument.

Value checks (finiteness, ranges, stochasticity) raise at once on concrete arrays. Under
`jax.jit` the arguments are tracers: the same checks are staged as `checkify.debug_check`s,
which cost nothing and do nothing in plain jitted code, and become errors in checked mode —
`checked(fn)` runs `fn` under `jax.experimental.checkify` (user checks, NaN and division checks)
and raises the first failed check as one `ValueError` naming the argument.

A staged check carries an integer code that `checkify` maps back to its message. `checkify.debug_check`
draws it from a process-wide counter, so the same function traced after other work lowered to another
program text — and JAX's persistent compilation cache, keyed by that text, missed it (the test suite
compiled 164 programs again on every warm run). `staged_check` keys the code by the message instead:
the program depends only on the function and its inputs.
"""
from __future__ import annotations

import functools
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from attngeo import errors

try:                                  # checkify's parts behind debug_check, to give the check a fixed code
  from jax._src import checkify as _checkify_impl
  _STAGE = (_checkify_impl.init_error, _checkify_impl.update_error, _checkify_impl._check_error,
            _checkify_impl.FailedCheckError, _checkify_impl.get_traceback)
except (ImportError, AttributeError):  # another JAX: debug_check itself (correct, only not cache-stable)
  _STAGE = None


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


def staged_check(pred, msg: str) -> None:
  """`checkify.debug_check(pred, msg)` with a code fixed by `msg`: a no-op in plain jitted code, an error
  under `checked`, and the same lowered program whatever the process traced before.

  checkify reports the failed error of least code, and the first failed check of each kind: the code is
  negative, below the counter's codes of checkify's NaN and division checks, so an argument check that fails
  is the one reported, as with `debug_check`. Two checks with one message share a code: their messages agree.
  """
  if _STAGE is None:
    checkify.debug_check(pred, msg)
    return
  init_error, update_error, check_error, failed_check, traceback = _STAGE
  code = -2 - zlib.crc32(msg.encode()) % (2**31 - 3)         # an int32 below checkify's -1 and its counter's codes
  err = failed_check(traceback(), msg)
  payload, metadata = jax.tree_util.tree_flatten(err)
  error = update_error(init_error, jnp.logical_not(pred), code, {code: metadata}, payload, err.get_effect_type())
  check_error(error, debug=True)


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
    staged_check(jnp.all(jnp.isfinite(x)), f"{name} must be finite; it contains NaN or Inf")
  elif not bool(np.all(np.isfinite(np.asarray(x)))):
    raise ValueError(f"{name} must be finite; it contains NaN or Inf")


def check_unit_interval(name: str, x) -> None:
  if not is_concrete(x):
    staged_check(jnp.all((x >= 0) & (x <= 1)), f"{name} must lie in [0, 1]")
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
    staged_check(jnp.all(jnp.isfinite(p)), f"{name} must be finite; it contains NaN or Inf")
    staged_check(jnp.all(p >= -atol) & jnp.all(jnp.abs(p.sum(-1) - 1) <= atol),
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
