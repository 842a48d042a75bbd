"""attngeo.kernels.split_paired: the β = 1 edge (ATAP), the β = 0 edge (DMTN) and DMAP's Gram blockwise, each pair
of tiles' products once.

Values and gradients (q, k, v, the key bias) against the float64 formula at two, four and eight tiles,
logits large enough that only a running max on both sides of a pair keeps them finite, the product count
of the gradient program (ATAP: ATTN's blockwise 7 units per tile; DMTN: 9 + 1/T; DMAP's Gram alone: 5 + 1/T; the
augmented heads: 11),
and the routing: `operators.transport` takes this kernel only on the blockwise kernel, unmasked, not causal,
with a static α and keys that cut into pairs of tiles.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import assert_edge_matches_float64, family_edge64, spy_calls

from attngeo import kernels, operators as op
from attngeo.experiments.time_parts import product_flops

B, H, D = 2, 3, 8


def qkv(seed, n, spread=1.0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  q, k, v = (jax.random.normal(kk, (B, n, H, D)) for kk in ks)
  return q * spread, k, v


def edge(q, k, v, alpha, block_size, **kw):
  return op.transport(q, k, v, beta=1.0, alpha=alpha, implementation="blockwise", block_size=block_size, **kw)


@pytest.fixture
def calls(monkeypatch):
  """How many times `transport` traced the paired kernel (a spy around `kernels.split_paired_attention`; a call
  traces it twice: the value, and the overflow mend's rerun, `operators._mend_overflow`)."""
  return spy_calls(monkeypatch, kernels, "split_paired_attention")


@pytest.mark.parametrize("n,block_size,alpha", [(64, 16, 0.0), (48, 12, 0.3), (64, 8, 0.0)])   # 4, 4 (of 12), 8 tiles
def test_values_and_gradients_match_float64(n, block_size, alpha, calls):
  assert_edge_matches_float64(lambda q, k, v: edge(q, k, v, alpha, block_size), *qkv(n, n), alpha)
  assert calls[0] > 0


@pytest.mark.parametrize("weights", [(0.65, 0.35), (0.5, 0.5)])       # X and Y; the symmetric pairs' one product
def test_the_key_bias_gradient_matches_the_dense_split_kernel(weights):
  """The kernel's own bias cotangent (transport's ATAP bias is a function of q, k; here an input)."""
  q, k, v = qkv(2, 32)
  bias = jax.random.normal(jax.random.PRNGKey(3), (B, 32, H)) * 3
  w = jax.random.normal(jax.random.PRNGKey(4), v.shape)
  run = lambda fn, **kw: jax.grad(lambda *a: jnp.sum(w * fn(*a[:3], bias=a[3], weights=weights, scale=0.3, **kw)),
                                  (0, 1, 2, 3))(q, k, v, bias)
  for g, r in zip(run(kernels.split_paired_attention, block_size=8), run(kernels.split_attention)):
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


def test_logits_in_the_hundreds_stay_exact_on_both_sides_of_a_pair(calls):
  """|L| up to ~300: e^L overflows float32 unless each side of a pair tile (rows a: the row max; rows b: the
  column max of L_baᵀ) and the final merge keep their own running max."""
  q, k, v = qkv(5, 64, spread=40.0)
  y = edge(q, k, v, 0.3, 16)
  assert calls[0] > 0 and np.all(np.isfinite(y))
  np.testing.assert_allclose(y, family_edge64(q, k, v, 0.3), atol=1e-5, rtol=1e-4)


def grad_flops(beta, alpha, n, block_size):
  q, k, v = qkv(6, n)
  loss = lambda q, k, v: jnp.sum(op.transport(q, k, v, beta=beta, alpha=alpha, implementation="blockwise",
                                              block_size=block_size))
  return product_flops(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v).jaxpr)


@pytest.mark.parametrize("n,block_size", [(64, 16), (64, 8)])
def test_the_edge_runs_attention_s_blockwise_product_count(n, block_size):
  """Forward + backward: 7 n × n × d units, as ATTN's recomputing blockwise kernel, where the augmented heads
  (2·d wide) ran 11 — a count, not a timing (docs/benchmarks.md has the times)."""
  unit = 2 * B * H * n * n * D
  assert grad_flops(*op.ATTN, n, block_size) == 7 * unit
  assert abs(grad_flops(*op.ATAP, n, block_size) - 7 * unit) < 0.01 * unit
  assert grad_flops(0.5, 0.5, n, block_size) >= 11 * unit                # off both edges: the augmented heads


