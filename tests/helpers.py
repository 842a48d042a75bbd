"""Shared test helpers (imported by name: pytest puts tests/ on sys.path)."""
import numpy as np


class Batches:
  """The same batch forever, with the iterator-state protocol `attngeo.train` expects."""

  def __init__(self, batch):
    self.batch = batch

  def __next__(self):
    return self.batch

  def get_state(self):
    return {}

  def set_state(self, state):
    pass


# `python -c ERRORS_SCRIPT JSON`: runs the `attngeo` command on each argv of the JSON list, one after another in
# this one interpreter (the CLI answers argument errors before importing JAX, so a case that imports it is
# caught there), and prints [exit status, stderr, whether JAX is imported] for each.
ERRORS_SCRIPT = """
import contextlib, io, json, sys
from attngeo import cli
out = []
for argv in json.loads(sys.argv[1]):
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    try:
      code = cli.main(argv)
    except SystemExit as e:
      code = e.code
  out.append([code, err.getvalue(), "jax" in sys.modules])
print(json.dumps(out))
"""


def assert_errors_before_jax(cases, cwd):
  """Each (argv, message) of `cases`, run as `attngeo ARGV` in one fresh interpreter in `cwd` (a process each
  cost 0.12 s of start-up a case): exit 2, one line on stderr containing `message`, JAX never imported."""
  import json
  import os
  import subprocess
  import sys
  from attngeo import cli
  env = {k: v for k, v in os.environ.items() if k not in cli.DISTRIBUTED_ENV + ("ATTNGEO_DEBUG",)}
  out = subprocess.run([sys.executable, "-c", ERRORS_SCRIPT, json.dumps([argv for argv, _ in cases])],
                       capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
  assert out.returncode == 0, out.stderr[-3000:]
  for (argv, message), (code, err, jax_imported) in zip(cases, json.loads(out.stdout.splitlines()[-1]), strict=True):
    assert code == 2 and message in err, (argv, err)
    assert len(err.strip().splitlines()) == 1, err
    assert not jax_imported, f"`attngeo {' '.join(argv)}` imported JAX before its argument error"


# ----------------------------------------------------------------------------- connection-walk references (float64)

def defect_from_lam(lam, rtol):
  """δ from eigenvalues λ [..., d] of TᵀT (float64): the definition, independently of the package."""
  keep = lam > rtol * lam[..., -1:]
  r = np.maximum(keep.sum(-1), 1)
  mean = (lam * keep).sum(-1) / r
  num = (((lam - mean[..., None]) ** 2) * keep).sum(-1)
  den = np.maximum((lam**2 * keep).sum(-1), 1e-300)
  return np.sqrt(num / den)


def rotations64(theta, k):
  """R(θ) `[..., k, k]` on complex pairs (2c, 2c+1), row vectors: (re, im)·R = (re cos − im sin, re sin + im cos)."""
  c, s = np.cos(theta)[..., None], np.sin(theta)[..., None]
  r = np.zeros(theta.shape + (k, k))
  idx = np.arange(0, k, 2)
  r[..., idx, idx], r[..., idx + 1, idx + 1] = c, c
  r[..., idx, idx + 1], r[..., idx + 1, idx] = s, -s
  return r


def dense_cmap_transports64(p, theta, wv, wo):
  """Per-edge `T_ij = Σ_h g^h_ij W_V^h R(θ^h_ij) W_O^h` `[n, n, d, d]` in float64, from the definition."""
  p, theta, wv, wo = (np.asarray(x, np.float64) for x in (p, theta, wv, wo))
  s = p.sum(0)
  g = p / np.where(s > 0, s, 1.0)
  r = rotations64(theta, wv.shape[2])                                           # [h, n, n, k, k]
  return np.einsum("hij,dhk,hijkl,hle->ijde", g, wv, r, wo)


# ----------------------------------------------------------------------------- stationary laws (float64)

def chain_pi(p):
  """π_true of the chain P/rowsum(P) (what `stationary` bounds against), by a float64 dense solve of Mᵀπ = 1/n."""
  p = np.asarray(p, np.float64)
  p = p / p.sum(-1, keepdims=True)
  n = p.shape[-1]
  m = np.eye(n) - p + 1.0 / n
  return np.linalg.solve(np.swapaxes(m, -1, -2), np.full(p.shape[:-1] + (1,), 1.0 / n))[..., 0]


# ----------------------------------------------------------------------------- the distance form (float64)

def distance_form_reference(q, k, v, coupling=None, causal=False):
  """DMAP (`coupling=None`) or CMAP at β = 0 from q, k, v [b, n, h, ·] in float64, written in the distance
  form `K = rownorm(exp(−¼ s‖m_i − m_j‖²))` (differences, no cancelling squares: exact at any norm),
  θ = γ·½ s (A − Aᵀ), A_ij = q_i·k_j (θ_ii = 0 exactly); CMAP's values are interleaved complex pairs."""
  q, k, v = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k, v))   # [b, h, n, ·]
  s = 1 / np.sqrt(q.shape[-1])
  m = (q + k) / np.sqrt(2)
  logit = -0.25 * s * np.sum((m[..., :, None, :] - m[..., None, :, :]) ** 2, -1)
  if causal:
    logit = np.where(np.tril(np.ones(logit.shape[-2:], bool)), logit, -np.inf)
  w = np.exp(logit - logit.max(-1, keepdims=True))
  kmat = w / w.sum(-1, keepdims=True)
  if coupling is None:
    return np.einsum("bhij,bhje->bhie", kmat, v).transpose(0, 2, 1, 3)
  a = np.einsum("bhid,bhjd->bhij", q, k)
  theta = coupling * 0.5 * s * (a - np.swapaxes(a, -1, -2))
  y = np.einsum("bhij,bhje->bhie", kmat * np.exp(1j * theta), v[..., 0::2] + 1j * v[..., 1::2]).transpose(0, 2, 1, 3)
  out = np.empty(y.shape[:-1] + (2 * y.shape[-1],))
  out[..., 0::2], out[..., 1::2] = y.real, y.imag
  return out


