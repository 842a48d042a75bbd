"""Markov diagnostics of a row-stochastic operator `P` (dense reference, batched over leading axes).

Conventions: `P` is `[..., n, n]`, `P_ij ≥ 0`, `Σ_j P_ij = 1`; masked entries are exactly 0.
Logs are natural. Every function validates `P` (shape, dtype, finiteness, stochasticity) when it
holds concrete values, and is jit/vmap/grad-compatible otherwise.

* stationary law `π`: left Perron vector, `πP = π`, `Σπ = 1` (power iteration on the lazy chain).
* mean row entropy `H̄ = mean_i −Σ_j P_ij log P_ij`; `e^{H̄}` is the effective number of neighbours.
* reversibility `ε_rev = ½ Σ_ij |π_i P_ij − π_j P_ji|` ∈ [0, 1]: total-variation distance between
  the one-step forward and time-reversed path laws; 0 iff detailed balance.
* skew share `ρ_skew = ‖antisym(L̃)‖_F / ‖L̃‖_F`, `L̃ = H L H`, `H = I − 11ᵀ/n`: the share of the
  logit that is antisymmetric and not exact (row/column potentials are removed by the centring).
* entropy production `σ = ½ Σ_ij (π_i P_ij − π_j P_ji) log(π_i P_ij / π_j P_ji)` ≥ 0.
* spectrum, diffusion coordinates `λ_k^t ψ_k` (Coifman–Lafon), heat semigroup `P^t f`, `e^{t(P−I)/τ} f`.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from attngeo import _checks

_TINY = 1e-30


class Stationary(NamedTuple):
  """π [..., n]; `residual` = max_i |(πP)_i − π_i| at exit; `iterations` run; `converged` = residual ≤ tol."""
  pi: jax.Array
  residual: jax.Array
  iterations: jax.Array
  converged: jax.Array


def stationary(p, *, tol: float = 1e-7, max_iter: int = 10_000) -> Stationary:
  """Stationary law of `P` [..., n, n] by power iteration on the lazy chain `(I + P)/2`.

  The lazy chain has the same stationary law and is aperiodic, so the iteration converges for
  every irreducible `P`. Stops when `max|πP − π| ≤ tol` or after `max_iter` steps (reported).
  """
  _checks.check_stochastic("P", p)
  p = p.astype(jnp.float32) if p.dtype != jnp.float64 else p
  n = p.shape[-1]
  pi0 = jnp.full(p.shape[:-1], 1.0 / n, p.dtype)

  def resid(pi):
    return jnp.max(jnp.abs(jnp.einsum("...i,...ij->...j", pi, p) - pi))

  def cond(state):
    _, r, it = state
    return (r > tol) & (it < max_iter)

  def body(state):
    pi, _, it = state
    for _ in range(8):  # eight lazy steps per convergence check
      pi = 0.5 * (pi + jnp.einsum("...i,...ij->...j", pi, p))
      pi = pi / pi.sum(-1, keepdims=True)
    return pi, resid(pi), it + 8

  pi, r, it = jax.lax.while_loop(cond, body, (pi0, resid(pi0), jnp.int32(0)))
  return Stationary(pi, r, it, r <= tol)


def _pi(p, pi):
  return stationary(p).pi if pi is None else pi


def entropy(p) -> jax.Array:
  """Mean row entropy `H̄` [...] (nats); `exp(H̄)` is the effective neighbour count."""
  _checks.check_stochastic("P", p)
  h_rows = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1)
  return h_rows.mean(-1)


def effective_neighbours(p) -> jax.Array:
  """`e^{H̄}` [...]: 1 for a deterministic walk, n for the uniform one."""
  return jnp.exp(entropy(p))


def flows(p, pi=None) -> jax.Array:
  """Edge flows `F_ij = π_i P_ij` [..., n, n] (the one-step path law)."""
  return _pi(p, pi)[..., :, None] * p


def reversibility(p, pi=None) -> jax.Array:
  """`ε_rev = ½ Σ_ij |π_i P_ij − π_j P_ji|` [...] ∈ [0, 1]; 0 iff detailed balance holds."""
  _checks.check_stochastic("P", p)
  f = flows(p, pi)
  return 0.5 * jnp.sum(jnp.abs(f - jnp.swapaxes(f, -1, -2)), (-2, -1))


def entropy_production(p, pi=None) -> jax.Array:
  """Schnakenberg entropy production `σ` [...] ≥ 0; 0 iff reversible.

  `σ = ½ Σ_ij (F_ij − F_ji) log(F_ij / F_ji)` with `F_ij = π_i P_ij`, over pairs where both
  directions have positive flow (a one-way edge makes σ infinite; it is skipped and should be
  read through `reversibility` instead).
  """
  _checks.check_stochastic("P", p)
  f = flows(p, pi)
  ft = jnp.swapaxes(f, -1, -2)
  both = (f > _TINY) & (ft > _TINY)
  term = (f - ft) * (jnp.log(jnp.where(both, f, 1.0)) - jnp.log(jnp.where(both, ft, 1.0)))
  return 0.5 * jnp.sum(jnp.where(both, term, 0.0), (-2, -1))


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
    _checks.check_stochastic("p", p)
    if _checks.is_concrete(p) and bool(jnp.any(p <= 0)):
      raise ValueError("p has zero entries (masked): pass the parametric `logits` instead")
    logits = jnp.log(p)
  else:
    _checks.check_square("logits", logits)
    _checks.check_finite("logits", logits)
  lt = double_centre(logits.astype(jnp.float32))
  skew = 0.5 * (lt - jnp.swapaxes(lt, -1, -2))
  return jnp.sqrt(jnp.sum(skew**2, (-2, -1)) / jnp.maximum(jnp.sum(lt**2, (-2, -1)), _TINY))


def spectrum(p, k: int | None = None) -> jax.Array:
  """Eigenvalues of `P` [..., k] (complex), sorted by decreasing modulus; λ₀ = 1.

  Uses a general eigensolver (`jnp.linalg.eig`: CPU backends only).
  """
  _checks.check_stochastic("P", p)
  ev = jnp.linalg.eig(p.astype(jnp.float32))[0]
  order = jnp.argsort(-jnp.abs(ev), axis=-1)
  ev = jnp.take_along_axis(ev, order, -1)
  return ev if k is None else ev[..., :k]


def spectral_gap(p) -> jax.Array:
  """`1 − |λ₁|` [...], the gap between the unit eigenvalue and the next largest modulus."""
  return 1.0 - jnp.abs(spectrum(p, 2)[..., 1])


def eigenbasis(p, k: int | None = None, pi=None):
  """Leading eigenpairs of the reversibilised P: (λ [..., k] descending, ψ [..., n, k]).

  With `Π = diag(π)`, `A = Π^{1/2} P Π^{-1/2}` is symmetric when P is reversible; its eigenpairs
  `A u = λ u` give right eigenvectors `ψ = Π^{-1/2} u` of P, orthonormal in L²(π). For a
  non-reversible P the symmetric part of A (the additive reversibilisation `(P + P*)/2`) is used.
  ψ₀ is constant with λ₀ = 1.
  """
  _checks.check_stochastic("P", p)
  pi = _pi(p, pi)
  sq = jnp.sqrt(jnp.maximum(pi, _TINY))
  a = sq[..., :, None] * p / sq[..., None, :]
  lam, u = jnp.linalg.eigh(0.5 * (a + jnp.swapaxes(a, -1, -2)))
  lam, u = lam[..., ::-1], u[..., ::-1]
  if k is not None:
    lam, u = lam[..., :k], u[..., :k]
  return lam, u / sq[..., :, None]


def diffusion_coordinates(p, k: int, t: float = 1.0, pi=None):
  """Coifman–Lafon diffusion map `Ψ_t(i) = (λ_1^t ψ_1(i), …, λ_k^t ψ_k(i))` (see `eigenbasis`).

  The trivial pair (λ₀ = 1, ψ₀ = 1) is dropped. Returns (coords [..., n, k], eigenvalues [..., k]).
  """
  lam, psi = eigenbasis(p, k + 1, pi)
  lam, psi = lam[..., 1:], psi[..., 1:]
  return jnp.sign(lam)[..., None, :] * jnp.abs(lam)[..., None, :] ** t * psi, lam


def propagate(p, mu, t: int) -> jax.Array:
  """Law of the walk after t steps, `μ P^t`, for an initial law μ `[..., n]` (heat from a point: μ = δ_i)."""
  _checks.check_stochastic("P", p)
  if int(t) != t or t < 0:
    raise ValueError(f"t must be a non-negative integer; got {t}")
  if mu.shape[-1] != p.shape[-1]:
    raise ValueError(f"mu must be [..., n] with n = {p.shape[-1]}; got {mu.shape}")
  return jax.lax.fori_loop(0, int(t), lambda _, m: jnp.einsum("...i,...ij->...j", m, p), mu)


def heat(p, f, t, *, tau: float | None = None) -> jax.Array:
  """Heat flow of values `f` [..., n, m] under P.

  Discrete semigroup (`tau=None`): `P^t f` for integer `t ≥ 0` (t applications, O(t·n²)).
  Continuous (`tau` given): `e^{t L} f` with generator `L = (P − I)/τ`, via `expm`.
  """
  _checks.check_stochastic("P", p)
  if f.shape[-2] != p.shape[-1]:
    raise ValueError(f"f must be [..., n, m] with n = {p.shape[-1]}; got {f.shape}")
  if tau is None:
    if int(t) != t or t < 0:
      raise ValueError(f"t must be a non-negative integer for the discrete semigroup; got {t}")
    return jax.lax.fori_loop(0, int(t), lambda _, g: p @ g, f)
  _checks.check_positive("tau", tau)
  eye = jnp.eye(p.shape[-1], dtype=p.dtype)
  return jax.scipy.linalg.expm(t * (p - eye) / tau) @ f
