"""attngeo.connection: connection-walk identities with known answers; trace tables against dense float64."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy.spatial.distance import jensenshannon

from attngeo import connection as conn, markov, nn, operators as op
from helpers import defect_from_lam, dense_cmap_transports64, rotations64


def random_p(seed, h=3, n=7):
  return jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(seed), (h, n, n)) * 2, -1)


def random_orthogonal(seed, d):
  q, _ = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(seed), (d, d)))
  return q


def random_factors(seed, d, h, k):
  ka, kb = jax.random.split(jax.random.PRNGKey(seed))
  return jax.random.normal(ka, (d, h, k)), jax.random.normal(kb, (h, k, d))


def dense_effective_defect64(p, wv, wo, rtol=1e-14):
  """The per-edge definition in float64: every T_ij formed, its singular values σ (λ = σ² resolved
  far below float32 round-off: a product of random factors has σ_min/σ_max ~ 10⁻⁵); W-weighted mean."""
  t = np.einsum("dhk,hke->hed", np.float64(wv), np.float64(wo))
  p = np.float64(p)
  s = p.sum(0)
  g = p / np.where(s > 0, s, 1.0)
  tij = np.einsum("hij,hde->ijde", g, t)
  lam = np.linalg.svd(tij, compute_uv=False)[..., ::-1] ** 2
  return float((p.mean(0) * defect_from_lam(lam, rtol)).sum() / p.shape[-1])


def test_attention_output_is_the_connection_walk():
  """y_i = Σ_h Σ_j P^h_ij T^h x_j = H Σ_j W_ij T_ij x_j, against the module's own forward pass."""
  att = nn.Attention(nn.BlockConfig(width=8, num_heads=2, operator="DMTN"), rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 6, 8))
  q, k, _ = att.qkv(x)
  p = op.markov_matrix(q, k, beta=0.0, alpha=1.0)[0]
  t = conn.head_transports(att.wv[...], att.wo[...])
  tij = conn.edge_transports(p, t)
  y = p.shape[0] * jnp.einsum("ij,ijde,je->id", conn.walk(p), tij, x[0])
  np.testing.assert_allclose(y, att(x)[0], atol=1e-5)


def test_single_head_has_constant_transport():
  p = random_p(0, h=1)
  t = random_orthogonal(1, 4)[None] * 2.0
  tij = conn.edge_transports(p, t)
  np.testing.assert_allclose(tij, jnp.broadcast_to(t[0], tij.shape), atol=1e-6)


def test_isometry_defect_of_orthogonal_and_scaled_maps():
  o = random_orthogonal(2, 5)
  d, c = conn.isometry_defect(o)
  assert float(d) < 1e-6 and abs(float(c) - 1) < 1e-5
  d, c = conn.isometry_defect(3.0 * o)
  assert float(d) < 1e-6 and abs(float(c) - 9.0) < 1e-4
  # rank-2 partial isometry (as a W_O W_V of head dim 2): judged on its row space
  d, _ = conn.isometry_defect(o[:, :2] @ o[:, :2].T)
  assert float(d) < 1e-6
  d, _ = conn.isometry_defect(jnp.diag(jnp.array([1.0, 2.0, 3.0])))
  lam = np.array([1.0, 4.0, 9.0])
  np.testing.assert_allclose(d, np.sqrt(((lam - lam.mean()) ** 2).sum() / (lam**2).sum()), rtol=1e-5)


def test_a_small_but_real_singular_value_is_in_the_row_space():
  """σ = (1, 1, 0.2, 0) rotated: λ = (1, 1, 0.04) is the row space; the structural 0 is not.

  A row-space cut above λ = 0.04 (4 % of the largest) would drop 0.2 and report a perfect isometry.
  """
  u, v = random_orthogonal(3, 4), random_orthogonal(4, 4)
  t = u @ jnp.diag(jnp.array([1.0, 1.0, 0.2, 0.0])) @ v.T
  expected = defect_from_lam(np.array([0.0, 0.04, 1.0, 1.0]), 1e-10)
  assert expected > 0.5
  np.testing.assert_allclose(conn.isometry_defect(t)[0], expected, rtol=1e-4)
  # the same map as one head of head dim 3 (factors O = U Σ, V = Vᵀ restricted to the row space)
  wo = (u[:, :3] * jnp.array([1.0, 1.0, 0.2])).T[None]                    # [h=1, k=3, d=4]
  wv = v[:, :3][:, None, :]                                                # [d=4, h=1, k=3]
  np.testing.assert_allclose(conn.head_isometry_defect(wv, wo)[0], [expected], rtol=1e-4)
  np.testing.assert_allclose(conn.effective_isometry_defect(jnp.full((1, 5, 5), 0.2), wv, wo).mean, expected,
                             rtol=1e-4)


