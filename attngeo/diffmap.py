"""Diffusion maps (Coifman & Lafon 2006), exact and matrix-free, with residuals and Nyström extension.

On a cloud x `[n, D]` with the Gaussian kernel `K_ij = exp(−‖x_i − x_j‖²/ε)`, degrees
`q_i = Σ_j K_ij`, the α-normalised kernel `K^α_ij = K_ij / (q_i q_j)^α` and the walk
`P = D⁻¹K^α` (`d_i = Σ_j K^α_ij`): P is reversible with `π ∝ d`, and its symmetric conjugate
`A = D^{1/2} P D^{-1/2} = D^{-1/2} K^α D^{-1/2}` is positive semi-definite with spectrum in [0, 1].
The leading eigenpairs `A u_c = λ_c u_c` give `ψ_c = u_c / √π` (right eigenvectors of P,
orthonormal in L²(π); ψ₀ = 1, λ₀ = 1) and the diffusion map at time t,

    Ψ_t(x_i) = (λ_1^t ψ_1(i), …, λ_k^t ψ_k(i)),

whose Euclidean distances are the walk's diffusion distances at time t. α = 1 removes the
sampling density (the generator tends to the Laplace–Beltrami operator, `(1 − λ_c)·4/ε → μ_c`).

"Exact" means the eigenpairs of the full kernel (no k-NN truncation, no landmarks): A is applied
matrix-free through the blockwise attention kernel (`walks.gaussian_walk`, O(n) memory) and
solved by `eigen.eigsh` (Chebyshev-filtered subspace iteration) to a residual tolerance; every
pair comes back with its residual and a posteriori bounds, and `1 − λ` is computed to full
relative precision (`rates`). For n above `coarse_min` the solver starts from the Nyström
extension of the diffusion map of a random quarter of the points (recursively), which saves most
filter steps on the full cloud; the answer is still checked by the full operator's residuals.

Nyström: at a new point y, `ψ_c(y) = λ_c⁻¹ Σ_j P(y, x_j) ψ_c(x_j)` with `P(y, ·)` the normalised
row of K^α at y (its `q(y)^α` cancels): one attention call with queries y.

Learned reversible attention (`attention_eigenpairs`): an exact-A member of the transport family
(α = 0: DMAP, ATAP and the edge between them) has logits `L_ij = s[S_ij + ½(g_i − g_j)]`, S
symmetric, so with `w_j = e^{−s g_j/2}` and `z_i = Σ_l e^{s S_il} w_l`, `π_i ∝ w_i z_i` satisfies
detailed balance (`π_i P_ij = w_i w_j e^{s S_ij}/Σπ`). `log z` is one chunked logsumexp of the
augmented logits of `operators.augment`; P is applied by `operators.transport` (blockwise kernel),
and the conjugate's eigenpairs come from `eigen.eigsh` (spectrum in [−1, 1]: S is not PSD for β > 0).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks, eigen, kernels, operators, walks


class DiffusionMap(NamedTuple):
  """coordinates [n, k] `λ_c^t ψ_c` (c = 1..k); values [k+1] λ (λ₀ = 1); rates [k+1] `1 − λ` to
  full relative precision; psi [n, k+1] L²(π)-orthonormal right eigenvectors (ψ₀ = 1); pi [n];
  residuals [k+1] `‖Au − λu‖`; value_bounds / vector_bounds [k+1] a posteriori bounds on |λ error|
  and sin∠(u, u_true); converged []; matvecs [] kernel applications on the full cloud; and what
  Nyström needs: x [n, D] (centred), centre [D], log_q [n], eps, alpha, t."""
  coordinates: jax.Array
  values: jax.Array
  rates: jax.Array
  psi: jax.Array
  pi: jax.Array
  residuals: jax.Array
  value_bounds: jax.Array
  vector_bounds: jax.Array
  converged: jax.Array
  matvecs: jax.Array
  x: jax.Array
  centre: jax.Array
  log_q: jax.Array
  eps: float
  alpha: float
  t: float


def _walk(x, eps, alpha, block_size):
  return walks.gaussian_walk(x, eps, alpha_norm=alpha, block_size=block_size)


def _extend(x_keys, log_q, eps, alpha, values, y, block_size):
  """`Σ_j P(y_i, x_j) values_j` [n', m] for centred keys x [n, D], new points y [n', D] (centred alike)."""
  bias = (-jnp.sum(x_keys * x_keys, -1) / eps - alpha * log_q)[None, :, None]
  return kernels.attention(y[None, :, None, :], x_keys[None, :, None, :], values[None, :, None, :], bias=bias,
                           scale=2.0 / eps, implementation="blockwise", block_size=block_size)[0, :, 0, :]


@functools.partial(jax.jit, static_argnames=("eps", "k", "alpha", "block", "degree", "tol", "max_matvecs",
                                             "block_size", "return_block", "seed"))
def _level(x, coarse, *, eps, k, alpha, block, degree, tol, max_matvecs, block_size, return_block, seed):
  """Solve one level: the walk of x and the k + 1 leading pairs of its conjugate (Perron pair first).

  `coarse` is None or (points, log q, ψ block) of a solved subsample: its block, Nyström-extended to
  x, starts the iteration.
  """
  walk = _walk(x, eps, alpha, block_size)
  x0 = None
  if coarse is not None:
    xs, lqs, psi_sub = coarse
    keys = xs - x.mean(0)                                  # the subsample in the frame of walk.x (x centred)
    x0 = jnp.exp(0.5 * walk.log_pi)[:, None] * _extend(keys, lqs, eps, alpha, psi_sub, walk.x, block_size)
  res = walks.conjugate_eigenpairs(walk, k + 1, tol=tol, block=block, degree=degree, max_matvecs=max_matvecs,
                                      x0=x0, seed=seed, return_block=return_block)
  return walk.x, walk.log_q, walk.log_pi, res


def _solve(x, eps, k, alpha, block, degree, tol, max_matvecs, block_size, coarse_min, seed, return_block):
  n = x.shape[0]
  coarse = None
  if n > coarse_min:
    sub = np.sort(np.random.default_rng(seed).choice(n, n // 4, replace=False))
    _, lqs, lps, res = _solve(x[sub], eps, k, alpha, block, degree, max(tol, 1e-4), max_matvecs, block_size,
                              coarse_min, seed + 1, True)
    coarse = (x[sub], lqs, res.vectors[:, 1:] * jnp.exp(-0.5 * lps)[:, None])   # ψ = u/√π of the block, Perron dropped
  return _level(x, coarse, eps=eps, k=k, alpha=alpha, block=block, degree=degree, tol=tol, max_matvecs=max_matvecs,
                block_size=block_size, return_block=return_block, seed=seed)


def diffusion_map(x, eps: float, k: int, *, alpha: float = 1.0, t: float = 1.0, tol: float = 2e-6,
                  block: int | None = None, degree: int = 16, max_matvecs: int = 2000, coarse_min: int = 6000,
                  block_size: int = 1024, seed: int = 0) -> DiffusionMap:
  """Exact diffusion map of a cloud x `[n, D]`: k nontrivial eigenpairs of the α-normalised walk.

  Args:
    x: points `[n, D]` (any float dtype; computed in float32).
    eps: kernel bandwidth ε in `exp(−‖x − y‖²/ε)` (see `bandwidth.bandwidth` for a rule).
    k: number of diffusion coordinates (nontrivial eigenpairs).
    alpha: Coifman–Lafon normalisation α ∈ [0, 1] (0: graph walk; ½: Fokker–Planck; 1: Laplace–Beltrami).
    t: diffusion time (coordinates `λ^t ψ`).
    tol: residual tolerance relative to ‖A‖ = 1 (see `eigen.eigsh`; ~1e-6 is the float32 floor).
    block: subspace size (default max(2k + 8, 24)).
    degree: largest Chebyshev degree per filter step.
    max_matvecs: budget of kernel applications per level.
    coarse_min: above this many points, warm-start from a random quarter (recursively).
    block_size: attention block size (memory ∝ block_size²).
    seed: subsampling and start-vector seed.

  Returns:
    `DiffusionMap`.
  """
  _checks.check_rank("x", x, 2, "[n_points, dim]")
  _checks.check_floating("x", x)
  _checks.check_finite("x", x)
  _checks.check_positive("eps", eps)
  n = x.shape[0]
  if not 1 <= k <= n - 2:
    raise ValueError(f"k must be in [1, n − 2 = {n - 2}]; got {k}")
  if not 0.0 <= alpha <= 1.0:
    raise ValueError(f"alpha must lie in [0, 1]; got {alpha}")
  if t < 0:
    raise ValueError(f"t must be non-negative; got {t}")
  block_size = kernels.check_block_size(block_size)
  block = min(max(2 * k + 8, 24) if block is None else block, n - 1)
  x = jnp.asarray(x, jnp.float32)
  centre = jnp.mean(x, 0)
  xc, log_q, log_pi, res = _solve(x, float(eps), k, float(alpha), block, degree, float(tol), max_matvecs, block_size,
                                  coarse_min, seed, False)
  pi = jnp.exp(log_pi)
  psi = res.vectors / jnp.sqrt(pi)[:, None]
  lam_t = jnp.exp(t * jnp.log1p(-res.shifted[1:]))
  return DiffusionMap(psi[:, 1:] * lam_t, res.values, res.shifted, psi, pi, res.residuals, res.value_bounds,
                      res.vector_bounds, res.converged, res.matvecs, xc, centre, log_q, float(eps), float(alpha), float(t))


def nystrom(dm: DiffusionMap, y, *, block_size: int = 1024) -> jax.Array:
  """Diffusion coordinates `[n', k]` of new points y `[n', D]` by Nyström extension of `dm`.

  `Ψ_t(y)_c = λ_c^{t−1} Σ_j P(y, x_j) ψ_c(x_j)`; at the map's own points this returns its
  coordinates (up to the residuals).
  """
  _checks.check_rank("y", y, 2, "[n_points, dim]")
  _checks.check_floating("y", y)
  _checks.check_finite("y", y)
  if y.shape[1] != dm.x.shape[1]:
    raise ValueError(f"y must have the map's dimension {dm.x.shape[1]}; got shape {y.shape}")
  block_size = kernels.check_block_size(block_size)
  y = jnp.asarray(y, jnp.float32) - dm.centre
  ext = _extend(dm.x, dm.log_q, dm.eps, dm.alpha, dm.psi[:, 1:], y, block_size)
  return ext * jnp.exp((dm.t - 1.0) * jnp.log1p(-dm.rates[1:]))


class AttentionSpectrum(NamedTuple):
  """Leading eigenpairs of a reversible attention walk: `pi` [n]; `psi` [n, k] right eigenvectors of P,
  L²(π)-orthonormal (ψ₀ = 1); `spectrum` the `eigen.Eigh` of the conjugate (Perron pair first)."""
  pi: jax.Array
  psi: jax.Array
  spectrum: eigen.Eigh


def _log_normaliser(qa, ka, bias, scale, chunk):
  """`log Σ_j exp(scale·qa_i·ka_j + bias_j)` [n] in query chunks (O(chunk·n) memory)."""
  n = qa.shape[0]
  pad = -n % chunk
  qp = jnp.pad(qa, ((0, pad), (0, 0)))
  rows = lambda qc: jax.nn.logsumexp(scale * qc @ ka.T + bias[None, :], -1)
  return jax.lax.map(rows, qp.reshape(-1, chunk, qa.shape[1])).reshape(-1)[:n]


def attention_eigenpairs(q, k, n_pairs: int, *, beta: float = 0.0, scale: float | None = None, tol: float = 1e-5,
                         block: int | None = None, degree: int = 16, max_matvecs: int = 2000, seed: int = 0,
                         block_size: int = 512) -> AttentionSpectrum:
  """The `n_pairs` leading eigenpairs of the exact-A (α = 0) attention walk of one head, matrix-free.

  Args:
    q, k: `[n, d]` queries and keys of one head (vmap over batch and heads).
    n_pairs: eigenpairs wanted, Perron pair included (≥ 2).
    beta: β ∈ [0, 1] of the operator (0: DMAP, 1: ATAP); α is 0 (the reversible members).
    scale: logit scale s (default 1/√d).
    tol, block, degree, max_matvecs, seed: as in `eigen.eigsh`.
    block_size: attention block size.

  Returns:
    `AttentionSpectrum`.
  """
  _checks.check_rank("q", q, 2, "[tokens, head_dim]")
  if jnp.shape(k) != jnp.shape(q):
    raise ValueError(f"k must have q's shape {jnp.shape(q)}; got {jnp.shape(k)}")
  n, d = q.shape
  if not 2 <= n_pairs <= n - 1:
    raise ValueError(f"n_pairs must be in [2, n − 1 = {n - 1}]; got {n_pairs}")
  _checks.check_unit_interval("beta", beta)
  block_size = kernels.check_block_size(block_size)
  s = 1.0 / d**0.5 if scale is None else float(scale)
  q4, k4 = jnp.asarray(q, jnp.float32)[None, :, None, :], jnp.asarray(k, jnp.float32)[None, :, None, :]
  aug = operators.augment(q4, k4, beta=float(beta), alpha=0.0, scale=s)
  bias = aug.bias[0, :, 0]
  log_pi = jax.nn.log_softmax(bias + _log_normaliser(aug.q[0, :, 0], aug.k[0, :, 0], bias, s, min(block_size, n)))
  sq = jnp.exp(0.5 * log_pi)[:, None]

  def conjugate(v):
    out = operators.transport(q4, k4, (v / sq)[None, :, None, :], beta=float(beta), alpha=0.0, scale=s,
                              implementation="blockwise", block_size=block_size)
    return sq * out[0, :, 0, :]

  res = eigen.eigsh(conjugate, n, n_pairs - 1, block=block, degree=degree, tol=tol, max_matvecs=max_matvecs,
                    lower=-1.0, deflate=sq, seed=seed)
  r0 = jnp.linalg.norm(conjugate(sq) - sq)
  cat = lambda a, b: jnp.concatenate([jnp.atleast_1d(a), b])
  spec = eigen.Eigh(cat(1.0, res.values), jnp.concatenate([sq, res.vectors], 1), cat(r0, res.residuals),
                    cat(r0, res.value_bounds), cat(jnp.minimum(1.0, r0 / (1.0 - res.values[0])), res.vector_bounds),
                    res.converged & (r0 <= tol), res.iterations, res.matvecs + 1)
  return AttentionSpectrum(jnp.exp(log_pi), spec.vectors / sq, spec)
