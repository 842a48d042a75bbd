"""attngeo.connection: connection-walk identities with known answers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import connection as conn, markov, nn, operators as op


def random_p(seed, h=3, n=7):
  return jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(seed), (h, n, n)) * 2, -1)


def random_orthogonal(seed, d):
  q, _ = jnp.linalg.qr(jax.random.normal(jax.random.PRNGKey(seed), (d, d)))
  return q


def test_attention_output_is_the_connection_walk():
  """y_i = Σ_h Σ_j P^h_ij T^h x_j = H Σ_j W_ij T_ij x_j, against the module's own forward pass."""
  att = nn.Attention(8, 2, 4, operator="DMTN", rngs=nnx.Rngs(0))
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


def test_block_laplacian_of_identity_transport_is_walk_laplacian_kron_identity():
  p = random_p(3)
  d = 3
  t = jnp.broadcast_to(jnp.eye(d), (p.shape[0], d, d))
  w = conn.walk(p)
  np.testing.assert_allclose(conn.connection_laplacian_matrix(p, t), jnp.kron(jnp.eye(7) - w, jnp.eye(d)), atol=1e-6)


def test_laplacian_apply_matches_matrix_and_chunked_matches_dense():
  p = random_p(4, h=2, n=9)
  t = jax.random.normal(jax.random.PRNGKey(5), (2, 4, 4))
  f = jax.random.normal(jax.random.PRNGKey(6), (9, 4))
  np.testing.assert_allclose(conn.connection_laplacian_apply(p, t, f),
                             (conn.connection_laplacian_matrix(p, t) @ f.reshape(-1)).reshape(9, 4), atol=1e-5)
  dense = jnp.sum(conn.walk(p) * conn.isometry_defect(conn.edge_transports(p, t))[0]) / 9
  np.testing.assert_allclose(conn.effective_isometry_defect(p, t, chunk=4), dense, rtol=1e-5)


def test_symmetric_walk_is_reversible_and_stability_of_equal_layers_is_zero():
  a = jax.random.uniform(jax.random.PRNGKey(7), (6, 6))
  s = (a + a.T) / (a + a.T).sum(-1, keepdims=True)
  w = conn.walk(jnp.stack([s, s]))
  assert float(markov.reversibility(w)) < 1e-6
  st = conn.stability([w, w, 0.5 * (w + jnp.eye(6))])
  assert st[0]["relative_change"] == 0 and st[0]["js_divergence"] < 1e-7 and st[0]["spectral_distance"] < 1e-5
  assert st[1]["relative_change"] > 0.1 and 0 < st[1]["js_divergence"] <= np.log(2)


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