def test_pairs_form_their_shared_product_part_in_one_product_two_heads_wide(calls):
  """ATAP at α = 0 (w = w_t) and the β = 0 edge (w = −w_t, beside its Gram) take Z = s·w·[q_a, k_a]·[k_b, ±q_b]ᵀ
  for X ± Y: products that contract 2·d (Z in the forward, and again in the backward's recomputation; the gradients
  Z̄·[k_b, ±q_b] contract the tile); ATAP at α = 0.3 takes X and Y apart, d wide, and none do. Each on the pairs
  kernel (`calls`: the augmented heads contract 2·d too). The units stay 7 and 9 + 1/T (above, below)."""
  def wide_products(beta, alpha, block_size):        # tiles of 8 or 4 tokens: no other product contracts 2·D = 16
    q, k, v = qkv(6, 64)
    loss = lambda q, k, v: jnp.sum(op.transport(q, k, v, beta=beta, alpha=alpha, implementation="blockwise",
                                                block_size=block_size))
    found = []

    def walk(jaxpr):
      for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
          (lc, _), _ = eqn.params["dimension_numbers"]
          found.append(np.prod([eqn.invars[0].aval.shape[i] for i in lc]) == 2 * D)
        for value in eqn.params.values():
          for sub in value if isinstance(value, (tuple, list)) else (value,):
            if hasattr(getattr(sub, "jaxpr", sub), "eqns"):
              walk(getattr(sub, "jaxpr", sub))
    walk(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v).jaxpr)
    return sum(found)
  for beta, alpha, block_size, wide in ((1.0, 0.0, 8, True), (1.0, 0.3, 8, False), (0.0, 1.0, 4, True)):
    before = calls[0]
    assert (wide_products(beta, alpha, block_size) > 0) == wide and calls[0] > before, (beta, alpha)


@pytest.mark.parametrize("n,block_size", [(64, 4), (96, 4)])                 # 16 and 32 tiles
def test_the_beta0_edge_runs_nine_units_per_tile(n, block_size):
  """DMTN on (m, n): X_ab, X_ba and the Gram G_ab per pair of tiles. A pair: forward 3 + 2 value products,
  backward 3 + 2 dP + 2 dv + 6 gradients = 18 units over two tiles' area; a diagonal tile 10 (its Gram is its
  own). So (9·T(T − 1) + 10·T)/T² = 9 + 1/T units of n × n × d, against the augmented heads' 11."""
  unit, tiles = 2 * B * H * n * n * D, kernels.tiling(n, block_size)[0]
  assert abs(grad_flops(*op.DMTN, n, block_size) - (9 + 1 / tiles) * unit) < 0.01 * unit
  assert abs(grad_flops(0.0, 0.4, n, block_size) - (9 + 1 / tiles) * unit) < 0.01 * unit


@pytest.mark.parametrize("n,block_size", [(64, 16), (64, 4)])                 # 4 and 16 tiles
def test_dmap_runs_its_gram_alone_at_five_units_per_tile(n, block_size, calls):
  """DMAP on pairs of tiles: the Gram G_ab = m_a·m_bᵀ per pair and no X, Y. A pair: forward 1 + 2 value products,
  backward 1 + 2 dP + 2 dv + 2 gradients = 10 units over two tiles' area; a diagonal tile 6. So 5 + 1/T units of
  n × n × d, against ATTN's 7 (and the heads (m, m/2) DMAP ran on before: ATTN's 7)."""
  unit, tiles = 2 * B * H * n * n * D, kernels.tiling(n, block_size)[0]
  assert abs(grad_flops(*op.DMAP, n, block_size) - (5 + 1 / tiles) * unit) < 0.01 * unit and calls[0] > 0


