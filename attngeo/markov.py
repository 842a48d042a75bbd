"""Markov diagnostics of a row-stochastic operator `P` (dense reference, batched over leading axes).

Conventions: `P` is `[..., n, n]`, `P_ij ≥ 0`, `Σ_j P_ij = 1`; masked entries are exactly 0.
Logs are natural. Each public function validates `P` (`check_chain`: shape, size, dtype,
finiteness, stochasticity) once when it holds concrete values (one host transfer per call), and is
jit/vmap/grad-compatible otherwise; the helpers it calls do not validate again. A supplied law π is
checked the same way (`check_law`: a probability vector, used as π/Σπ).

* stationary law `π`: the left Perron vector, `πP = π`, `Σπ = 1`, solved directly. π_true is the
  law of the chain given, `P̃ = P/rowsum(P)` (float32 rows sum to 1 only to rounding; a float64 P
  rounded to float32 is another chain, whose π can differ by up to ‖M⁻¹‖·u). With `v = 1/n`,
  `M = I − P̃ + 1vᵀ` is invertible whenever π is unique (one closed class) and `πM = vᵀ`, so π is one
  LU solve in the working dtype; two steps of iterative refinement follow, each from the residual
  `r = π̂ − π̂P̃` computed in float64 on the host (mixed-precision refinement: π̂ reaches the working
  precision, where a residual in float32 stalls at ‖M⁻¹‖·√n·u).
  A posteriori bound: with `S = Σπ̂`, `(π̂ − Sπ)M = r` exactly, so `π̂ − π = r M⁻¹ + (S − 1)π`. One
  more solve gives `δ̂ ≈ r M⁻¹` and the host its residual `r₂ = r − δ̂M` in float64, and

      ‖π̂ − π‖₁ ≤ ‖δ̂‖₁ + κ (‖r₂‖₁ + ρ) + |S − 1|,     κ = κ̂/(1 − κ̂η) ≥ ‖M⁻¹‖_∞,

  times (1 + γ) for the float64 sums. κ̂ is Hager–Higham's estimate (LAPACK's condition estimate)
  of the inverse of the matrix the LU factored, η = max|rowsum(P) − 1| + 10√n·u bounds how far that
  is from M (the LU's backward error, probabilistic model, Higham & Mary 2019; κ = inf when κ̂η ≥ 1:
  a π that is not unique is never certified), ρ = γ(2S + ‖r‖₁ + 3‖δ̂‖₁) the float64 rounding of
  the residuals and γ = (n + 4)·u₆₄. ‖δ̂‖₁ is the error itself to relative accuracy ≈ κu, so a
  well-conditioned chain's bound is within a few times its true error (1.2–1.4× on float32
  Gaussian walks of 500–4000 points; the bound `κ̂(‖r‖₁ + 2√n·u)` of a float32 residual was 40–3500×).
  ‖M⁻¹‖ grows like 1/gap: as κu approaches 1 the solve for δ̂ stops converging, r₂ ≈ r and the
  bound is the condition times the residual, so a slowly mixing chain in float32 reports a large
  bound and `converged = False` instead of a wrong π; pass float64 P (under `jax.enable_x64`) to
  resolve it. For float32 P the float64 steps are `jax.pure_callback`s to the host (jit- and
  vmap-compatible); float64 P keeps them on the device; a concrete float32 P (not traced) runs them
  between programs, so that every program stays in JAX's persistent compilation cache. π's gradient is the LU solve's, with the
  refinement's residuals held constant.
* damped law `π_τ` (`damped_law`): the stationary law of P with restarts to uniform at rate τ, unique
  and well conditioned for every stochastic P (the read-outs' π where a walk is nearly reducible).
* mean row entropy `H̄ = mean_i Σ_j entr(P_ij)`, `entr(x) = −x log x`; `e^{H̄}` is the effective
  number of neighbours.
* reversibility `ε_rev = ½ Σ_ij |π_i P_ij − π_j P_ji|` ∈ [0, 1]: total-variation distance between
  the one-step forward and time-reversed path laws; 0 iff detailed balance.
* skew share `ρ_skew = ‖antisym(L̃)‖_F / ‖L̃‖_F`, `L̃ = H L H`, `H = I − 11ᵀ/n`: the share of the
  logit that is antisymmetric and not exact (row/column potentials are removed by the centring).
* entropy production `σ = ½ Σ_ij (F_ij − F_ji) log(F_ij/F_ji) = ½ Σ_ij [rel_entr(F_ij, F_ji) +
  rel_entr(F_ji, F_ij)]` ≥ 0, `F_ij = π_i P_ij`.
* spectrum (`attngeo.eigen.eig`: restarted Arnoldi with explicit residuals), reversibilised
  eigenbasis and diffusion coordinates `λ_k^t ψ_k` (Coifman–Lafon), heat semigroup `P^t f`, `e^{t(P−I)/τ} f`.
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import entr, rel_entr

from attngeo import _checks, eigen, linalg

_TINY = 1e-30


def _check_nonempty(name, x):
  if jnp.size(x) == 0:
    raise ValueError(f"{name} must have at least one state and a non-empty batch; got shape {jnp.shape(x)}")


def check_chain(p, name: str = "P") -> None:
  """`p` [..., n, n] must be a non-empty row-stochastic array (`_checks.check_stochastic`, one-line errors)."""
  _checks.check_square(name, p)
  _check_nonempty(name, p)
  _checks.check_stochastic(name, p)


def _working(p):
  return p if p.dtype == jnp.float64 else p.astype(jnp.float32)


# ----------------------------------------------------------------------------- stationary law

class Stationary(NamedTuple):
  """π [..., n]; `residual` [...] = ‖πP̃ − π‖₁ (float64); `error_bound` [...] ≥ ‖π − π_true‖₁ (= 2·TV);
  `condition` [...] the estimate of ‖M⁻¹‖_∞ (≈ 1/gap); `iterations` refinement steps;
  `converged` [...] = error_bound ≤ tol (False when π is not unique: the bound is then inf/NaN)."""
  pi: jax.Array
  residual: jax.Array
  error_bound: jax.Array
  condition: jax.Array
  iterations: int
  converged: jax.Array


def _inverse_norm_1(lu, n, dtype):
  """Hager–Higham estimate of ‖B⁻¹‖₁ for B = Mᵀ given `lu = lu_factor(M)` (batched, 4 sweeps)."""
  solve_b = lambda x: linalg.lu_solve(lu, x[..., None], trans=1)[..., 0]    # B⁻¹x
  solve_bt = lambda x: linalg.lu_solve(lu, x[..., None], trans=0)[..., 0]   # B⁻ᵀx
  batch = lu[0].shape[:-2]
  x = jnp.full(batch + (n,), 1.0 / n, dtype)
  est = jnp.zeros(batch, dtype)
  for _ in range(4):
    y = solve_b(x)
    est = jnp.maximum(est, jnp.sum(jnp.abs(y), -1))
    z = solve_bt(jnp.where(y >= 0, 1.0, -1.0).astype(dtype))
    x = jax.nn.one_hot(jnp.argmax(jnp.abs(z), -1), n, dtype=dtype)
  alt = (jnp.where(jnp.arange(n) % 2 == 0, 1.0, -1.0) * (1.0 + jnp.arange(n) / max(n - 1, 1))).astype(dtype)
  return jnp.maximum(est, 2.0 * jnp.sum(jnp.abs(solve_b(jnp.broadcast_to(alt, batch + (n,)))), -1) / (3 * n))


def _factor(p):
  """lu_factor(M), `M = I − P + 11ᵀ/n` (one matrix per LAPACK call): `Mᵀπ = 1/n` defines π."""
  n = p.shape[-1]
  return linalg.lu_factor(jnp.eye(n, dtype=p.dtype) - p + 1.0 / n)


def _solve_pi(p, refine: int = 2, residual=None):
  """(π, lu_factor(M)) for P [..., n, n] in its working dtype: one LU solve plus `refine` refinement
  steps, each from `residual(p, π)` (default `_residual`, in the working dtype)."""
  residual = residual or _residual
  pi, lu = _first_solve(p)
  for _ in range(refine):
    pi = _refined(lu, pi, residual(p, pi))
  return _normalised(pi), lu


def _first_solve(p):
  """(π₀ = 𝟙ᵀM⁻¹/n, lu_factor(M)): the solve before any refinement."""
  lu = _factor(p)
  return _lu_solve(lu, jnp.full(p.shape[:-1], 1.0 / p.shape[-1], p.dtype)), lu


def _refined(lu, pi, r):
  """One refinement step from the residual r = π − πP: π − r M⁻¹."""
  return pi - _lu_solve(lu, r)


def _normalised(pi):
  pi = jnp.maximum(pi, 0.0)
  return pi / pi.sum(-1, keepdims=True)


def _lu_solve(lu, b):
  """`M⁻ᵀ b` for `lu = lu_factor(M)`, b [..., n]: the row vector `b M⁻¹`."""
  return linalg.lu_solve(lu, b[..., None], trans=1)[..., 0]


def _residual(p, pi):
  return pi - jnp.einsum("...i,...ij->...j", pi, p)


# Residuals and the a posteriori bound (module docstring) are computed in float64 from the chain
# `P̃ = P / rowsum(P)` whose law π_true is: for a float32 P on the host (numpy, through a
# `pure_callback`), for a float64 P where it lies (jax.numpy; the device already works in float64, and
# a callback's float64 result would be cast to float32 on a thread `jax.enable_x64` does not reach).
# `xp` is the array module, numpy or jax.numpy.

def _chain64(xp, p):
  p = xp.asarray(p, np.float64)
  return p / p.sum(-1, keepdims=True)


def _residual_of(xp, p, pi):
  return pi - xp.einsum("...i,...ij->...j", pi, p)


def _host_residual(xp, p, pi):
  """`π − π P̃` [..., n] in float64, returned in π's dtype."""
  with np.errstate(all="ignore"):
    return _residual_of(xp, _chain64(xp, p), xp.asarray(pi, np.float64)).astype(pi.dtype)


