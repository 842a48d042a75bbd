"""attngeo.operators: every (β, α) on every kernel against the dense reference and the closed forms
(the kernels on their own: tests/test_kernels.py)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo import kernels, operators as op
from helpers import distance_form_reference, family_exact, huge_and_plain_tokens

B, N, H, D = 2, 33, 3, 8
PARAMS = [op.ATTN, op.DMTN, op.ATAP, op.DMAP, (0.3, 0.7), (0.81, 0.05),
          (np.array([0.0, 0.5, 1.0], np.float32), np.array([1.0, 0.2, 0.0], np.float32))]
IMPLS = ["einsum", "xla", "blockwise"] + (["cudnn"] if jax.default_backend() == "gpu" else [])


def tol(impl, atol, rtol=1e-7):
  """cuDNN computes in bf16 (GPU only): its parity is checked at bf16 precision."""
  return dict(atol=3e-2, rtol=3e-2) if impl == "cudnn" else dict(atol=atol, rtol=rtol)


def qkv(seed=0, n=N, d=D):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(kk, (B, n, H, d)) for kk in ks]


def dense_out(q, k, v, beta, alpha, causal=False, mask=None):
  p = op.markov_matrix(q, k, beta=beta, alpha=alpha, causal=causal, mask=mask)
  return jnp.einsum("bhij,bjhe->bihe", p, v)


@pytest.mark.parametrize("beta,alpha", PARAMS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_kernels_match_dense_reference(beta, alpha, causal, impl):
  q, k, v = qkv()
  out = op.transport(q, k, v, beta=beta, alpha=alpha, causal=causal, implementation=impl, block_size=16)
  np.testing.assert_allclose(out, dense_out(q, k, v, beta, alpha, causal), **tol(impl, 3e-6, 1e-5))


@pytest.mark.parametrize("impl", IMPLS)
def test_explicit_mask(impl):
  q, k, v = qkv(1)
  mask = jax.random.bernoulli(jax.random.PRNGKey(5), 0.6, (B, 1, N, N)) | jnp.eye(N, dtype=bool)
  out = op.transport(q, k, v, beta=0.4, alpha=0.6, mask=mask, implementation=impl, block_size=16)
  np.testing.assert_allclose(out, dense_out(q, k, v, 0.4, 0.6, mask=mask), **tol(impl, 3e-6))


def test_attn_corner_is_standard_attention():
  q, k, v = qkv(2)
  for causal in (False, True):
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    for impl in IMPLS:
      out = op.transport(q, k, v, beta=1.0, alpha=1.0, causal=causal, implementation=impl, block_size=16)
      np.testing.assert_allclose(out, ref, **tol(impl, 1e-6))


def _closed_form(q, k, name):
  s = 1 / math.sqrt(q.shape[-1])
  qf, kf = jnp.transpose(q, (0, 2, 1, 3)), jnp.transpose(k, (0, 2, 1, 3))   # [b,h,n,d]
  m = (qf + kf) / math.sqrt(2)
  dot = lambda x, y: jnp.einsum("bhid,bhjd->bhij", x, y)
  if name == "ATTN":
    lg = s * dot(qf, kf)
  elif name == "DMTN":
    lg = s * (0.5 * dot(m, m) + 0.5 * (dot(qf, kf) - dot(kf, qf)))
  elif name == "ATAP":
    dq = qf[:, :, :, None] - qf[:, :, None]
    dk = kf[:, :, :, None] - kf[:, :, None]
    lg = -0.5 * s * jnp.sum(dq * dk, -1)
  else:  # DMAP: Gaussian kernel on m
    lg = -0.25 * s * jnp.sum((m[:, :, :, None] - m[:, :, None]) ** 2, -1)
  return jax.nn.softmax(lg, -1)


@pytest.mark.parametrize("name", ["ATTN", "DMTN", "ATAP", "DMAP"])
def test_corner_closed_forms(name):
  q, k, _ = qkv(3)
  p = op.markov_matrix(q, k, beta=op.corner(name)[0], alpha=op.corner(name)[1])
  np.testing.assert_allclose(p, _closed_form(q, k, name), atol=2e-6)


def test_logit_split_is_symmetric_plus_antisymmetric():
  q, k, _ = qkv(4)
  lg = op.logits(q, k, beta=0.3, alpha=0.6)
  np.testing.assert_allclose(lg.sym, jnp.swapaxes(lg.sym, -1, -2), atol=1e-5)
  np.testing.assert_allclose(lg.skew, -jnp.swapaxes(lg.skew, -1, -2), atol=1e-5)
  np.testing.assert_allclose(lg.full, lg.sym + lg.skew, atol=1e-5)


def test_dmap_depends_on_w_plus_only():
  """Moving along the flat gauge direction n = (q − k)/√2 leaves DMAP unchanged."""
  q, k, v = qkv(5)
  shift = jax.random.normal(jax.random.PRNGKey(9), q.shape)
  a = op.transport(q, k, v, beta=0.0, alpha=0.0)
  b = op.transport(q + shift, k - shift, v, beta=0.0, alpha=0.0)
  np.testing.assert_allclose(a, b, atol=2e-5)


def test_static_and_traced_coefficients_agree():
  q, k, v = qkv(6)
  for beta, alpha in [op.DMAP, op.ATTN, op.DMTN, op.ATAP]:
    static = op.transport(q, k, v, beta=beta, alpha=alpha)
    traced = jax.jit(lambda b_, a_: op.transport(q, k, v, beta=b_, alpha=a_))(beta, alpha)
    np.testing.assert_allclose(static, traced, atol=2e-6)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("beta,alpha", [(0.3, 0.4), op.DMAP])
def test_gradients_match_dense(impl, beta, alpha):
  q, k, v = qkv(7, n=20)
  f = lambda fn: (lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v))))
  fused = f(lambda q, k, v: op.transport(q, k, v, beta=beta, alpha=alpha, causal=True, implementation=impl, block_size=8))
  dense = f(lambda q, k, v: dense_out(q, k, v, beta, alpha, causal=True))
  for a, b in zip(jax.grad(fused, (0, 1, 2))(q, k, v), jax.grad(dense, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, **tol(impl, 2e-5, 1e-4))


@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_with_a_key_mask_match_dense(impl):
  q, k, v = qkv(8, n=20)
  mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.5, (B, 1, 20, 20)) | jnp.eye(20, dtype=bool)
  f = lambda fn: (lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v))))
  fused = f(lambda q, k, v: op.transport(q, k, v, beta=0.5, alpha=0.5, mask=mask, implementation=impl, block_size=8))
  dense = f(lambda q, k, v: dense_out(q, k, v, 0.5, 0.5, mask=mask))
  for a, b in zip(jax.grad(fused, (0, 1, 2))(q, k, v), jax.grad(dense, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(a, b, **tol(impl, 2e-5, 1e-4))


def test_coefficient_gradients_match_dense():
  """dL/dβ, dL/dα per head through the fused kernel equal those of the dense reference."""
  q, k, v = qkv(9)
  fused = lambda b_, a_: jnp.sum(op.transport(q, k, v, beta=b_, alpha=a_) ** 2)
  dense = lambda b_, a_: jnp.sum(dense_out(q, k, v, b_, a_) ** 2)
  b0, a0 = jnp.array([0.2, 0.5, 0.9]), jnp.array([0.7, 0.5, 0.1])
  for a, b in zip(jax.grad(fused, (0, 1))(b0, a0), jax.grad(dense, (0, 1))(b0, a0)):
    assert float(jnp.abs(b).min()) > 1e-3            # a real gradient, not round-off
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)


def test_coefficient_gradients_at_the_edges_are_finite_and_exact():
  """At β = 1 (ATAP's edge, where a learnable β is clipped) and β = 0, dL/dβ and dL/dα are the dense
  reference's, not NaN (a √(1 − β) in the key bias made them NaN at β = 1); a β clipped from above gets 0."""
  q, k, v = qkv(9)
  fused = lambda b_, a_: jnp.sum(op.transport(q, k, v, beta=b_, alpha=a_) ** 2)
  dense = lambda b_, a_: jnp.sum(dense_out(q, k, v, b_, a_) ** 2)
  b0, a0 = jnp.array([1.0, 0.0, 1.0]), jnp.array([0.3, 0.6, 0.0])
  for a, b in zip(jax.grad(fused, (0, 1))(b0, a0), jax.grad(dense, (0, 1))(b0, a0)):
    assert float(jnp.abs(b).min()) > 1e-3
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-5)
  clipped = jax.grad(lambda raw: fused(jnp.clip(raw, 0.0, 1.0), a0))(jnp.array([1.2, 0.5, 1.3]))
  assert bool(jnp.all(jnp.isfinite(clipped))) and float(clipped[0]) == float(clipped[2]) == 0.0


