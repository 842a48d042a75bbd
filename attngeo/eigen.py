"""Matrix-free eigensolvers that report what they achieved: residuals, error bounds, a converged flag.

Both solvers see the operator only through a block matvec `f: [n, m] -> [n, m]` (m columns at
once, e.g. one call of the blockwise attention kernel with m value columns), run inside one
`jax.lax.while_loop` (jit-compatible, no host round trip per iteration) and return the residual
of every pair they hand back, computed with one last application of the operator.

Symmetric A (`eigsh`, the k algebraically largest eigenpairs λ₁ ≥ λ₂ ≥ …): Chebyshev-filtered
subspace iteration (Zhou & Saad 2007). A block V of m ≥ k orthonormal columns is filtered,

    V ← orth(p_d(A) V),   p_d(λ) = T_d(x(λ)) / T_d(x(γ)),   x(λ) = (2λ − a − b)/(b − a),

with T_d the Chebyshev polynomial of degree d, `a` a lower bound of the spectrum (`lower`), b the
smallest Ritz value of the block and γ the largest: |p_d| ≤ 1/T_d(x(γ)) on [a, b] while λ > b is
amplified like e^{d·acosh x(λ)} — the optimal (Krylov) rate, 1 − O(√gap) per application. The
three-term recurrence is scaled by T_j(x(γ)) so nothing overflows. After each filter, Rayleigh–Ritz
on span(V) gives Ritz pairs (θ_j, v_j); the residual r_j = ‖A v_j − θ_j v_j‖ (‖v_j‖ = 1) bounds
the error a posteriori (symmetric A):

    |λ − θ| ≤ r (Weyl),   |λ − θ| ≤ r²/δ (Kato–Temple),   sin∠(v, u) ≤ r/δ (Davis–Kahan),

δ the distance from θ to the rest of the spectrum, estimated as min_{i≠j} (|θ_j − θ_i| − r_i) over
the block's Ritz values (the usual practice; the first bound needs no gap). The iteration stops
when every wanted residual is ≤ `tol`·‖A‖ (‖A‖ estimated by max_j |θ_j|), when it stagnates, or
at `max_matvecs`; `converged` is True only in the first case.

Known eigenvectors (e.g. √π, the Perron vector of a reversible walk's symmetric conjugate) can
be deflated: the iteration runs in their orthogonal complement.

General real A (`eig`, the k eigenvalues of largest modulus): thick-restart Arnoldi in complex
arithmetic (a Krylov–Schur decomposition `A V = V S + v bᵀ` with a full projected matrix S).
Each cycle extends the basis to `krylov` vectors, takes the eigenpairs (θ, y) of S, keeps the
span of the leading Ritz vectors and restarts. For a non-normal A the residual ‖Ax − θx‖ bounds
the backward error; the eigenvalue error can exceed it by the eigenvalue's condition number. When
`krylov` ≥ n the Krylov space is the whole space and the answer is exact after one cycle (the
small n × n eigenproblem then runs in LAPACK: CPU and GPU backends).

Fixed-size Krylov (`lanczos`, batched, no loop to converge): m Lanczos steps from one start vector
build an orthonormal basis V of K_m(A, v₀) = span{v₀, Av₀, …, A^{m−1}v₀} (full reorthogonalisation,
classical Gram–Schmidt twice), and Rayleigh–Ritz on it gives m Ritz pairs. The Ritz values of a
projection interlace A's spectrum (Cauchy), so θ_min ≥ λ_min and θ_max ≤ λ_max — the extreme Ritz
values never overshoot — and each pair's residual r bounds the distance to some eigenvalue (|λ − θ| ≤ r)
at no extra matvec (A V is kept). With m = n the answer is exact; where K_j turns invariant early
(its pairs exact), the basis continues from a fresh direction. Its cost
is m matvecs and O(m²n) of orthogonalisation, a fixed shape: for the extreme pairs of many small
matrices (e.g. the spectral gap of every head's walk) it replaces a dense O(n³) `eigh` per matrix.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numbers

import jax
import jax.numpy as jnp

from attngeo import linalg

Matvec = Callable[[jax.Array], jax.Array]


class Eigh(NamedTuple):
  """Symmetric eigenpairs: `values` [k] descending, `vectors` [n, k] orthonormal; `residuals` [k]
  ‖Av − λv‖₂; `value_bounds` [k] bound on |λ − λ_true|; `vector_bounds` [k] bound on sin∠(v, v_true)
  (1 when the pair is not separated); `converged` [] every residual ≤ tol·‖A‖; `iterations` []
  filter steps; `matvecs` [] block applications of A; `shifted` [k] `σ − λ` to full relative
  precision when a shift σ was given (e.g. 1 − λ for a Markov conjugate), else None."""
  values: jax.Array
  vectors: jax.Array
  residuals: jax.Array
  value_bounds: jax.Array
  vector_bounds: jax.Array
  converged: jax.Array
  iterations: jax.Array
  matvecs: jax.Array
  shifted: jax.Array | None = None


class Eig(NamedTuple):
  """General eigenpairs: `values` [k] complex by decreasing modulus, `vectors` [n, k] complex, unit
  norm; `residuals` [k] ‖Ax − λx‖₂; `converged` [] every residual ≤ tol·max|λ|; `iterations` []
  Arnoldi cycles; `matvecs` [] block applications of A."""
  values: jax.Array
  vectors: jax.Array
  residuals: jax.Array
  converged: jax.Array
  iterations: jax.Array
  matvecs: jax.Array


class Ritz(NamedTuple):
  """Ritz pairs of a symmetric A on an m-dimensional subspace: `values` [..., m] ascending, `vectors`
  [..., m, n] (orthonormal rows), `residuals` [..., m] ‖Ax − θx‖₂ (|λ − θ| ≤ residual for some eigenvalue
  λ of A)."""
  values: jax.Array
  vectors: jax.Array
  residuals: jax.Array


def _check_sizes(n: int, k: int, block: int):
  if not 1 <= k <= n:
    raise ValueError(f"k must be in [1, n = {n}]; got {k}")
  if not k <= block <= n:
    raise ValueError(f"block must be in [k = {k}, n = {n}]; got {block}")


# ----------------------------------------------------------------------------- symmetric

def _project_out(y, basis):
  return y if basis is None else y - basis @ (basis.T @ y)


def _orthonormal(y, basis):
  """Orthonormal basis of span(y) ⊥ span(basis) (projection twice, Householder QR twice)."""
  y = _project_out(_project_out(y, basis), basis)
  q = jnp.linalg.qr(y)[0]
  return jnp.linalg.qr(_project_out(q, basis))[0]


def _chebyshev(matvec, v, degree, a, b, top):
  """`T_d(x(A)) v / T_d(x(top))`, x(λ) = (2λ − a − b)/(b − a), by the scaled three-term recurrence
  (`degree` may be traced)."""
  e, c = 0.5 * (b - a), 0.5 * (b + a)
  xa = lambda y: (matvec(y) - c * y) / e
  g = (top - c) / e
  sigma = 1.0 / g

  def step(_, carry):
    y_prev, y, sigma = carry
    sigma_new = 1.0 / (2.0 * g - sigma)
    return y, sigma_new * (2.0 * xa(y) - sigma * y_prev), sigma_new

  _, y, _ = jax.lax.fori_loop(1, degree, step, (v, xa(v) * sigma, sigma))
  return y


def _rayleigh_ritz(matvec, y, deflate, sigma):
  """Ritz pairs of A on span(y) ⊥ deflate, descending: (V [n, m], θ [m], residual norms [m]).

  The projected matrix and the residuals are formed from `(A − σ)Q`, whose entries are small for
  Ritz values near σ: float32 cancellation in `QᵀAQ` would otherwise cost ~√n·u in every θ.
  """
  q = _orthonormal(y, deflate)
  bq = matvec(q) - sigma * q
  h = q.T @ bq
  mu, w = jnp.linalg.eigh(0.5 * (h + h.T))
  mu, w = mu[::-1], w[:, ::-1]
  v = q @ w
  return v, sigma + mu, jnp.linalg.norm(bq @ w - v * mu, axis=0)


def _bounds(theta, res, k):
  """Weyl / Kato–Temple value bounds and Davis–Kahan vector bounds of the first k Ritz pairs."""
  m = theta.shape[0]
  dist = jnp.abs(theta[:k, None] - theta[None, :]) - res[None, :]
  dist = jnp.where(jnp.arange(m)[None, :] == jnp.arange(k)[:, None], jnp.inf, dist)
  delta = jnp.min(dist, axis=1)
  r = res[:k]
  separated = delta > r
  value = jnp.where(separated, jnp.minimum(r, r * r / jnp.where(separated, delta, 1.0)), r)
  vector = jnp.where(separated, jnp.minimum(1.0, r / jnp.where(separated, delta, 1.0)), 1.0)
  return value, vector


def eigsh(matvec: Matvec, n: int, k: int, *, block: int | None = None, degree: int = 16, tol: float = 1e-6,
          max_matvecs: int = 2000, lower: float = -1.0, deflate=None, x0=None, seed: int = 0,
          dtype=jnp.float32, patience: int = 3, return_block: bool = False, shift: float | None = None) -> Eigh:
  """The k largest eigenpairs of a symmetric A, given only `matvec`: A·X for X [n, m].

  Args:
    matvec: `X [n, m] -> A X [n, m]`, A symmetric (only its action is used).
    n: dimension.
    k: number of wanted eigenpairs (algebraically largest).
    block: subspace size m ≥ k (default max(2k, k + 8)); a larger block converges in fewer
      applications (the rate is set by the gap between λ_k and λ_{m+1}), each one costs more.
    degree: largest Chebyshev degree per filter step. Each step uses the smallest degree d ≥ 4
      predicted to bring the slowest wanted residual to tol (T_d(x(θ_k)) ≥ r/(tol·‖A‖)); a step
      costs d applications plus one for Rayleigh–Ritz.
    tol: stop when every wanted residual ‖Av − θv‖ ≤ tol·‖A‖ (‖A‖ ≈ max |θ|).
    max_matvecs: budget of block applications.
    lower: a lower bound of the spectrum of A (−1 for the symmetric conjugate of a Markov
      operator, 0 when A is positive semi-definite, e.g. a Gaussian kernel's); eigenvalues below
      it would be amplified by the filter.
    deflate: optional [n, j] orthonormal known eigenvectors; the iteration runs orthogonally to them.
    x0: optional starting block [n, m] (e.g. the Nyström extension of a coarser problem's block);
      random otherwise.
    seed: PRNG seed of the random start.
    dtype: working dtype when x0 is not given.
    patience: stop (not converged) after this many filter steps without a 10 % drop of the
      largest wanted residual (round-off floor reached).
    return_block: return all m Ritz pairs of the final block (the first k are the wanted ones
      that `tol` and `converged` refer to), e.g. to warm-start a finer problem.
    shift: σ near the wanted eigenvalues (1 for a Markov conjugate): `shifted = σ − λ` is then
      returned as `vᵀ(σv − Av)/vᵀv`, a sum of small terms, accurate relative to σ − λ itself
      (float32 `values` near 1 carry only ~1e-7 absolute accuracy).

  Returns:
    `Eigh`.
  """
  m = max(2 * k, k + 8) if block is None else block
  m = min(m, n - (0 if deflate is None else deflate.shape[1]))
  _check_sizes(n, k, m)
  if degree < 1:
    raise ValueError(f"degree must be at least 1; got {degree}")
  if not tol > 0:
    raise ValueError(f"tol must be positive; got {tol}")
  if x0 is None:
    x0 = jax.random.normal(jax.random.PRNGKey(seed), (n, m), dtype)
  elif x0.shape != (n, m):
    raise ValueError(f"x0 must be [n, block] = {(n, m)}; got {x0.shape}")
  if deflate is not None:
    deflate = deflate.astype(x0.dtype)
  min_degree = min(4, degree)

  def target(theta):
    return tol * jnp.max(jnp.abs(theta))

  v, theta, res = _rayleigh_ritz(matvec, x0, deflate, 0.0 if shift is None else shift)

  def cond(s):
    _, theta, res, it, mv, _, stall = s
    return jnp.any(res[:k] > target(theta)) & (mv + degree + 2 <= max_matvecs) & (stall < patience)

  def body(s):
    v, theta, res, it, mv, best, stall = s
    top = theta[0]
    b = jnp.minimum(theta[-1], top - 1e-3 * jnp.maximum(top - lower, 1e-30))
    a = jnp.minimum(lower, b - 1e-6)
    x = (2.0 * theta[:k] - a - b) / (b - a)                        # > 1 for the wanted pairs
    need = jnp.arccosh(jnp.maximum(res[:k] / target(theta), 1.0)) / jnp.arccosh(jnp.maximum(x, 1.0 + 1e-6))
    d = jnp.clip(jnp.ceil(jnp.max(need)) + 1, min_degree, degree).astype(jnp.int32)
    y = _chebyshev(matvec, v, d, a, b, top)
    v, theta, res = _rayleigh_ritz(matvec, y / jnp.linalg.norm(y, axis=0), deflate, top if shift is None else shift)
    worst = jnp.max(res[:k])
    improved = worst < 0.9 * best
    return (v, theta, res, it + 1, mv + d + 1, jnp.where(improved, worst, best), jnp.where(improved, 0, stall + 1))

  state = (v, theta, res, jnp.int32(0), jnp.int32(1), jnp.asarray(jnp.inf, theta.dtype), jnp.int32(0))
  v, theta, res, it, mv, _, _ = jax.lax.while_loop(cond, body, state)
  # Honest residuals of the returned vectors: one more application of A.
  # Values as θ + vᵀ(Av − θv)/vᵀv: the correction is a sum of small terms (no √n·u cancellation).
  kk = m if return_block else k
  vk, t0 = v[:, :kk], theta[:kk]
  av = matvec(vk)
  correction = jnp.sum(vk * (av - t0 * vk), axis=0) / jnp.sum(vk * vk, axis=0)
  values = t0 + correction
  resid = jnp.linalg.norm(av - vk * values, axis=0)
  theta = theta.at[:kk].set(values)
  res = res.at[:kk].set(resid)
  value_bounds, vector_bounds = _bounds(theta, res, kk)
  value_bounds = value_bounds + jnp.finfo(values.dtype).eps * jnp.abs(values)     # rounding of the stored value
  converged = jnp.all(res[:k] <= target(theta))
  shifted = None if shift is None else (shift - t0) - correction
  return Eigh(values, vk, resid, value_bounds, vector_bounds, converged, it, mv + 1, shifted)


# ----------------------------------------------------------------------------- general

def _complex_matvec(matvec):
  def mv(z):
    out = matvec(jnp.concatenate([z.real, z.imag], 1))
    m = z.shape[1]
    return jax.lax.complex(out[:, :m], out[:, m:])
  return mv


def eig(matvec: Matvec, n: int, k: int, *, krylov: int | None = None, tol: float = 1e-5, max_cycles: int = 100,
        seed: int = 0, dtype=jnp.float32) -> Eig:
  """The k eigenvalues of largest modulus of a general real A, given only `matvec`: A·X for X [n, m].

  Args:
    matvec: `X [n, m] -> A X [n, m]` (real).
    n: dimension.
    k: number of wanted eigenpairs.
    krylov: Krylov basis size per cycle, k < krylov ≤ n (default min(n, max(2k + 1, 20))); with
      krylov = n one cycle is an exact (Hessenberg) reduction.
    tol: stop when every wanted residual ‖Ax − θx‖ ≤ tol·max|θ|.
    max_cycles: budget of restart cycles.
    seed: PRNG seed of the start vector.
    dtype: real working dtype (the basis is complex of the matching width).

  Returns:
    `Eig`.
  """
  m = min(n, max(2 * k + 1, 20)) if krylov is None else krylov
  if not 1 <= k <= n:
    raise ValueError(f"k must be in [1, n = {n}]; got {k}")
  if not (k < m <= n or m == n):
    raise ValueError(f"krylov must be in (k = {k}, n = {n}]; got {m}")
  cdtype = jnp.complex128 if jnp.dtype(dtype) == jnp.float64 else jnp.complex64
  mv = _complex_matvec(matvec)
  keep = min(m - 1, k + max(2, (m - k) // 2))
  eps = jnp.finfo(dtype).eps
  key = jax.random.PRNGKey(seed)

  def expand(j, carry):
    v, h = carry
    w = mv(v[:, j][:, None])[:, 0]
    coef = v.conj().T @ w
    w = w - v @ coef
    again = v.conj().T @ w                                 # DGKS: orthogonalise twice
    w, coef = w - v @ again, coef + again
    beta = jnp.linalg.norm(w)
    scale = jnp.linalg.norm(coef) + beta
    broke = beta <= 10 * n * eps * scale                   # invariant subspace: restart with a fresh direction
    fresh = jax.random.normal(jax.random.fold_in(key, j + 1), (n,), dtype).astype(cdtype)
    fresh = fresh - v @ (v.conj().T @ fresh)
    fresh = fresh - v @ (v.conj().T @ fresh)
    w = jnp.where(broke, fresh, w)
    nxt = jnp.where(jnp.arange(m + 1) == j + 1, 1.0, 0.0)[None, :] * (w / jnp.linalg.norm(w))[:, None]
    v = v + jnp.where(j + 1 < min(m + 1, n), 1.0, 0.0) * nxt
    h = h.at[:, j].set(coef[: m + 1].at[j + 1].set(jnp.where(broke, 0.0, beta)))
    return v, h

  def ritz(v, h):
    s, row = h[:m, :m], h[m, :m]
    theta, y = jnp.linalg.eig(s)
    order = jnp.argsort(-jnp.abs(theta))
    theta, y = theta[order], y[:, order]
    y = y / jnp.linalg.norm(y, axis=0)
    return theta, y, jnp.abs(row @ y)

  def conv(theta, res):
    return jnp.all(res[:k] <= tol * jnp.max(jnp.abs(theta[:k])))

  def cycle(s):
    v, h, start, it, _, _, _ = s
    v, h = jax.lax.fori_loop(start, m, expand, (v, h))
    theta, y, res = ritz(v, h)
    q = jnp.linalg.qr(y[:, :keep])[0]                       # span of the kept Ritz vectors (S-invariant)
    v_new = jnp.zeros_like(v).at[:, :keep].set(v[:, :m] @ q).at[:, keep].set(v[:, m])
    h_new = jnp.zeros_like(h).at[:keep, :keep].set(q.conj().T @ h[:m, :m] @ q).at[keep, :keep].set(h[m, :m] @ q)
    return v_new, h_new, jnp.int32(keep), it + 1, conv(theta, res), theta[:k], v[:, :m] @ y[:, :k]

  v0 = jax.random.normal(key, (n,), dtype).astype(cdtype)
  v = jnp.zeros((n, m + 1), cdtype).at[:, 0].set(v0 / jnp.linalg.norm(v0))
  h = jnp.zeros((m + 1, m), cdtype)
  state = (v, h, jnp.int32(0), jnp.int32(0), jnp.asarray(False), jnp.zeros((k,), cdtype), jnp.zeros((n, k), cdtype))
  _, _, _, it, _, theta, x = jax.lax.while_loop(lambda s: ~s[4] & (s[3] < max_cycles), cycle, state)
  x = x / jnp.linalg.norm(x, axis=0)
  resid = jnp.linalg.norm(mv(x) - x * theta, axis=0)       # explicit residuals of what is returned
  matvecs = m + (it - 1) * (m - keep) + 1
  return Eig(theta, x, resid, conv(theta, resid), it, matvecs)


# ----------------------------------------------------------------------------- fixed-size Krylov

BatchedMatvec = Callable[[jax.Array], jax.Array]


def lanczos(matvec: BatchedMatvec, v0, steps: int) -> Ritz:
  """Rayleigh–Ritz of a symmetric A on `K_m(A, v₀)`, m = `steps` (module docstring), batched.

  Args:
    matvec: `v [..., n] -> A v [..., n]`, one symmetric A per leading index.
    v0: start vectors [..., n] (normalised here; a zero one is replaced by a fixed pseudo-random one). Components of v₀ in an A-invariant
      subspace U stay in U: start orthogonal to a known eigenvector to deflate it.
    steps: subspace dimension m in [1, n] (the basis is `[..., m, n]`; m = n gives every eigenpair exactly).

  Returns:
    `Ritz`. The basis is built step by step, `v_{j+1} ∝ (I − V_jV_jᵀ)² A v_j` (V_j the first j + 1
    rows), and `H = V (AV)ᵀ` symmetrised is diagonalised (m × m): θ its eigenvalues, x = yᵀV the Ritz
    vectors, r = ‖yᵀ(AV) − θ x‖. A step whose new direction is ≤ 100·eps of ‖Av_j‖ (K_j is invariant:
    its pairs are exact) restarts from a fixed pseudo-random vector orthogonalised against the basis, so
    the subspace stays m-dimensional and interlacing holds. Stopped against differentiation: for the
    gradient of an eigenvalue use the Rayleigh quotient `xᵀ A x` of a Ritz vector (Hellmann–Feynman:
    the value's error is O(r²), the gradient's O(r/δ), δ the gap to the rest of the spectrum).
  """
  v0 = jax.lax.stop_gradient(jnp.asarray(v0))
  if not jnp.issubdtype(v0.dtype, jnp.floating) or v0.ndim < 1:
    raise ValueError(f"v0 must be a floating array [..., n]; got {v0.dtype} of shape {v0.shape}")
  lead, n, dtype = v0.shape[:-1], v0.shape[-1], v0.dtype
  if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or not 1 <= steps <= n:
    raise ValueError(f"steps must be an integer in [1, n = {n}] (the subspace dimension); got {steps!r}")
  steps = int(steps)
  tiny = 100 * jnp.finfo(dtype).eps
  dot = lambda a, b, spec: jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST)
  start = jnp.linalg.norm(v0, axis=-1, keepdims=True)
  fallback = jax.random.normal(jax.random.PRNGKey(0x1A2B), lead + (n,), dtype)              # a zero start
  v = jnp.where(start > 0, v0 / jnp.maximum(start, jnp.finfo(dtype).tiny),
                fallback / jnp.linalg.norm(fallback, axis=-1, keepdims=True))
  basis = jnp.zeros(lead + (steps, n), dtype).at[..., 0, :].set(v)
  images = jnp.zeros(lead + (steps, n), dtype)

  def step(j, carry):
    basis, images = carry
    w = matvec(basis[..., j, :])
    images = images.at[..., j, :].set(w)
    scale = jnp.linalg.norm(w, axis=-1, keepdims=True)
    for _ in range(2):                                             # unfilled rows are zero: they project nothing
      w = w - dot(dot(basis, w, "...mn,...n->...m"), basis, "...m,...mn->...n")
    norm = jnp.linalg.norm(w, axis=-1, keepdims=True)
    fresh = jax.random.normal(jax.random.fold_in(jax.random.PRNGKey(0x1A2C), j), lead + (n,), dtype)
    for _ in range(2):
      fresh = fresh - dot(dot(basis, fresh, "...mn,...n->...m"), basis, "...m,...mn->...n")
    fresh = fresh / jnp.maximum(jnp.linalg.norm(fresh, axis=-1, keepdims=True), jnp.finfo(dtype).tiny)
    nxt = jnp.where(norm > tiny * jnp.maximum(scale, jnp.finfo(dtype).tiny), w / jnp.maximum(norm, jnp.finfo(dtype).tiny), fresh)
    row = jnp.minimum(j + 1, steps - 1)
    return jnp.where(j + 1 < steps, basis.at[..., row, :].set(nxt), basis), images

  basis, images = jax.lax.fori_loop(0, steps, step, (basis, images))
  h = dot(basis, images, "...an,...bn->...ab")
  theta, y = linalg.eigh(0.5 * (h + jnp.swapaxes(h, -1, -2)))              # one matrix per LAPACK call
  x = dot(y, basis, "...mk,...mn->...kn")
  r = jnp.linalg.norm(dot(y, images, "...mk,...mn->...kn") - theta[..., :, None] * x, axis=-1)
  return Ritz(theta, x, r)
