"""attngeo.kernels: every softmax and phase kernel against a float64 reference written here, and the dispatcher.

Shapes are odd (t = 13 queries, s = 21 keys, blocks of 8): the blockwise kernels pad both axes. The
reference is the definition in float64 numpy: `P = softmax(scale·q·kᵀ + bias_j)` over the attended
keys (mask and causal order, top-left aligned), a row with none is 0, `y = P v` (phase: `P e^{iθ} v`).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo import kernels, operators as op

B, T, S, H, D, E = 2, 13, 21, 3, 8, 6
IMPLS = ["einsum", "xla", "blockwise"] + (["cudnn"] if jax.default_backend() == "gpu" else [])


def tol(impl, atol, rtol=1e-6):
  """cuDNN computes in bf16 (GPU only): its parity is checked at bf16 precision."""
  return dict(atol=3e-2, rtol=3e-2) if impl == "cudnn" else dict(atol=atol, rtol=rtol)


def inputs(seed=0, t=T, s=S, dtype=jnp.float32):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  q = jax.random.normal(ks[0], (B, t, H, D))
  k, v = (jax.random.normal(kk, (B, s, H, w)) for kk, w in zip(ks[1:3], (D, E)))
  bias = jax.random.normal(ks[3], (B, s, H))
  return [x.astype(dtype) for x in (q, k, v)] + [bias]


def weights(mask, causal, t, s, scale, q, k, bias, xp=np):
  """P [b, h, t, s] in float64 (xp: numpy, or jax.numpy under x64 for gradients); empty rows 0."""
  logits = scale * xp.einsum("bthd,bshd->bhts", q, k) + xp.transpose(bias, (0, 2, 1))[:, :, None, :]
  keep = np.ones((1, 1, t, s), bool) if mask is None else np.broadcast_to(np.asarray(mask), (B, H, t, s))
  if causal:
    keep = keep & np.tril(np.ones((t, s), bool))
  top = xp.where(keep.any(-1, keepdims=True), xp.max(xp.where(keep, logits, -1e300), -1, keepdims=True), 0.0)
  w = xp.where(keep, xp.exp(xp.where(keep, logits, top) - top), 0.0)       # no inf anywhere: finite gradients
  return w / xp.maximum(xp.sum(w, -1, keepdims=True), 1e-300)


def reference(q, k, v, bias, mask=None, causal=False, scale=None):
  q, k, v, bias = (np.asarray(x, np.float64) for x in (q, k, v, bias))
  scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
  p = weights(mask, causal, q.shape[1], k.shape[1], scale, q, k, bias)
  return np.einsum("bhts,bshe->bthe", p, v)


def masks():
  pad = np.arange(S) >= 4                                    # left padding: with causal, rows 0–3 are empty
  dense = np.array(jax.random.bernoulli(jax.random.PRNGKey(9), 0.6, (B, H, T, S)))
  dense[:, :, 5] = False                                     # a dead row
  return {"none": None, "key": np.broadcast_to(pad, (B, 1, 1, S)), "dense": dense}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("mask", ["none", "key", "dense"])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_the_float64_reference(impl, mask, causal):
  q, k, v, bias = inputs()
  m = masks()[mask]
  out = kernels.attention(q, k, v, bias=bias, mask=None if m is None else jnp.asarray(m), causal=causal,
                          scale=0.4, implementation=impl, block_size=8)
  np.testing.assert_allclose(out, reference(q, k, v, bias, m, causal, 0.4), **tol(impl, 2e-6))


@pytest.mark.parametrize("impl", IMPLS)
def test_attention_gradients_match_float64_autodiff(impl):
  """d/d(q, k, v, bias) of Σ w ⊙ y under a key mask and the causal order (the blockwise kernel's custom VJP)."""
  q, k, v, bias = inputs(1)
  m = masks()["key"]
  w = jax.random.normal(jax.random.PRNGKey(3), (B, T, H, E))
  loss = lambda q, k, v, b: jnp.sum(w * kernels.attention(q, k, v, bias=b, mask=jnp.asarray(m), causal=True,
                                                           implementation=impl, block_size=8))
  got = jax.grad(loss, range(4))(q, k, v, bias)
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x), jnp.float64)

    def ref(q, k, v, b):
      p = weights(m, True, T, S, 1 / math.sqrt(D), q, k, b, xp=jnp)
      return jnp.sum(x64(w) * jnp.einsum("bhts,bshe->bthe", p, v))
    want = [np.asarray(g) for g in jax.grad(ref, range(4))(*(x64(x) for x in (q, k, v, bias)))]
  for a, b in zip(got, want):
    assert np.abs(b).max() > 1e-2                                       # a real gradient
    np.testing.assert_allclose(a, b, **tol(impl, 1e-5 * np.abs(b).max(), 1e-4))