def test_head_defect_from_k_by_k_cores_matches_dense():
  wv, wo = random_factors(5, 12, 3, 4)
  d_dense, c_dense = conn.isometry_defect(conn.head_transports(wv, wo))
  d, c = conn.head_isometry_defect(wv, wo)
  np.testing.assert_allclose(d, d_dense, rtol=1e-5)
  np.testing.assert_allclose(c, c_dense, rtol=1e-5)


def test_trace_tables_match_dense_traces():
  wv, wo = random_factors(6, 10, 3, 4)
  t = np.einsum("dhk,hke->hed", np.float64(wv), np.float64(wo))
  gram = np.einsum("aij,bij->ab", t, t)                                    # tr(T^aᵀT^b)
  x = np.einsum("aji,bjk->abik", t, t)                                     # T^aᵀT^b
  quartic = np.einsum("abij,cdji->abcd", x, x)                             # tr(T^aᵀT^b T^cᵀT^d)
  tab = conn.transport_tables(wv, wo)
  np.testing.assert_allclose(tab.gram, gram, rtol=2e-5, atol=1e-5 * np.abs(gram).max())
  np.testing.assert_allclose(tab.quartic, quartic, rtol=2e-5, atol=1e-5 * np.abs(quartic).max())
  g = np.array([0.2, 0.5, 0.3])
  tg = np.einsum("h,hde->de", g, t)
  m = tg.T @ tg
  tr, f2 = conn.gated_traces(jnp.asarray(g, jnp.float32), tab)
  np.testing.assert_allclose([tr, f2], [np.trace(m), (m**2).sum()], rtol=2e-5)


@pytest.mark.parametrize("d,h,k", [(16, 2, 8), (8, 3, 4)])
def test_effective_defect_from_tables_equals_the_per_edge_definition(d, h, k):
  """H·k = d (rank pinned by the factors) and H·k > d (generic rank by random draws); H·k < d is
  the single head of the small-singular-value test."""
  wv, wo = random_factors(d + h, d, h, k)
  p = random_p(h, h=h, n=9)
  got = conn.effective_isometry_defect(p, wv, wo, chunk=4)
  np.testing.assert_allclose(got.mean, dense_effective_defect64(p, wv, wo), rtol=2e-5)
  t = np.einsum("dhk,hke->hed", np.float64(wv), np.float64(wo))
  pn = np.float64(p)
  lam = np.linalg.svd(np.einsum("hij,hde->ijde", pn / pn.sum(0), t), compute_uv=False) ** 2
  participation = (pn.mean(0) * lam.sum(-1) ** 2 / (lam**2).sum(-1)).sum() / pn.shape[-1]
  np.testing.assert_allclose(got.participation, participation, rtol=2e-5)
  assert float(got.stderr) == 0 and float(got.sampled_mass) == 0 and int(got.rank) == min(d, h * k)


def test_dense_float32_reference_agrees_when_the_row_space_is_well_conditioned():
  """With orthonormal head factors and moderate gates every nonzero λ clears the float32 cut."""
  d, h, k = 12, 3, 2
  o = random_orthogonal(7, d)[:, : h * k].reshape(d, h, k)
  v = random_orthogonal(8, d)[:, : h * k].reshape(d, h, k)
  wv, wo = v, jnp.transpose(o, (1, 2, 0)) * jnp.array([1.0, 2.0, 0.5])[:, None, None]
  p = jax.nn.softmax(0.3 * jax.random.normal(jax.random.PRNGKey(9), (h, 8, 8)), -1)
  dense = conn.effective_isometry_defect_dense(p, conn.head_transports(wv, wo), chunk=4)
  np.testing.assert_allclose(conn.effective_isometry_defect(p, wv, wo).mean, dense, rtol=2e-5)
  np.testing.assert_allclose(dense, dense_effective_defect64(p, wv, wo), rtol=2e-5)