@pytest.mark.parametrize("impl", ["einsum", "blockwise"])
def test_bf16_error_of_every_member_is_within_3x_attention(impl):
  """16-bit inputs: augmented keys are split hi + lo, so mixed members are as accurate as ATTN."""
  ks = jax.random.split(jax.random.PRNGKey(10), 3)
  for mult in (1.0, 10.0, 30.0):
    q, k, v = [(jax.random.normal(kk, (B, 64, H, 16)) * (mult if i < 2 else 1.0) / 2).astype(jnp.bfloat16)
               for i, kk in enumerate(ks)]
    q32, k32, v32 = q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32)

    def err(beta, alpha):
      out = op.transport(q, k, v, beta=beta, alpha=alpha, implementation=impl, block_size=16)
      assert out.dtype == jnp.bfloat16
      ref = dense_out(q32, k32, v32, beta, alpha)
      return float(jnp.abs(out.astype(jnp.float32) - ref).max() / jnp.abs(v32).max())
    attn = err(1.0, 1.0)
    for beta, alpha in [op.DMTN, op.ATAP, op.DMAP, (0.5, 0.5), (0.2, 0.9)]:
      assert err(beta, alpha) <= 3 * attn + 1e-3, (mult, beta, alpha, err(beta, alpha), attn)


