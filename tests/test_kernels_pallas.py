"""attngeo.kernels.pallas in interpret mode on CPU: the flash kernel against float64 and the blockwise kernel.

Ragged lengths (t = s = 45, blocks of 16: three blocks, the last padded by 3), batch 2, 2 heads, head dim 16,
value dim 8. The reference is the definition in float64 (jax.numpy under x64, for its gradients):
`P = softmax(scale·q·kᵀ + bias_j)` over the attended keys (mask and causal order, top-left aligned), a row
with none is 0, `y = P v`. Each case is one program (outputs and the four gradients of Σ w ⊙ y together):
interpret mode compiles slowly, so the default suite runs three of them and `-m slow` the rest.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (as_tpu_v5e, assert_matches_both, attention_mask, check_float32_running_sums, lowered_calls,
                     masked_softmax, triton_calls)

from attngeo import kernels, operators as op
from attngeo.kernels import pallas

B, N, H, D, E, BLOCK = 2, 45, 2, 16, 8, 16


def inputs(seed=0, dtype=jnp.float32):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k = (jax.random.normal(kk, (B, N, H, D)) for kk in ks[:2])
  v = jax.random.normal(ks[2], (B, N, H, E))
  bias = jax.random.normal(ks[3], (B, N, H))
  w = jax.random.normal(ks[4], (B, N, H, E))
  return [x.astype(dtype) for x in (q, k, v)] + [bias, w]


def make_mask(kind):
  """`helpers.attention_mask` at this file's shapes (batch 1 keeps its first 30 keys)."""
  return attention_mask(kind, B, H, N, keep=30)


def reference(q, k, v, bias, w, mask, causal, scale):
  """(y, dq, dk, dv, dbias) of Σ w ⊙ y in float64, from the definition."""
  keep = np.ones((B, H, N, N), bool) if mask is None else np.broadcast_to(mask, (B, H, N, N))
  if causal:
    keep = keep & np.tril(np.ones((N, N), bool))
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x, np.float64))

    def y(q, k, v, b):
      s = scale * jnp.einsum("bthd,bshd->bhts", q, k) + jnp.transpose(b, (0, 2, 1))[:, :, None, :]
      return jnp.einsum("bhts,bshe->bthe", masked_softmax(s, keep), v)
    loss = lambda *a: (jnp.sum(x64(w) * y(*a)), y(*a))
    (_, out), grads = jax.jit(jax.value_and_grad(loss, range(4), has_aux=True))(*(x64(x) for x in (q, k, v, bias)))
    return [np.asarray(x) for x in (out, *grads)]


def run(impl, q, k, v, bias, w, mask, causal, scale, block=BLOCK):
  """(y, dq, dk, dv, dbias) of Σ w ⊙ y through `kernels.attention(implementation=impl)`, one jitted program."""
  m = None if mask is None else jnp.asarray(mask)

  @jax.jit
  def f(q, k, v, bias):
    def loss(q, k, v, bias):
      y = kernels.attention(q, k, v, bias=bias, mask=m, causal=causal, scale=scale, implementation=impl,
                            block_size=block)
      return jnp.sum(w * y.astype(jnp.float32)), y
    (_, y), g = jax.value_and_grad(loss, range(4), has_aux=True)(q, k, v, bias)
    return (y, *g)
  return [np.asarray(x, np.float64) for x in f(q, k, v, bias)]


NAMES = ("y", "dq", "dk", "dv", "dbias")
# (mask, causal, also against the blockwise kernel): the default suite compares with blockwise once (its
# gradient program costs another ~9 s to compile), the slow cases every time.
CASES = [pytest.param("key", True, True, id="key-mask-causal"), pytest.param("full", False, False, id="full-mask"),
         pytest.param("none", False, True, id="plain", marks=pytest.mark.slow),
         pytest.param("full", True, True, id="full-mask-causal", marks=pytest.mark.slow)]


@pytest.mark.parametrize("kind,causal,blockwise", CASES)
def test_outputs_and_gradients_match_float64_and_the_blockwise_kernel(kind, causal, blockwise):
  """Float32: within 2e-5·max|ref| of float64 (y and all four gradients), and within 1e-5·max of blockwise."""
  q, k, v, bias, w = inputs()
  mask = make_mask(kind)
  scale = 1 / math.sqrt(D)
  got = run("pallas", q, k, v, bias, w, mask, causal, scale)
  want = reference(q, k, v, bias, w, mask, causal, scale)
  block = run("blockwise", q, k, v, bias, w, mask, causal, scale) if blockwise else want
  assert_matches_both(NAMES, got, want, block)
  if kind == "full":
    assert np.all(got[0][0, 7, 1] == 0)                                  # the row with no keys is 0
  if kind == "key":
    np.testing.assert_array_equal(got[2][1, 30:], 0)                     # masked keys get no gradient
    np.testing.assert_array_equal(got[4][1, 30:], 0)