def test_partial_supports_are_sampled_within_their_error_bar():
  """Edges where some head is exactly 0 (underflow, head masks) carry their own rank; their share
  of W is estimated from edges drawn from W: each estimate within 4 standard errors of the truth,
  and the mean of 16 independent estimates within 4 standard errors of that mean (no bias)."""
  d, h, k, n = 8, 3, 4, 13
  wv, wo = random_factors(11, d, h, k)
  p = random_p(12, h=h, n=n)
  # scattered zeros, plus rows 0-3 where head 0 sees only the diagonal and head 1 only keys 0-3:
  # rows differ in off-support mass, so sampling rows by anything but their mass biases the mean
  keep = jax.random.bernoulli(jax.random.PRNGKey(13), 0.95, p.shape) | jnp.eye(n, dtype=bool)
  keep = keep.at[0, :4].set(False).at[0, :4, :4].set(jnp.eye(4, dtype=bool)).at[1, :4, 4:].set(False)
  p = p * keep
  p = p / p.sum(-1, keepdims=True)
  truth = dense_effective_defect64(p, wv, wo)
  est = [conn.effective_isometry_defect(p, wv, wo, samples=64, key=jax.random.PRNGKey(s)) for s in range(16)]
  means, ses = np.array([e.mean for e in est]), np.array([e.stderr for e in est])
  pn = np.asarray(p, np.float64)
  partial_mass = (pn.mean(0) * ~np.all(pn > 0, 0)).sum() / n
  np.testing.assert_allclose(est[0].sampled_mass, partial_mass, rtol=1e-5)
  assert np.all(ses > 0) and np.all(ses < 0.01)
  assert np.all(np.abs(means - truth) < 4 * ses)
  assert abs(means.mean() - truth) < 4 * np.sqrt(np.sum(ses**2)) / len(est)


def test_rank_of_a_gated_mixture_is_not_the_sum_of_head_ranks():
  """T¹ = e₁e₁ᵀ, T² = e₁e₂ᵀ: row spaces span 2 dimensions, every mixture has rank 1."""
  d = 4
  e = jnp.eye(d)
  wo = jnp.stack([e[0][None], e[0][None]])                                 # O_h = e₁  [h=2, k=1, d]
  wv = jnp.stack([e[0], e[1]], 0).T[:, :, None]                            # V_1 = e₁ᵀ, V_2 = e₂ᵀ  [d, 2, 1]
  key = jax.random.PRNGKey(0)
  assert int(conn.mixture_rank(wv, wo, jnp.array([True, True]), key)) == 1
  # the generic branch (H·k > d): compare with float64 numpy at a random mixture
  wv, wo = random_factors(15, 5, 3, 3)
  g = np.array([0.5, 0.3, 0.2])
  ref = np.linalg.matrix_rank(np.einsum("dhk,h,hke->ed", np.float64(wv), g, np.float64(wo)))
  assert int(conn.mixture_rank(wv, wo, jnp.array([True, True, True]), key)) == ref == 5
  # a single supported head of head dim 3 has rank 3
  assert int(conn.mixture_rank(wv, wo, jnp.array([False, True, False]), key)) == 3


def test_block_laplacian_of_identity_transport_is_walk_laplacian_kron_identity():
  p = random_p(3)
  d = 3
  t = jnp.broadcast_to(jnp.eye(d), (p.shape[0], d, d))
  w = conn.walk(p)
  np.testing.assert_allclose(conn.connection_laplacian_matrix(p, t), jnp.kron(jnp.eye(7) - w, jnp.eye(d)), atol=1e-6)