def test_fully_masked_rows_are_zero_on_every_kernel():
  n = 37                                                      # not a multiple of the block: padding too
  q, k, v = qkv(11, n=n)
  mask = jax.random.bernoulli(jax.random.PRNGKey(4), 0.5, (B, H, n, n))
  mask = mask.at[:, :, 5].set(False).at[0, 1, 20].set(False)  # dead rows
  outs = [op.transport(q, k, v, beta=0.3, alpha=0.6, mask=mask, implementation=i, block_size=16) for i in IMPLS]
  for out in outs:
    np.testing.assert_array_equal(out[:, 5], 0.0)
    np.testing.assert_array_equal(out[0, 20, 1], 0.0)
    np.testing.assert_allclose(out, outs[0], **tol("einsum", 3e-6, 1e-5))
  p = op.markov_matrix(q, k, beta=0.3, alpha=0.6, mask=mask)
  np.testing.assert_array_equal(p[:, :, 5], 0.0)
  np.testing.assert_allclose(outs[0], jnp.einsum("bhij,bjhe->bihe", p, v), atol=3e-6)


@pytest.mark.parametrize("key_mask", [False, True])
def test_rows_emptied_by_the_mask_and_the_causal_order_together_are_zero(key_mask):
  """Left padding under a causal order: query i < 3 sees keys ≤ i, all padded, so it has no distribution
  and is 0 on every kernel and in the dense P — though neither the mask nor the order alone empties it."""
  n = 37
  q, k, v = qkv(13, n=n)
  pad = jnp.arange(n) >= 3
  mask = jnp.broadcast_to(pad, (B, 1, 1, n) if key_mask else (B, H, n, n))
  p = op.markov_matrix(q, k, beta=0.3, alpha=0.6, causal=True, mask=mask)
  np.testing.assert_array_equal(p[:, :, :3], 0.0)
  np.testing.assert_allclose(p[:, :, 3:].sum(-1), 1.0, atol=1e-6)
  for impl in IMPLS:
    out = op.transport(q, k, v, beta=0.3, alpha=0.6, causal=True, mask=mask, implementation=impl, block_size=16)
    np.testing.assert_array_equal(out[:, :3], 0.0)
    np.testing.assert_allclose(out, jnp.einsum("bhij,bjhe->bihe", p, v), **tol(impl, 3e-6, 1e-5))


