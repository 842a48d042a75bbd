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
from attngeo.kernels import split
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


@pytest.mark.parametrize("alpha", [ALPHA_PER_HEAD, 0.0])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_float64_for_q_k_v_and_alpha(alpha, causal):
  """A per-head α (differentiated, its own gradient checked) and ATAP's static α = 0 (`symmetric_logits`)."""
  q, k, v = qkv(3)
  w = jax.random.normal(jax.random.PRNGKey(4), (B, N, H, D))
  static = isinstance(alpha, float)
  run = lambda q, k, v, a: op.transport(q, k, v, beta=1.0, alpha=alpha if static else a, causal=causal,
                                        implementation="einsum")
  got = jax.grad(lambda *x: jnp.sum(w * run(*x)), (0, 1, 2, 3))(q, k, v, jnp.asarray(alpha, jnp.float32))
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, alpha, w)]
    dense = lambda q, k, v, a: jnp.sum(x64[4] * family_edge(q, k, v, a, causal=causal))
    want = [np.asarray(r) for r in jax.grad(dense, (0, 1, 2, 3))(*x64[:4])]
  for g, r in zip(got[:3] if static else got, want):
    assert np.abs(r).max() > 1e-3
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


def test_symmetric_logits_backward_is_one_product_on_the_symmetrised_cotangent():
  """At w = w_t (ATAP) the logits' pullback is one 2·d-wide product contracting the n × n cotangent on its last
  axis — no product reading it transposed, which XLA:CPU runs on Eigen — and it equals the float64 VJP; forward
  mode (a custom JVP) equals float64's."""
  q, k, _ = qkv(7)
  g = jax.random.normal(jax.random.PRNGKey(8), (B, H, N, N))
  logits, pullback = jax.vjp(lambda q, k: split.split_logits(q, k, 0.5, 0.5, 0.25), q, k)
  dots = [e for e in jax.make_jaxpr(pullback)(g).jaxpr.eqns if e.primitive.name == "dot_general"]
  assert len(dots) == 1
  (lhs_contract, _), _ = dots[0].params["dimension_numbers"]
  assert dots[0].invars[0].aval.shape[-2:] == (N, N) and tuple(lhs_contract) == (3,)
  assert dots[0].outvars[0].aval.shape[-1] == 2 * D
  with jax.enable_x64(True):
    ref = lambda q, k: 0.25 * 0.5 * (jnp.einsum("bihd,bjhd->bhij", q, k) + jnp.einsum("bihd,bjhd->bhij", k, q))
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, g)]
    want, ref_pullback = jax.vjp(ref, *x64[:2])
    want_grads = ref_pullback(x64[2])
    tq, tk = (jnp.asarray(np.asarray(jax.random.normal(jax.random.PRNGKey(9 + i), q.shape)), jnp.float64)
              for i in range(2))
    _, want_tangent = jax.jvp(ref, tuple(x64[:2]), (tq, tk))
  np.testing.assert_allclose(logits, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_array_equal(logits, jnp.swapaxes(logits, -1, -2))
  for got, r in zip(pullback(g), want_grads):
    np.testing.assert_allclose(got, r, atol=1e-5 * np.abs(r).max(), rtol=1e-5)
  _, tangent = jax.jvp(lambda q, k: split.split_logits(q, k, 0.5, 0.5, 0.25), (q, k),
                       tuple(jnp.asarray(t, jnp.float32) for t in (tq, tk)))           # forward mode too
  np.testing.assert_allclose(tangent, want_tangent, atol=1e-5 * np.abs(want_tangent).max(), rtol=1e-5)


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


# ---- DMAP's Gram: softmax(c·m·mᵀ + bias_j)·v with a one-product backward

def gram64(m, v, bias, c, mask=None, causal=False):
  """softmax(c·m·mᵀ + bias_j, masked)·v written out (any precision): [b, n, h, e]."""
  lg = c * jnp.einsum("bihd,bjhd->bhij", m, m) + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
  keep = jnp.ones(lg.shape, bool) if mask is None else jnp.broadcast_to(mask, lg.shape)
  if causal:
    keep = keep & jnp.tril(jnp.ones(lg.shape[-2:], bool))
  p = jax.nn.softmax(jnp.where(keep, lg, -jnp.inf), -1)
  return jnp.einsum("bhij,bjhe->bihe", p, v)


@pytest.mark.parametrize("causal", [False, True])
def test_gram_attention_matches_float64_in_both_modes(causal):
  """Values, reverse mode (m, v, bias) and forward mode of `kernels.gram_attention` against the formula in float64,
  under a mask."""
  m, v, _ = qkv(10)
  bias = jax.random.normal(jax.random.PRNGKey(11), (B, N, H))
  mask = jax.random.bernoulli(jax.random.PRNGKey(12), 0.7, (B, 1, N, N)) | jnp.eye(N, dtype=bool)
  w = jax.random.normal(jax.random.PRNGKey(13), (B, N, H, D))
  tangents = [jax.random.normal(jax.random.PRNGKey(14 + i), x.shape) for i, x in enumerate((m, v, bias))]
  run = lambda m, v, b: kernels.gram_attention(m, v, c=0.3, bias=b, mask=mask, causal=causal)
  got = run(m, v, bias)
  grads = jax.grad(lambda *x: jnp.sum(w * run(*x)), (0, 1, 2))(m, v, bias)
  _, tangent = jax.jvp(run, (m, v, bias), tuple(tangents))
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x), jnp.float64)
    ref = lambda m, v, b: gram64(m, v, b, 0.3, mask, causal)
    want = ref(x64(m), x64(v), x64(bias))
    want_grads = jax.grad(lambda *x: jnp.sum(x64(w) * ref(*x)), (0, 1, 2))(x64(m), x64(v), x64(bias))
    _, want_tangent = jax.jvp(ref, (x64(m), x64(v), x64(bias)), tuple(x64(t) for t in tangents))
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
  for g, r in zip(grads, want_grads):
    assert np.abs(r).max() > 1e-3
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)
  np.testing.assert_allclose(tangent, want_tangent, atol=2e-5 * np.abs(want_tangent).max(), rtol=1e-4)