def _host_bound(xp, p, pi, delta, cond):
  """(‖π − πP̃‖₁, bound) [..., 2]: `‖δ̂‖₁ + κ (‖r₂‖₁ + ρ) + |Σπ − 1|`, times (1 + γ), rounded up;
  κ = κ̂/(1 − κ̂η) bounds ‖M̃⁻¹‖_∞ from the estimate for the factored matrix (inf when κ̂η ≥ 1)."""
  with np.errstate(all="ignore"):
    rows = xp.asarray(p, np.float64).sum(-1)
    pt = _chain64(xp, p)
    pi, delta, cond = (xp.asarray(x, np.float64) for x in (pi, delta, cond))
    n = pi.shape[-1]
    gamma = (n + 4) * np.finfo(np.float64).eps
    eta = xp.max(xp.abs(rows - 1), -1) + 10 * math.sqrt(n) * np.finfo(p.dtype).eps
    cond = xp.where(cond * eta < 1, cond / (1 - cond * eta), np.inf)
    r = _residual_of(xp, pt, pi)
    r2 = r - (_residual_of(xp, pt, delta) + delta.sum(-1, keepdims=True) / n)        # r − δ̂M̃
    l1 = lambda x: xp.abs(x).sum(-1)
    total = pi.sum(-1)
    rho = gamma * (2 * xp.abs(total) + l1(r) + 3 * l1(delta))
    bound = (l1(delta) + cond * (l1(r2) + rho) + xp.abs(total - 1)) * (1 + gamma)
    out = xp.stack([l1(r), bound], -1)
    low = out.astype(p.dtype)
    return xp.where(low < out, xp.nextafter(low, xp.asarray(np.inf, p.dtype)), low)


