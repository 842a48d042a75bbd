"""Read-outs of the magnetic (U(1)) walk `K_θ = K ⊙ e^{iθ}` (`operators.magnetic_transport`, CMAP).

Conventions: `K` `[..., n, n]` is the row-stochastic magnitude, `θ` `[..., n, n]` the antisymmetric
phases (θ_ji = −θ_ij; `operators.phases`), and `(K_θ v)_i = Σ_j K_ij e^{iθ_ij} v_j`: the transport
from j to i multiplies by e^{+iθ_ij}. π is K's stationary law (`Σπ = 1`), `Π = diag(π)`.

* Hermitian form `H = D^{−1/2} W_θ D^{−1/2}`, `W_ij = ½(π_i K_ij + π_j K_ji)` (the flows, symmetrised),
  `W_θ = W ⊙ e^{iθ}`, `D = diag(Σ_j W_ij)` (= Π when π is stationary; the degrees keep every
  identity below exact for a π known only to the stationary solver's error). For a reversible K (every α = 0 magnitude, unmasked or under a symmetric
  mask) `W_ij = π_i K_ij` and `H = Π^{1/2} K_θ Π^{−1/2}`: K_θ is similar to a Hermitian matrix, so the
  magnetic walk has a real spectrum in [−1, 1]. Otherwise H is the additive reversibilisation (as in
  `markov.eigenbasis`). The magnetic Laplacian is `Δ_θ = I − H` (spectrum in [0, 2]).
* Gauge: `θ_ij → θ_ij + φ_j − φ_i` is `H → U* H U`, `U = diag(e^{iφ})`: the spectrum is invariant.
* Curvature of the connection: the circulation `F_ijk = θ_ij + θ_jk + θ_ki` around a triangle,
  wrapped to (−π, π] (gauge invariant). For CMAP's bilinear phase `θ_ij = c·ω(z_i, z_j)`,
  `z = [q, k]`, `ω(z, z') = q·k' − k·q'`, `c = γ s/2`, it is `c·ω(z_j − z_i, z_k − z_i)` before wrapping:
  the symplectic area of the triangle. Its distribution is read over proper triangles (i, j, k
  distinct) under the 3-cycle law `w_ijk ∝ K_ij K_jk K_ki`; the mean holonomy `Σ w e^{iF}` is the
  Wilson loop. (Over all closed 3-walks, the degenerate ones carrying no flux, it is
  `tr(K_θ³) / tr(K³)`.) For a reversible K both orientations of a triangle weigh the same, so the
  Wilson loop is real.
* Frustration index (Bandeira–Singer–Spielman's, for U(1)) `ν = min_{|x_i| = 1} ½ Σ_ij W_ij |x_i −
  e^{iθ_ij} x_j|²` ∈ [0, 1]: 0 iff θ is pure gauge (θ_ij = φ_i − φ_j) on the support of K. Its
  relaxation to `Σ D_ii |x_i|² = 1` is `λ_min(Δ_θ) = 1 − λ_max(H) ≤ ν`; any unit-modulus section x
  gives an upper bound `E(x) = Σ D − Re x* W_θ x`. `frustration` rounds the top eigenvector of H to
  unit moduli and then runs the generalised power method `x ← phase((W_θ + D) x)` (W_θ + D =
  D^{1/2}(H + I)D^{1/2} ⪰ 0, so each step cannot raise E) to a fixed point: ν is bracketed by
  `[lower, upper]`, and the gap says how well it is known (ν itself is a non-convex minimum). With
  `E_π(x) = ½ Σ_i π_i a_i`, `a_i = Σ_j K_ij |x_i − e^{iθ_ij} x_j|² ∈ [0, 4]`, and `Σ(π − π') = 0`,
  `|E_π − E_π'| ≤ ‖π − π'‖₁`: a π known to ℓ¹ error ε widens the bracket by ε. And ν ≤ 1 (random
  phases average `1 − Σ_i W_ii`).
* Connection walk (`attngeo.connection`): the edge transport of each channel pair is the rotation
  `R(θ_ij)` (`phase_rotations`) — an exact isometry (`phase_isometry_defect` 0); `I − [K_ij R(θ_ij)]`
  (`rotation_laplacian_matrix`) is the real form of `I − K_θ`. Names are this module's own where their
  signature or result differs from `connection`'s and `markov`'s (`symmetrised_flows` is not `markov.flows`,
  `hermitian_spectrum` not `markov.spectrum`, `magnitude_stationary(q, k)` not `markov.stationary(p)`).

Dense functions take `(p, theta)` arrays (small n); `sampled_curvature` reads the circulation law
from random triangles when n³ is too many. Matrix-free: `magnitude_stationary` (π from the
kernel's log-normaliser), `hermitian_operator` (H applied through the fused phase kernel, O(n)
memory), `hermitian_eigenvalues` (a thin solver over any Hermitian matvec; `real_embedding` turns
it into a real symmetric one for a real symmetric eigensolver) and `triangle_circulation` (F from
q, k for given triangles).
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import _checks, connection, kernels, linalg, markov, operators

_TINY = 1e-30


def _check_pair(p, theta):
  markov.check_chain(p)
  _checks.check_square("theta", theta)
  _checks.check_floating("theta", theta)
  if jnp.shape(theta) != jnp.shape(p):
    raise ValueError(f"theta must have P's shape {jnp.shape(p)}; got {jnp.shape(theta)}")
  _checks.check_finite("theta", theta)
  if _checks.is_concrete(theta):
    t = np.asarray(theta, np.float64)
    err = np.max(np.abs(t + np.swapaxes(t, -1, -2)), initial=0.0)
    if err > 1e-4 * max(1.0, float(np.max(np.abs(t), initial=0.0))):
      raise ValueError(f"theta must be antisymmetric (theta_ji = -theta_ij); deviates by up to {err:.3g}")


def wrap(x):
  """Angles mapped to (−π, π]."""
  return jnp.pi - jnp.mod(jnp.pi - x, 2 * jnp.pi)


def gauge(theta, phi):
  """The gauge-transformed phases `θ_ij + φ_j − φ_i` for a potential φ `[..., n]`."""
  return theta + phi[..., None, :] - phi[..., :, None]


# ----------------------------------------------------------------------------- Hermitian form, spectrum

def symmetrised_flows(p, pi=None):
  """Symmetrised flows `W_ij = ½(π_i P_ij + π_j P_ji)` [..., n, n] and π [..., n] (`markov.stationary` if None)."""
  pi = markov.stationary(p).pi if pi is None else pi
  f = pi[..., :, None] * p
  return 0.5 * (f + jnp.swapaxes(f, -1, -2)), pi


def _check_pi(p, pi):
  """A supplied π [..., n]: a probability vector (`markov.check_law`, returned as π/Σπ) and stationary
  for P (residual ≤ 1e-4)."""
  if pi is None:
    return None
  pi = markov.check_law(p, pi)
  if _checks.is_concrete(pi):
    a, pm = np.asarray(pi, np.float64), np.asarray(p, np.float64)
    res = float(np.max(np.abs(np.einsum("...i,...ij->...j", a, pm) - a).sum(-1), initial=0.0))
    if res > 1e-4:
      raise ValueError(f"pi must be P's stationary law: ||pi P - pi||_1 = {res:.3g} (> 1e-4)")
  return pi


def _law(p, pi):
  """(π, ε ≥ ‖π − π_true‖₁): `markov.stationary`'s π and bound, or a checked supplied π with the same
  a posteriori bound (`markov.error_bound`). ε is inf or NaN when π is not unique."""
  pi = _check_pi(p, pi)
  if pi is None:
    st = markov.stationary(p)
    return st.pi, st.error_bound
  return pi, markov.error_bound(p, pi)


@jax.jit
def _hermitian(p, theta, pi):
  """(H, W_θ, D, D^{−1/2}) of the module docstring; D the flows' degrees."""
  w, _ = symmetrised_flows(p, pi)
  d = jnp.sum(w, -1)
  r = jax.lax.rsqrt(jnp.maximum(d, _TINY))
  wt = w * jnp.exp(1j * theta.astype(w.dtype))
  return r[..., :, None] * wt * r[..., None, :], wt, d, r