def test_gram_logits_backward_is_one_d_wide_product():
  """m̄ = c·(L̄ + L̄ᵀ)·m: one product, d wide, contracting the symmetrised cotangent on its last axis."""
  m, _, _ = qkv(15)
  g = jax.random.normal(jax.random.PRNGKey(16), (B, H, N, N))
  _, pullback = jax.vjp(lambda m: split.gram_logits(m, 0.25), m)
  dots = [e for e in jax.make_jaxpr(pullback)(g).jaxpr.eqns if e.primitive.name == "dot_general"]
  assert len(dots) == 1
  (lhs_contract, _), _ = dots[0].params["dimension_numbers"]
  assert dots[0].invars[0].aval.shape[-2:] == (N, N) and tuple(lhs_contract) == (3,)
  assert dots[0].outvars[0].aval.shape[-1] == D
  with jax.enable_x64(True):
    m64, g64 = (jnp.asarray(np.asarray(x), jnp.float64) for x in (m, g))
    want = jax.vjp(lambda m: 0.25 * jnp.einsum("bihd,bjhd->bhij", m, m), m64)[1](g64)[0]
  np.testing.assert_allclose(pullback(g)[0], want, atol=1e-5 * np.abs(want).max(), rtol=1e-5)


def test_dmap_runs_the_gram_kernel_where_it_pays_and_keeps_its_values():
  """`transport` routes DMAP (β = α = 0.0, inputs of ≥ 32 bits) to `gram_attention` on the einsum kernel up to
  384² entries per head — 5 product units to ATTN's 6 — and the result is the distance form's, in float64 terms,
  gradients included; past 384 keys, in bf16 or blockwise it keeps the augmented heads."""
  unit = 2 * B * H * N * N * D
  assert op.split_kernel(*op.DMAP, "einsum", N) == "gram" and op.split_kernel(*op.DMAP, "einsum", 384) == "gram"
  assert op.split_kernel(*op.DMAP, "einsum", N, masked=True, causal=True) == "gram"
  for args, kw in (((*op.DMAP, "einsum", 385), {}), ((*op.DMAP, "einsum", N), dict(dtype="bfloat16")),
                   ((*op.DMAP, "blockwise", N), {}), ((0.0, jnp.float32(0.0), "einsum", N), {})):
    assert op.split_kernel(*args, **kw) is None, (args, kw)
  assert abs(grad_flops(*op.DMAP) - 5 * unit) < 0.05 * unit and grad_flops(*op.ATTN) == 6 * unit
  q, k, v = qkv(17)
  w = jax.random.normal(jax.random.PRNGKey(18), (B, N, H, D))
  f = lambda q, k, v: op.transport(q, k, v, beta=0.0, alpha=0.0, causal=True, implementation="einsum")
  from helpers import distance_form_reference
  np.testing.assert_allclose(f(q, k, v), distance_form_reference(q, k, v, causal=True), atol=2e-6, rtol=1e-5)
  got = jax.grad(lambda *x: jnp.sum(w * f(*x)), (0, 1, 2))(q, k, v)
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, w)]

    def dense(q, k, v):
      m = (q + k) / np.sqrt(2)
      sq = jnp.sum((m[:, :, None] - m[:, None]) ** 2, -1)                 # [b, i, j, h]
      lg = jnp.transpose(-0.25 / np.sqrt(D) * sq, (0, 3, 1, 2))
      p = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((N, N), bool)), lg, -jnp.inf), -1)
      return jnp.sum(x64[3] * jnp.einsum("bhij,bjhe->bihe", p, v))
    want = jax.grad(dense, (0, 1, 2))(*x64[:3])
  for g, r in zip(got, want):
    assert np.abs(r).max() > 1e-3
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


def test_gram_attention_refuses_bad_arguments_in_one_line():
  m, v, _ = qkv(19)
  cases = [(dict(m=m[0], v=v[0], c=0.5), ValueError, "4-D"), (dict(m=m, v=v[:, :-1], c=0.5), ValueError, "share"),
           (dict(m=m, v=v, c=0.5, bias=jnp.ones((B, N))), ValueError, "bias"),
           (dict(m=m, v=v, c=True), TypeError, "c must"), (dict(m=m, v=v, c=jnp.float32(0.5)), TypeError, "c must")]
  for kwargs, error, word in cases:
    with pytest.raises(error, match=word) as info:
      kernels.gram_attention(**kwargs)
    assert len(str(info.value).splitlines()) == 1
  np.testing.assert_allclose(kernels.gram_attention(m, v, c=np.float32(0.5)), kernels.gram_attention(m, v, c=0.5))