def test_checked_mode_turns_nan_and_bad_coefficients_under_jit_into_errors():
  from attngeo import _checks
  q, k, v = qkv(12)
  fn = jax.jit(lambda q, k, v, b_: op.transport(q, k, v, beta=b_, alpha=1.0))
  assert bool(jnp.isnan(fn(q.at[0, 0, 0, 0].set(jnp.nan), k, v, 0.5)).any())      # plain jit: silent
  safe = _checks.checked(fn)
  np.testing.assert_allclose(safe(q, k, v, 0.5), fn(q, k, v, 0.5), atol=1e-6)
  with pytest.raises(ValueError, match="q must be finite"):
    safe(q.at[0, 0, 0, 0].set(jnp.nan), k, v, 0.5)
  with pytest.raises(ValueError, match="v must be finite"):
    safe(q, k, v.at[1, 2, 0, 3].set(jnp.inf), 0.5)
  with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
    safe(q, k, v, 1.5)


@pytest.mark.parametrize("impl", ["einsum", "blockwise", "xla"])
@pytest.mark.parametrize("causal", [False, True])
def test_dmap_at_huge_query_norms_matches_float64(impl, causal):
  """|q| ≈ 1e20 on half the tokens: the SDPA form's terms s·m_i·½m_j and ¼s‖m_j‖² overflowed and made those
  rows NaN (ATTN is finite there). Far tokens are isolated: their rows are the point mass on themselves,
  their keys weigh 0 elsewhere — the float64 distance form exactly; the plain rows are unchanged."""
  q, k, v = huge_and_plain_tokens()
  y = op.transport(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), beta=0.0, alpha=0.0, causal=causal,
                   implementation=impl, block_size=8)
  np.testing.assert_allclose(y, distance_form_reference(q, k, v, causal=causal), rtol=1e-5, atol=1e-5)
  assert np.all(np.isfinite(op.transport(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), beta=1.0, alpha=1.0)))


def family_reference64(q, k, v, beta, alpha, causal=False):
  """P(β, α)·v in float64 from the logit's Gram terms, each with its own coefficient (no difference of huge
  terms: a zero coefficient drops its term exactly, so ATTN is s·q_i·k_j itself and ATAP has no ‖q‖²)."""
  q, k, v = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k, v))          # [b, h, n, ·]
  dot = lambda a, c: np.einsum("bhid,bhjd->bhij", a, c)
  qk = dot(q, k)
  g = 0.25 * (1 - beta) * ((q * q).sum(-1) + (k * k).sum(-1)) + 0.5 * (1 + beta) * (q * k).sum(-1)
  lg = (0.25 * (1 - beta) * (dot(q, q) + dot(k, k)) + (0.25 * (1 + beta) + 0.5 * alpha) * qk
        + (0.25 * (1 + beta) - 0.5 * alpha) * np.swapaxes(qk, -1, -2) + 0.5 * (1 - alpha) * (g[..., :, None] - g[..., None, :]))
  lg = lg / math.sqrt(q.shape[-1])
  if causal:
    lg = np.where(np.tril(np.ones(lg.shape[-2:], bool)), lg, -np.inf)
  w = np.exp(lg - lg.max(-1, keepdims=True))
  return np.einsum("bhij,bhje->bhie", w / w.sum(-1, keepdims=True), v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize("impl", ["einsum", "blockwise", "xla"])
def test_augmented_members_at_huge_query_norms_match_float64(impl):
  """|q| ≈ 1e20 on half the tokens: DMTN's s·¼ q_i·q_j overflowed float32 (its far rows NaN), ATAP's key bias
  was ¼‖q + k‖² − ¼‖q − k‖² = inf − inf (every row NaN), a mixed member both. Now g has no difference of
  squares and an overflowing row is recomputed on 2^−p-scaled q, k: the float64 answer on every row."""
  q, k, v = huge_and_plain_tokens()
  for i, (beta, alpha) in enumerate([op.DMTN, op.ATAP, (0.3, 0.7)]):
    y = op.transport(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), beta=beta, alpha=alpha, causal=i == 2,
                     implementation=impl, block_size=8)
    np.testing.assert_allclose(y, family_reference64(q, k, v, beta, alpha, causal=i == 2), rtol=1e-5, atol=1e-5)