def _on_host(fn, like, *args):
  """`fn(xp, *args)` in float64, its result shaped and typed as `like` (anything with a shape and a dtype):
  on the host (`jax.pure_callback`, numpy) unless `like` is float64 already (jax.numpy, where it is). The
  arguments carry no gradient (a bound and a refinement step are not differentiated)."""
  args = tuple(jax.lax.stop_gradient(a) for a in args)
  if like.dtype == jnp.float64:
    return fn(jnp, *args)
  return jax.pure_callback(functools.partial(fn, np), jax.ShapeDtypeStruct(like.shape, like.dtype),
                           *args, vmap_method="broadcast_all")


def _on_host_now(fn, like, *args):
  """`_on_host` for concrete arguments: `fn(numpy, *args)` called here, between programs."""
  return jnp.asarray(fn(np, *(np.asarray(a) for a in args)))


def _traced(piece):
  return piece


# The device steps of the staged route, one program each, which JAX's persistent cache keeps (a program that
# holds a host callback it never keeps: `_stationary` is compiled anew in every process, 0.3–1.4 s a shape).
_STAGED = {}


def _staged(piece):
  if piece not in _STAGED:
    _STAGED[piece] = jax.jit(piece)
  return _STAGED[piece]


def _start(p):
  """(P in its working dtype, π₀, lu_factor(M))."""
  p = _working(p)
  return (p, *_first_solve(p))