def hermitian_form(p, theta, pi=None) -> jax.Array:
  """`H = D^{−1/2} (W ⊙ e^{iθ}) D^{−1/2}` [..., n, n] complex; `Π^{1/2} K_θ Π^{−1/2}` for reversible K."""
  _check_pair(p, theta)
  return _hermitian(p, theta, _check_pi(p, pi))[0]


def laplacian(p, theta, pi=None) -> jax.Array:
  """Normalised magnetic Laplacian `Δ_θ = I − H` [..., n, n] complex (Hermitian, spectrum in [0, 2])."""
  h = hermitian_form(p, theta, pi)
  return jnp.eye(h.shape[-1], dtype=h.dtype) - h


@jax.jit
def _spectrum(p, theta, pi):
  return linalg.eigvalsh(_hermitian(p, theta, pi)[0])[..., ::-1]


def hermitian_spectrum(p, theta, k: int | None = None, pi=None) -> jax.Array:
  """Real eigenvalues of H [..., k], descending (dense `eigh`); those of `Δ_θ` are `1 − λ`."""
  _check_pair(p, theta)
  if k is not None and not 1 <= int(k) <= p.shape[-1]:
    raise ValueError(f"k must lie in [1, n] = [1, {p.shape[-1]}] or be None; got {k}")
  lam = _spectrum(p, theta, _check_pi(p, pi))
  return lam if k is None else lam[..., :int(k)]