@pytest.mark.parametrize("causal", [False, True])
def test_dmap_on_pairs_matches_the_distance_form_at_huge_norms(causal, calls):
  """|q| ≈ 1e20 on half the tokens, 8 tiles: on pairs (not causal) as on the blockwise kernel (causal), far
  tokens are isolated (`operators._FAR`) and every row is the float64 distance form; the gradients of the plain
  tokens' half (their rows and keys only, 4 tiles) match the float64 formula's."""
  from helpers import distance_form_reference, huge_and_plain_tokens
  q, k, v = (jnp.asarray(x) for x in huge_and_plain_tokens(n=32))
  run = lambda q, k, v: op.transport(q, k, v, beta=0.0, alpha=0.0, causal=causal, implementation="blockwise",
                                     block_size=4)
  np.testing.assert_allclose(run(q, k, v), distance_form_reference(q, k, v, causal=causal), rtol=1e-5, atol=1e-5)
  assert (calls[0] > 0) != causal
  plain, before = slice(16, None), calls[0]
  qp, kp, vp = q[:, plain], k[:, plain], v[:, plain]
  w = jax.random.normal(jax.random.PRNGKey(9), vp.shape)
  got = jax.grad(lambda *a: jnp.sum(w * run(*a)), (0, 1, 2))(qp, kp, vp)
  assert (calls[0] > before) != causal
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (qp, kp, vp, w)]
    want = jax.grad(lambda *a: jnp.sum(x64[3] * family_beta0(*a, 0.0, causal)), (0, 1, 2))(*x64[:3])
  for g, r in zip(got, want):
    r = np.asarray(r)
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


def test_no_products_at_all_is_the_softmax_of_the_bias():
  """w = w_t = c = 0: every logit is its key's bias, y = softmax(bias)·v, and the cotangents of q and k are 0 —
  the forward and backward of a pair and of a diagonal tile with no product at all."""
  q, k, v = qkv(4, 32)
  bias = jax.random.normal(jax.random.PRNGKey(8), (B, 32, H)) * 2
  w = jax.random.normal(jax.random.PRNGKey(9), v.shape)
  run = lambda q, k, v, bias: kernels.split_paired_attention(q, k, v, weights=(0.0, 0.0), bias=bias, scale=0.3,
                                                             block_size=8)
  def dense(q, k, v, bias):                                       # every row the same: softmax(bias)·v
    return jnp.broadcast_to(jnp.einsum("bjh,bjhe->bhe", jax.nn.softmax(bias, 1), v)[:, None], v.shape)
  np.testing.assert_allclose(run(q, k, v, bias), dense(q, k, v, bias), atol=2e-6, rtol=1e-5)
  grads = [jax.grad(lambda *a: jnp.sum(w * f(*a)), (0, 1, 2, 3))(q, k, v, bias) for f in (run, dense)]
  for g, r in zip(*grads):
    np.testing.assert_allclose(g, r, atol=2e-5 * max(float(np.abs(r).max()), 1e-30), rtol=1e-4)
  assert float(jnp.abs(grads[0][0]).max()) == 0.0 and float(jnp.abs(grads[0][1]).max()) == 0.0


def family_beta0(q, k, v, alpha, causal=False):
  """P(β = 0, α)·v from the module formula of `attngeo.operators`, written in q and k (float64 below):
  s·[¼(q_i + k_i)·(q_j + k_j) + α·½(q_i·k_j − k_i·q_j)] + s·(1 − α)·½·(g_i − g_j), g = ¼‖q + k‖²."""
  qk = jnp.einsum("bihd,bjhd->bhij", q, k)
  mm = jnp.einsum("bihd,bjhd->bhij", q + k, q + k) / 4
  g = jnp.sum((q + k) ** 2, -1).transpose(0, 2, 1) / 4
  lg = (mm + alpha * 0.5 * (qk - jnp.swapaxes(qk, -1, -2)) + (1 - alpha) * 0.5 * (g[..., :, None] - g[..., None, :]))
  lg = lg / np.sqrt(q.shape[-1])
  if causal:
    lg = jnp.where(jnp.tril(jnp.ones(lg.shape[-2:], bool)), lg, -jnp.inf)
  p = jax.nn.softmax(lg, -1)
  return jnp.einsum("bhij,bjhe->bihe", p, v)