def test_bf16_inputs_accumulate_in_float32():
  """bf16 q, k, v (key mask, causal): against float64 on the same bf16-rounded inputs, y within 1e-2·max|y|
  and the gradients within 3e-2·max (bf16 operands, P and dS rounded to bf16 before their products); the same
  tolerance to blockwise. A bf16 running sum passes these tolerances (tried); the next test catches it."""
  q, k, v, bias, w = inputs(2, jnp.bfloat16)
  mask = make_mask("key")
  got = run("pallas", q, k, v, bias, w, mask, True, 0.25)
  want = reference(q, k, v, bias, w, mask, True, 0.25)
  assert got[0].dtype == np.float64 and all(jnp.asarray(x).dtype == jnp.bfloat16 for x in (q, k, v))
  for name, a, b, tol in zip(NAMES, got, want, (1e-2, 3e-2, 3e-2, 3e-2, 3e-2)):
    size = np.abs(b).max()
    np.testing.assert_allclose(a, b, atol=tol * size, rtol=0, err_msg=name)


def test_bf16_running_sums_are_float32():
  """The running sums (forward `o`, backward dv over query blocks) stay float32 under bf16 operands
  (`helpers.check_float32_running_sums`); planted bf16 sums in either fail it."""
  zeros = jnp.zeros((1, 96, 1, D), jnp.bfloat16)
  check_float32_running_sums(lambda v, bias, block: pallas.pallas_sdpa(zeros, zeros, v, bias, None, False, 1.0, block),
                             1, 1, E)


def test_transport_runs_dmtn_and_atap_by_the_dispatcher_name():
  """`operators.transport(implementation="pallas")` for DMTN and ATAP (2·d augmented heads plus a key bias),
  key mask, against the dense `markov_matrix`·v (float32, 1e-5); one jitted program for both."""
  q, k, v, _, _ = inputs(3)
  q, k = 0.5 * q, 0.5 * k
  v = jnp.concatenate([v, v], -1)                                       # e = 16
  mask = jnp.asarray(make_mask("key"))
  names = ("DMTN", "ATAP")
  both = jax.jit(lambda q, k, v: [op.transport(q, k, v, beta=op.corner(name)[0], alpha=op.corner(name)[1], mask=mask,
                                               implementation="pallas", block_size=BLOCK) for name in names])
  for name, got in zip(names, both(q, k, v)):
    p = op.markov_matrix(q, k, beta=op.corner(name)[0], alpha=op.corner(name)[1], mask=mask)
    want = np.einsum("bhts,bshe->bthe", np.asarray(p, np.float64), np.asarray(v, np.float64))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=name)


@pytest.mark.slow
def test_transport_gradient_through_pallas_matches_blockwise():
  """d/d(q, k, v) of Σ w ⊙ transport for DMTN, causal: the Pallas VJP against the blockwise one."""
  q, k, v, _, w = inputs(4)
  beta, alpha = op.corner("DMTN")

  def grads(impl):
    loss = lambda q, k, v: jnp.sum(w * op.transport(q, k, v, beta=beta, alpha=alpha, causal=True,
                                                    implementation=impl, block_size=BLOCK))
    return jax.jit(jax.grad(loss, range(3)))(q, k, v)
  for a, b in zip(grads("pallas"), grads("blockwise")):
    np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max(), rtol=1e-4)


def test_the_dispatcher_selects_pallas_by_name_only(monkeypatch):
  """"pallas" is a softmax, phase and magnetic kernel name (`pallas_phase`), kept as it is on every backend;
  never the default of any kind (CPU above all)."""
  for backend in ("cpu", "gpu", "tpu"):
    monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
    for kind in ("softmax", "phase", "magnetic"):
      assert kernels.choose(kind, "pallas", 8) == "pallas"
      assert "pallas" not in {kernels.choose(kind, None, n) for n in (None, 8, 10 ** 6)}