def _bound_start(p, pi):
  """(P in its working dtype, π in it, lu_factor(M)): `error_bound`'s first step."""
  p = _working(p)
  return p, pi.astype(p.dtype), _factor(p)


def _correction(lu, r):
  """(δ̂ = r M⁻¹, κ̂ ≈ ‖M⁻¹‖_∞) from the float64 residual r rounded to the working dtype."""
  return _lu_solve(lu, r), _inverse_norm_1(lu, r.shape[-1], r.dtype)


def _bound(p, pi, lu, host=_on_host, run=_traced):
  """(‖π − πP̃‖₁, ‖M⁻¹‖ estimate κ̂, a posteriori bound ≥ ‖π − π_true‖₁) for any π [..., n]:
  δ̂ ≈ r M⁻¹ by one solve from the float64 residual r (rounded to the working dtype), then r₂ = r − δ̂M
  and the bound on the host (module docstring). `host` runs the float64 steps and `run(piece)` the
  device ones: inside one program (`_on_host`, `_traced`) or between programs (`_on_host_now`, `_staged`)."""
  delta, cond = run(_correction)(lu, host(_host_residual, pi, p, pi))
  out = host(_host_bound, jax.ShapeDtypeStruct(pi.shape[:-1] + (2,), p.dtype), p, pi, delta, cond)
  return out[..., 0], cond, out[..., 1]


def _stationary_steps(p, tol: float, refine: int, host=_on_host, run=_traced) -> Stationary:
  """The solve, its refinement from float64 residuals and the bound (module docstring); `host`, `run` as in `_bound`."""
  p, pi, lu = run(_start)(p)
  for _ in range(refine):
    pi = run(_refined)(lu, pi, host(_host_residual, pi, p, pi))
  pi = run(_normalised)(pi)
  r, cond, bound = _bound(p, pi, lu, host, run)
  return Stationary(pi, r, bound, cond, refine, jnp.isfinite(bound) & (bound <= tol))


_stationary = jax.jit(_stationary_steps, static_argnames=("tol", "refine", "host", "run"))


def _concrete_low_precision(p) -> bool:
  """True for a P with values (not traced) that is not float64: the staged route serves it."""
  return _checks.is_concrete(p) and jnp.asarray(p).dtype != jnp.float64


def error_bound(p, pi) -> jax.Array:
  """The bound `stationary` reports, for a given law π [..., n]: `≥ ‖π − π_true‖₁` [...] (inf/NaN when
  π_true is not unique). π is checked by `check_law` (so it sums to 1 within 1e-4); the bound is that
  of the π given, with its |Σπ − 1|."""
  check_chain(p)
  pi = jnp.asarray(pi)
  law = check_law(p, pi)
  pi = jnp.where(jnp.isnan(law), law, pi)
  if _concrete_low_precision(p) and _checks.is_concrete(pi):
    return _bound(*_staged(_bound_start)(p, pi), _on_host_now, _staged)[2]
  return _error_bound(p, pi)


@jax.jit
def _error_bound(p, pi):
  return _bound(*_bound_start(p, pi))[2]


def stationary(p, *, tol: float = 1e-4, refine: int = 2) -> Stationary:
  """Stationary law of `P` [..., n, n]: direct solve, iterative refinement, a posteriori ℓ¹ bound.

  Args:
    p: row-stochastic `[..., n, n]` (float64 is kept, anything else computed in float32).
    tol: `converged` iff the bound on ‖π̂ − π‖₁ is ≤ tol.
    refine: iterative-refinement steps after the first solve (residuals in float64 on the host).

  Returns:
    `Stationary`. Periodic chains are fine (no power iteration); a chain with several closed
    classes has no unique π and returns a non-finite bound with `converged = False`.
  """
  check_chain(p)
  if not tol > 0:
    raise ValueError(f"tol must be positive; got {tol}")
  if isinstance(refine, bool) or not isinstance(refine, numbers.Integral) or refine < 0:
    raise ValueError(f"refine must be an integer ≥ 0 (refinement steps); got {refine!r}")
  if _concrete_low_precision(p):
    return _stationary_steps(jnp.asarray(p), float(tol), int(refine), _on_host_now, _staged)
  return _stationary(p, float(tol), int(refine))