def test_the_overflow_mend_is_a_forward_constant_of_the_gradient_program():
  """The mend's rerun reads no differentiable input: the gradient of a DMTN (and a learnable-β) transport
  holds the kernel in one cond, in the forward pass — not a second, differentiated copy of it (which doubled
  the compile time and kept the rerun's residuals); the backward's cond (the transposed select of the hot
  rows) holds no product. Gradients are unchanged."""
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 12, 2, 8)) for i in range(3))
  loss = lambda q, k, v, b: jnp.sum(op.transport(q, k, v, beta=b, alpha=0.0) ** 2)

  def conds(jaxpr):
    """[number of dot_generals inside each cond] of a jaxpr and its sub-jaxprs."""
    out = []
    for eqn in jaxpr.eqns:
      subs = [getattr(sub, "jaxpr", sub) for value in eqn.params.values()
              for sub in (value if isinstance(value, (tuple, list)) else (value,))]
      subs = [sub for sub in subs if hasattr(sub, "eqns")]
      if eqn.primitive.name == "cond":
        out.append(sum(str(sub).count("dot_general") for sub in subs))
      else:
        out.extend(c for sub in subs for c in conds(sub))
    return out
  for beta in (1.0, jnp.full((2,), 0.7)):
    grad = jax.grad(loss, (0, 1, 2) if isinstance(beta, float) else (0, 1, 2, 3))
    products = conds(jax.make_jaxpr(grad)(q, k, v, beta).jaxpr)
    assert sum(1 for p in products if p) == 1 and len(products) <= 2, products
  dense = lambda q, k, v: jnp.sum(jnp.einsum("bhij,bjhe->bihe", op.markov_matrix(q, k, beta=1.0, alpha=0.0), v) ** 2)
  for got, want in zip(jax.grad(loss, (0, 1, 2))(q, k, v, 1.0), jax.grad(dense, (0, 1, 2))(q, k, v)):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


def primitives_outside_conds(jaxpr) -> list[tuple]:
  """(name, first operand's shape) of the equations of a jaxpr and its sub-jaxprs (jit, loops), but not
  inside `cond` branches."""
  out = []
  for eqn in jaxpr.eqns:
    out.append((eqn.primitive.name, getattr(eqn.invars[0].aval, "shape", None) if eqn.invars else None))
    if eqn.primitive.name == "cond":
      continue
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          out.extend(primitives_outside_conds(sub))
  return out


