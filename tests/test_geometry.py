"""attngeo.geometry: Γ, Γ₂ against the sphere's closed forms, dense vs matrix-free, graph curvature."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from attngeo import data, geometry as geo, operators as op, walks

A = np.array([0.3, -0.5, 0.81]) / np.linalg.norm([0.3, -0.5, 0.81])


def gamma_reference(p, f, g, tau):
  """Γ(f, g)_i = (1/2τ) Σ_j P_ij (f_j − f_i)(g_j − g_i), in float64, term by term."""
  p, f, g = (np.asarray(v, np.float64) for v in (p, f, g))
  df = f[..., None, :, :] - f[..., :, None, :]
  dg = g[..., None, :, :] - g[..., :, None, :]
  return np.einsum("...ij,...ijm->...im", p, df * dg) / (2 * tau)


def gamma2_reference(p, f, tau):
  """Γ₂(f) = ½ L Γ(f) − Γ(f, Lf) from the definition, in float64."""
  p64 = np.asarray(p, np.float64)
  lap = lambda h: (p64 @ h - h) / tau
  f = np.asarray(f, np.float64)
  return 0.5 * lap(gamma_reference(p64, f, f, tau)) - gamma_reference(p64, f, lap(f), tau)


@pytest.fixture(scope="module")
def sphere4000():
  return jnp.asarray(data.sphere(4000, seed=0))


@pytest.mark.parametrize("radius,eps", [(1.0, 0.1), (2.0, 0.4)])
def test_sphere_gamma_and_gamma2(radius, eps):
  """S²(r), f = a·x: Γ(f) = 1 − f²/r², Γ₂(f) = 1/r² + f²/r⁴ (N = 4000, α = 1, τ = ε/4)."""
  x = jnp.asarray(data.sphere(4000, seed=0, radius=radius))
  f = x @ A
  p = walks.gaussian_markov(x, eps)
  g = geo.gamma(p, f[:, None], tau=eps / 4)[:, 0]
  g2 = geo.gamma2(p, f[:, None], tau=eps / 4)[:, 0]
  g_true, g2_true = 1 - f**2 / radius**2, 1 / radius**2 + f**2 / radius**4
  assert float(jnp.median(jnp.abs(g - g_true) / g_true)) < 0.10
  assert abs(float(g2.mean() / g2_true.mean()) - 1) < 0.10


def test_laplacian_of_coordinate_on_sphere(sphere4000):
  """Δ x₃ = −2 x₃ on S²: the fitted slope approaches −2 (−1.98 at ε = 0.05, N = 4000 in ../shared/DESIGN.md)."""
  f = sphere4000[:, 2:]
  lf = geo.generator(walks.gaussian_markov(sphere4000, 0.05), f, tau=0.05 / 4)
  slope = float(jnp.sum(lf * f) / jnp.sum(f * f))
  assert -2.05 < slope < -1.9


def test_spectral_gamma2_is_pointwise_accurate(sphere4000):
  f = sphere4000 @ A
  p = walks.gaussian_markov(sphere4000, 0.05)
  plain = geo.gamma2(p, f[:, None], tau=0.05 / 4)[:, 0]
  spec = geo.gamma2(walks.spectral(p, 16, 0.05 / 4), f[:, None])[:, 0]
  err = lambda g2: float(jnp.median(jnp.abs(g2 - (1 + f**2)) / (1 + f**2)))
  assert err(spec) < 0.10 < err(plain)


def test_spectral_ricci_cometric_is_the_tangent_projector(sphere4000):
  ric = geo.ricci(walks.spectral(walks.gaussian_markov(sphere4000, 0.05), 16, 0.05 / 4), sphere4000, 2)
  assert abs(float(ric.mean_ricci.mean()) - 1.0) < 0.2
  # the co-metric of an embedded manifold is the tangent projector: trace = dimension
  np.testing.assert_allclose(np.median(np.trace(ric.cometric, axis1=1, axis2=2)), 2.0, rtol=0.1)


def _torus_laplace_beltrami(kmax, grid=64, big=2.0, small=1.0, harmonics=16):
  """Exact (float64) Laplace–Beltrami eigenpairs of the torus of revolution on a grid×grid (θ, φ) grid:
  Θ(θ)·{cos, sin}(mφ), Θ by Fourier–Galerkin in θ. Returns ψ [n, kmax] (orthonormal in the area
  measure w), μ [kmax] (eigenvalues of Δ, ≤ 0), w [n] (area weights, sum 1), points [n, 3], K [n]."""
  tq = 2 * np.pi * np.arange(8 * harmonics) / (8 * harmonics)
  js = np.arange(1, harmonics + 1)
  basis = lambda t: np.concatenate([np.ones((len(t), 1)), np.cos(np.outer(t, js)), np.sin(np.outer(t, js))], 1)
  b, db = basis(tq), np.concatenate([np.zeros((len(tq), 1)), -js * np.sin(np.outer(tq, js)), js * np.cos(np.outer(tq, js))], 1)
  ring = big + small * np.cos(tq)
  mass = (b * (small * ring)[:, None]).T @ b
  chol_inv = np.linalg.inv(np.linalg.cholesky(mass))
  modes = []
  for m in range(12):
    stiff = (db * (ring / small)[:, None]).T @ db + m * m * (b * (small / ring)[:, None]).T @ b
    lam, v = np.linalg.eigh(chol_inv @ stiff @ chol_inv.T)
    for val, c in zip(lam[:12], (chol_inv.T @ v).T[:12]):
      modes += [(val, m, np.cos, c)] + ([(val, m, np.sin, c)] if m else [])
  modes = sorted(modes, key=lambda t: t[0])[:kmax]
  th, ph = (a.ravel() for a in np.meshgrid(*(2 * np.pi * np.arange(grid) / grid,) * 2, indexing="ij"))
  ring = big + small * np.cos(th)
  w = ring / ring.sum()
  psi = np.stack([(basis(th) @ c) * trig(m * ph) for _, m, trig, c in modes], 1)
  psi /= np.sqrt(w @ psi**2)
  x = np.stack([ring * np.cos(ph), ring * np.sin(ph), small * np.sin(th)], 1)
  return psi, -np.array([md[0] for md in modes]), w, x, np.cos(th) / (small * ring)


def test_ricci_on_exact_torus_eigenfunctions_integrates_to_gauss_bonnet():
  """No sampling, no ε: `ricci` on the exact Laplace–Beltrami eigenfunctions of the torus of revolution.
  At k = 54 the area mean of the read-out is the Gauss–Bonnet value 0; at k = 36 (which already holds
  the degree-≤3 monomials to 5 %) truncating the normal part of Γ₂ biases it by +0.07 — the bias
  the stability rule of `ricci_estimate` steps past."""
  psi, mu, w, x, curv = _torus_laplace_beltrami(54)
  assert abs(w @ curv) < 1e-12
  means = {}
  for k in (36, 54):
    p32 = jnp.asarray(psi[:, :k], jnp.float32)
    pw = jnp.asarray((psi[:, :k] * w[:, None]).T, jnp.float32)
    op = walks.MarkovOperator(lambda f, p32=p32, pw=pw, k=k: p32 @ (jnp.asarray(mu[:k, None], jnp.float32) * (pw @ f)),
                            lambda h, p32=p32, pw=pw: p32 @ (pw @ h))
    ric = np.asarray(geo.ricci(op, x.astype(np.float32), 2).mean_ricci, np.float64)
    means[k] = float(w @ ric)
    if k == 54:
      assert np.median(np.abs(ric - curv)) < 0.06
  assert abs(means[54]) < 0.01 and means[36] > 0.05


def test_dense_gamma_matches_term_by_term_reference():
  x = jnp.asarray(np.random.default_rng(0).standard_normal((60, 3)), jnp.float32)
  p = walks.gaussian_markov(x, 1.0, alpha_norm=0.5)
  f = jnp.stack([x[:, 0], jnp.sin(x[:, 1])], -1)
  g = jnp.stack([x[:, 2], x[:, 0] * x[:, 1]], -1)
  np.testing.assert_allclose(geo.gamma(p, f, g, tau=0.3), gamma_reference(p, f, g, 0.3), rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(geo.gamma2(p, f, tau=0.3), gamma2_reference(p, f, 0.3), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("alpha_norm", [0.0, 0.5, 1.0])
def test_matrix_free_gaussian_matches_dense(alpha_norm):
  x = jnp.asarray(data.sphere(300, seed=1))
  f = jnp.stack([x[:, 0], x[:, 1] * x[:, 2]], -1)
  dense = walks.gaussian_markov(x, 0.1, alpha_norm=alpha_norm)
  free = walks.gaussian(x, 0.1, alpha_norm=alpha_norm, block_size=64)
  np.testing.assert_allclose(geo.gamma(free, f), geo.gamma(dense, f, tau=0.025), rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(geo.gamma2(free, f), geo.gamma2(dense, f, tau=0.025), rtol=1e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["ATTN", "DMTN", "ATAP", "DMAP"])
@pytest.mark.parametrize("causal", [False, True])
def test_matrix_free_attention_matches_dense(name, causal):
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k = jax.random.normal(ks[0], (2, 40, 2, 8)), jax.random.normal(ks[1], (2, 40, 2, 8))
  f = jax.random.normal(ks[2], (2, 2, 40, 3))
  beta, alpha = op.corner(name)
  p = op.markov_matrix(q, k, beta=beta, alpha=alpha, causal=causal)
  for impl in ("einsum", "blockwise"):
    free = walks.attention(q, k, beta=beta, alpha=alpha, causal=causal, tau=0.5, implementation=impl, block_size=16)
    np.testing.assert_allclose(geo.gamma(free, f), geo.gamma(p, f, tau=0.5), atol=2e-5, rtol=1e-4)
    np.testing.assert_allclose(geo.gamma2(free, f), geo.gamma2(p, f, tau=0.5), atol=2e-4, rtol=1e-3)
  np.testing.assert_allclose(geo.gamma(p, f, tau=0.5), gamma_reference(p, f, f, 0.5), atol=2e-5, rtol=1e-4)


def test_gamma2_is_differentiable():
  """Reverse-mode gradients against finite differences, each function jitted (one compile for the values
  and one for the VJP, where op-by-op dispatch compiled the blockwise scan's pieces anew each call)."""
  x = jnp.asarray(data.sphere(40, seed=2))
  fn = jax.jit(lambda x: jnp.sum(geo.gamma2(walks.gaussian(x, 0.5, block_size=16), x[:, :2])))
  check_grads(fn, (x,), order=1, modes=["rev"], atol=5e-2, rtol=5e-2, eps=1e-3)
  q = jax.random.normal(jax.random.PRNGKey(1), (1, 12, 1, 4))
  fq = jax.jit(lambda q: jnp.sum(geo.gamma(walks.attention(q, q * 0.5, beta=0.0, alpha=1.0),
                                           q[:, :, :, :2].transpose(0, 2, 1, 3))))
  check_grads(fq, (q,), order=1, modes=["rev"], atol=5e-2, rtol=5e-2, eps=1e-3)


def _walk(adj):
  adj = np.asarray(adj, np.float64)
  return jnp.asarray(adj / adj.sum(1, keepdims=True), jnp.float32)


@pytest.mark.parametrize("n", [3, 5, 8])
def test_curvature_of_complete_graph(n):
  """K_n: unnormalised-Laplacian curvature 1 + n/2 (Cushing–Liu–Peyerimhoff), /D = n − 1 for the walk."""
  k = geo.graph_curvature(_walk(np.ones((n, n)) - np.eye(n)))
  np.testing.assert_allclose(k, (1 + n / 2) / (n - 1), rtol=1e-6)


@pytest.mark.parametrize("n", [5, 6, 9])
def test_curvature_of_cycle_is_zero(n):
  cyc = np.roll(np.eye(n), 1, 1) + np.roll(np.eye(n), -1, 1)
  np.testing.assert_allclose(geo.graph_curvature(_walk(cyc)), 0.0, atol=1e-6)


@pytest.mark.parametrize("d", [2, 3, 4])
def test_curvature_of_hypercube(d):
  """Q_d: unnormalised curvature 2 (Klartag–Kozma–Ralli–Tetali), so 2/d for the simple random walk."""
  verts = list(itertools.product([0, 1], repeat=d))
  adj = [[sum(a != b for a, b in zip(u, v)) == 1 for v in verts] for u in verts]
  np.testing.assert_allclose(geo.graph_curvature(_walk(adj)), 2 / d, rtol=1e-6)


def test_finite_dimension_lowers_curvature_and_family_bound_is_above():
  p = _walk(np.ones((6, 6)) - np.eye(6))
  assert np.all(geo.graph_curvature(p, dimension=2) < geo.graph_curvature(p))
  f = jax.random.normal(jax.random.PRNGKey(0), (6, 4))
  assert np.all(np.asarray(geo.family_curvature(p, f)) >= geo.graph_curvature(p) - 1e-4)


def test_bad_inputs():
  p = jnp.full((4, 4), 0.25)
  with pytest.raises(ValueError, match="row-stochastic"):
    geo.gamma(p * 2, jnp.ones((4, 1)))
  with pytest.raises(ValueError, match=r"\[..., n, m\]"):
    geo.gamma(p, jnp.ones(4))
  with pytest.raises(ValueError, match="g must have"):
    geo.gamma(p, jnp.ones((4, 1)), jnp.ones((4, 2)))
  with pytest.raises(ValueError, match="f must be finite"):
    geo.gamma(p, jnp.full((4, 1), jnp.nan))
  with pytest.raises(ValueError, match="eps must be positive"):
    walks.gaussian_markov(jnp.ones((4, 2)), 0.0)
  with pytest.raises(ValueError, match="tau must be positive"):
    geo.gamma(p, jnp.ones((4, 1)), tau=-1.0)
  with pytest.raises(ValueError, match="x must have rank 2"):
    walks.gaussian(jnp.ones((4,)), 1.0)
  with pytest.raises(ValueError, match="P must have at least one state"):      # numpy's zero-size error before
    geo.gamma(jnp.zeros((0, 0)), jnp.ones((0, 1)))
  for fn in (geo.gamma, geo.gamma2, geo.generator):                           # was einsum's "Size of label 'j'"
    with pytest.raises(ValueError, match=r"f must have one row per state of P: P is \[..., 4, 4\], f has shape \(5, 2\)"):
      fn(p, jnp.ones((5, 2)))


@pytest.mark.parametrize("fn", [geo.gamma, geo.gamma2])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_g_is_refused_and_propagates_under_jit(fn, bad):
  """g was not checked (only f): a NaN g went through silently. Eagerly it is one line naming g; under
  jit its column is NaN and the finite column matches the float64 definition."""
  p = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(0), (5, 5)), -1)
  f = jax.random.normal(jax.random.PRNGKey(1), (5, 2))
  g = jnp.ones((5, 2)).at[:, 1].set(jnp.arange(5.0)).at[2, 0].set(bad)
  with pytest.raises(ValueError, match="^g must be finite"):
    fn(p, f, g)
  with pytest.raises(TypeError, match="^g must be a floating"):
    fn(p, f, jnp.ones((5, 2), jnp.int32))
  out = jax.jit(fn)(p, f, g)
  assert np.all(np.isnan(out[:, 0]))
  if fn is geo.gamma:
    np.testing.assert_allclose(out[:, 1:], gamma_reference(p, f[:, 1:], g[:, 1:], 1.0), rtol=1e-5, atol=1e-6)
  else:
    assert np.all(np.isfinite(out[:, 1]))