class Frustration(NamedTuple):
  """`lower ≤ ν ≤ upper` [...]; `x` [..., n] the unit-modulus section whose energy gives `upper`.

  `rounded` [...] bounds ν from the rounded eigenvector before the power method; `steps` [...] the
  power-method steps each walk took; `stalled` [...] whether its last step still moved x by more
  than `xtol` (then `upper` is still a valid bound, just not at a fixed point); `pi_error` [...] the
  ℓ¹ error bound of the π used, by which the bounds were widened; `lambda_max` [...] λ_max(H) for
  that π (not widened: `lower` is `1 − lambda_max` only when `pi_error` is 0).
  """
  lower: jax.Array
  upper: jax.Array
  x: jax.Array
  rounded: jax.Array
  steps: jax.Array
  stalled: jax.Array
  pi_error: jax.Array
  lambda_max: jax.Array


def frustration(p, theta, pi=None, *, max_steps: int = 500, xtol: float = 1e-6) -> Frustration:
  """Bracket the U(1) frustration index ν (module docstring): `lower ≤ ν ≤ upper`.

  `lower = 1 − λ_max(H)` (the spectral relaxation); `upper = E(x)` for the section x reached from
  the rounded top eigenvector of H (`u = D^{−1/2}·vec`, `x_i = u_i/|u_i|`, 1 where u_i = 0) by the
  generalised power method `x ← phase((W_θ + D) x)`, each walk stopped when none of its `x_i` moves
  by more than `xtol`, or after `max_steps`. Both bounds are widened by `pi_error` (module docstring;
  ν ∈ [0, 1] clips them) and by `2(n + 4)·u`, the working precision's rounding of E(x) and λ_max (W
  sums to 1, ‖H‖ ≤ 1; probabilistic model), so they hold for K's true π (that of K/rowsum(K), as in
  `markov.stationary`) whenever the stationary solver's bound does: a nearly decomposable K, whose π
  is ill-determined, gets a wide bracket, and one whose π is not unique [0, 1]. ν = 0 iff θ is pure gauge on the support of K.
  """
  _check_pair(p, theta)
  if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 0 or not xtol > 0:
    raise ValueError(f"max_steps must be an integer ≥ 0 and xtol > 0; got max_steps={max_steps!r}, xtol={xtol}")
  pi, eps = _law(p, pi)
  fr = _frustration(p, theta, pi, int(max_steps), float(xtol))
  eps = eps.astype(fr.lower.dtype)
  known = eps <= 1.0                                 # False for inf/NaN (π not unique): all of [0, 1]
  slack = eps + 2 * (p.shape[-1] + 4) * jnp.finfo(fr.lower.dtype).eps          # + the rounding of E and λ_max
  bound = lambda x, unknown: jnp.where(known, jnp.clip(x, 0.0, 1.0), unknown)
  return fr._replace(lower=bound(fr.lower - slack, 0.0), upper=bound(fr.upper + slack, 1.0),
                     rounded=bound(fr.rounded + slack, 1.0), pi_error=eps)


def _phase_of(u):
  mod = jnp.abs(u)
  return jnp.where(mod > _TINY, u / jnp.maximum(mod, _TINY), 1.0)