def test_the_blockwise_backward_reads_the_bias_cotangent_off_the_dk_product():
  """dbias_j = Σ_i dS_ij comes out of `[s·qᵀ; 1ᵀ]·dS` (the dk product, one row more: d + 1), not out of a sum of
  its own over each block's rows, which read every [b, h, bq, bk] block of dS once more (softmax._flash_bwd).
  Without a bias the products keep their widths: the key side's sums are d (dk) and e (dv) rows."""
  from helpers import jaxpr_eqns
  q, k, v, bias = inputs(1)
  run = lambda q, k, v, b=None: jnp.sum(kernels.attention(q, k, v, bias=b, implementation="blockwise", block_size=4))
  for args in ((q, k, v, bias), (q, k, v)):
    eqns = list(jaxpr_eqns(jax.make_jaxpr(jax.grad(run, range(len(args))))(*args).jaxpr))
    assert not [e for e in eqns if e.primitive.name == "reduce_sum" and e.invars[0].aval.shape[-2:] == (4, 4)
                and tuple(e.params["axes"]) == (2,)]                                  # no Σ_i over a block's rows
    key_sums = {e.outvars[0].aval.shape[2] for e in eqns if e.primitive.name == "dot_general"
                and e.invars[0].aval.ndim == 4 and e.invars[0].aval.shape[-1] == 4
                and e.invars[1].aval.shape[-2:] == (4, 4)}                            # [b, h, f, bq]·[b, h, bq, bk]
    assert key_sums == ({D + 1, E} if len(args) == 4 else {D, E}), key_sums


@pytest.mark.parametrize("impl", ["einsum", "xla", "blockwise"])
def test_bf16_inputs_accumulate_in_float32(impl):
  """bf16 q, k, v over 64 keys: the output is bf16 and within its final rounding (2⁻⁸ relative) of the
  float64 answer on the same rounded inputs — a bf16 accumulation of the 64 terms would not be."""
  q, k, v, bias = inputs(2, t=16, s=64, dtype=jnp.bfloat16)
  out = kernels.attention(q, k, v, bias=bias, implementation=impl, block_size=16)
  assert out.dtype == jnp.bfloat16
  want = reference(q, k, v, bias)
  np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2 ** -8, atol=2 ** -9 * np.abs(want).max())


def test_the_einsum_kernel_scales_the_queries_not_the_logits():
  """The logits' scale sits on q (n × d) where that is exact: the gradient program then has as many n × n passes
  at scale 1/8 as at scale 1 (its VJP would otherwise multiply dS, n × n, by the scale), in float32 and in bf16 at a
  power-of-two scale. Elsewhere the logits take it: float16, whose range a scaled q leaves (q = 4e4 at scale 2
  overflows to inf, and every row to NaN), and a traced scale."""
  import re
  q, k, v, bias = inputs(4, t=64, s=64)

  def square_passes(scale, dtype):
    x = [a.astype(dtype) for a in (q, k, v)]
    f = lambda q, k, v: jnp.sum(kernels.attention(q, k, v, bias=bias, scale=scale, implementation="einsum")
                                .astype(jnp.float32) ** 2)
    text = jax.jit(jax.grad(f, (0, 1, 2))).lower(*x).compile().as_text()
    return len(re.findall(rf"= f32\[{B},{H},64,64\]\S* fusion\(", text))
  for dtype in (jnp.float32, jnp.bfloat16):
    assert square_passes(0.125, dtype) == square_passes(1.0, dtype) > 0, dtype
  qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
  out = kernels.attention(qb, kb, vb, bias=bias, scale=0.25, implementation="einsum")
  want = reference(qb, kb, vb, bias, scale=0.25)
  np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=2 ** -8, atol=2 ** -9 * np.abs(want).max())
  big = jnp.full((1, 2, 1, 4), 4e4, jnp.float16)
  small, values = jnp.full((1, 2, 1, 4), 1e-4, jnp.float16), jnp.eye(2, dtype=jnp.float16).reshape(1, 2, 1, 2)
  out = kernels.attention(big, small, values, scale=2.0, implementation="einsum")
  np.testing.assert_allclose(np.asarray(out, np.float32)[0, :, 0], [[0.5, 0.5]] * 2)
  traced = jax.jit(lambda s: kernels.attention(q, k, v, bias=bias, scale=s, implementation="einsum"))(0.3)
  np.testing.assert_allclose(traced, reference(q, k, v, bias, scale=0.3), atol=2e-6, rtol=1e-5)


