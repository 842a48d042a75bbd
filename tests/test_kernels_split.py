"""attngeo.kernels.split: the β = 1 edge (ATAP) on one d-wide product and its transpose.

Values and gradients against float64 references (masks, causal order, a per-head α, the coefficient's own
gradient), the product count of the gradient program (ATTN's 6 n × n × d products, not the augmented
form's 9), and the routing: `operators.transport` takes this kernel only on the β = 1 edge, on the einsum
kernel below `BLOCKWISE_FROM` keys, for inputs of ≥ 32 bits.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import family_edge, family_edge64

from attngeo import kernels, operators as op
from attngeo.experiments.time_parts import product_flops

B, N, H, D = 2, 24, 3, 8
ALPHA_PER_HEAD = np.array([0.0, 0.4, 0.9], np.float32)


def qkv(seed=0, n=N, dtype=jnp.float32):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(kk, (B, n, H, D), dtype) for kk in ks]


@pytest.mark.parametrize("alpha", [0.0, 0.3, ALPHA_PER_HEAD])
@pytest.mark.parametrize("causal", [False, True])
def test_values_match_float64(alpha, causal):
  q, k, v = qkv(1)
  mask = jax.random.bernoulli(jax.random.PRNGKey(2), 0.7, (B, 1, N, N)) | jnp.eye(N, dtype=bool)
  for m in (None, mask):
    y = op.transport(q, k, v, beta=1.0, alpha=alpha, causal=causal, mask=m, implementation="einsum")
    np.testing.assert_allclose(y, family_edge64(q, k, v, alpha, causal=causal, mask=m), atol=2e-6, rtol=1e-5)


def test_gradients_match_float64_for_q_k_v_and_alpha():
  q, k, v = qkv(3)
  w = jax.random.normal(jax.random.PRNGKey(4), (B, N, H, D))
  fused = lambda q, k, v, a: jnp.sum(w * op.transport(q, k, v, beta=1.0, alpha=a, causal=True, implementation="einsum"))
  got = jax.grad(fused, (0, 1, 2, 3))(q, k, v, jnp.asarray(ALPHA_PER_HEAD))
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, ALPHA_PER_HEAD, w)]
    dense = lambda q, k, v, a: jnp.sum(x64[4] * family_edge(q, k, v, a, causal=True))
    want = [np.asarray(r) for r in jax.grad(dense, (0, 1, 2, 3))(*x64[:4])]
  for g, r in zip(got, want):
    assert np.abs(r).max() > 1e-3
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


def grad_flops(beta, alpha, n=N, dtype=jnp.float32, implementation="einsum"):
  q, k, v = qkv(5, n, dtype)
  loss = lambda q, k, v: jnp.sum(op.transport(q, k, v, beta=beta, alpha=alpha, implementation=implementation)
                                 .astype(jnp.float32))
  return product_flops(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v).jaxpr)


def test_the_edge_runs_attention_s_products_and_the_augmented_form_half_again():
  """Forward + backward of ATAP on the einsum kernel: the 6 n × n × d products of ATTN (plus the key
  bias's O(n·d) work), where the 2·d-wide augmented heads ran 9 — a count, not a timing."""
  unit = 2 * B * H * N * N * D
  attn = grad_flops(*op.ATTN)
  assert attn == 6 * unit
  for alpha in (0.0, 0.5):
    assert grad_flops(1.0, alpha) - attn < 0.05 * unit, alpha
  assert grad_flops(*op.DMTN) == 9 * unit                           # off the edge: the augmented form


def test_routing_keeps_the_augmented_form_off_its_domain():
  unit = lambda n: 2 * B * H * n * n * D
  # named einsum from BLOCKWISE_FROM keys on (where the transposes cost more than they save)
  n = kernels.BLOCKWISE_FROM
  assert grad_flops(*op.ATAP, n=n) >= 9 * unit(n)
  # 16-bit inputs keep the augmented hi + lo keys (4·d wide)
  assert grad_flops(*op.ATAP, dtype=jnp.bfloat16) > 9 * unit(N)
  # a β given as an array (a learnable member) is not routed here
  assert grad_flops(jnp.float32(1.0), 0.0) >= 9 * unit(N)


def test_split_attention_is_self_attention_and_checks_its_mask():
  q, k, v = qkv(6)
  with pytest.raises(ValueError, match="self-attention"):
    kernels.split_attention(q, k[:, :-1], v, weights=(1.0, 0.0), scale=1.0)
  with pytest.raises(ValueError, match="mask must be 4-D"):
    kernels.split_attention(q, k, v, weights=(1.0, 0.0), mask=jnp.ones((N, N), bool), scale=1.0)