def _energy(wt, d, x):
  """`E(x) = Σ D − Re x* W_θ x` [...] (= ½ Σ W_ij |x_i − e^{iθ_ij} x_j|² for |x_i| = 1, D = diag(Σ_j W_ij))."""
  return jnp.sum(d, -1) - jnp.real(jnp.einsum("...i,...ij,...j->...", jnp.conj(x), wt, x))


@functools.partial(jax.jit, static_argnums=(3, 4))
def _frustration(p, theta, pi, max_steps, xtol):
  h, wt, d, r = _hermitian(p, theta, pi)
  lam, vec = linalg.eigh(h)
  x0 = _phase_of(vec[..., -1] * r)
  batch = lam.shape[:-1]

  def cond(c):
    return (c[1] < max_steps) & jnp.any(c[2])

  def step(c):                                    # walks that have settled keep their x and step count
    x, i, moving, steps = c
    y = _phase_of(jnp.einsum("...ij,...j->...i", wt, x) + d * x)
    return (jnp.where(moving[..., None], y, x), i + 1, moving & (jnp.max(jnp.abs(y - x), -1) > xtol),
            steps + moving)

  init = (x0, jnp.asarray(0), jnp.full(batch, max_steps > 0), jnp.zeros(batch, jnp.int32))
  x, _, stalled, steps = jax.lax.while_loop(cond, step, init)
  return Frustration(1.0 - lam[..., -1], _energy(wt, d, x), x, _energy(wt, d, x0), steps, stalled,
                     jnp.zeros(batch, lam.dtype), lam[..., -1])


# ----------------------------------------------------------------------------- curvature of the connection

def _check_vertices(name, idx, n):
  """Concrete vertex indices must lie in [0, n) (jnp indexing would clamp them silently)."""
  if _checks.is_concrete(idx):
    a = np.asarray(idx)
    if not np.issubdtype(a.dtype, np.integer):
      raise ValueError(f"{name} must be integer vertex indices; got dtype {a.dtype}")
    if a.size and (a.min() < 0 or a.max() >= n):
      raise ValueError(f"{name} must index the n = {n} tokens (0 <= index < {n}); got [{a.min()}, {a.max()}]")


def circulation(theta, i, j, k) -> jax.Array:
  """Wrapped circulations `F = θ_ij + θ_jk + θ_ki` [..., T] for index arrays i, j, k [T]."""
  for name, idx in (("i", i), ("j", j), ("k", k)):
    _check_vertices(name, idx, jnp.shape(theta)[-1])
  return wrap(theta[..., i, j] + theta[..., j, k] + theta[..., k, i])


def triangle_circulation(q, k, triangles, *, coupling=1.0, scale=None) -> jax.Array:
  """Matrix-free `F_ijk` [b, h, T] (wrapped) of CMAP for triangles [T, 3] from q, k [b, n, h, d].

  Each θ_ab = γ·½ s (q_a·k_b − k_a·q_b) is formed from the three tokens only: O(T·d) work at any n.
  """
  _, coupling, scale, _ = operators.magnetic_arguments(q, k, coupling=coupling, scale=scale)
  tri = np.asarray(triangles)
  if tri.ndim != 2 or tri.shape[1] != 3 or not np.issubdtype(tri.dtype, np.integer):
    raise ValueError(f"triangles must be an integer array [T, 3]; got {tri.dtype} {tri.shape}")
  _check_vertices("triangles", tri, q.shape[1])
  qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
  g = jnp.asarray(coupling, jnp.float32)[..., None] * 0.5 * scale                      # [] or [h, 1]

  def theta(a, b):
    dot = lambda x, y: jnp.einsum("bthd,bthd->bht", x[:, a], y[:, b])
    return g * (dot(qf, kf) - dot(kf, qf))
  i, j, l = tri[:, 0], tri[:, 1], tri[:, 2]
  return wrap(theta(i, j) + theta(j, l) + theta(l, i))


class Curvature(NamedTuple):
  """Distribution of the circulation F over proper triangles under the 3-cycle law `w_ijk ∝ K_ij K_jk K_ki`.

  wilson [...] complex: `Σ w e^{iF}`; mean_abs [...]: `Σ w |F|`; rms [...]: `(Σ w F²)^{1/2}` (radians);
  hist [..., bins]: the weight of each bin `(e_b, e_{b+1}]` of (−π, π]; edges [bins + 1]. A walk with no
  proper 3-cycle (every K_ij K_jk K_ki = 0 over distinct i, j, k: n < 3, a matching, the identity)
  has no such law: NaN there.
  """
  wilson: jax.Array
  mean_abs: jax.Array
  rms: jax.Array
  hist: jax.Array
  edges: jax.Array


