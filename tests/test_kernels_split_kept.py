"""attngeo.kernels.split_kept: the family's split edges on two tiles, the forward's P kept for the backward.

Values and gradients against the float64 formula (through `operators.transport`, which routes ATAP there on the
blockwise kernel up to `kernels.KEPT_UP_TO` keys) and against the dense softmax of the same logits on every form of
its pair and diagonal tiles (X and Y apart, X ± Y, a Gram term, the Gram alone, no product at all), logits in the
hundreds, the product count of the gradient program (ATAP 6.5 units of n × n × d against ATTN's blockwise 7), the
routing and its bad calls.
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


def edge(q, k, v, alpha, block_size=None, **kw):
  return op.transport(q, k, v, beta=1.0, alpha=alpha, implementation="blockwise", block_size=block_size, **kw)


@pytest.fixture
def calls(monkeypatch):
  """How many times `transport` traced the kept kernel (a spy around `kernels.split_kept_attention`)."""
  return spy_calls(monkeypatch, kernels, "split_kept_attention")


@pytest.mark.parametrize("n,block_size,alpha", [(64, None, 0.0), (64, 32, 0.3), (48, None, 0.0), (2, None, 0.7)])
def test_values_and_gradients_match_float64(n, block_size, alpha, calls):
  assert_edge_matches_float64(lambda q, k, v: edge(q, k, v, alpha, block_size), *qkv(n, n), alpha)
  assert calls[0] > 0


@pytest.mark.parametrize("wx,wt,c", [(0.65, 0.35, 0.0), (0.5, 0.5, 0.0), (1.0, 0.0, 0.0), (0.0, 0.7, 0.0),
                                     (0.2, -0.45, 0.7), (0.35, 0.35, 0.7), (-0.4, 0.4, 0.7), (0.0, 0.0, 0.7),
                                     (0.0, 0.0, 0.0)])
def test_every_tile_form_and_the_bias_gradient_match_the_dense_softmax(wx, wt, c):
  """X and Y apart, the shared X ± Y, with a Gram term and the Gram alone, and no product at all: the values and
  (q, k, v, bias) cotangents against the softmax of the same logits written out densely."""
  q, k, v = qkv(3, 32)
  bias = jax.random.normal(jax.random.PRNGKey(5), (B, 32, H)) * 3
  w = jax.random.normal(jax.random.PRNGKey(6), v.shape)
  s = 0.3

  def dense(q, k, v, bias):
    qk, qq = jnp.einsum("bihd,bjhd->bhij", q, k), jnp.einsum("bihd,bjhd->bhij", q, q)
    lg = s * (wx * qk + wt * jnp.swapaxes(qk, -1, -2) + c * qq) + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
    return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(lg, -1), v)
  kept = lambda q, k, v, bias: kernels.split_kept_attention(q, k, v, weights=(wx, wt), gram=c, bias=bias, scale=s)
  np.testing.assert_allclose(kept(q, k, v, bias), dense(q, k, v, bias), atol=2e-6, rtol=1e-5)
  grad = lambda fn: jax.grad(lambda *a: jnp.sum(w * fn(*a)), (0, 1, 2, 3))(q, k, v, bias)
  got, want = grad(kept), grad(dense)
  for g, r in zip(got, want):
    np.testing.assert_allclose(g, r, atol=2e-5 * max(float(np.abs(r).max()), 1e-30), rtol=1e-4)
  if not (wx or wt):                                                   # k unread: its cotangent exactly 0
    assert float(jnp.abs(got[1]).max()) == 0.0


def test_logits_in_the_hundreds_stay_exact(calls):
  """|L| up to ~300: e^L overflows float32 unless each row's max spans its diagonal tile and both orientations
  of the pair (rows b: the column max of L_baᵀ)."""
  q, k, v = qkv(5, 64, spread=40.0)
  y = edge(q, k, v, 0.3)
  assert calls[0] > 0 and np.all(np.isfinite(y))
  np.testing.assert_allclose(y, family_edge64(q, k, v, 0.3), atol=1e-5, rtol=1e-4)


def test_it_composes_with_jit_and_vmap():
  q, k, v = qkv(6, 16)
  f = lambda q, k, v: kernels.split_kept_attention(q, k, v, weights=(0.5, 0.5), scale=0.4)
  np.testing.assert_allclose(jax.jit(jax.vmap(f))(q[None], k[None], v[None])[0], f(q, k, v), atol=1e-6, rtol=1e-6)


def grad_flops(alpha, n, block_size=None):
  q, k, v = qkv(6, n)
  loss = lambda q, k, v: jnp.sum(op.transport(q, k, v, beta=1.0, alpha=alpha, implementation="blockwise",
                                              block_size=block_size))
  return product_flops(jax.make_jaxpr(jax.grad(loss, (0, 1, 2)))(q, k, v).jaxpr)


def test_atap_runs_six_and_a_half_units_where_attn_runs_seven(calls):
  """In t × t × d products (t = n/2, a quarter of a unit): the forward's pair one 2·d wide (2), its diagonal tiles
  one 2·d wide each (4), P̃·v on four tiles (4); the backward's dP (4), dv (4), the diagonal tiles' [q̄, k̄] from
  their symmetric cotangent (2·d wide: 4) and the pair's Z̄ products (4): 26 = 6.5 units, no recomputation; at α =
  0.3 X and Y apart (+0) and the diagonal tiles' antisymmetric part (+4): 7.5. ATTN's blockwise kernel: 7."""
  n, unit = 64, 2 * B * H * 64 * 64 * D
  assert abs(grad_flops(0.0, n) - 6.5 * unit) < 0.01 * unit
  assert abs(grad_flops(0.3, n) - 7.5 * unit) < 0.01 * unit
  assert calls[0] > 0


def test_routing(calls):
  runs = lambda n, **kw: kernels.runs_split("blockwise", n, static=True, kept=True, **kw)
  assert runs(1024) == "kept" and runs(512) == "kept" and runs(64) == "kept"
  assert runs(2048) == "paired"                                        # past KEPT_UP_TO: n² a head is too much
  assert runs(1023) is None and runs(1026) is None
  assert runs(1024, block_size=256) == "paired"                        # tiles of n/2 over the named tile bound
  assert runs(1024, masked=True) is None and runs(1024, causal=True) is None
  assert kernels.runs_split("blockwise", 1024, static=False, kept=True) is None
  assert kernels.runs_split("blockwise", 1024, static=True) is None    # not asked for
  assert kernels.runs_split(None, 256, static=True, kept=True) == "dense"   # einsum below BLOCKWISE_FROM
  split = op.split_kernel
  assert split(*op.ATAP, "blockwise", 1024) == "kept" and split(1.0, 0.3, "blockwise", 512) == "kept"
  assert split(*op.ATAP, None, 1024) == "kept"                          # the CPU default from 512 keys: blockwise
  assert split(*op.DMAP, "blockwise", 1024) is None and split(*op.DMTN, "blockwise", 1024) is None   # measured slower
  assert split(*op.ATAP, "blockwise", 1024, dtype="bfloat16") is None
  # P's entries in all, b·h·n², up to KEPT_ENTRIES (256 MiB: batch 8 × 8 heads at 1024 keys)
  assert runs(1024, heads=64) == "kept" and runs(1024, heads=65) is None and runs(2048, heads=1) == "paired"
  assert split(*op.ATAP, "blockwise", 1024, heads=64) == "kept" and split(*op.ATAP, "blockwise", 1024, heads=128) is None
  q, k, v = qkv(7, 64)
  edge(q, k, v, 0.0)
  kept = calls[0]
  assert kept > 0
  for kwargs in (dict(mask=jnp.ones((B, 1, 64, 64), bool)), dict(causal=True), dict(alpha=jnp.array([0.0, 0.2, 0.5])),
                 dict(block_size=16)):
    args = dict(alpha=0.0, block_size=None)
    args.update(kwargs)
    edge(q, k, v, args.pop("alpha"), args.pop("block_size"), **args)
    assert calls[0] == kept, kwargs                                    # another kernel ran


def test_transport_keeps_p_only_under_the_entries_cap(calls, monkeypatch):
  """b·h·n² over `KEPT_ENTRIES` (lowered here to just under this call's): ATAP takes another kernel."""
  from attngeo.kernels import dispatch
  q, k, v = qkv(9, 64)
  edge(q, k, v, 0.0)
  assert calls[0] == 1
  monkeypatch.setattr(dispatch, "KEPT_ENTRIES", B * H * 64 * 64 - 1)
  y = edge(q, k, v, 0.0)
  assert calls[0] == 1
  np.testing.assert_allclose(y, family_edge64(q, k, v, 0.0), atol=2e-6, rtol=1e-5)


def test_bad_calls_are_one_line():
  q, k, v = qkv(8, 32)
  with pytest.raises(ValueError, match="n must be even and at least 2; got n = 31"):
    kernels.split_kept_attention(q[:, 1:], k[:, 1:], v[:, 1:], weights=(0.5, 0.5), scale=1.0)
  with pytest.raises(ValueError, match="n must be even and at least 2; got n = 0"):
    kernels.split_kept_attention(q[:, :0], k[:, :0], v[:, :0], weights=(0.5, 0.5), scale=1.0)
  with pytest.raises(ValueError, match=r"q, k and v must be 4-D, \[b, n, h, ·\]"):
    kernels.split_kept_attention(q[0], k[0], v[0], weights=(0.5, 0.5), scale=1.0)
  with pytest.raises(ValueError, match=r"bias must be None or \[b, n, h\] = \[2, 32, 3\] \(a key's logit bias\); got \(2, 32\)"):
    kernels.split_kept_attention(q, k, v, weights=(0.5, 0.5), bias=jnp.zeros((B, 32)), scale=1.0)
  with pytest.raises(ValueError, match=r"static float weights \(w, w_t\); got \(0.5, 0.5, 0.1\)"):
    kernels.split_kept_attention(q, k, v, weights=(0.5, 0.5, 0.1), scale=1.0)
  for bad in (None, True, float("nan")):
    with pytest.raises(ValueError, match="scale must be a finite real number known at trace time"):
      kernels.split_kept_attention(q, k, v, weights=(0.5, 0.5), scale=bad)
  with pytest.raises(ValueError, match="got DynamicJaxprTracer"):
    jax.jit(lambda s: kernels.split_kept_attention(q, k, v, weights=(0.5, 0.5), scale=s))(1.0)
  with pytest.raises(ValueError, match="self-attention"):
    kernels.split_kept_attention(q, k[:, :-2], v, weights=(0.5, 0.5), scale=1.0)
  with pytest.raises(ValueError, match=r"v must be \[b, n, h, e\] = \[2, 32, 3, e\] like q"):
    kernels.split_kept_attention(q, k, v[:, :-1], weights=(0.5, 0.5), scale=1.0)
  with pytest.raises(ValueError, match="static float weights"):
    kernels.split_kept_attention(q, k, v, weights=kernels.split_weights(jnp.zeros(H)), scale=1.0)
  with pytest.raises(ValueError, match="static float gram weight"):
    kernels.split_kept_attention(q, k, v, weights=(0.5, 0.5), gram=jnp.float32(0.5), scale=1.0)