def test_the_overflow_check_reads_the_inputs_and_a_hot_head_is_a_constant():
  """The mend decides from the inputs' norms (`_hot_rows`), not from a reduction over y: an is_finite pass
  over y beside its use cost a quarter of the einsum kernel's forward + backward at 256 keys. One token of
  norm 1.2e19 makes its whole head hot (the bound holds Z², Z the largest norm) though nothing overflows
  here (ATAP with that token's key 0: its logits are ~1e18, its bias 0). Its values are the float64 ones;
  every other head keeps the dense formula's gradient; the hot head is a constant of the forward pass —
  gradient 0 where the dense formula's is not, the documented price of a mend that costs nothing."""
  q, k, _ = qkv(11, n=12)
  v = jax.random.normal(jax.random.PRNGKey(13), (B, 12, H, 6))     # y [b, n, h, 6]: not the inputs' shape
  def passes_over_y(beta, alpha):                          # outside conds; ATTN has no mend: its count is v's check
    f = lambda q, k, v: op.transport(q, k, v, beta=beta, alpha=alpha)
    return primitives_outside_conds(jax.make_jaxpr(f)(q, k, v).jaxpr).count(("is_finite", v.shape))
  for beta, alpha in [op.DMTN, op.ATAP, (0.3, 0.7)]:
    assert passes_over_y(beta, alpha) == passes_over_y(*op.ATTN), (beta, alpha)
  u = jnp.zeros((D,)).at[0].set(1.2e19)                    # ‖u‖² = 1.4e38: its bound passes 2^126, not its square
  q_hot, k_hot = q.at[1, 3, 0].set(u), k.at[1, 3, 0].set(0.0)              # batch 1, head 0: |q_3| = 1.2e19
  hot = op._hot_rows(q_hot, k_hot, D ** -0.5)[..., 0]
  assert bool(hot[1, :, 0].all()) and int(hot.sum()) == hot.shape[1]
  w = jax.random.normal(jax.random.PRNGKey(12), v.shape)
  dense = lambda q, k: jnp.sum(w * jnp.einsum("bhij,bjhe->bihe", op.markov_matrix(q, k, beta=1.0, alpha=0.0), v))
  fused = lambda q, k: jnp.sum(w * op.transport(q, k, v, beta=1.0, alpha=0.0, implementation="einsum"))
  cold = np.ones(q.shape, bool)
  cold[1, :, 0] = False
  for got, want in zip(jax.grad(fused, (0, 1))(q_hot, k_hot), jax.grad(dense, (0, 1))(q_hot, k_hot)):
    assert np.all(np.isfinite(want)) and float(jnp.abs(want[1, :, 0]).max()) > 1e-3
    np.testing.assert_allclose(np.asarray(got)[cold], np.asarray(want)[cold], rtol=2e-4, atol=2e-5)
    assert float(jnp.abs(got[1, :, 0]).max()) == 0.0
  np.testing.assert_allclose(op.transport(q_hot, k_hot, v, beta=1.0, alpha=0.0),
                             family_reference64(q_hot, k_hot, v, 1.0, 0.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["einsum", "xla", "blockwise"])
def test_a_zero_token_beside_an_infinite_norm_is_mended(impl):
  """A token of norm 2e19 makes the largest norm Z = inf (its square overflows); a zero token's bound
  ‖z_i‖·Z = 0·inf is NaN, which once read "not hot": its row came back NaN. ATAP with k_3 = −q_3 gives
  key 3 the bias +s/2·‖q_3‖² = inf, so every other row — the zero token's too — is the point mass on key 3.
  Token 3's own row is decided by its ~1e19 logits beside a difference of ~4e38 ones that float32 cannot
  form at either scale: NaN (it once matched a float64 formula that rounds those 1e19 terms away too)."""
  q, k, v = qkv(5, n=12)
  u = jnp.zeros((D,)).at[0].set(2e19)
  q, k = q.at[0, 0, 1].set(0.0).at[0, 3, 1].set(u), k.at[0, 0, 1].set(0.0).at[0, 3, 1].set(-u)
  for beta, alpha in [op.ATAP, (0.3, 0.7)]:
    y = np.array(op.transport(q, k, v, beta=beta, alpha=alpha, implementation=impl, block_size=8))
    exact = family_exact(q, k, v, beta, alpha)
    assert np.all(np.isnan(y[0, 3, 1]))
    y[0, 3, 1] = exact[0, 3, 1]
    np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y[0, 0, 1], v[0, 3, 1], rtol=1e-6)


