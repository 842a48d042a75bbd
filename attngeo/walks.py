"""Markov operators as values: a generator `f -> Lf` built from a dense P, an attention operator or a
Gaussian kernel on a point cloud, applied dense or matrix-free.

A `MarkovOperator` is what the Bakry–Émery calculus of `attngeo.geometry` consumes: its `generator`
maps values f `[..., n, m]` to `Lf = (Pf − f)/τ` with one application of P, and `project` maps derived
fields (products, Γ's) back into the operator's function space (the identity, except for `spectral`
operators, which live on their k leading eigenfunctions). Constructors:

* `dense(P, τ)` — a materialised row-stochastic `P` `[..., n, n]`;
* `attention(q, k, β, α, …)` — the operator family of `attngeo.operators`, through its fused kernels;
* `gaussian_markov` / `gaussian_walk` / `gaussian` — the Coifman–Lafon walk of a cloud,
  `K_ij = exp(−‖x_i − x_j‖²/ε)`, `P_α = rownorm(K / (q_i q_j)^α)`, dense or as one attention call
  (queries x, keys x, scale 2/ε, key bias `−‖x_j‖²/ε − α log q_j`), with τ = ε/4
  (`laplacian_time_scale`): with α = 1, `(P − I)/τ → Δ`;
* `spectral` / `gaussian_spectral` — the generator restricted to the k leading eigenfunctions of a
  reversible P, `L h = Σ_c μ_c ⟨h, ψ_c⟩_π ψ_c` (dense `eigh`, or matrix-free `conjugate_eigenpairs`).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from attngeo import _checks, eigen, kernels, markov, operators

def _identity(h):
  return h


class MarkovOperator(NamedTuple):
  """A Markov generator acting on values f `[..., n, m]`.

  generator: `f -> Lf`, `L = (P − I)/τ` (one application of P).
  project: maps derived fields (products, Γ's) back into the operator's function space: the
    identity, except for `spectral` operators, which live on their leading eigenfunctions.
  spectrum: for `spectral` / `gaussian_spectral` operators, the `eigen.Eigh` of the symmetric
    conjugate their eigenfunctions came from (values, residuals, error bounds, converged); else None.
  """
  generator: Callable[[jax.Array], jax.Array]
  project: Callable[[jax.Array], jax.Array] = _identity
  spectrum: eigen.Eigh | None = None


def _from_apply(apply, tau) -> MarkovOperator:
  return MarkovOperator(lambda f: (apply(f) - f) / tau)


def dense(p, tau: float = 1.0) -> MarkovOperator:
  """A materialised row-stochastic `P` `[..., n, n]` as an operator."""
  markov.check_chain(p)
  _checks.check_positive("tau", tau)
  return _from_apply(lambda f: jnp.einsum("...ij,...jm->...im", p, f.astype(p.dtype)), tau)


def attention(q, k, *, beta=1.0, alpha=1.0, causal=False, mask=None, scale=None, tau: float = 1.0,
              implementation=None, block_size: int = 512) -> MarkovOperator:
  """The attention operator (β, α) on q, k `[b, n, h, d]`, applied matrix-free.

  Values use the dense convention `[b, h, n, m]` (matching `operators.markov_matrix`).
  """
  _checks.check_positive("tau", tau)

  def apply(f):
    v = jnp.transpose(f, (0, 2, 1, 3)).astype(jnp.float32)
    out = operators.transport(q, k, v, beta=beta, alpha=alpha, causal=causal, mask=mask, scale=scale,
                              implementation=implementation, block_size=block_size)
    return jnp.transpose(out, (0, 2, 1, 3))
  return _from_apply(apply, tau)


def laplacian_time_scale(eps: float) -> float:
  """τ(ε) = ε/4: with α = 1, `(P − I)/τ → Δ` for the kernel `exp(−‖x − y‖²/ε)`."""
  return eps / 4.0


def centre(x):
  _checks.check_rank("x", x, 2, "[n_points, dim]")
  _checks.check_floating("x", x)
  _checks.check_finite("x", x)
  return x - x.mean(0)


def _gaussian_logits(x, eps):
  """`log K_ij = −‖x_i − x_j‖²/ε` [n, n] (dense)."""
  sq = jnp.sum(x * x, -1)
  return -(sq[:, None] + sq[None, :] - 2 * x @ x.T) / eps


def _log_degree(x, eps, chunk: int, key_bias=None):
  """`log Σ_j exp(−‖x_i − x_j‖²/ε + b_j)` [n] (b = `key_bias` or 0), in query chunks.

  O(chunk·n) memory; checkpointed so its gradient keeps that bound.
  """
  n = x.shape[0]
  pad = -n % chunk
  xp = jnp.pad(x, ((0, pad), (0, 0)))
  sq = jnp.sum(x * x, -1)
  b = jnp.zeros((n,), x.dtype) if key_bias is None else key_bias

  @jax.checkpoint
  def rows(xc):
    d2 = jnp.sum(xc * xc, -1)[:, None] + sq[None, :] - 2 * xc @ x.T
    return jax.nn.logsumexp(-d2 / eps + b[None, :], -1)
  return jax.lax.map(rows, xp.reshape(-1, chunk, x.shape[1])).reshape(-1)[:n]


def gaussian_markov(x, eps: float, *, alpha_norm: float = 1.0, k: int | None = None):
  """Dense Coifman–Lafon operator on a point cloud x `[n, D]`: `[n, n]` row-stochastic.

  `K_ij = exp(−‖x_i − x_j‖²/ε)`, `q_i = Σ_j K_ij`, `K^α_ij = K_ij / (q_i q_j)^α`, `P = rownorm(K^α)`
  (α = 0: graph walk; ½: Fokker–Planck; 1: Laplace–Beltrami, density-free). With `k`, the kernel
  is restricted to the symmetrised k-nearest-neighbour graph before normalising. Time scale:
  `laplacian_time_scale(eps)`. Computed in the log domain.
  """
  _checks.check_positive("eps", eps)
  if not 0.0 <= alpha_norm <= 1.0:
    raise ValueError(f"alpha_norm must lie in [0, 1]; got {alpha_norm}")
  x = centre(jnp.asarray(x, jnp.float32))
  lk = _gaussian_logits(x, eps)
  if k is not None:
    if not 1 <= k < x.shape[0]:
      raise ValueError(f"k must be in [1, n_points); got {k}")
    kth = -jnp.sort(-lk, axis=-1)[:, k][:, None]   # k neighbours besides the point itself
    keep = lk >= kth
    keep = keep | keep.T
    lk = jnp.where(keep, lk, -jnp.inf)
  # log q_j as a column reduction (lk is symmetric): XLA:CPU fuses a row reduction broadcast
  # along columns into the softmax with an O(n³) access pattern.
  lq = jax.nn.logsumexp(lk, 0)
  return jax.nn.softmax(lk - alpha_norm * lq[None, :], -1)


class GaussianWalk(NamedTuple):
  """The Coifman–Lafon walk `P_α` of a cloud, matrix-free (see `gaussian_walk`).

  apply: `f [n, m] -> P_α f` (one attention call); log_q [n]: log kernel degree `log q_i`;
  log_pi [n]: log of its reversible law `π_i ∝ d_i = Σ_j K^α_ij`; x [n, D]: the centred cloud.
  """
  apply: Callable[[jax.Array], jax.Array]
  log_q: jax.Array
  log_pi: jax.Array
  x: jax.Array

  def conjugate(self, v):
    """`A v = Π^{1/2} P_α Π^{-1/2} v` for v [n, m]: symmetric, PSD, spectrum in [0, 1], A√π = √π."""
    sq = jnp.exp(0.5 * self.log_pi)[:, None]
    return sq * self.apply(v / sq)


def gaussian_walk(x, eps: float, *, alpha_norm: float = 1.0, implementation: str | None = "blockwise",
                  block_size: int = 1024) -> GaussianWalk:
  """`gaussian_markov(x, eps, alpha_norm)` as a `GaussianWalk`, never materialised (O(n) memory).

  `P_α f` is one attention call: queries x, keys x, scale 2/ε and key bias `−‖x_j‖²/ε − α log q_j`
  (the i-only terms cancel in the row normalisation). `K^α` is symmetric, so P_α is reversible
  with `π_i ∝ d_i`, `log d_i = −α log q_i + log Σ_j exp(−‖x_i − x_j‖²/ε − α log q_j)`; both degree
  passes are chunked logsumexps.
  """
  _checks.check_positive("eps", eps)
  if not 0.0 <= alpha_norm <= 1.0:
    raise ValueError(f"alpha_norm must lie in [0, 1]; got {alpha_norm}")
  block_size = kernels.check_block_size(block_size)
  x = centre(jnp.asarray(x, jnp.float32))
  chunk = min(256, x.shape[0])                                                # [chunk, n] per degree step
  lq = _log_degree(x, eps, chunk)
  log_d = -alpha_norm * lq + _log_degree(x, eps, chunk, key_bias=-alpha_norm * lq)
  return GaussianWalk(_gaussian_apply(x, eps, alpha_norm, lq, block_size, implementation), lq,
                      jax.nn.log_softmax(log_d), x)


def gaussian(x, eps: float, *, alpha_norm: float = 1.0, implementation: str | None = "blockwise",
             block_size: int = 1024) -> MarkovOperator:
  """Matrix-free `gaussian_markov(x, eps, alpha_norm)` with `τ = ε/4`: P is never materialised.

  Values f are `[n, m]`; one attention call per application (see `gaussian_walk`). O(n) memory
  with the blockwise kernel.
  """
  _checks.check_positive("eps", eps)
  block_size = kernels.check_block_size(block_size)
  x = centre(jnp.asarray(x, jnp.float32))
  lq = _log_degree(x, eps, min(block_size, x.shape[0]))
  return _from_apply(_gaussian_apply(x, eps, alpha_norm, lq, block_size, implementation), laplacian_time_scale(eps))


def _gaussian_apply(x, eps, alpha_norm, lq, block_size, implementation="blockwise"):
  """`f -> P_α f` for centred x with kernel log-degrees lq: one attention call (see `gaussian`)."""
  bias = (-jnp.sum(x * x, -1) / eps - alpha_norm * lq)[None, :, None]       # [1, n, 1]
  xq = x[None, :, None, :]

  def apply(f):
    v = f.astype(jnp.float32)[None, :, None, :]
    return kernels.attention(xq, xq, v, bias=bias, scale=2.0 / eps, implementation=implementation,
                               block_size=block_size)[0, :, 0, :]
  return apply


def spectral_operator(pi, lam, psi, tau, spectrum=None, log_generator: bool = False) -> MarkovOperator:
  """Generator `Σ_c μ_c ⟨·, ψ_c⟩_π ψ_c` and projection on span(ψ), `μ = (λ − 1)/τ` (or `log λ / τ`)."""
  mu = jnp.log(jnp.maximum(lam, 1e-30)) / tau if log_generator else (lam - 1.0) / tau
  coeffs = lambda h: jnp.einsum("...nc,...n,...nm->...cm", psi, pi, h)
  return MarkovOperator(lambda f: jnp.einsum("...nc,...c,...cm->...nm", psi, mu, coeffs(f)),
                        lambda h: jnp.einsum("...nc,...cm->...nm", psi, coeffs(h)), spectrum)


def conjugate_eigenpairs(walk: GaussianWalk, k: int, *, tol: float = 1e-5, block: int | None = None,
                         degree: int = 16, max_matvecs: int = 2000, x0=None, seed: int = 0,
                         return_block: bool = False) -> eigen.Eigh:
  """The k leading eigenpairs of the symmetric conjugate `A = Π^{1/2} P_α Π^{-1/2}` of a Gaussian walk.

  The Perron pair (1, √π) is known and deflated; `eigen.eigsh` (Chebyshev-filtered subspace
  iteration with shift σ = 1; the spectrum is bounded below by 0: `K^α` is a Gaussian kernel,
  hence PSD) finds the k − 1 others. The returned `Eigh` has the Perron pair first, its residual
  and `shifted` (1 − λ, accurate relative to itself) measured like the others' (x0, block,
  return_block as in `eigen.eigsh`, for the k − 1 nontrivial pairs).
  """
  if k < 2:
    raise ValueError(f"k must be at least 2 eigenpairs; got {k}")
  n = walk.x.shape[0]
  sq = jnp.exp(0.5 * walk.log_pi)[:, None]
  res = eigen.eigsh(walk.conjugate, n, k - 1, block=block, degree=degree, tol=tol, max_matvecs=max_matvecs,
                    lower=0.0, deflate=sq, x0=x0, seed=seed, return_block=return_block, shift=1.0)
  a_sq = walk.conjugate(sq)
  r0, rate0 = jnp.linalg.norm(a_sq - sq), jnp.sum(sq * (sq - a_sq))
  cat = lambda a, b: jnp.concatenate([jnp.atleast_1d(a), b])
  return eigen.Eigh(cat(1.0 - rate0, res.values), jnp.concatenate([sq, res.vectors], 1), cat(r0, res.residuals),
                    cat(r0 + jnp.abs(rate0), res.value_bounds), cat(jnp.minimum(1.0, r0 / res.shifted[0]), res.vector_bounds),
                    res.converged & (r0 <= tol), res.iterations, res.matvecs + 1, cat(rate0, res.shifted))


def gaussian_spectral(x, eps: float, k: int, *, alpha_norm: float = 1.0, tol: float = 1e-5, block: int | None = None,
                      degree: int = 16, seed: int = 0, block_size: int = 1024) -> MarkovOperator:
  """`spectral(gaussian_markov(x, eps, alpha_norm), k, ε/4)` without materialising P (large n).

  `K^α` is symmetric, so P is reversible with `π_i ∝ d_i` and `A = Π^{1/2} P Π^{-1/2}` is
  symmetric with spectrum in [0, 1]; its k leading eigenpairs come from `conjugate_eigenpairs`
  (residual-checked; `op.spectrum.converged` says whether every residual met `tol`), `ψ = Π^{-1/2} u`.
  """
  walk = gaussian_walk(x, eps, alpha_norm=alpha_norm, block_size=block_size)
  spec = conjugate_eigenpairs(walk, k, tol=tol, block=block, degree=degree, seed=seed)
  pi = jnp.exp(walk.log_pi)
  return spectral_operator(pi, spec.values, spec.vectors / jnp.sqrt(pi)[:, None], laplacian_time_scale(eps), spec)


def spectral(p, k: int, tau: float = 1.0, *, tol: float = 1e-4, log_generator: bool = False) -> MarkovOperator:
  """The generator of a dense reversible P restricted to its k leading eigenfunctions.

  With `(λ_c, ψ_c)` from `markov.eigenbasis` (ψ orthonormal in L²(π)) and `μ_c = (λ_c − 1)/τ`:
  `Proj h = Σ_c ⟨h, ψ_c⟩_π ψ_c`, `L h = Σ_c μ_c ⟨h, ψ_c⟩_π ψ_c`. Every product and Γ is projected
  back onto the span, which removes the sampling noise that the plain pointwise estimators
  amplify (the "diffusion geometry" construction). k trades bias (too few modes to hold products
  of the test functions) against noise. `op.spectrum` holds the residuals `‖A u − λ u‖` of the
  conjugate pairs `u = √π ψ` (they include the error of π), `converged` iff all ≤ `tol`. With
  `log_generator`, `μ_c = log λ_c / τ` (the generator of the semigroup P^{t/τ}; for a Gaussian
  kernel walk the consistent estimate of Δ, see `ricci_estimate`).
  """
  markov.check_chain(p)
  _checks.check_positive("tau", tau)
  if k < 2:
    raise ValueError(f"k must be at least 2 eigenfunctions; got {k}")
  p32 = p.astype(jnp.float32) if p.dtype != jnp.float64 else p
  pi = markov.law(p32)
  lam, psi = markov.eigenbasis(p32, k, pi)
  sq = jnp.sqrt(pi)[:, None]
  u = psi * sq
  resid = jnp.linalg.norm(sq * (p32 @ psi) - u * lam, axis=0)
  zero = jnp.zeros((), jnp.int32)
  spec = eigen.Eigh(lam, u, resid, resid, jnp.ones_like(resid), jnp.all(resid <= tol), zero, zero)
  return spectral_operator(pi, lam, psi, tau, spec, log_generator)


def as_operator(p, tau) -> MarkovOperator:
  if isinstance(p, MarkovOperator):
    if tau is not None:
      raise ValueError("tau is part of a MarkovOperator; pass it when building the operator")
    return p
  return dense(p, 1.0 if tau is None else tau)
