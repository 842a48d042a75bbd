"""attngeo._checks: staged argument checks that leave a program's text — JAX's persistent cache key — alone."""
import jax
import jax.numpy as jnp
import pytest
from jax.experimental import checkify

from attngeo import _checks, markov, operators as op


def lowered(fn, *args) -> str:
  """The program `fn` lowers to, traced anew (a fresh `jax.jit` wrapper, so no trace is reused)."""
  return jax.jit(lambda *a: fn(*a)).lower(*args).as_text()


def test_a_checked_function_lowers_to_the_same_program_whatever_was_traced_before():
  """checkify.debug_check numbers its checks from a process-wide counter, so the same function traced later
  lowered to another program and every warm run compiled it again; staged_check's codes follow the message."""
  q = jnp.ones((1, 8, 2, 4))
  p = jnp.full((2, 5, 5), 0.2)
  first = lowered(lambda q: op.transport(q, q, q, beta=0.5, alpha=1.0), q)
  for _ in range(3):                                     # other checked programs traced in between
    lowered(lambda p: markov.stationary(p).pi, p)
    lowered(lambda x: checkify.debug_check(jnp.all(x > 0), "debug_check's own counter moves") or x, q)
  assert lowered(lambda q: op.transport(q, q, q, beta=0.5, alpha=1.0), q) == first


def test_plain_debug_check_is_what_the_cache_missed():
  """The reference behaviour staged_check replaces: two traces of one debug_check differ in their text."""
  f = lambda x: checkify.debug_check(jnp.all(x > 0), "x must be positive") or x     # noqa: E731
  g = lambda x: _checks.staged_check(jnp.all(x > 0), "x must be positive") or x     # noqa: E731
  x = jnp.ones(3)
  assert lowered(f, x) != lowered(f, x)
  assert lowered(g, x) == lowered(g, x)


def test_checked_mode_reports_the_first_failed_argument_check_before_a_nan_check():
  def fn(a, b):
    _checks.check_finite("a", a)
    _checks.check_finite("b", b)
    return jnp.log(a - 2.0) + b               # NaN where a < 2: checkify's own NaN check fails too
  safe = _checks.checked(jax.jit(fn))
  with pytest.raises(ValueError, match="^a must be finite"):
    safe(jnp.array([jnp.nan, 1.0]), jnp.array([jnp.inf, 0.0]))
  with pytest.raises(ValueError, match="^b must be finite"):
    safe(jnp.array([3.0, 1.0]), jnp.array([jnp.inf, 0.0]))
  with pytest.raises(ValueError, match="nan generated"):
    safe(jnp.array([3.0, 1.0]), jnp.array([0.0, 0.0]))
  assert jnp.isfinite(safe(jnp.array([3.0, 4.0]), jnp.zeros(2))).all()