# ----------------------------------------------------------------------------- the β = 1 edge (float64)

def family_edge(q, k, v, alpha, causal=False, mask=None):
  """P(β = 1, α)·v from the logits of `attngeo.kernels.split`'s docstring, in the inputs' precision (float64 below): s·[½(q_i·k_j +
  k_i·q_j) + α·½(q_i·k_j − k_i·q_j)] + s·(1 − α)·½·(g_i − g_j), g = q·k — the formula, not `split_logits`."""
  import jax
  import jax.numpy as jnp
  a = jnp.asarray(alpha, q.dtype).reshape(-1, 1, 1)
  qk = jnp.einsum("bihd,bjhd->bhij", q, k)
  g = jnp.einsum("bihd,bihd->bhi", q, k)
  lg = (0.5 * (qk + jnp.swapaxes(qk, -1, -2)) + a * 0.5 * (qk - jnp.swapaxes(qk, -1, -2))
        + (1 - a) * 0.5 * (g[..., :, None] - g[..., None, :])) / np.sqrt(q.shape[-1])
  keep = jnp.ones(lg.shape, bool)
  if causal:
    keep = keep & jnp.tril(jnp.ones(lg.shape[-2:], bool))
  if mask is not None:
    keep = keep & mask
  p = jax.nn.softmax(jnp.where(keep, lg, -jnp.inf), -1)
  return jnp.einsum("bhij,bjhe->bihe", p, v)


def family_edge64(*arrays, **kw):
  """`family_edge` in float64 (numpy out) from float32 arrays."""
  import jax
  import jax.numpy as jnp
  with jax.enable_x64(True):
    return np.asarray(family_edge(*(jnp.asarray(np.asarray(x), jnp.float64) for x in arrays), **kw))



