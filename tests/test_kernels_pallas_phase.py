"""attngeo.kernels.pallas_phase in interpret mode on CPU: the phase flash kernels against float64 and blockwise.

`y_i = Σ_j P_ij e^{iθ_ij} v_j`, `θ_ij = c_h·qt_i·kt_j`, on ragged lengths (t = s = 77, blocks of 32: three
blocks, the last padded by 19), batch 2, 2 heads, head dim 16, phase dim 8, value dim 8 (four complex pairs),
a per-head coupling whose phases wrap (|θ| up to ~10). The reference is the definition in float64 (jax.numpy
under x64, for its gradients w.r.t. q, k, v, bias, qt, kt and c): P over the attended keys (mask and causal
order, top-left aligned), a row with none is 0. Each case is one program (the output and the seven gradients
of Σ w ⊙ y together): interpret mode compiles slowly, so the default suite runs two cases and `-m slow` the rest.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (as_tpu_v5e, assert_matches_both, attention_mask, check_float32_running_sums, lowered_calls,
                     masked_softmax, triton_calls)

from attngeo import kernels, operators as op
from attngeo.kernels import pallas, pallas_phase

B, N, H, D, F, E, BLOCK = 2, 77, 2, 16, 8, 8, 32
COUPLING = np.array([0.7, -1.3], np.float32)
NAMES = ("y", "dq", "dk", "dv", "dbias", "dqt", "dkt", "dc")


def inputs(seed=0, dtype=jnp.float32):
  """q, k, v, bias, qt, kt, c, w (w: the weights of the loss Σ w ⊙ y); q, k, v, qt, kt in `dtype`."""
  ks = jax.random.split(jax.random.PRNGKey(seed), 7)
  q, k = (jax.random.normal(kk, (B, N, H, D)) for kk in ks[:2])
  v = jax.random.normal(ks[2], (B, N, H, E))
  qt, kt = (jax.random.normal(kk, (B, N, H, F)) for kk in ks[3:5])
  bias = jax.random.normal(ks[5], (B, N, H))
  w = jax.random.normal(ks[6], (B, N, H, E))
  q, k, v, qt, kt = (x.astype(dtype) for x in (q, k, v, qt, kt))
  return q, k, v, bias, qt, kt, jnp.asarray(COUPLING), w


def make_mask(kind):
  """`helpers.attention_mask` at this file's shapes (batch 1 keeps its first 50 keys)."""
  return attention_mask(kind, B, H, N, keep=50)


def reference(q, k, v, bias, qt, kt, c, w, mask, causal, scale):
  """(y, dq, dk, dv, dbias, dqt, dkt, dc) of Σ w ⊙ y in float64, from the definition (real and imaginary parts
  of `P e^{iθ}` times the complex pairs of v)."""
  keep = np.ones((B, H, N, N), bool) if mask is None else np.broadcast_to(mask, (B, H, N, N))
  if causal:
    keep = keep & np.tril(np.ones((N, N), bool))
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x, np.float64))

    def y(q, k, v, b, qt, kt, c):
      s = scale * jnp.einsum("bthd,bshd->bhts", q, k) + jnp.transpose(b, (0, 2, 1))[:, :, None, :]
      p = masked_softmax(s, keep)
      theta = c[None, :, None, None] * jnp.einsum("bthf,bshf->bhts", qt, kt)
      pc, ps = p * jnp.cos(theta), p * jnp.sin(theta)
      mix = lambda a, x: jnp.einsum("bhts,bshe->bthe", a, x)
      vr, vi = v[..., 0::2], v[..., 1::2]
      return jnp.stack([mix(pc, vr) - mix(ps, vi), mix(ps, vr) + mix(pc, vi)], -1).reshape(q.shape[:3] + (E,))
    loss = lambda *a: (jnp.sum(x64(w) * y(*a)), y(*a))
    args = (x64(x) for x in (q, k, v, bias, qt, kt, c))
    (_, out), grads = jax.jit(jax.value_and_grad(loss, range(7), has_aux=True))(*args)
    return [np.asarray(x) for x in (out, *grads)]


def run(impl, q, k, v, bias, qt, kt, c, w, mask, causal, scale):
  """(y, dq, dk, dv, dbias, dqt, dkt, dc) of Σ w ⊙ y through `phase_attention(implementation=impl)`, one program."""
  m = None if mask is None else jnp.asarray(mask)

  @jax.jit
  def f(*args):
    def loss(q, k, v, bias, qt, kt, c):
      y = kernels.phase_attention(q, k, v, qt, kt, c, bias=bias, mask=m, causal=causal, scale=scale,
                                  implementation=impl, block_size=BLOCK)
      return jnp.sum(w * y.astype(jnp.float32)), y
    (_, y), g = jax.value_and_grad(loss, range(7), has_aux=True)(*args)
    return (y, *g)
  return [np.asarray(x, np.float64) for x in f(q, k, v, bias, qt, kt, c)]