def test_laplacian_apply_matches_matrix():
  p = random_p(4, h=2, n=9)
  t = jax.random.normal(jax.random.PRNGKey(5), (2, 4, 4))
  f = jax.random.normal(jax.random.PRNGKey(6), (9, 4))
  np.testing.assert_allclose(conn.connection_laplacian_apply(p, t, f),
                             (conn.connection_laplacian_matrix(p, t) @ f.reshape(-1)).reshape(9, 4), atol=1e-5)


def test_symmetric_walk_is_reversible_and_stability_of_equal_layers_is_zero():
  a = jax.random.uniform(jax.random.PRNGKey(7), (6, 6))
  s = (a + a.T) / (a + a.T).sum(-1, keepdims=True)
  w = conn.walk(jnp.stack([s, s]))
  assert float(markov.reversibility(w)) < 1e-6
  st = conn.stability([w, w, 0.5 * (w + jnp.eye(6))])
  assert st[0]["relative_change"] == 0 and st[0]["js_divergence"] < 1e-7 and st[0]["spectral_distance"] < 1e-5
  assert st[1]["relative_change"] > 0.1 and 0 < st[1]["js_divergence"] <= np.log(2)


def test_row_js_divergence_matches_scipy():
  w1, w2 = conn.walk(random_p(20)), conn.walk(random_p(21))
  w2 = w2.at[0].set(jnp.eye(7)[3])                                         # a row with zeros
  ref = np.mean([jensenshannon(a, b) ** 2 for a, b in zip(np.float64(w1), np.float64(w2))])
  np.testing.assert_allclose(conn.row_js_divergence(w1, w2), ref, rtol=1e-5)


def test_walk_spectrum_reports_convergence():
  w = op.rownorm(jax.random.normal(jax.random.PRNGKey(23), (1, 2, 9, 9)))[0].mean(0)
  moduli, converged = conn.walk_spectrum(w, 4)
  np.testing.assert_allclose(moduli, np.sort(np.abs(np.linalg.eigvals(np.asarray(w, np.float64))))[::-1][:4], atol=1e-5)
  assert bool(converged)


def test_triangular_walk_moduli_are_its_diagonal_spectrum():
  causal = op.rownorm(jax.random.normal(jax.random.PRNGKey(22), (1, 2, 9, 9)), causal=True)[0].mean(0)
  np.testing.assert_allclose(conn.walk_moduli(causal, 5, triangular=True), jnp.abs(markov.spectrum(causal, 5).values),
                             atol=1e-5)


def test_bad_inputs():
  p = random_p(8, h=2)
  with pytest.raises(ValueError, match="2 heads but transports has 3"):
    conn.edge_transports(p, jnp.zeros((3, 4, 4)))
  with pytest.raises(ValueError, match="row-stochastic"):
    conn.walk(p * 2)
  with pytest.raises(ValueError, match="wv must be"):
    conn.head_transports(jnp.zeros((4, 2, 3)), jnp.zeros((2, 2, 4)))
  with pytest.raises(ValueError, match="F must be"):
    conn.connection_laplacian_apply(p, jnp.zeros((2, 4, 4)), jnp.zeros((7, 3)))
  wv, wo = random_factors(0, 4, 3, 2)
  with pytest.raises(ValueError, match="heads = 3"):
    conn.effective_isometry_defect(p, wv, wo)
  with pytest.raises(ValueError, match="samples must be at least 2"):
    conn.effective_isometry_defect(random_p(8, h=3), wv, wo, samples=1)


# ----------------------------------------------------------------------------- magnetic (CMAP) layers

def test_cmap_attention_output_is_the_walk_with_rotated_transports():
  """Anchor of the convention: a CMAP layer's output is `Σ_h Σ_j P^h_ij x_j W_V^h R(θ^h_ij) W_O^h`."""
  att = nn.Attention(nn.BlockConfig(width=8, num_heads=2, operator="CMAP", coupling=1.3), rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 6, 8))
  q, k, _ = att.qkv(x)
  p = op.markov_matrix(q, k, beta=0.0, alpha=0.0)[0]
  theta = op.phases(q, k, coupling=1.3)[0]
  r = rotations64(np.asarray(theta, np.float64), 4)
  y = np.einsum("hij,je,ehk,hijkl,hld->id", np.float64(p), np.float64(x[0]), np.float64(att.wv[...]), r,
                np.float64(att.wo[...]))
  np.testing.assert_allclose(y, att(x)[0], atol=1e-5)
  assert float(jnp.abs(theta).max()) > 0.1