def curvature(p, theta, bins: int = 24) -> Curvature:
  """Circulation distribution over all proper triangles of a dense walk (n³ terms, n² at a time)."""
  _check_pair(p, theta)
  if int(bins) < 1:
    raise ValueError(f"bins must be a positive integer; got {bins}")
  return _curvature(p, theta, int(bins))


@functools.partial(jax.jit, static_argnums=2)
def _curvature(p, theta, bins):
  lead, n = p.shape[:-2], p.shape[-1]
  pf, tf = p.reshape((-1, n, n)).astype(jnp.float32), theta.reshape((-1, n, n)).astype(jnp.float32)
  edges = jnp.linspace(-jnp.pi, jnp.pi, int(bins) + 1)

  def one(pk, tk):
    distinct = ~jnp.eye(n, dtype=bool)

    def row(i):                                             # all triangles through vertex i: [n, n] (j, k)
      w = pk[i][:, None] * pk * pk[:, i][None, :]
      w = jnp.where(distinct & distinct[i][:, None] & distinct[i][None, :], w, 0.0)
      f = wrap(tk[i][:, None] + tk + tk[:, i][None, :])
      idx = jnp.clip(jnp.searchsorted(edges, f, side="left") - 1, 0, int(bins) - 1)
      hist = jnp.zeros(int(bins), jnp.float32).at[idx.ravel()].add(w.ravel())
      return jnp.stack([w.sum(), jnp.sum(w * jnp.cos(f)), jnp.sum(w * jnp.sin(f)), jnp.sum(w * jnp.abs(f)),
                        jnp.sum(w * f * f)]), hist
    sums, hists = jax.lax.map(row, jnp.arange(n))
    tot = sums[:, 0].sum()
    tot = jnp.where(tot > 0, tot, jnp.nan)                    # no proper 3-cycle: no law (class docstring)
    s = sums.sum(0) / tot
    return s[1] + 1j * s[2], s[3], jnp.sqrt(s[4]), hists.sum(0) / tot

  wil, mabs, rms, hist = jax.vmap(one)(pf, tf)
  return Curvature(wil.reshape(lead), mabs.reshape(lead), rms.reshape(lead), hist.reshape(lead + (int(bins),)), edges)


class SampledCurvature(NamedTuple):
  """Monte Carlo read of `Curvature`'s wilson / mean_abs [...] with standard errors [...] (delta method)
  and the effective sample size `ess` [...] = (Σw)²/Σw² of the weighted triangles. The standard errors
  are NaN below 30 effective triangles (the delta method does not hold there), the estimates NaN when
  no sampled triangle carries weight (no proper 3-cycle)."""
  wilson: jax.Array
  mean_abs: jax.Array
  wilson_se: jax.Array
  mean_abs_se: jax.Array
  ess: jax.Array


_MIN_ESS = 30.0


def sampled_curvature(p, theta, key, samples: int = 4096) -> SampledCurvature:
  """The circulation law of `curvature` from `samples` random triangles per walk: O(samples), not O(n³).

  Draws proper triangles only: `i` uniform, `j ≠ i` with probability `K_ij / Σ_{j'≠i} K_ij'`, `k ∉ {i, j}`
  with probability `K_jk / Σ_{k'∉{i,j}} K_jk'`, and weighs each by `K_ki` times both normalisers (summed
  from the off-diagonal entries, not as `1 − K_ii`, which loses a sharp walk's mass in float32),
  so the weights are the 3-cycle law `w_ijk ∝ K_ij K_jk K_ki` up to its normaliser even when K is
  nearly diagonal (drawing j, k from the rows themselves wasted almost every sample there). The
  self-normalised ratio `Σ w g(F) / Σ w` is consistent for `g = e^{iF}` and `|F|`, with standard error
  `(Σ w²(g − R)²)^{1/2} / Σ w`. Use it where n³ is too many (the probe at model scale); `curvature` is
  the exact sum.
  """
  _check_pair(p, theta)
  if int(samples) < 2:
    raise ValueError(f"samples must be at least 2; got {samples}")
  return _sampled_curvature(p, theta, key, int(samples))