@pytest.mark.parametrize("backend,t,d,want", [
    ("cpu", 45, 16, (16, 16, 16, 8)), ("cpu", 10, 16, (10, 10, 16, 8)),
    ("gpu", 45, 16, (64, 64, 16, 16)), ("gpu", 1000, 96, (64, 64, 128, 16)), ("gpu", 5, 8, (16, 16, 16, 16)),
    ("gpu", 4096, 256, (32, 32, 256, 16)), ("gpu", 4096, 32, (64, 64, 32, 16)),
    ("tpu", 45, 96, (128, 128, 96, 8)), ("tpu", 5000, 256, (512, 512, 256, 8))])
def test_layout_pads_to_what_each_backend_lowers(backend, t, d, want):
  """Blocks and head widths (bq, bk, D', E') at block_size 16 (cpu) / 512 (gpu, tpu), value dim 8: Triton
  powers of two ≥ 16, blocks ≤ GPU_BLOCK and within GPU_TILE (block × (D' + E'): 256-wide heads get 32-blocks);
  Mosaic blocks multiples of 128, head dims whole; interpret mode as asked."""
  block = 16 if backend == "cpu" else 512
  got = pallas.layout(backend, t, t, d, 8, block)
  assert got == want
  bq, bk, dp, ep = got
  if backend == "gpu":
    assert all(x & (x - 1) == 0 and x >= 16 for x in got)
    assert bk <= pallas.GPU_BLOCK and (bk * (dp + ep) <= pallas.GPU_TILE or bk == 16)
  if backend == "tpu":
    assert bq % 128 == 0 and bk % 128 == 0


def grads_on_shapes(mask, causal, dtype, d=D, e=E, n=N):
  """(gradient of Σ pallas_sdpa over q, k, v, bias; its ShapeDtypeStruct arguments) at block_size 512."""
  q = jax.ShapeDtypeStruct((B, n, H, d), dtype)
  v = jax.ShapeDtypeStruct((B, n, H, e), dtype)
  bias = jax.ShapeDtypeStruct((B, n, H), jnp.float32)
  keep = attention_mask(mask, B, H, n, keep=30)
  m = None if keep is None else jnp.asarray(keep)
  y = lambda q, k, v, b: pallas.pallas_sdpa(q, k, v, b, m, causal, 0.25, 512).astype(jnp.float32)
  return jax.grad(lambda *a: jnp.sum(y(*a)), range(4)), (q, q, v, bias)


@pytest.mark.parametrize("mask,causal,dtype", [("full", True, jnp.bfloat16), ("key", False, jnp.float32)])
def test_forward_and_backward_lower_to_triton(monkeypatch, mask, causal, dtype):
  """On CPU, the GPU path's three kernels (forward, dk/dv/dbias, dq) lower to Triton MLIR (the custom call
  XLA:GPU compiles): every op of the kernel bodies has a Triton lowering at the padded widths and
  power-of-two blocks of `layout`. Lowering only — PTX compilation and the numbers need a GPU."""
  pytest.importorskip("jax._src.pallas.triton.lowering")
  monkeypatch.setattr(pallas, "_backend", lambda: "gpu")
  grads, args = grads_on_shapes(mask, causal, dtype)
  assert triton_calls(lowered_calls(grads, args, "cuda")) == 3


@pytest.mark.parametrize("mask,causal,dtype,d", [("full", True, jnp.bfloat16, 64), ("key", False, jnp.float32, 48),
                                                 ("none", True, jnp.float32, 16)])
def test_forward_and_backward_lower_to_mosaic(monkeypatch, mask, causal, dtype, d):
  """On CPU, the TPU path's three kernels lower to Mosaic (`tpu_custom_call`, the chip named TPU v5e): every op
  has a Mosaic lowering and every block passes its rule (last two dims multiples of (8, 128) or whole), at the
  blocks of `layout` (multiples of 128) and whole head dims (48: not a multiple of 128). Blocks of 64 break
  the rule in the backward (the key bias's [1, 64] block), so the check is live. Lowering only — Mosaic's
  compiler (libtpu) and the numbers need a TPU."""
  as_tpu_v5e(monkeypatch)
  before = pallas.backend()
  with pallas.lowering_target("tpu"):
    grads, args = grads_on_shapes(mask, causal, dtype, d=d, e=d)
    assert lowered_calls(grads, args, "tpu").count("tpu_custom_call") == 3
    layout = pallas.layout
    monkeypatch.setattr(pallas, "layout", lambda backend, t, s, d, e, b, size=2: (64, 64) + layout(
        backend, t, s, d, e, b, size)[2:])
    grads, args = grads_on_shapes(mask, causal, dtype, d=d, e=d, n=256)
    with pytest.raises(ValueError, match="divisible by 8 and 128"):
      lowered_calls(grads, args, "tpu")
  assert pallas.backend() == before
  with pytest.raises(ValueError, match="lowering_target: backend must be 'gpu' or 'tpu'; got 'cuda'"):
    with pallas.lowering_target("cuda"):
      pass