@pytest.mark.parametrize("d,h,k", [(16, 2, 4), (8, 3, 4)])
def test_cmap_effective_defect_from_tables_equals_the_per_edge_definition(d, h, k):
  """Rotated head transports through 2h virtual heads with signed gates: the trace-table defect equals the
  per-edge float64 one (H·k < d, rank pinned; H·k > d, generic rank), and differs from the phase-free one."""
  wv, wo = random_factors(d + h + 1, d, h, k)
  p = random_p(h + 5, h=h, n=9)
  theta = 2.0 * jax.random.normal(jax.random.PRNGKey(3), p.shape)
  theta = theta - jnp.swapaxes(theta, -1, -2)
  got = conn.effective_isometry_defect(p, wv, wo, phases=theta, chunk=4)
  lam = np.linalg.svd(dense_cmap_transports64(p, theta, wv, wo), compute_uv=False)[..., ::-1] ** 2
  pn = np.float64(p)
  truth = float((pn.mean(0) * defect_from_lam(lam, 1e-14)).sum() / pn.shape[-1])
  np.testing.assert_allclose(got.mean, truth, rtol=2e-5)
  assert int(got.rank) == min(d, h * k) and float(got.sampled_mass) == 0
  assert abs(float(conn.effective_isometry_defect(p, wv, wo).mean) - truth) > 1e-3
  np.testing.assert_allclose(conn.effective_isometry_defect(p, wv, wo, phases=jnp.zeros_like(p)).mean,
                             conn.effective_isometry_defect(p, wv, wo).mean, rtol=1e-5)   # θ = 0: the family's


def test_cmap_partial_supports_are_sampled_within_their_error_bar():
  d, h, k, n = 8, 2, 4, 11
  wv, wo = random_factors(21, d, h, k)
  p = random_p(22, h=h, n=n)
  keep = jax.random.bernoulli(jax.random.PRNGKey(23), 0.7, p.shape) | jnp.eye(n, dtype=bool)
  p = p * keep
  p = p / p.sum(-1, keepdims=True)
  theta = jax.random.uniform(jax.random.PRNGKey(24), p.shape, minval=-3.0, maxval=3.0)
  lam = np.linalg.svd(dense_cmap_transports64(p, theta, wv, wo), compute_uv=False)[..., ::-1] ** 2
  pn = np.float64(p)
  truth = float((pn.mean(0) * defect_from_lam(lam, 1e-10)).sum() / n)
  est = conn.effective_isometry_defect(p, wv, wo, phases=theta, samples=256, key=jax.random.PRNGKey(5))
  assert float(est.sampled_mass) > 0.1 and 0 < float(est.stderr) < 0.02
  assert abs(float(est.mean) - truth) < 4 * float(est.stderr), (float(est.mean), truth, float(est.stderr))


def test_cmap_phases_must_match_p():
  wv, wo = random_factors(0, 8, 3, 4)
  with pytest.raises(ValueError, match="phases must be"):
    conn.effective_isometry_defect(random_p(1), wv, wo, phases=jnp.zeros((3, 5, 5)))
  with pytest.raises(ValueError, match="k must be even"):
    conn.effective_isometry_defect(random_p(1), *random_factors(0, 8, 3, 3), phases=jnp.zeros((3, 7, 7)))


# ----------------------------------------------------------------------------- one definition, two routes

def defect64(t, rtol=1e-12):
  """The definition in float64 (module docstring): singular values of T, rank σ² > rtol·σ₁², sum of squared
  deviations of λ = σ² on the kept ones."""
  lam = np.linalg.svd(np.float64(t), compute_uv=False)[..., ::-1] ** 2
  return defect_from_lam(lam, rtol)