@functools.partial(jax.jit, static_argnums=3)
def _sampled_curvature(p, theta, key, samples):
  lead, n = p.shape[:-2], p.shape[-1]
  pf, tf = p.reshape((-1, n, n)).astype(jnp.float32), theta.reshape((-1, n, n)).astype(jnp.float32)

  def one(pk, tk, kk):
    ki, kj, kl = jax.random.split(kk, 3)
    logp = jnp.log(jnp.maximum(pk, _TINY))
    cols = jnp.arange(n)[None, :]
    i = jax.random.randint(ki, (samples,), 0, n)
    not_i = cols != i[:, None]                                                            # [samples, n]
    j = jax.random.categorical(kj, jnp.where(not_i, logp[i], -jnp.inf))
    not_ij = not_i & (cols != j[:, None])
    l = jax.random.categorical(kl, jnp.where(not_ij, logp[j], -jnp.inf))
    # the proposal's normalisers Σ_{j≠i} K_ij and Σ_{l∉{i,j}} K_jl, summed (1 − K_ii by subtraction loses a
    # sharp walk's mass in float32)
    w = pk[l, i] * jnp.sum(jnp.where(not_i, pk[i], 0.0), -1) * jnp.sum(jnp.where(not_ij, pk[j], 0.0), -1)
    w = jnp.where((i != j) & (j != l) & (l != i), w, 0.0)      # a row with no other state: drawn index moot
    w = w / jnp.maximum(jnp.max(w), _TINY)                     # scale-free; w² would underflow in float32
    f = wrap(tk[i, j] + tk[j, l] + tk[l, i])
    tot = w.sum()
    ess = tot ** 2 / jnp.maximum(jnp.sum(w * w), _TINY)
    tot = jnp.where(tot > 0, tot, jnp.nan)

    def ratio(g):
      r = jnp.sum(w * g) / tot
      se = jnp.sqrt(jnp.sum((w * (g - r)) ** 2)) / tot
      return r, jnp.where(ess >= _MIN_ESS, se, jnp.nan)
    (c, c_se), (s, s_se), (a, a_se) = ratio(jnp.cos(f)), ratio(jnp.sin(f)), ratio(jnp.abs(f))
    return c + 1j * s, a, jnp.sqrt(c_se ** 2 + s_se ** 2), a_se, ess

  keys = jax.random.split(key, pf.shape[0])
  out = jax.vmap(one)(pf, tf, keys)
  return SampledCurvature(*(x.reshape(lead) for x in out))


# ----------------------------------------------------------------------------- connection-walk read-outs

def phase_rotations(theta, rows=None) -> jax.Array:
  """Per-edge transports `R(θ_ij) = [[cos, −sin], [sin, cos]]` [..., rows, n, 2, 2] on one (Re, Im) pair
  (the magnetic walk's; `connection.edge_transports` is the attention-gated mixture of head transports)."""
  if rows is not None:
    theta = theta[..., rows, :]
  c, s = jnp.cos(theta), jnp.sin(theta)
  return jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)


def phase_isometry_defect(p, theta, chunk: int = 64) -> jax.Array:
  """`Σ_ij P_ij δ(R(θ_ij)) / n` [...], δ the one definition (`connection.isometry_defect`) of each edge's
  rotation (`phase_rotations`): 0 to float32 round-off (every transport is a rotation)."""
  _check_pair(p, theta)
  if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
    raise ValueError(f"chunk must be a positive integer; got {chunk!r}")
  n = p.shape[-1]
  total = 0.0
  for start in range(0, n, chunk):
    stop = min(start + chunk, n)
    total = total + _weighted_defect(p[..., start:stop, :], theta[..., start:stop, :])
  return total / n


@jax.jit
def _weighted_defect(p_rows, theta_rows):
  return jnp.sum(p_rows * connection.isometry_defect(phase_rotations(theta_rows))[0], (-2, -1))