def huge_and_plain_tokens(seed=0, n=16, h=2, d=8, e=6, size=1e20):
  """q, k, v [1, n, h, ·]: the first half of the queries scaled to |q| ≈ `size`, the rest standard normal."""
  rng = np.random.default_rng(seed)
  q, k, v = (rng.standard_normal((1, n, h, w)).astype(np.float32) for w in (d, d, e))
  q[:, : n // 2] *= np.float32(size)
  return q, k, v


def family_exact(q, k, v, beta, alpha, causal=False):
  """P(β, α)·v [b, n, h, e] float64 from exact logits: the inputs' float32 values as rationals, so that no term
  of ~‖q‖² rounds away the ~‖q‖ ones beside it (the float64 formula does at ‖q‖ ≈ 1e18 with k ≈ −q: 1e36 terms
  hold gaps of 1e18, under its 2^−52). L_ij = ¼(1 − β)(q_i·q_j + k_i·k_j) + (¼(1 + β) + ½α)·q_i·k_j
  + (¼(1 + β) − ½α)·q_j·k_i − ½(1 − α)·g_j (g_i is a row constant), each row's softmax of s·(L_ij − max_j L_ij)
  in float64. For a few tokens only (a Python loop over rows)."""
  from fractions import Fraction
  q, k, v = (np.asarray(x) for x in (q, k, v))
  b_, a_, quarter = Fraction(float(beta)), Fraction(float(alpha)), Fraction(1, 4)
  s = q.shape[-1] ** -0.5
  dot = lambda x, y: sum(Fraction(float(p)) * Fraction(float(r)) for p, r in zip(x, y))
  out = np.zeros(v.shape, np.float64)
  for bi, hi in np.ndindex(q.shape[0], q.shape[2]):
    qs, ks = q[bi, :, hi], k[bi, :, hi]
    g = [quarter * (1 - b_) * (dot(x, x) + dot(y, y)) + (1 + b_) / 2 * dot(x, y) for x, y in zip(qs, ks)]
    for i in range(q.shape[1]):
      keys = range(i + 1 if causal else q.shape[1])
      lg = [quarter * (1 - b_) * (dot(qs[i], qs[j]) + dot(ks[i], ks[j])) + (quarter * (1 + b_) + a_ / 2) * dot(qs[i], ks[j])
            + (quarter * (1 + b_) - a_ / 2) * dot(qs[j], ks[i]) - (1 - a_) / 2 * g[j] for j in keys]
      top = max(lg)
      w = np.array([np.exp(float(x - top) * s) for x in lg])
      out[bi, i, hi] = w @ v[bi, :len(w), hi].astype(np.float64) / w.sum()
  return out


def check_float32_running_sums(attend, batch: int, heads: int, width: int, n: int = 96, block: int = 4):
  """Assert a flash kernel keeps its running sums in float32 under bf16 operands, where bf16 ones drop terms.

  `attend(v, bias, block)` → y `[batch, n, heads, width]`: attention with q = k = 0 (every row's P is
  softmax(bias)) over values v ≡ 1 (bf16) and key bias `[batch, n, heads]`, in key blocks of `block`. The
  first block's bias is 0, the others' −6: after it each later block adds 4e^{−6} ≈ 0.01 to a running sum of
  4, under half a bf16 ulp there (0.0156), so a bf16 running output drops them all (y ≈ 0.95) where a float32
  one gives y = 1 exactly. Likewise dv_j = Σ_i P_ij G_i (a sum over query blocks) with G = 1 on the first
  query block and 2⁻⁹ after it: 4 % low in bf16, within dv's own bf16 rounding (2⁻⁸) of float64 otherwise."""
  import jax
  import jax.numpy as jnp
  v = jnp.ones((batch, n, heads, width), jnp.bfloat16)
  bias = jnp.where(jnp.arange(n) < block, 0.0, -6.0)[None, :, None] * jnp.ones((batch, 1, heads))
  w = jnp.where(jnp.arange(n) < block, 1.0, 2.0 ** -9)[None, :, None, None] * jnp.ones((batch, 1, heads, width))

  def loss(v):
    y = attend(v, bias, block)
    return jnp.sum(w * y.astype(jnp.float32)), y
  (_, y), dv = jax.jit(jax.value_and_grad(loss, has_aux=True))(v)
  np.testing.assert_array_equal(np.asarray(y, np.float32), 1.0)
  p = np.exp(np.asarray(bias[0, :, 0], np.float64))
  p = p / p.sum()                                                        # every row's P (q = k = 0)
  want = p[:, None] * np.asarray(w[0, :, 0], np.float64).sum(0)[None, :]   # dv_j = P_j Σ_i G_i, per channel
  np.testing.assert_allclose(np.asarray(dv, np.float64)[0, :, 0], want, rtol=2 ** -8, atol=0)


def attention_mask(kind: str, batch: int, heads: int, n: int, keep: int):
  """The kernel tests' masks over n tokens: "none" → None; "key" → a key-padding mask [b, 1, 1, n] (batch 1
  keeps its first `keep` keys); "full" → a random [b, h, n, n] mask (70 % kept, seed 1) in which query row 7
  of batch 0 / head 1 has no key at all (0 on every kernel) and every other row keeps key 0 (so it has a key
  under the causal order too)."""
  if kind == "none":
    return None
  if kind == "key":
    return np.arange(n)[None, None, None, :] < np.array([n, keep])[:, None, None, None]
  full = np.random.default_rng(1).random((batch, heads, n, n)) > 0.3
  full[:, :, :, 0] |= (np.arange(n) != 7)[None, None, :]
  full[0, 1, 7] = False
  return full


def masked_softmax(s, keep):
  """softmax_j(s) over the kept entries (`keep`, broadcastable to s), with a row that keeps none 0: the float64
  references' P (jax.numpy, differentiable; call it under `jax.enable_x64`)."""
  import jax.numpy as jnp
  rows = keep.any(-1, keepdims=True)
  top = jnp.where(rows, jnp.max(jnp.where(keep, s, -1e300), -1, keepdims=True), 0.0)
  e = jnp.where(keep, jnp.exp(jnp.where(keep, s, top) - top), 0.0)
  return e / jnp.where(rows, e.sum(-1, keepdims=True), 1.0)


def assert_matches_both(names, got, want, other, ref_tol: float = 2e-5, other_tol: float = 1e-5):
  """Each output/gradient in `got` against the float64 reference `want` (atol `ref_tol`·max|want|) and another
  kernel's `other` (atol `other_tol`·max|want|), rtol 1e-4; each reference must be a real signal (max > 1e-2),
  so a vanishing gradient cannot pass by being compared with zero."""
  for name, a, b, c in zip(names, got, want, other):
    size = np.abs(b).max()
    assert size > 1e-2, name
    np.testing.assert_allclose(a, b, atol=ref_tol * size, rtol=1e-4, err_msg=name)
    np.testing.assert_allclose(a, c, atol=other_tol * size, rtol=1e-4, err_msg=name)


def as_tpu_v5e(monkeypatch):
  """Lower Pallas for TPU on this CPU: the Mosaic lowering reads the chip's generation from the default device's
  kind (`jax._src.pallas.mosaic.tpu_info`); this names it "TPU v5 lite", one core. Skips where that module or
  its two readers are missing (a JAX that moved them)."""
  import pytest
  tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
  if not all(hasattr(tpu_info, f) for f in ("get_device_kind", "get_num_device_cores", "get_tpu_info")):
    pytest.skip("this JAX's Mosaic lowering reads the TPU's kind elsewhere")
  monkeypatch.setattr(tpu_info, "get_device_kind", lambda: "TPU v5 lite")
  monkeypatch.setattr(tpu_info, "get_num_device_cores", lambda: 1)


def lowered_calls(fn, args, platform: str) -> str:
  """The StableHLO text of `jit(fn)` traced on ShapeDtypeStructs `args` and lowered for `platform`."""
  import jax
  return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def triton_calls(stablehlo: str) -> int:
  """How many Pallas Triton kernels a lowered program calls: jaxlib ≤ 0.10.2 names them `__gpu$xla.gpu.triton`
  (the Triton IR in the call), later ones `triton_kernel_call_ffi` (compiled at lowering, in a compressed proto)."""
  return stablehlo.count("__gpu$xla.gpu.triton") + stablehlo.count("triton_kernel_call_ffi")


def jaxpr_eqns(jaxpr):
  """Every equation of a jaxpr and of the jaxprs inside it (scan and cond bodies, custom rules), depth first."""
  for e in jaxpr.eqns:
    yield e
    for p in e.params.values():
      for sub in (p if isinstance(p, (list, tuple)) else [p]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          yield from jaxpr_eqns(inner)


def spy_calls(monkeypatch, module, name):
  """[count]: how many times `module.name` is called from here to the test's end (a spy that calls through)."""
  count, fn = [0], getattr(module, name)

  def spy(*args, **kwargs):
    count[0] += 1
    return fn(*args, **kwargs)
  monkeypatch.setattr(module, name, spy)
  return count


def assert_edge_matches_float64(run, q, k, v, alpha):
  """`run(q, k, v)`, a kernel of the β = 1 edge at α, against `family_edge` in float64: values, and the gradients
  of Σ w ⊙ y in q, k, v (w fixed normal), to float32's accuracy."""
  import jax
  import jax.numpy as jnp
  np.testing.assert_allclose(run(q, k, v), family_edge64(q, k, v, alpha), atol=2e-6, rtol=1e-5)
  w = jax.random.normal(jax.random.PRNGKey(1), v.shape)
  got = jax.grad(lambda q, k, v: jnp.sum(w * run(q, k, v)), (0, 1, 2))(q, k, v)
  with jax.enable_x64(True):
    x64 = [jnp.asarray(np.asarray(x), jnp.float64) for x in (q, k, v, w)]
    want = jax.grad(lambda q, k, v: jnp.sum(x64[3] * family_edge(q, k, v, alpha)), (0, 1, 2))(*x64[:3])
  for g, r in zip(got, want):
    r = np.asarray(r)
    np.testing.assert_allclose(g, r, atol=2e-5 * np.abs(r).max(), rtol=1e-4)