def test_the_xla_kernel_keeps_its_rows_once_the_logits_pass_2_31():
  """Jitted on XLA:CPU, `jax.nn.dot_product_attention` recomputes logits·scale in the softmax's max and in its
  exp(· − max), one of them contracted into an FMA: at the row's top logit the difference is the product's
  rounding, and past 2^31 that overflows e^x (jax-ml/jax#37234). The "xla" kernel's rows were NaN — ATTN's at
  |q| = 1e14 (d = 8, scale 1/√8), DMTN's 2·d-wide heads' from 1e6 — and their gradients NaN from 1e10. With the
  scale on q (`scale_queries`) the logits carry no multiply: every row and gradient is finite, and the rows
  are the exact ones (`family_exact`)."""
  from helpers import family_exact
  rng = np.random.default_rng(1)
  q, k, v = (rng.standard_normal((1, 12, 2, w)).astype(np.float32) for w in (8, 8, 6))
  w = rng.standard_normal(v.shape).astype(np.float32)
  for size, members in ((1e6, [op.DMTN]), (1e14, [op.ATTN, op.DMTN, op.ATAP, (0.3, 0.7)])):
    qh = q.copy()
    qh[0, 3, 1] *= np.float32(size / np.linalg.norm(qh[0, 3, 1]))
    for beta, alpha in members:
      attend = lambda q, k, v: op.transport(q, k, v, beta=beta, alpha=alpha, implementation="xla")
      y = jax.jit(attend)(qh, k, v)
      np.testing.assert_allclose(y, family_exact(qh, k, v, beta, alpha), atol=1e-6, err_msg=str((size, beta, alpha)))
      grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(w * attend(q, k, v)), (0, 1, 2)))(qh, k, v)
      assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads), (size, beta, alpha)


def row_axis_products(jaxpr, n_rows, n_cols):
  """The dot_generals of a jaxpr that contract a [.., n_rows, n_cols] operand on its row axis (XLA:CPU: Eigen)."""
  found = []
  for e in jaxpr.eqns:
    if e.primitive.name != "dot_general":
      continue
    (contract_l, contract_r), _ = e.params["dimension_numbers"]
    for operand, contract in zip(e.invars, (contract_l, contract_r)):
      shape = operand.aval.shape
      if shape[-2:] == (n_rows, n_cols) and tuple(contract) == (len(shape) - 2,):
        found.append(e)
  return found