@pytest.mark.parametrize("n,block_size,alpha", [(64, 4, 1.0), (48, 3, 0.4), (32, 2, 1.0)])   # 16 tiles each
def test_the_beta0_edge_matches_float64(n, block_size, alpha, calls):
  q, k, v = qkv(n + 1, n)
  w = jax.random.normal(jax.random.PRNGKey(2), v.shape)
  run = lambda q, k, v: op.transport(q, k, v, beta=0.0, alpha=alpha, implementation="blockwise", block_size=block_size)
  y, grads = run(q, k, v), jax.grad(lambda *a: jnp.sum(w * run(*a)), (0, 1, 2))(q, k, v)
  assert calls[0] > 0
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, w)]
    want_y = family_beta0(*x64[:3], alpha)
    want = jax.grad(lambda *a: jnp.sum(x64[3] * family_beta0(*a, alpha)), (0, 1, 2))(*x64[:3])
  np.testing.assert_allclose(y, np.asarray(want_y), atol=2e-6, rtol=1e-5)
  for g, r in zip(grads, want):
    r = np.asarray(r)
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


@pytest.mark.parametrize("wx,wt", [(0.2, -0.45), (0.35, 0.35), (-0.4, 0.4), (0.0, 0.0)])  # X, Y apart; X ± Y; Gram alone
def test_the_gram_term_and_its_bias_gradient_match_the_einsum_kernel(wx, wt):
  """The kernel's values and (q, k, v, bias) cotangents with a Gram weight, against the softmax of the same
  logits written out densely, on each of its pair forms (the Gram alone: k unread, its cotangent exactly 0)."""
  q, k, v = qkv(3, 32)
  bias = jax.random.normal(jax.random.PRNGKey(5), (B, 32, H)) * 3
  w = jax.random.normal(jax.random.PRNGKey(6), v.shape)
  s, c = 0.3, 0.7

  def dense(q, k, v, bias):
    qk, qq = jnp.einsum("bihd,bjhd->bhij", q, k), jnp.einsum("bihd,bjhd->bhij", q, q)
    lg = s * (wx * qk + wt * jnp.swapaxes(qk, -1, -2) + c * qq) + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
    return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(lg, -1), v)
  paired = lambda q, k, v, bias: kernels.split_paired_attention(q, k, v, weights=(wx, wt), gram=c, bias=bias, scale=s,
                                                                block_size=8)
  np.testing.assert_allclose(paired(q, k, v, bias), dense(q, k, v, bias), atol=2e-6, rtol=1e-5)
  grad = lambda fn: jax.grad(lambda *a: jnp.sum(w * fn(*a)), (0, 1, 2, 3))(q, k, v, bias)
  for g, r in zip(grad(paired), grad(dense)):
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)