def rotation_laplacian_matrix(p, theta) -> jax.Array:
  """Dense real `I − [P_ij R(θ_ij)]` [..., 2n, 2n] (block (i, j) is 2×2): the real form of `I − K_θ`
  (`connection.connection_laplacian_matrix` with the per-edge rotations `phase_rotations`)."""
  _check_pair(p, theta)
  n = p.shape[-1]
  blocks = p[..., :, :, None, None] * phase_rotations(theta)                            # [..., i, j, 2, 2]
  blocks = jnp.swapaxes(blocks, -3, -2).reshape(p.shape[:-2] + (2 * n, 2 * n))           # [..., (i a), (j b)]
  return jnp.eye(2 * n, dtype=blocks.dtype) - blocks


# ----------------------------------------------------------------------------- matrix-free

def _check_symmetric_mask(mask, n):
  """π from the log-normaliser and a Hermitian H need a reversible magnitude: a symmetric mask (or none)."""
  if mask is None or not _checks.is_concrete(mask):
    return
  m = np.broadcast_to(np.asarray(mask), mask.shape[:2] + (n, n))
  if not np.array_equal(m, np.swapaxes(m, -1, -2)):
    raise ValueError("mask must be symmetric (mask[..., i, j] == mask[..., j, i]) for the stationary law and H; "
                     "a key-padding mask is not: drop the padded tokens instead")


def magnitude_stationary(q, k, *, beta=0.0, scale=None, mask=None, block_size: int = 512) -> jax.Array:
  """π [b, n, h] of the magnitude `K = P(β, α = 0)`, matrix-free: `π_i ∝ exp(lse_i + bias_i)`.

  With the augmented logit `scale·qa_i·ka_j + bias_j` (`operators.augment`, α = 0) equal to
  `s S_ij − ½ s g_j`, `π_i K_ij ∝ exp(s S_ij − ½ s g_i − ½ s g_j)` is symmetric, and its row sum is
  `exp(lse_i + bias_i)`. Exact for a symmetric mask (or none); other masks are refused.
  """
  beta, _, scale, mask = operators.magnetic_arguments(q, k, beta=beta, scale=scale, mask=mask)
  _check_symmetric_mask(mask, q.shape[1])
  aug = operators.augment(q.astype(jnp.float32), k.astype(jnp.float32), beta=beta, alpha=0.0, scale=scale)
  lse = kernels.log_normaliser(aug.q, aug.k, bias=aug.bias, mask=mask, scale=scale, block_size=block_size)
  logw = lse + aug.bias
  return jax.nn.softmax(logw, axis=1)


def hermitian_operator(q, k, *, beta=0.0, coupling=1.0, scale=None, mask=None, batch: int = 0, head: int = 0,
                       implementation: str | None = None, block_size: int = 512):
  """`u ↦ H u` for one (batch, head) slice of CMAP, matrix-free through `kernels.phase_attention`.

  `H u = Π^{1/2} K_θ Π^{−1/2} u`, K_θ applied as the magnetic transport of u's real and imaginary
  parts (one channel pair per column). Returns a function of a complex numpy array [n] or [n, m]
  (jitted; float32 inside) giving the same shape in complex128 — the matvec for
  `hermitian_eigenvalues`. Memory O(n·m). A mask must be symmetric (checked) for H to be Hermitian.
  """
  beta, coupling, scale, mask = operators.magnetic_arguments(q, k, beta=beta, coupling=coupling, scale=scale,
                                                                 mask=mask)
  _check_symmetric_mask(mask, q.shape[1])
  b, n, h, _ = q.shape
  if not (0 <= batch < b and 0 <= head < h):
    raise ValueError(f"batch and head must index [b, h] = {(b, h)}; got {(batch, head)}")
  sl = lambda x: x[batch:batch + 1, :, head:head + 1].astype(jnp.float32)
  qs, ks = sl(q), sl(k)
  pick = lambda x: x if isinstance(x, float) else jnp.broadcast_to(jnp.asarray(x), (h,))[head:head + 1]
  beta, coupling = pick(beta), pick(coupling)
  ms = None if mask is None else jnp.broadcast_to(mask, (b, h, n, n))[batch:batch + 1, head:head + 1]
  root = jnp.sqrt(magnitude_stationary(qs, ks, beta=beta, scale=scale, mask=ms, block_size=block_size)[0, :, 0])   # [n]

  @jax.jit
  def apply(re, im):                                                         # [n, m] each
    x = jnp.stack([re, im], -1) / root[:, None, None]                        # [n, m, 2]: Π^{-1/2} u
    v = x.reshape(1, n, 1, -1)
    y = operators.magnetic_transport(qs, ks, v, beta=beta, coupling=coupling, scale=scale, mask=ms,
                                     implementation=implementation, block_size=block_size)
    y = y.reshape(n, -1, 2) * root[:, None, None]
    return y[..., 0], y[..., 1]

  def matvec(u):
    u = np.asarray(u)
    cols = u.reshape(n, -1)
    re, im = apply(jnp.asarray(cols.real, jnp.float32), jnp.asarray(cols.imag, jnp.float32))
    return (np.asarray(re, np.float64) + 1j * np.asarray(im, np.float64)).reshape(u.shape)
  return matvec