def test_the_logits_product_reads_its_cotangent_row_major_in_both_modes():
  """`_blocks.logits_product` (the einsum kernel's q·kᵀ): its pullback on CPU contracts the n × n cotangent on its
  last axis in both products — k̄ from the transposed cotangent written once behind an optimization barrier, where
  autodiff of the einsum contracts the row axis (Eigen on XLA:CPU) — up to `TRANSPOSED_COTANGENT_UP_TO` entries per
  head, past them as written; and both its reverse and forward modes equal float64 autodiff of the einsum."""
  from attngeo.kernels._blocks import logits_product
  q, k, _, _ = inputs(5)
  g = jax.random.normal(jax.random.PRNGKey(6), (B, H, T, S))
  dq, dk = (jax.random.normal(jax.random.PRNGKey(7 + i), x.shape) for i, x in enumerate((q, k)))
  out, pullback = jax.vjp(logits_product, q, k)
  program = jax.make_jaxpr(pullback)(g).jaxpr
  assert [e.primitive.name for e in program.eqns].count("dot_general") == 2
  on_cpu = jax.default_backend() == "cpu"                  # elsewhere a transposed operand is free: as written
  assert ("optimization_barrier" in [e.primitive.name for e in program.eqns]) == on_cpu
  assert bool(row_axis_products(program, T, S) or row_axis_products(program, S, T)) != on_cpu
  plain = jax.make_jaxpr(jax.vjp(lambda q, k: jnp.einsum("bthd,bshd->bhts", q, k), q, k)[1])(g).jaxpr
  assert row_axis_products(plain, T, S)                    # what the barrier avoids
  n = 385                                                  # past TRANSPOSED_COTANGENT_UP_TO: differentiated as written
  x = jnp.ones((1, n, 1, 2))
  large = jax.make_jaxpr(jax.vjp(logits_product, x, x)[1])(jnp.ones((1, 1, n, n))).jaxpr
  assert row_axis_products(large, n, n) and "optimization_barrier" not in [e.primitive.name for e in large.eqns]
  _, tangent = jax.jvp(logits_product, (q, k), (dq, dk))
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, g, dq, dk)]
    ref = lambda q, k: jnp.einsum("bthd,bshd->bhts", q, k)
    want, ref_pullback = jax.vjp(ref, *x64[:2])
    want_grads = ref_pullback(x64[2])
    _, want_tangent = jax.jvp(ref, tuple(x64[:2]), tuple(x64[3:]))
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(tangent, want_tangent, atol=1e-5 * np.abs(want_tangent).max(), rtol=1e-5)
  for got, r in zip(pullback(g), want_grads):
    np.testing.assert_allclose(got, r, atol=1e-5 * np.abs(r).max(), rtol=1e-5)


def test_the_einsum_kernel_keeps_forward_mode():
  """`jax.jvp` through `attention` on the einsum kernel (a custom JVP, not a custom VJP) equals float64 forward mode."""
  q, k, v, bias = inputs(8)
  tq, tk, tv = (jax.random.normal(jax.random.PRNGKey(20 + i), x.shape) for i, x in enumerate((q, k, v)))
  f = lambda q, k, v: kernels.attention(q, k, v, bias=bias, causal=True, implementation="einsum")
  _, got = jax.jvp(f, (q, k, v), (tq, tk, tv))
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x), jnp.float64)
    ref = lambda q, k, v: jnp.einsum("bhts,bshe->bthe", weights(None, True, T, S, 1 / math.sqrt(D), q, k, x64(bias),
                                                                 xp=jnp), v)
    _, want = jax.jvp(ref, tuple(x64(x) for x in (q, k, v)), tuple(x64(x) for x in (tq, tk, tv)))
  np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=1e-4)