def law(p) -> jax.Array:
  """π [..., n] of P [..., n, n]: one LU solve and two refinement steps in P's working dtype (float64 kept,
  anything else float32) — the estimate `stationary` returns, without its error bound (use `stationary`
  for the bound and `converged`).

  Differentiable by the implicit function theorem, not through the factorisation: π solves πM = 𝟙ᵀ/n,
  M = I − P + 𝟙𝟙ᵀ/n, so dπ = π dP M⁻¹, projected by the normalisation π/Σπ onto Σdπ = 0 (exact at any P:
  the normalised π absorbs Σπ). That tangent is linear in dP through the forward pass's LU factors, so a
  gradient is one more solve (the cotangent ḡ gives `P̄ = πᵀ y`, `M y = ḡᵀ − (ḡ·π) 𝟙`) and forward mode
  works as well. The clamp π ≥ 0 (rounding on nearly reducible chains) is not differentiated."""
  check_chain(p)
  return _law(_working(p))


@jax.custom_jvp
def _law(p):
  return _solve_pi(p)[0]


@_law.defjvp
def _law_jvp(primals, tangents):
  """dπ = π dP M⁻¹ − π (Σ_j (π dP M⁻¹)_j): linear in dP through the forward LU, so reverse mode is its
  transpose (one more solve) and forward mode works too."""
  (p,), (dp,) = primals, tangents
  pi, lu = _solve_pi(p)
  dpi = _lu_solve(lu, jnp.einsum("...i,...ij->...j", pi, dp))
  return pi, dpi - pi * jnp.sum(dpi, -1, keepdims=True)


def check_law(p, pi, atol: float = 1e-4) -> jax.Array:
  """A supplied law π [..., n] for P [..., n, n]: P's leading shape, floating, finite, ≥ 0 and Σπ = 1
  within `atol` (one-line errors on concrete values); returned as π/Σπ, so read-outs stay in their
  documented ranges (ε_rev ∈ [0, 1]). Traced, the checks are staged (`_checks`) and a π that fails
  them comes back NaN, so nothing computed from it looks valid."""
  pi = jnp.asarray(pi)
  if pi.shape != p.shape[:-1]:
    raise ValueError(f"pi must be [..., n] = {p.shape[:-1]} (a law on P's states); got shape {pi.shape}")
  _checks.check_floating("pi", pi)
  total = jnp.sum(pi, -1, keepdims=True)
  if _checks.is_concrete(pi):
    a = np.asarray(pi, np.float64)
    sums = a.sum(-1)
    if not (np.all(np.isfinite(a)) and np.all(a >= 0) and np.all(np.abs(sums - 1) <= atol)):
      raise ValueError(f"pi must be a probability vector (finite, >= 0, summing to 1 within {atol:g}); got "
                       f"min {np.min(a, initial=0.0):.3g}, sums in [{sums.min():.6g}, {sums.max():.6g}]")
    return pi / total
  ok = jnp.all(jnp.isfinite(pi) & (pi >= 0), -1, keepdims=True) & (jnp.abs(total - 1) <= atol)
  _checks.staged_check(jnp.all(ok), "pi must be a probability vector (finite, >= 0, summing to 1)")
  return jnp.where(ok, pi / total, jnp.nan)