@pytest.mark.parametrize("impl", ["einsum", "blockwise"])
def test_hot_rows_are_the_exact_answer_or_nan(impl):
  """One token of norm 3e19 or 1e20 in a head, its key random, 0, q or −q, against exact logits
  (`family_exact`). Its own row came back finite on the wrong key in the mixed members (a random, zero or equal
  key) and in ATAP (k = q): at 3e19 its key bias ½(1 − α)·g_3 (~‖q_3‖²) passed float32's range where the logit
  it cancels in did not, and −inf took its own key out of the row that picks it. A hot row is now the rerun's point mass, or its unscaled row where
  the row's products stay in range, or NaN — only where k = −q, whose own logit is a difference of ~‖q‖²
  terms (NaN in the old kernel too, or a wrong row)."""
  rng = np.random.default_rng(3)
  q, k, v = (rng.standard_normal((1, 12, 2, w)).astype(np.float32) for w in (8, 8, 6))
  for size in (3e19, 1e20) if impl == "einsum" else (3e19,):
    for key in ("random", "zero", "q", "-q"):
      qh, kh = q.copy(), k.copy()
      qh[0, 3, 1] *= np.float32(size / np.linalg.norm(qh[0, 3, 1]))
      kh[0, 3, 1] = {"random": kh[0, 3, 1], "zero": 0.0, "q": qh[0, 3, 1], "-q": -qh[0, 3, 1]}[key]
      for beta, alpha in [op.DMTN, op.ATAP, (0.3, 0.7), (0.9, 0.1)]:
        y = np.asarray(op.transport(jnp.asarray(qh), jnp.asarray(kh), jnp.asarray(v), beta=beta, alpha=alpha,
                                    implementation=impl, block_size=4))
        nan = ~np.isfinite(y).all(-1)
        where = (size, key, beta, alpha)
        assert not nan.any() or (key == "-q" and [tuple(i) for i in np.argwhere(nan)] == [(0, 3, 1)]), where
        np.testing.assert_allclose(y[~nan], family_exact(qh, kh, v, beta, alpha)[~nan], rtol=1e-5, atol=1e-5,
                                   err_msg=str(where))