def test_log_normaliser_matches_float64_logsumexp():
  q, k, _, bias = inputs(3)
  m = masks()["key"]
  got = kernels.log_normaliser(q, k, bias=bias, mask=jnp.asarray(m), causal=True, block_size=8)
  logits = (np.einsum("bthd,bshd->bhts", np.asarray(q, np.float64), np.asarray(k, np.float64)) / math.sqrt(D)
            + np.transpose(np.asarray(bias, np.float64), (0, 2, 1))[:, :, None, :])
  keep = np.broadcast_to(m, (B, H, T, S)) & np.tril(np.ones((T, S), bool))
  rows = keep.any(-1)
  lse = np.log(np.sum(np.where(keep, np.exp(logits), 0.0), -1)[rows])
  np.testing.assert_allclose(np.transpose(np.asarray(got), (0, 2, 1))[rows], lse, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("impl", ["einsum", "blockwise"])
def test_phase_attention_matches_the_complex128_reference(impl):
  """y_i = Σ_j P_ij e^{iθ_ij} v_j with θ_ij = c_h·qt_i·kt_j, per-head c, a dense mask with a dead row, causal."""
  q, k, v, bias = inputs(4)
  qt, kt = jax.random.normal(jax.random.PRNGKey(5), (B, T, H, 4)), jax.random.normal(jax.random.PRNGKey(6), (B, S, H, 4))
  c = np.array([0.0, 0.7, -1.9], np.float32)
  m = masks()["dense"]
  out = kernels.phase_attention(q, k, v, qt, kt, c, bias=bias, mask=jnp.asarray(m), causal=True,
                                implementation=impl, block_size=8)
  p = weights(m, True, T, S, 1 / math.sqrt(D), *(np.asarray(x, np.float64) for x in (q, k, bias)))
  theta = c[None, :, None, None] * np.einsum("bthf,bshf->bhts", np.asarray(qt, np.float64), np.asarray(kt, np.float64))
  vc = np.asarray(v, np.float64)[..., 0::2] + 1j * np.asarray(v, np.float64)[..., 1::2]
  y = np.einsum("bhts,bshe->bthe", p * np.exp(1j * theta), vc)
  want = np.stack([y.real, y.imag], -1).reshape(out.shape)
  np.testing.assert_allclose(out, want, atol=3e-6, rtol=1e-5)
  np.testing.assert_array_equal(out[:, 5], 0.0)


def test_a_key_mask_keeps_the_blockwise_kernels_o_n():
  """A key-padding mask [b, 1, 1, s] under causality is sliced per block, never broadcast to [b, 1, t, s]:
  the compiled backward's temporaries stay below the t·s bytes a materialised mask would take (it held
  one, as a residual, before)."""
  n = 4096
  x = jnp.ones((1, n, 1, 8))
  mask = jnp.ones((1, 1, 1, n), bool).at[..., :5].set(False)
  for fn in (lambda q, k, v: kernels.attention(q, k, v, mask=mask, causal=True, implementation="blockwise",
                                               block_size=512),
             lambda q, k, v: op.magnetic_transport(q, k, v, mask=mask, causal=True, implementation="blockwise",
                                                   block_size=512)):
    compiled = jax.jit(jax.grad(lambda q, k, v: fn(q, k, v).sum(), (0, 1, 2))).lower(x, x, x).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < n * n           # 16 MiB; 3.8 (ATTN), 9.5 (CMAP)
  with pytest.raises(ValueError, match=r"mask must be 4-D, broadcastable to \[b, h, t, s\]"):
    kernels.attention(x, x, x, mask=jnp.ones((n, n), bool))


@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (2, 1, 1, 5), (1, 3, 7, 1), (2, 3, 1, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_attended_rows_against_a_brute_force_count(shape, causal):
  """t = 7 queries, s = 5 keys (t ≠ s: the causal order is top-left aligned, key j ≤ query i)."""
  t, s = 7, 5
  mask = np.asarray(jax.random.bernoulli(jax.random.PRNGKey(sum(shape)), 0.3, shape))
  full = np.broadcast_to(mask, shape[:2] + (t, s)) & (np.tril(np.ones((t, s), bool)) if causal else True)
  np.testing.assert_array_equal(kernels.attended_rows(jnp.asarray(mask), causal, t, s), full.any(-1))


# ----------------------------------------------------------------------------- the dispatcher

@pytest.mark.parametrize("backend,short,long", [("cpu", "einsum", "blockwise"), ("gpu", "cudnn", "cudnn"),
                                                ("cuda", "cudnn", "cudnn"), ("tpu", "xla", "xla")])
def test_the_dispatcher_chooses_by_backend_and_length(monkeypatch, backend, short, long):
  """Softmax: cuDNN on GPU, XLA on TPU, on CPU einsum below BLOCKWISE_FROM keys and blockwise from it;
  the phase kernels by length on every backend; "paired" only when named; a name is kept as it is."""
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  edge = kernels.BLOCKWISE_FROM
  assert [kernels.choose("softmax", None, n) for n in (None, edge - 1, edge)] == [short, short, long]
  assert kernels.default_implementation(edge) == long
  for kind in ("phase", "magnetic"):
    assert [kernels.choose(kind, None, n) for n in (None, edge - 1, edge)] == ["einsum", "einsum", "blockwise"]
  for kind, names in kernels.KERNELS.items():
    assert [kernels.choose(kind, name, 8) for name in names] == list(names)


@pytest.mark.parametrize("kind,batch_heads,block", [
    ("softmax", 1, 2048), ("softmax", 4, 2048), ("softmax", 5, 1024), ("softmax", 16, 1024), ("softmax", 17, 512),
    ("softmax", 64, 512), ("softmax", 4096, 512),
    ("phase", 1, 2048), ("phase", 2, 2048), ("phase", 3, 1024), ("phase", 8, 1024), ("phase", 9, 512), ("phase", 64, 512)])
def test_the_default_block_is_the_largest_power_of_two_whose_step_fits(kind, batch_heads, block):
  """`block_size_for(b·h, kind)`: the largest power of two from 512 to 2048 with b·h·block² ≤ 2^24 entries a step for
  the softmax kernel, 2^23 for the phase kernel."""
  got = kernels.block_size_for(batch_heads, kind)
  assert got == block
  assert got == kernels.TILE or batch_heads * got ** 2 <= kernels.STEP_ENTRIES[kind]
  assert got == kernels.MAX_BLOCK or batch_heads * (2 * got) ** 2 > kernels.STEP_ENTRIES[kind]


def test_a_bad_block_size_is_one_line_on_every_kernel():
  """block_size is checked whatever kernel runs (einsum, which has no blocks, included); a kind without a rule is
  one line too."""
  q, k, v, _ = inputs()
  for impl in ("einsum", "blockwise"):
    with pytest.raises(ValueError, match=r"block_size must be a positive integer; got 0$"):
      kernels.attention(q, k, v, implementation=impl, block_size=0)
    with pytest.raises(ValueError, match=r"block_size must be a positive integer; got 1.5$"):
      kernels.phase_attention(q, k, v, q, k, 1.0, implementation=impl, block_size=1.5)
  with pytest.raises(ValueError, match=r"block_size must be a positive integer; got True$"):
    kernels.paired_magnetic(q[:, :16], q[:, :16], v[:, :16], 1.0, scale=0.5, block_size=True)
  with pytest.raises(ValueError, match=r"kind must be one of \('softmax', 'phase'\); got 'magnetic'"):
    kernels.block_size_for(8, "magnetic")


def _blockwise_loop_lengths(fn, *args):
  """The trip counts of the scans and maps in fn's jaxpr (a blockwise kernel's loops over its blocks)."""
  from helpers import jaxpr_eqns
  return sorted({e.params["length"] for e in jaxpr_eqns(jax.make_jaxpr(fn)(*args).jaxpr) if e.primitive.name == "scan"})


@pytest.mark.parametrize("batch,heads", [(1, 2), (1, 4), (1, 8), (4, 8)])
def test_the_blockwise_kernels_take_the_default_block_when_none_is_named(batch, heads):
  """block_size=None: the softmax and phase kernels (and `log_normaliser`) run on `block_size_for(b·h, kind)`: at
  4096 keys their loops visit 4096 / block blocks (2, 4 and 8 here); a block named is kept."""
  n = 4096
  q, k, v = (jnp.zeros((batch, n, heads, 4)) for _ in range(3))
  block = kernels.block_size_for(batch * heads)
  blocks = lambda bs=None: _blockwise_loop_lengths(
      lambda q, k, v: kernels.attention(q, k, v, implementation="blockwise", block_size=bs), q, k, v)
  assert blocks() == [n // block] and blocks(256) == [n // 256]
  grads = _blockwise_loop_lengths(jax.grad(lambda q: jnp.sum(kernels.attention(q, k, v, implementation="blockwise"))), q)
  assert grads == [n // block]
  phase = _blockwise_loop_lengths(lambda q, k, v: kernels.phase_attention(q, k, v, q, k, 1.0, implementation="blockwise"),
                                  q, k, v)
  assert phase == [n // kernels.block_size_for(batch * heads, "phase")]
  assert _blockwise_loop_lengths(lambda q, k: kernels.log_normaliser(q, k), q, k) == [n // block]


def test_the_default_block_gives_the_named_blocks_answer():
  """The default block changes where the loops cut, not what they compute: at batch 1 × 2 heads (a 2048-key block)
  the blockwise output and gradients match a 512-key block's to float32 rounding, and equal a named 2048 bitwise."""
  ks = jax.random.split(jax.random.PRNGKey(7), 3)
  q, k, v = (jax.random.normal(kk, (1, 2048, 2, 8)) for kk in ks)
  run = lambda bs: jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.tanh(
      kernels.attention(q, k, v, implementation="blockwise", block_size=bs))), (0, 1, 2))(q, k, v)
  default, named, small = run(None), run(2048), run(512)
  for a, b, c in zip(jax.tree.leaves(default), jax.tree.leaves(named), jax.tree.leaves(small)):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, c, rtol=2e-5, atol=2e-6 * float(jnp.max(jnp.abs(c))))


def test_the_dispatcher_refuses_foreign_names_unless_lenient():
  """strict (operators, kernels): a name of another kind or of none is one line naming the choices;
  lenient (a layer's setting across a graft): another kind's name takes the default, no kind's still errs."""
  with pytest.raises(ValueError, match=r"implementation must be one of .*'paired'.* for the magnetic operator"):
    kernels.choose("magnetic", "xla", 8)
  with pytest.raises(ValueError, match=r"implementation must be one of .* for phase attention; got 'paired'"):
    kernels.choose("phase", "paired", 8)
  with pytest.raises(ValueError, match=r"implementation must be one of .* or None; got 'paired'"):
    kernels.choose("softmax", "paired", 8)
  assert kernels.choose("softmax", "paired", 8, strict=False) == kernels.choose("softmax", None, 8)
  assert kernels.choose("magnetic", "cudnn", 600, strict=False) == "blockwise"
  with pytest.raises(ValueError, match="got 'magic'"):
    kernels.choose("softmax", "magic", 8, strict=False)
  with pytest.raises(ValueError, match="got 'magic'"):
    kernels.attention(*inputs()[:3], implementation="magic")


@pytest.mark.parametrize("bq,bk", [(8, 8), (8, 5), (3, 8)])
def test_causal_kernels_skip_exactly_the_blocks_above_the_diagonal(bq, bk):
  """`_blocks.live_block`: a block is skipped iff the causal order keeps none of its entries (key j ≤ query
  i, top-left), checked against every entry of a 40 × 48 grid; the non-causal kernels skip nothing."""
  from attngeo.kernels._blocks import live_block
  for iq in range(-(-40 // bq)):
    for ik in range(-(-48 // bk)):
      kept = any(j <= i for i in range(iq * bq, iq * bq + bq) for j in range(ik * bk, ik * bk + bk))
      assert bool(live_block(True, iq, ik, bq, bk)) == kept, (iq, ik)
  assert live_block(False, 0, 5, bq, bk) is None


@pytest.mark.parametrize("t,s,block", [(5, 21, 8), (21, 13, 4)])
def test_causal_block_skip_keeps_values_and_gradients(t, s, block):
  """Skipping the blocks above the diagonal, with unequal query and key blocks (bq = min(block, t)) and left
  padding (empty rows): the blockwise kernels' outputs and gradients (q, k, v, bias; phase heads and
  coupling too) equal the einsum kernels', which compute every entry, to float32 rounding."""
  q, k, v, bias = inputs(7, t=t, s=s)
  qt, kt = jax.random.normal(jax.random.PRNGKey(8), (B, t, H, 4)), jax.random.normal(jax.random.PRNGKey(9), (B, s, H, 4))
  mask = jnp.asarray(np.broadcast_to(np.arange(s) >= 2, (B, 1, 1, s)))
  w = jax.random.normal(jax.random.PRNGKey(10), (B, t, H, E))
  c = jnp.array([0.5, -1.2, 0.9])
  runs = {"softmax": lambda impl, q, k, v, b, qt, kt, c: kernels.attention(
              q, k, v, bias=b, mask=mask, causal=True, implementation=impl, block_size=block),
          "phase": lambda impl, q, k, v, b, qt, kt, c: kernels.phase_attention(
              q, k, v, qt, kt, c, bias=b, mask=mask, causal=True, implementation=impl, block_size=block)}
  for name, run in runs.items():
    args = (q, k, v, bias, qt, kt, c)
    loss = lambda impl: lambda *a: jnp.sum(w * run(impl, *a))
    got, want = (jax.value_and_grad(loss(impl), range(7))(*args) for impl in ("blockwise", "einsum"))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, err_msg=name)
    for i, (a, b) in enumerate(zip(got[1], want[1])):
      if name == "softmax" and i >= 4:
        continue                                                    # qt, kt, c: not arguments of attention
      assert np.abs(b).max() > 1e-3, (name, i)
      np.testing.assert_allclose(a, b, atol=2e-5 * np.abs(b).max(), rtol=1e-4, err_msg=f"{name} argument {i}")