def damped_law(p, damping: float) -> jax.Array:
  """The damped (PageRank) law π_τ [..., n] of P [..., n, n], τ = `damping` ∈ (0, 1]: the stationary law
  of the walk that restarts from the uniform law u = 1/n with probability τ at each step,

      π_τ (I − (1 − τ) P) = τ u,        π_τ = τ Σ_{t≥0} (1 − τ)^t u P^t.

  `I − (1 − τ)P` is row diagonally dominant by τ (‖(I − (1 − τ)P)⁻¹‖_∞ ≤ 1/τ), so π_τ is unique, ≥ 0 and
  well conditioned for every stochastic P — reducible or nearly reducible walks included, where π is
  undetermined (`stationary` reports `converged = False`) — and so is its gradient (one linear solve).
  Its distance to π, for a P with one closed class: π_τ − π = τ Σ_t (1 − τ)^t (u − π) P^t, so

      ‖π_τ − π‖₁ ≤ τ ‖u − π‖₁ / (1 − (1 − τ) δ(P)),     δ(P) = ½ max_ij ‖P_i· − P_j·‖₁ ∈ [0, 1]

  (Dobrushin's contraction coefficient), and any read-out linear in π with rows of P summing to 1 —
  ε_rev among them — moves by at most ‖π_τ − π‖₁ (`reversibility`). Computed in P's working dtype.
  """
  check_chain(p)
  if isinstance(damping, bool) or not isinstance(damping, numbers.Real) or not 0 < damping <= 1:
    raise ValueError(f"damping must be a number in (0, 1] (the restart probability τ); got {damping!r}")
  return _damped_law(_working(p), float(damping))


def _damped_solve(p, damping: float):
  """(π_τ, lu_factor(A)), `A = I − (1 − τ)P`."""
  n = p.shape[-1]
  lu = linalg.lu_factor(jnp.eye(n, dtype=p.dtype) - (1.0 - damping) * p)
  rhs = jnp.full(p.shape[:-1], damping / n, p.dtype)
  pi = jnp.maximum(linalg.lu_solve(lu, rhs[..., None], trans=1)[..., 0], 0.0)    # π_τ A = τu ⇔ Aᵀ π_τᵀ = τuᵀ
  return pi / pi.sum(-1, keepdims=True), lu


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _damped_law(p, damping: float):
  """π_τ; its derivative by the implicit function theorem (as `law`): dπ_τ = (1 − τ) π_τ dP A⁻¹, projected
  onto Σdπ_τ = 0 — linear in dP through the forward LU (reverse mode: one more solve)."""
  return _damped_solve(p, damping)[0]


@_damped_law.defjvp
def _damped_jvp(damping, primals, tangents):
  (p,), (dp,) = primals, tangents
  pi, lu = _damped_solve(p, damping)
  dpi = (1.0 - damping) * _lu_solve(lu, jnp.einsum("...i,...ij->...j", pi, dp))
  return pi, dpi - pi * jnp.sum(dpi, -1, keepdims=True)


def _pi(p, pi):
  return _law(_working(p)) if pi is None else check_law(p, pi)


# ----------------------------------------------------------------------------- entropies and flows

def entropy(p) -> jax.Array:
  """Mean row entropy `H̄` [...] (nats); `exp(H̄)` is the effective neighbour count."""
  check_chain(p)
  return _entropy(p)


def _entropy(p):
  return jnp.sum(entr(jnp.maximum(p, 0.0)), -1).mean(-1)


def effective_neighbours(p) -> jax.Array:
  """`e^{H̄}` [...]: 1 for a deterministic walk, n for the uniform one."""
  check_chain(p)
  return jnp.exp(_entropy(p))


def _flows(p, pi):
  return _pi(p, pi)[..., :, None] * p


def flows(p, pi=None) -> jax.Array:
  """Edge flows `F_ij = π_i P_ij` [..., n, n] (the one-step path law)."""
  check_chain(p)
  return _flows(p, pi)


def _reversibility(p, pi):
  f = _flows(p, pi)
  return 0.5 * jnp.sum(jnp.abs(f - jnp.swapaxes(f, -1, -2)), (-2, -1))


def reversibility(p, pi=None) -> jax.Array:
  """`ε_rev = ½ Σ_ij |π_i P_ij − π_j P_ji|` [...] ∈ [0, 1]; 0 iff detailed balance holds."""
  check_chain(p)
  return _reversibility(p, pi)