def real_embedding(matvec):
  """`x = [a; b] ↦ [Re H(a + ib); Im H(a + ib)]` on R^{2n}: real symmetric when H is Hermitian.

  Its spectrum is H's with every eigenvalue twice (u and iu) — the form a real symmetric
  (e.g. Lanczos) eigensolver takes.
  """
  def apply(x):
    x = np.asarray(x)
    n = x.shape[0] // 2
    y = matvec(x[:n] + 1j * x[n:])
    return np.concatenate([y.real, y.imag], 0)
  return apply


def hermitian_eigenvalues(matvec, n: int, num: int = 6, *, which: str = "LA", tol: float = 1e-6) -> np.ndarray:
  """`num` eigenvalues of a Hermitian operator given by its matvec ([n] complex -> [n] complex).

  which: "LA" (largest, descending) or "SA" (smallest, ascending). Implicitly restarted Lanczos
  (`scipy.sparse.linalg.eigsh`, ARPACK) on the complex operator; only matvecs are used.
  """
  from scipy.sparse.linalg import LinearOperator, eigsh
  if which not in ("LA", "SA"):
    raise ValueError(f"which must be 'LA' or 'SA'; got {which!r}")
  if not 1 <= int(num) < n:
    raise ValueError(f"num must lie in [1, n) = [1, {n}); got {num}")
  if not tol > 0:
    raise ValueError(f"tol must be positive; got {tol}")
  probe = np.asarray(matvec(np.ones(n, np.complex128)))
  if probe.shape != (n,):
    raise ValueError(f"matvec must map [n] = [{n}] to [{n}]; it returned shape {probe.shape} (is n right?)")
  op = LinearOperator((n, n), matvec=matvec, matmat=matvec, dtype=np.complex128)
  v0 = np.ones(n, np.complex128) / math.sqrt(n)
  lam = np.sort(eigsh(op, k=int(num), which=which, tol=tol, v0=v0, return_eigenvectors=False))
  return lam[::-1] if which == "LA" else lam


# ----------------------------------------------------------------------------- one layer's summary

def readouts(q, k, *, beta=0.0, coupling=1.0, scale=None, mask=None) -> dict[str, np.ndarray]:
  """Per-head [h] read-outs of CMAP on (q, k) [b, n, h, d] (dense: small n), averaged over the batch.

  `lambda_max` λ_max(H) (1 iff unfrustrated), `frustration_lower` / `frustration_upper` (bounds on ν),
  `wilson` Re of the 3-cycle Wilson loop, `mean_abs_circulation` (radians), `isometry_defect` (0).
  """
  _, _, _, mask = operators.magnetic_arguments(q, k, mask=mask)
  if mask is not None and _checks.is_concrete(mask) and not bool(np.all(kernels.attended_rows(mask, False, q.shape[1],
                                                                                              q.shape[1]))):
    raise ValueError("mask leaves some tokens with no keys (padding?): the dense read-outs need a stochastic "
                     "walk on every token; drop the padded tokens instead")
  p = operators.markov_matrix(q, k, beta=beta, alpha=0.0, mask=mask, scale=scale)
  theta = operators.phases(q, k, coupling=coupling, scale=scale)
  fr = frustration(p, theta)
  cv = curvature(p, theta)
  stats = {"lambda_max": fr.lambda_max, "frustration_lower": fr.lower, "frustration_upper": fr.upper,
           "wilson": jnp.real(cv.wilson), "mean_abs_circulation": cv.mean_abs,
           "isometry_defect": phase_isometry_defect(p, theta)}
  return {key: np.asarray(v).mean(0) for key, v in stats.items()}