def test_repeated_huge_tokens_bf16_and_masked_hot_rows_are_exact_or_nan():
  """Cases a review found against exact logits (`family_exact`). A huge token repeated (its q and k at
  positions 2 and 3): at 2e19 its key biases overflowed to −inf where the products they cancel did not, and
  both its rows came back finite on a cold key (error 2.1); the rerun splits them 50/50, which is no point
  mass, so they are NaN now. In bf16 a near-duplicate's rows are a 97/3 mix that a tolerance of 8 bf16 ulps
  took for a point mass: the rerun runs in float32 now. A hot row whose keys are all masked is 0, as every
  fully masked row is."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.standard_normal((1, 6, 1, w)).astype(np.float32) for w in (8, 8, 4))
  for size in (2e19, 5e19):
    qh, kh = q.copy(), k.copy()
    qh[0, 2, 0] *= np.float32(size / np.linalg.norm(qh[0, 2, 0]))
    qh[0, 3, 0], kh[0, 3, 0] = qh[0, 2, 0], kh[0, 2, 0]
    for impl in ("einsum", "blockwise"):
      y = np.asarray(op.transport(jnp.asarray(qh), jnp.asarray(kh), jnp.asarray(v), beta=0.5, alpha=0.5,
                                  implementation=impl, block_size=4))
      nan = ~np.isfinite(y).all(-1)
      assert nan[0, 2:4, 0].all() and not nan[0, [0, 1, 4, 5], 0].any(), (size, impl)
      np.testing.assert_allclose(y[~nan], family_exact(qh, kh, v, 0.5, 0.5)[~nan], rtol=1e-5, atol=1e-5)
  qb = q.copy()
  qb[0, 2, 0] *= np.float32(3e19 / np.linalg.norm(qb[0, 2, 0]))
  qb[0, 3, 0] = qb[0, 2, 0]
  qb[0, 3, 0, 0] *= 1 + 2.0 ** -7
  qb, kb, vb = (jnp.asarray(x, jnp.bfloat16) for x in (qb, k, v))
  for beta, alpha in [op.DMTN, (0.3, 0.7)]:
    y = np.asarray(op.transport(qb, kb, vb, beta=beta, alpha=alpha).astype(jnp.float32))
    exact = family_exact(*(np.asarray(x.astype(jnp.float32)) for x in (qb, kb, vb)), beta, alpha)
    ok = np.isfinite(y).all(-1)
    np.testing.assert_allclose(y[ok], exact[ok], atol=2e-2 * float(np.abs(exact).max()))
  mask = np.ones((1, 1, 6, 6), bool)
  mask[0, 0, 2] = False
  qh = q.copy()
  qh[0, 2, 0] *= np.float32(3e19 / np.linalg.norm(qh[0, 2, 0]))
  for beta, alpha in [op.DMTN, op.ATAP, (0.3, 0.7)]:
    y = op.transport(jnp.asarray(qh), jnp.asarray(k), jnp.asarray(v), beta=beta, alpha=alpha, mask=jnp.asarray(mask))
    assert np.all(np.asarray(y)[0, 2, 0] == 0), (beta, alpha)


def test_a_far_token_whose_own_key_is_masked_is_nan():
  q, k, v = (jnp.asarray(x) for x in huge_and_plain_tokens())
  mask = ~jnp.eye(16, dtype=bool)[None, None]
  y = op.transport(q, k, v, beta=0.0, alpha=0.0, mask=mask)
  assert np.all(np.isnan(y[:, :8])) and np.all(np.isfinite(y[:, 8:]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(beta=1.5), "beta must lie in"),
    (dict(alpha=-0.1), "alpha must lie in"),
    (dict(beta=np.ones(5, np.float32)), "per-head"),
    (dict(implementation="magic"), "implementation must be one of"),
    (dict(mask=np.ones((2, 3, 33, 33), np.float32)), "mask must be boolean"),
    (dict(mask=np.ones((2, 3, 4, 4), bool)), "does not broadcast"),
    (dict(beta="ATTN"), r"beta must be a number .* operators.corner\('ATTN'\)"),
    (dict(scale=float("nan")), "scale must be a finite positive number"),
    (dict(scale=-1.0), "scale must be a finite positive number"),
    (dict(scale=True), r"scale must be a finite positive number .*; got True"),      # bool is an int: read as 1.0
    (dict(scale=np.bool_(True)), "scale must be a finite positive number"),
    (dict(scale="0.5"), "scale must be a finite positive number"),
    (dict(scale=[0.5]), "scale must be a finite positive number"),
    (dict(beta=True), "beta must be a number .* not a bool"),
    (dict(alpha=np.array([True, False, True])), "alpha must be .* not a bool"),
    (dict(implementation="blockwise", block_size=0), "block_size must be a positive integer"),
])
def test_bad_arguments(kwargs, match):
  q, k, v = qkv()
  with pytest.raises((ValueError, TypeError), match=match):
    op.transport(q, k, v, **kwargs)


def test_bad_shapes_and_values():
  q, k, v = qkv()
  with pytest.raises(ValueError, match="q must have rank 4"):
    op.transport(q[0], k, v)
  with pytest.raises(ValueError, match="same shape"):
    op.transport(q, k[:, :5], v)
  with pytest.raises(ValueError, match="v must be"):
    op.transport(q, k, v[:, :5])
  with pytest.raises(ValueError, match="q must be finite"):
    op.transport(q.at[0, 0, 0, 0].set(jnp.nan), k, v)
  with pytest.raises(ValueError, match="v must be finite"):
    op.transport(q, k, v.at[0, 0, 0, 0].set(jnp.nan))
  with pytest.raises(TypeError, match="v must be a floating-point array"):
    op.transport(q, k, jnp.ones(v.shape, jnp.int32))
  with pytest.raises(ValueError, match="at least one token"):
    op.transport(q[:, :0], k[:, :0], v[:, :0])
  with pytest.raises(ValueError, match="operator must be one of"):
    op.corner("softmax")



@pytest.mark.parametrize("block_size,batch_heads", [(None, 2 * 3), (512, None), (64, None)])
def test_transport_tells_the_router_whether_the_block_is_the_default(monkeypatch, block_size, batch_heads):
  """`transport` passes b·h to `split_kernel` only when no block is named (the augmented heads then run on
  `kernels.block_size_for(b·h)`), and the split kernels' tile bound: the block named, else `kernels.TILE`."""
  seen = {}
  real = op.split_kernel

  def spy(*args, **kw):
    seen.update(kw)
    return real(*args, **kw)
  monkeypatch.setattr(op, "split_kernel", spy)
  x = jax.ShapeDtypeStruct((2, 1024, 3, 8), jnp.float32)
  jax.eval_shape(lambda q, k, v: op.transport(q, k, v, beta=0.0, alpha=1.0, implementation="blockwise",
                                              block_size=block_size), x, x, x)
  assert seen["batch_heads"] == batch_heads
  assert seen["block_size"] == (kernels.TILE if block_size is None else block_size)