def test_triton_params_reach_all_three_kernels_and_are_restored(monkeypatch):
  """`pallas.triton_params` sets num_warps / num_stages (other than the default's) of the forward, dk/dv and dq
  kernels traced inside it (read from the lowered Triton calls), restores the default after, and names an
  unknown parameter."""
  import re
  pytest.importorskip("jax._src.pallas.triton.lowering")
  from jax._src.lib import version as jaxlib_version
  if jaxlib_version > (0, 10, 2):
    pytest.skip("jaxlib > 0.10.2 compiles the Triton kernels at lowering and keeps their parameters in a proto")
  monkeypatch.setattr(pallas, "_backend", lambda: "gpu")
  q = jax.ShapeDtypeStruct((1, 32, 1, 16), jnp.bfloat16)
  bias = jax.ShapeDtypeStruct((1, 32, 1), jnp.float32)

  def lowered():
    y = lambda q, k, v, b: jnp.sum(pallas.pallas_sdpa(q, k, v, b, None, False, 0.25, 64).astype(jnp.float32))
    text = jax.jit(jax.grad(y, range(4))).trace(q, q, q, bias).lower(lowering_platforms=("cuda",)).as_text()
    return re.findall(r"num_warps = (\d+)", text), re.findall(r"num_stages = (\d+)", text)

  default = dict(pallas.TRITON)
  assert default["num_warps"] != 4 and default["num_stages"] != 3
  with pallas.triton_params(num_warps=4, num_stages=3):
    assert lowered() == (["4"] * 3, ["3"] * 3)
  assert pallas.TRITON == default
  assert lowered() == ([str(default["num_warps"])] * 3, [str(default["num_stages"])] * 3)
  with pytest.raises(ValueError, match="unknown.*num_ctas"):
    with pallas.triton_params(num_ctas=2):
      pass


def test_unbounded_tiles_lifts_the_gpu_tile_bound_only_inside():
  """Inside `unbounded_tiles` a 256-wide head gets the 128-blocks asked for (the sweeps' way to the layouts the
  bound rules out), also after a nested block ends; outside, GPU_TILE's 32 again, also after an error inside.
  float32 operands halve the tile (64-wide heads: 32-blocks, not bf16's 64)."""
  assert pallas.layout("gpu", 4096, 4096, 256, 64, 128)[:2] == (32, 32)
  with pytest.raises(RuntimeError), pallas.unbounded_tiles():
    with pallas.unbounded_tiles():                                       # nested: the outer block stays unbounded
      pass
    assert pallas.layout("gpu", 4096, 4096, 256, 64, 128)[:2] == (128, 128)
    raise RuntimeError
  assert pallas.layout("gpu", 4096, 4096, 256, 64, 128)[:2] == (32, 32)
  assert pallas.layout("gpu", 4096, 4096, 64, 64, 512, itemsize=4)[:2] == (32, 32)      # float32: half the tile


def test_the_gpu_layout_pads_exactly_in_interpret_mode(monkeypatch):
  """The GPU path's own padding, run here: with `layout` giving what it gives Triton (E = 8 zero-padded to 16, the
  45 tokens in one power-of-two block of 64, 19 of them padding), the kernel in interpret mode matches float64
  (y and the four gradients within 2e-5·max|ref|; no mask and no causal order, so only the padded keys' NEG bias keeps them out) — what Triton then compiles is the same
  program at those shapes."""
  gpu = pallas.layout("gpu", N, N, D, E, 64)
  assert gpu == (64, 64, 16, 16)
  layout = pallas.layout
  monkeypatch.setattr(pallas, "layout", lambda backend, *a: layout("gpu", *a))
  q, k, v, bias, w = inputs(seed=3)
  mask, scale = None, 1 / math.sqrt(D)
  got = run("pallas", q, k, v, bias, w, mask, False, scale, block=64)
  want = reference(q, k, v, bias, w, mask, False, scale)
  assert_matches_both(NAMES, got, want, want)