# (mask, causal): the default suite runs a key mask under the causal order and a full mask with an empty row;
# the slow cases the unmasked kernel and the full mask under the causal order. Every case is also compared
# with the blockwise kernel.
CASES = [pytest.param("key", True, id="key-mask-causal"), pytest.param("full", False, id="full-mask"),
         pytest.param("none", False, id="plain", marks=pytest.mark.slow),
         pytest.param("full", True, id="full-mask-causal", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind,causal", CASES)
def test_outputs_and_gradients_match_float64_and_the_blockwise_kernel(kind, causal):
  """Float32: y and the seven gradients within 2e-5·max|ref| of float64 and within 1e-5·max of the blockwise
  kernel (measured: ≤ 8e-7·max against either)."""
  args = inputs()
  mask = make_mask(kind)
  scale = 1 / math.sqrt(D)
  got = run("pallas", *args, mask, causal, scale)
  want = reference(*args, mask, causal, scale)
  block = run("blockwise", *args, mask, causal, scale)
  assert_matches_both(NAMES, got, want, block)
  if kind == "full":
    assert np.all(got[0][0, 7, 1] == 0)                                  # the row with no keys is 0 ...
    assert np.all(got[1][0, 7, 1] == 0) and np.all(got[5][0, 7, 1] == 0)  # ... and has no gradient
  if kind == "key":
    for i in (2, 3, 4, 6):                                               # masked keys get no gradient
      np.testing.assert_array_equal(got[i][1, 50:], 0, err_msg=NAMES[i])


def test_bf16_inputs_accumulate_in_float32():
  """bf16 q, k, v, qt, kt (key mask, causal): against float64 on the same bf16-rounded inputs, y within
  1e-2·max|y| and the gradients within 3e-2·max (bf16 operands, P cos θ, P sin θ, dS and dθ rounded to bf16
  before their products). Measured: ≤ 4.5e-3·max. A bf16 running sum over these three blocks stays within
  the tolerances too (≤ 1e-2·max, measured): the next test is the one that catches it."""
  args = inputs(2, jnp.bfloat16)
  mask = make_mask("key")
  got = run("pallas", *args, mask, True, 0.25)
  want = reference(*args, mask, True, 0.25)
  assert all(x.dtype == jnp.bfloat16 for x in args[:3] + args[4:6])
  for name, a, b, tol in zip(NAMES, got, want, (1e-2,) + (3e-2,) * 7):
    size = np.abs(b).max()
    np.testing.assert_allclose(a, b, atol=tol * size, rtol=0, err_msg=name)


def test_bf16_accumulators_are_float32():
  """The running sums stay float32 under bf16 operands (`helpers.check_float32_running_sums`): with c = 0 the
  phase is 1, so y ≡ 1 whatever P; planted bf16 sums in the forward or the dk/dv kernel fail it."""
  zeros = jnp.zeros((B, 96, H, D), jnp.bfloat16)
  qt = jax.random.normal(jax.random.PRNGKey(5), (B, 96, H, F)).astype(jnp.bfloat16)
  check_float32_running_sums(lambda v, bias, block: kernels.phase_attention(
      zeros, zeros, v, qt, qt, jnp.zeros(H), bias=bias, implementation="pallas", block_size=block), B, H, E)


def test_magnetic_transport_runs_it_by_the_dispatcher_name():
  """`operators.magnetic_transport(implementation="pallas")` (β = 0.4: a key bias; per-head coupling, key mask,
  causal) against the blockwise kernel, float32, 2e-6; "pallas" is never a phase or magnetic default."""
  q, k, v = (x[..., :8] for x in inputs(3)[:3])                        # d = 8: augmented heads 16, phase heads 16
  mask = jnp.asarray(make_mask("key"))
  run = lambda impl: op.magnetic_transport(q, k, v, beta=0.4, coupling=jnp.asarray(COUPLING), causal=True, mask=mask,
                                           implementation=impl, block_size=BLOCK)
  got, want = jax.jit(lambda: (run("pallas"), run("blockwise")))()
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
  for kind in ("phase", "magnetic"):
    assert "pallas" in kernels.KERNELS[kind]
    assert "pallas" not in {kernels.choose(kind, None, n) for n in (None, 8, 10 ** 6)}


@pytest.mark.parametrize("backend,t,d,f,e,want", [
    ("cpu", 77, 16, 8, 8, (32, 32, 16, 8, 8)), ("gpu", 77, 16, 8, 8, (32, 32, 16, 16, 16)),
    ("gpu", 1000, 96, 96, 48, (32, 32, 128, 128, 64)), ("gpu", 4096, 128, 256, 64, (32, 32, 128, 256, 64)),
    ("gpu", 4096, 64, 128, 64, (32, 32, 64, 128, 64)),
    ("tpu", 1000, 96, 96, 48, (512, 512, 96, 96, 48))])
def test_layout_pads_the_phase_heads_like_the_head_dim(backend, t, d, f, e, want):
  """(bq, bk, D', F', E') at block_size 32 (cpu) / 512 (gpu, tpu): Triton pads F like D (powers of two ≥ 16) and
  keeps blocks within PHASE_GPU_BLOCK and block × (D' + F' + E') within PHASE_GPU_TILE (CMAP at d = 64:
  32-blocks); Mosaic and interpret mode keep the widths."""
  assert pallas_phase.phase_layout(backend, t, t, d, f, e, 32 if backend == "cpu" else 512) == want


def grads_on_shapes(mask, causal, dtype, n=N):
  """(gradient of Σ pallas_phase_attention over its seven inputs; their ShapeDtypeStructs) at block_size 512."""
  q = jax.ShapeDtypeStruct((B, n, H, D), dtype)
  v = jax.ShapeDtypeStruct((B, n, H, E), dtype)
  phase = jax.ShapeDtypeStruct((B, n, H, F), dtype)
  bias = jax.ShapeDtypeStruct((B, n, H), jnp.float32)
  c = jax.ShapeDtypeStruct((H,), jnp.float32)
  keep = attention_mask(mask, B, H, n, keep=30)
  m = None if keep is None else jnp.asarray(keep)
  y = lambda q, k, v, b, qt, kt, c: pallas_phase.pallas_phase_attention(q, k, v, b, qt, kt, c, m, causal, 0.25,
                                                                        512).astype(jnp.float32)
  return jax.grad(lambda *a: jnp.sum(y(*a)), range(7)), (q, q, v, bias, phase, phase, c)


@pytest.mark.parametrize("mask,causal,dtype", [("full", True, jnp.bfloat16), ("key", False, jnp.float32)])
def test_forward_and_backward_lower_to_triton(monkeypatch, mask, causal, dtype):
  """On CPU, the GPU path's three kernels (forward, dk/dv/dbias/dkt, dq/dqt) lower to Triton MLIR at the padded
  widths and power-of-two blocks of `phase_layout`. Lowering only — PTX compilation and the numbers need a GPU."""
  pytest.importorskip("jax._src.pallas.triton.lowering")
  monkeypatch.setattr(pallas, "_backend", lambda: "gpu")
  grads, args = grads_on_shapes(mask, causal, dtype)
  assert triton_calls(lowered_calls(grads, args, "cuda")) == 3


@pytest.mark.parametrize("mask,causal,dtype", [("full", True, jnp.bfloat16), ("key", False, jnp.float32),
                                               ("none", True, jnp.float32)])
def test_forward_and_backward_lower_to_mosaic(monkeypatch, mask, causal, dtype):
  """On CPU, the TPU path's three kernels lower to Mosaic (`tpu_custom_call`, the chip named TPU v5e): sin, cos
  and every other op have Mosaic lowerings, and every block passes the (8, 128)-or-whole rule at the blocks of
  `phase_layout` (multiples of 128) with whole head dims (16, 8) and c's [1, 1] block. Blocks of 64 break the
  rule in the backward, so the check is live. Lowering only — Mosaic's compiler and the numbers need a TPU."""
  as_tpu_v5e(monkeypatch)
  monkeypatch.setattr(pallas, "_backend", lambda: "tpu")
  grads, args = grads_on_shapes(mask, causal, dtype)
  assert lowered_calls(grads, args, "tpu").count("tpu_custom_call") == 3
  layout = pallas_phase.phase_layout
  monkeypatch.setattr(pallas_phase, "phase_layout", lambda backend, t, s, d, f, e, b, size=2: (64, 64) + layout(
      backend, t, s, d, f, e, b, size)[2:])
  grads, args = grads_on_shapes(mask, causal, dtype, n=256)
  with pytest.raises(ValueError, match="divisible by 8 and 128"):
    lowered_calls(grads, args, "tpu")


def test_the_gpu_layout_pads_exactly_in_interpret_mode(monkeypatch):
  """The GPU path's own padding, run here: with `phase_layout` giving what it gives Triton (F = 8 and E = 8
  zero-padded to 16 — E as [re, im, zeros] — and 77 tokens in three 32-blocks, 19 of them padding), the kernel in
  interpret mode matches float64 (y and the seven gradients within 2e-5·max|ref|; no mask and no causal order, so only the padded keys' NEG bias keeps them out)."""
  assert pallas_phase.phase_layout("gpu", N, N, D, F, E, BLOCK) == (32, 32, 16, 16, 16)
  layout = pallas_phase.phase_layout
  monkeypatch.setattr(pallas_phase, "phase_layout", lambda backend, *a: layout("gpu", *a))
  args = inputs(seed=3)
  mask, scale = None, 1 / math.sqrt(D)
  got = run("pallas", *args, mask, False, scale)
  want = reference(*args, mask, False, scale)
  assert_matches_both(NAMES, got, want, want)