def entropy_production(p, pi=None) -> jax.Array:
  """Schnakenberg entropy production `σ` [...] ≥ 0; 0 iff reversible.

  `σ = ½ Σ_ij [rel_entr(F_ij, F_ji) + rel_entr(F_ji, F_ij)]` with `F_ij = π_i P_ij`, over pairs
  where both directions have positive flow (a one-way edge makes σ infinite; it is skipped and
  should be read through `reversibility` instead). Under jit, where P is not validated, a non-finite
  flow makes σ NaN (the pair mask alone would skip it and report 0, "reversible").
  """
  check_chain(p)
  f = _flows(p, pi)
  ft = jnp.swapaxes(f, -1, -2)
  both = (f > _TINY) & (ft > _TINY)
  finite = jnp.all(jnp.isfinite(f), (-2, -1))
  f, ft = jnp.where(both, f, 1.0), jnp.where(both, ft, 1.0)
  sigma = 0.5 * jnp.sum(jnp.where(both, rel_entr(f, ft) + rel_entr(ft, f), 0.0), (-2, -1))
  return jnp.where(finite, sigma, jnp.nan)


def double_centre(x) -> jax.Array:
  """`H X H` over the last two axes, `H = I − 11ᵀ/n`: removes every term `c_i + d_j`."""
  return x - x.mean(-1, keepdims=True) - x.mean(-2, keepdims=True) + x.mean((-2, -1), keepdims=True)


def skew_share(logits=None, *, p=None) -> jax.Array:
  """`ρ_skew = ‖antisym(L̃)‖_F / ‖L̃‖_F` [...] ∈ [0, 1], `L̃ = H L H`.

  Give either `logits` [..., n, n] (the parametric logit; required when P is masked) or an
  unmasked `p` (strictly positive; `L = log P`, defined up to the row shifts the centring removes).
  The exact part of A (`φ_j − φ_i`) and all row/column potentials vanish under the centring, so
  exact-A operators (DMAP, ATAP) give 0.
  """
  if (logits is None) == (p is None):
    raise ValueError("skew_share takes exactly one of `logits` or `p`")
  if p is not None:
    check_chain(p, "p")
    if _checks.is_concrete(p) and bool(jnp.any(p <= 0)):
      raise ValueError("p has zero entries (masked): pass the parametric `logits` instead")
    logits = jnp.log(p)
  else:
    _checks.check_square("logits", logits)
    _check_nonempty("logits", logits)
    _checks.check_finite("logits", logits)
  lt = double_centre(logits.astype(jnp.float32))
  skew = 0.5 * (lt - jnp.swapaxes(lt, -1, -2))
  return jnp.sqrt(jnp.sum(skew**2, (-2, -1)) / jnp.maximum(jnp.sum(lt**2, (-2, -1)), _TINY))


# ----------------------------------------------------------------------------- spectra

def _batched(fn, p):
  """Apply `fn` to every [n, n] matrix of p [..., n, n]; outputs gain p's leading axes."""
  lead = p.shape[:-2]
  out = jax.lax.map(fn, p.reshape((-1,) + p.shape[-2:]))    # not vmap: one matrix per LAPACK call (linalg)
  return jax.tree.map(lambda a: a.reshape(lead + a.shape[1:]), out)


def spectrum(p, k: int | None = None, *, tol: float = 1e-5, krylov: int | None = None) -> eigen.Eig:
  """The k eigenvalues of `P` [..., n, n] of largest modulus (all n when k is None), with residuals.

  Thick-restart Arnoldi on `f ↦ P f` (`attngeo.eigen.eig`); with k = None or `krylov = n` it is an
  exact Hessenberg reduction. Returns `eigen.Eig` with leading axes `[...]`: `values` [..., k]
  (complex, decreasing modulus; λ₀ = 1), `vectors` [..., n, k] (right eigenvectors), `residuals`
  [..., k], `converged` [...] (every residual ≤ tol·max|λ|).
  """
  check_chain(p)
  _check_k(k, p.shape[-1])
  return _spectrum(p, k, float(tol), krylov)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _spectrum(p, k, tol, krylov):
  p = _working(p)
  n = p.shape[-1]
  k = n if k is None else k
  krylov = n if k == n else krylov
  return _batched(lambda a: eigen.eig(lambda v: a @ v, n, k, krylov=krylov, tol=tol, dtype=a.dtype), p)


def _check_k(k, n):
  if k is not None and not 1 <= k <= n:
    raise ValueError(f"k must be in [1, n = {n}]; got {k}")


class SpectralGap(NamedTuple):
  """`gap` [...] = 1 − |λ₁|; `residual` [...] of the λ₁ eigenpair (‖Px − λ₁x‖); `converged` [...]."""
  gap: jax.Array
  residual: jax.Array
  converged: jax.Array