def test_routing_keeps_the_augmented_heads_off_its_domain(calls):
  runs = kernels.runs_split
  assert runs("blockwise", 2048, static=True) == "paired"
  assert runs("blockwise", 1024, static=True) is None                    # two tiles: the pairing costs more
  assert runs("blockwise", 2048, static=True, masked=True) is None
  assert runs("blockwise", 2048, static=True, causal=True) is None
  assert runs("blockwise", 2048, static=False) is None                   # a per-head α array
  assert runs("blockwise", 2049, static=True) is None                    # one tile of 2049: n × n memory
  assert runs("einsum", 2048, static=True) is None and runs("einsum", 256, static=True) == "dense"
  split = op.split_kernel
  assert split(*op.DMTN, "blockwise", 8192) == "paired" and split(0.0, 0.3, "blockwise", 8192) == "paired"
  assert split(*op.DMTN, "blockwise", 4096) is None                    # 8 tiles: the augmented heads are as fast
  assert split(*op.DMTN, "blockwise", 64, block_size=4) == "paired" and split(*op.ATAP, "blockwise", 4096) == "paired"
  assert split(*op.DMTN, "blockwise", 64, block_size=8) is None        # 8 tiles (tiles halve: 8, then 16)
  assert split(*op.DMTN, "blockwise", 8192, block_size=256) == "paired"              # 32 tiles
  # on the default block (batch_heads = b·h given): DMTN keeps the augmented heads where they run on blocks over 512
  assert split(*op.DMTN, "blockwise", 16384, batch_heads=32) == "paired" and split(0.0, 0.3, "blockwise", 8192,
                                                                                   batch_heads=64) == "paired"
  assert split(*op.DMTN, "blockwise", 16384, batch_heads=8) is None and split(0.0, 0.3, "blockwise", 8192,
                                                                            batch_heads=1) is None
  assert split(*op.ATAP, "blockwise", 4096, batch_heads=1) == "paired" and split(*op.DMAP, "blockwise", 2048,
                                                                                 batch_heads=1) == "paired"
  assert split(*op.DMTN, "einsum", 256) is None                        # the dense split is the β = 1 edge's only
  assert split(*op.DMAP, "blockwise", 2048) == "paired" and split(*op.DMAP, "blockwise", 1024) is None  # its Gram
  assert split(*op.DMAP, "einsum", 256) == "gram" and split(*op.DMAP, "einsum", 448) is None
  for args, kw in (((*op.DMAP, "blockwise", 2048), dict(masked=True)), ((*op.DMAP, "blockwise", 2048), dict(causal=True)),
                   ((*op.ATTN, "blockwise", 8192), {}),
                   ((*op.DMTN, "blockwise", 8192), dict(causal=True)), ((*op.DMTN, "blockwise", 8192), dict(masked=True)),
                   ((*op.DMTN, "blockwise", 8192), dict(dtype="bfloat16")), ((0.0, jnp.ones(3), "blockwise", 8192), {})):
    assert split(*args, **kw) is None, (args, kw)
  q, k, v = qkv(7, 64)
  edge(q, k, v, 0.0, 16)
  paired = calls[0]
  assert paired > 0
  alpha_per_head = jnp.array([0.0, 0.2, 0.5])
  for kwargs in (dict(mask=jnp.ones((B, 1, 64, 64), bool)), dict(causal=True), dict(alpha=alpha_per_head),
                 dict(block_size=32), dict(q=q.astype(jnp.bfloat16))):       # two tiles of 32: the kept kernel
    args = dict(q=q, k=k, v=v, alpha=0.0, block_size=16)
    args.update(kwargs)
    qq = args.pop("q")
    edge(qq, args.pop("k").astype(qq.dtype), args.pop("v").astype(qq.dtype), args.pop("alpha"), args.pop("block_size"),
         **args)
    assert calls[0] == paired, kwargs                                    # another kernel ran


def test_bad_calls_are_one_line():
  q, k, v = qkv(8, 32)
  with pytest.raises(ValueError, match="self-attention"):
    kernels.split_paired_attention(q, k[:, :-2], v, weights=(0.5, 0.5), scale=1.0)
  with pytest.raises(ValueError, match=r"needs n = T·t keys in T ≥ 2 tiles of t ≤ block_size = 32; got n = 32"):
    kernels.split_paired_attention(q, k, v, weights=(0.5, 0.5), scale=1.0, block_size=32)
  with pytest.raises(ValueError, match=r"v must be \[b, n, h, e\] = \[2, 32, 3, e\] like q"):
    kernels.split_paired_attention(q, k, v[:, :-1], weights=(0.5, 0.5), scale=1.0, block_size=8)
  for bad in (0, 16.5, True):
    with pytest.raises(ValueError, match=rf"^block_size must be a positive integer; got {bad!r}$"):
      kernels.split_paired_attention(q, k, v, weights=(0.5, 0.5), scale=1.0, block_size=bad)
    with pytest.raises(ValueError, match=rf"^block_size must be a positive integer; got {bad!r}$"):
      op.transport(q, k, v, beta=1.0, alpha=0.0, implementation="blockwise", block_size=bad)
  with pytest.raises(ValueError, match="static float weights"):
    kernels.split_paired_attention(q, k, v, weights=kernels.split_weights(jnp.zeros(H)), scale=1.0, block_size=16)
  with pytest.raises(ValueError, match="static float gram weight"):
    kernels.split_paired_attention(q, k, v, weights=(0.5, 0.5), gram=jnp.float32(0.5), scale=1.0, block_size=16)