def effective64(p, wv, wo):
  p = np.float64(p)
  t = np.einsum("dhk,hke->hed", np.float64(wv), np.float64(wo))
  tij = np.einsum("hij,hde->ijde", p / p.sum(0), t)
  return float((p.mean(0) * defect64(tij)).sum() / p.shape[-1])


def isometric_heads(seed, d, h, k, scale=1.0):
  """h heads with one transport `scale·Q` on a k-dimensional row space (orthonormal factors)."""
  o = random_orthogonal(seed, d)[:, :k]
  v = random_orthogonal(seed + 1, d)[:, :k]
  return jnp.repeat(v[:, None, :], h, 1), jnp.repeat(scale * o.T[None], h, 0)


def small_singular_value_heads(seed, d=12, k=3):
  """Two heads on orthogonal row spaces, the second scaled by 10⁻⁴: its λ = 10⁻⁸·λ_max are real (the rank
  rule counts them; the former dense cut λ > 10⁻⁶·λ_max dropped them and read a near-isometry)."""
  o = random_orthogonal(seed, d)[:, :2 * k].reshape(d, 2, k)
  v = random_orthogonal(seed + 1, d)[:, :2 * k].reshape(d, 2, k)
  return v, jnp.transpose(o, (1, 2, 0)) * jnp.array([1.0, 1e-4])[:, None, None]


CASES = {"random": lambda: random_factors(31, 8, 3, 4),                         # H·k > d: generic rank
         "isometric one head": lambda: isometric_heads(32, 8, 1, 8),
         "isometric three heads": lambda: isometric_heads(34, 8, 3, 4, 2.0),     # rank 4 < d = 8
         "rank deficient": lambda: random_factors(36, 12, 2, 3),                 # H·k = 6 < d = 12
         "small singular value": lambda: small_singular_value_heads(37)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dense_and_trace_routes_read_the_one_definition(case):
  """Both routes against the float64 definition: the dense one to round-off (an exact isometry < 10⁻⁶), the
  trace tables to their stated floor `TABLE_FLOOR2` in δ², and the head defect of the k×k cores to 10⁻⁵."""
  wv, wo = CASES[case]()
  h = wv.shape[1]
  p = random_p(40, h=h, n=6)
  truth = effective64(p, wv, wo)
  dense = float(conn.effective_isometry_defect_dense(p, conn.head_transports(wv, wo), chunk=4))
  tables = float(conn.effective_isometry_defect(p, wv, wo).mean)
  assert abs(dense - truth) <= 1e-6 + 2e-5 * truth, (dense, truth)
  assert abs(tables**2 - truth**2) <= conn.TABLE_FLOOR2 + 4e-5 * truth**2, (tables, truth)
  heads = defect64(np.einsum("dhk,hke->hed", np.float64(wv), np.float64(wo)))
  np.testing.assert_allclose(conn.head_isometry_defect(wv, wo)[0], heads, rtol=1e-5, atol=1e-6)
  if case.startswith("isometric"):
    assert dense < 1e-6 and max(conn.head_isometry_defect(wv, wo)[0]) < 1e-6 and tables**2 < conn.TABLE_FLOOR2
    np.testing.assert_allclose(conn.isometry_defect(conn.head_transports(wv, wo))[0], 0.0, atol=1e-6)


def test_a_real_singular_value_under_the_former_dense_cut_counts_in_both_routes():
  """λ = 10⁻⁸·λ_max (σ = 10⁻⁴·σ₁) is in the row space by the rank rule: the routes agree on δ ≈ 0.7, not the
  former dense 0 (isometric on the larger head alone) against the tables' 0.7."""
  wv, wo = small_singular_value_heads(41)
  p = jnp.full((2, 5, 5), 0.2)
  truth = effective64(p, wv, wo)
  assert truth > 0.5
  np.testing.assert_allclose(conn.effective_isometry_defect_dense(p, conn.head_transports(wv, wo)), truth, rtol=1e-5)
  np.testing.assert_allclose(conn.effective_isometry_defect(p, wv, wo).mean, truth, rtol=1e-5)
  np.testing.assert_allclose(conn.isometry_defect(conn.head_transports(wv, wo)[1] + conn.head_transports(wv, wo)[0])[0],
                             truth, rtol=1e-5)