def spectral_gap(p, *, tol: float = 1e-5) -> SpectralGap:
  """`1 − |λ₁|` [...], the gap between the unit eigenvalue and the next largest modulus."""
  check_chain(p)
  ev = _spectrum(p, min(2, p.shape[-1]), float(tol), None)
  return SpectralGap(1.0 - jnp.abs(ev.values[..., -1]), ev.residuals[..., -1], ev.converged)


def eigenbasis(p, k: int | None = None, pi=None):
  """Leading eigenpairs of the reversibilised P: (λ [..., k] descending, ψ [..., n, k]).

  With `Π = diag(π)`, `A = Π^{1/2} P Π^{-1/2}` is symmetric when P is reversible; its eigenpairs
  `A u = λ u` (dense `eigh`, exact) give right eigenvectors `ψ = Π^{-1/2} u` of P, orthonormal in
  L²(π). For a non-reversible P the symmetric part of A (the additive reversibilisation
  `(P + P*)/2`) is used. ψ₀ is constant with λ₀ = 1. π is `stationary(p)` unless given (its
  accuracy is `stationary(p).error_bound`).
  """
  check_chain(p)
  return _eigenbasis(p, k, pi)


def _eigenbasis(p, k, pi):
  p = _working(p)
  pi = _pi(p, pi)
  sq = jnp.sqrt(jnp.maximum(pi, _TINY))
  a = sq[..., :, None] * p / sq[..., None, :]
  lam, u = linalg.eigh(0.5 * (a + jnp.swapaxes(a, -1, -2)))
  lam, u = lam[..., ::-1], u[..., ::-1]
  if k is not None:
    lam, u = lam[..., :k], u[..., :k]
  return lam, u / sq[..., :, None]


def diffusion_coordinates(p, k: int, t: float = 1.0, pi=None):
  """Coifman–Lafon diffusion map `Ψ_t(i) = (λ_1^t ψ_1(i), …, λ_k^t ψ_k(i))` (see `eigenbasis`).

  The trivial pair (λ₀ = 1, ψ₀ = 1) is dropped. Returns (coords [..., n, k], eigenvalues [..., k]).
  For large point clouds use `attngeo.diffmap.diffusion_map` (matrix-free, with residuals).
  """
  check_chain(p)
  lam, psi = _eigenbasis(p, k + 1, pi)
  lam, psi = lam[..., 1:], psi[..., 1:]
  return jnp.sign(lam)[..., None, :] * jnp.abs(lam)[..., None, :] ** t * psi, lam


# ----------------------------------------------------------------------------- heat

def propagate(p, mu, t: int) -> jax.Array:
  """Law of the walk after t steps, `μ P^t`, for an initial law μ `[..., n]` (heat from a point: μ = δ_i)."""
  check_chain(p)
  if int(t) != t or t < 0:
    raise ValueError(f"t must be a non-negative integer; got {t}")
  if mu.shape[-1] != p.shape[-1]:
    raise ValueError(f"mu must be [..., n] with n = {p.shape[-1]}; got {mu.shape}")
  return jax.lax.fori_loop(0, int(t), lambda _, m: jnp.einsum("...i,...ij->...j", m, p), mu)


def heat(p, f, t, *, tau: float | None = None) -> jax.Array:
  """Heat flow of values `f` [..., n, m] under P (direct: no tolerance involved).

  Discrete semigroup (`tau=None`): `P^t f` for integer `t ≥ 0` (t applications, O(t·n²)).
  Continuous (`tau` given): `e^{t L} f` with generator `L = (P − I)/τ`, via `expm`.
  """
  check_chain(p)
  if f.shape[-2] != p.shape[-1]:
    raise ValueError(f"f must be [..., n, m] with n = {p.shape[-1]}; got {f.shape}")
  if tau is None:
    if int(t) != t or t < 0:
      raise ValueError(f"t must be a non-negative integer for the discrete semigroup; got {t}")
    return jax.lax.fori_loop(0, int(t), lambda _, g: p @ g, f)
  _checks.check_positive("tau", tau)
  eye = jnp.eye(p.shape[-1], dtype=p.dtype)
  return jax.scipy.linalg.expm(t * (p - eye) / tau) @ f
