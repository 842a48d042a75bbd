"""The paired (Hermitian) kernel of CMAP at β = 0, against complex128 numpy and complex autodiff.

Theorem checked: the tiles carry every ordered token pair (i, j) to row i exactly once (pair tiles
both ways round, diagonal tiles one way), for lengths that halve evenly, stop at an odd part, or do
not halve.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo.kernels import paired as hk
from attngeo import operators as op
from test_magnetic import B, H, dense_out, qkv, reference

CASES = [(1, 4), (8, 4), (24, 4), (29, 4)]     # (n, block): one tile; 2 tiles (kept); 8 tiles of 3 (recomputed); odd


def _coverage(n, block_size):
  """count[i, j]: how many computed entries carry the pair (i, j) to row i — a pair tile (a, b) gives
  both (i, j) and (j, i), a diagonal tile only (i, j)."""
  tiles, t = hk.tiling(n, block_size)
  count = np.zeros((n, n), int)
  for a in range(tiles):
    count[a * t:(a + 1) * t, a * t:(a + 1) * t] += 1
  for a, b in hk.pair_tasks(tiles):
    count[a * t:(a + 1) * t, b * t:(b + 1) * t] += 1
    count[b * t:(b + 1) * t, a * t:(a + 1) * t] += 1
  return count


@pytest.mark.parametrize("n,block", CASES + [(1024, 512), (96, 8)])
def test_the_tiles_cover_every_pair_exactly_once(n, block):
  np.testing.assert_array_equal(_coverage(n, block), np.ones((n, n), int))


def test_tiling_and_memory_rule():
  assert [hk.tiling(n, b) for n, b in [(1024, 512), (24, 4), (29, 4), (512, 512), (1, 1), (4096, 512)]] == \
      [(2, 512), (8, 3), (1, 29), (1, 512), (1, 1), (8, 512)]
  assert [hk._saves_pairs(t) for t in (1, 2, 3, 4, 8)] == [True, True, True, False, False]
  assert hk.pair_tasks(4).tolist() == [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]


def _paired(q, k, v, coupling, block):
  return op.magnetic_transport(q, k, v, coupling=coupling, implementation="paired", block_size=block)


@pytest.mark.parametrize("n,block", [(24, 4), (29, 4)])     # (8, 4): with the gradients below
def test_matches_the_complex_reference(n, block):
  q, k, v = qkv(11, n=n)
  coupling = np.array([0.0, -0.7, 2.5], np.float32)
  out = jax.jit(_paired, static_argnums=4)(q, k, v, coupling, block)
  np.testing.assert_allclose(out, reference(q, k, v, 0.0, coupling), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("n,block", [(24, 4), (8, 4)])
def test_gradients_match_autodiff_of_the_complex_matrix(n, block):
  """d/d(q, k, v, γ) through the paired VJP (8 tiles recomputed; 2 tiles kept) = autodiff of the dense
  complex matrix."""
  q, k, v = qkv(12, n=n)
  g0 = jnp.array([0.5, 1.0, -2.0])
  f = lambda fn: (lambda *a: jnp.sum(jnp.sin(fn(*a))))
  paired = f(lambda q, k, v, g: _paired(q, k, v, g, block))
  dense = f(lambda q, k, v, g: dense_out(q, k, v, 0.0, g))
  (value, got), (want_value, want) = (jax.jit(jax.value_and_grad(fn, range(4)))(q, k, v, g0) for fn in (paired, dense))
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  for a, b in zip(got, want):
    assert float(jnp.abs(b).min() if b.ndim == 1 else jnp.abs(b).max()) > 1e-3       # real gradients
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-4)


def test_gradients_on_peaked_rows_are_float32_accurate():
  """Keys 4× spread (near one-hot rows, where Φ = Re(BH) + G(gD_i + gD_j) cancels): dq, dk, dγ within 2e-5
  of float64 autodiff of the dense matrix, as the einsum kernel's are (tested in test_magnetic)."""
  q, k, v = (x * s for x, s in zip(qkv(13, n=16), (4.0, 4.0, 1.0)))
  w, g0 = jax.random.normal(jax.random.PRNGKey(5), v.shape), jnp.array([0.5, -1.0, 2.0])
  loss = lambda q, k, g: jnp.sum(w * _paired(q, k, v, g, 4))
  got = jax.jit(jax.grad(loss, range(3)))(q, k, g0)
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x), jnp.float64)
    ref = lambda q, k, g: jnp.sum(x64(w) * dense_out(q, k, x64(v), 0.0, g))
    want = [np.asarray(a) for a in jax.jit(jax.grad(ref, range(3)))(x64(q), x64(k), x64(g0))]
  for a, b in zip(got, want):
    assert np.abs(np.asarray(a, np.float64) - b).max() <= 2e-5 * np.abs(b).max()


def test_bf16_inputs_keep_their_dtypes_and_float32_values():
  """16-bit inputs are upcast (float32 throughout): the output and the gradients come back in their dtypes,
  equal to the float32 kernel's on the same (rounded) inputs up to the final rounding to bf16."""
  q, k, v = (x.astype(jnp.bfloat16) for x in qkv(14, n=8))
  w = jax.random.normal(jax.random.PRNGKey(6), v.shape)
  loss = lambda q, k, v, g: jnp.sum(w * _paired(q, k, v, g, 4).astype(jnp.float32))
  g0 = jnp.full((H,), 0.5)
  grads = jax.jit(jax.grad(loss, range(4)))(q, k, v, g0)
  want = jax.jit(jax.grad(loss, range(4)))(*(x.astype(jnp.float32) for x in (q, k, v)), g0)
  assert [g.dtype for g in grads] == [jnp.bfloat16] * 3 + [jnp.float32]
  for a, b in zip(grads, want):
    np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=1e-2, atol=1e-2 * float(jnp.abs(b).max()))


def test_huge_inputs_stay_finite():
  """At |q|, |k| ~ 1e4 rounding put log G_ii in [−96, 160] before G was clamped (NaN from 0/0 and inf/inf)."""
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 64, 2, 64)) for i in range(3))
  q, k = 1e4 * q, 1e4 * k
  out = _paired(q, k, v, 0.0, 32)                       # two tiles: the diagonal's and the pair tile's clamp
  assert bool(jnp.isfinite(out).all())
  np.testing.assert_allclose(out, op.magnetic_transport(q, k, v, coupling=0.0, implementation="einsum"), atol=1e-5)


def test_block_size_forms_and_the_attention_layer():
  q, k, v = qkv(17, n=4)
  want = _paired(q, k, v, 0.5, 4)
  for bs in (np.int64(4), 4.0):
    np.testing.assert_array_equal(_paired(q, k, v, 0.5, bs), want)
  from flax import nnx
  from attngeo import nn
  x = jax.random.normal(jax.random.PRNGKey(1), (B, 4, 16))
  cmap = nn.Attention(nn.BlockConfig(width=16, num_heads=H, head_dim=8, operator="CMAP", implementation="paired"),
                      rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="needs mask=None and causal=False"):   # reached: the layer passes it on
    cmap(x, mask=jnp.ones((B, 1, 1, 4), bool))
  nn.graft(cmap, "DMAP")
  assert bool(jnp.isfinite(cmap(x)).all())               # the family ignores the CMAP-only kernel name


@pytest.mark.parametrize("kwargs,match", [
    (dict(beta=0.4), "needs beta=0.0"),
    (dict(beta=np.zeros(H, np.float32)), "needs beta=0.0"),
    (dict(causal=True), "needs mask=None and causal=False"),
    (dict(mask=np.ones((B, 1, 1, 29), bool)), "needs mask=None and causal=False"),
    (dict(block_size=0), "block_size must be a positive integer"),
])
def test_out_of_scope_calls_get_one_line(kwargs, match):
  q, k, v = qkv()
  with pytest.raises(ValueError, match=match):
    op.magnetic_transport(q, k, v, implementation="paired", **kwargs)
