"""The magnetic (U(1)) operator CMAP and its read-outs, against float64/complex128 numpy written here.

Theorems checked: γ = 0 is the magnitude operator; the magnetic walk of a reversible magnitude has
a real spectrum equal to the Hermitian form's; the spectrum is gauge invariant; the frustration of a
triangle of flux Φ is 1 − cos(Φ/3); the circulation of the bilinear phase is a symplectic area; the
Wilson loop over proper triangles plus the degenerate closed walks is tr(K_θ³)/tr(K³); every edge transport is a rotation (isometry defect 0).
"""
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import magnetic as mg
from attngeo import markov
from attngeo import kernels, nn, operators as op
from helpers import chain_pi, distance_form_reference, huge_and_plain_tokens, jaxpr_eqns

B, N, H, D, E = 2, 29, 3, 8, 6
IMPLS = ["einsum", "blockwise"]


def qkv(seed=0, n=N, d=D, e=E, b=B):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(kk, (b, n, H, w)) for kk, w in zip(ks, (d, d, e))]


def reference(q, k, v, beta=0.0, coupling=1.0, causal=False, mask=None):
  """y_i = Σ_j K_ij e^{iθ_ij} v_j in complex128, from the definition: K = rownorm(exp(s S + ½ s (g_i − g_j)))."""
  q, k, v = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k, v))   # [b, h, n, ·]
  s = 1 / math.sqrt(q.shape[-1])
  beta = np.broadcast_to(np.asarray(beta, np.float64), (q.shape[1],))[None, :, None, None]
  gamma = np.broadcast_to(np.asarray(coupling, np.float64), (q.shape[1],))[None, :, None, None]
  m, n = (q + k) / math.sqrt(2), (q - k) / math.sqrt(2)
  dot = lambda a, c: np.einsum("bhid,bhjd->bhij", a, c)
  sym = 0.5 * dot(m, m) - beta * 0.5 * dot(n, n)
  g = 0.5 * (m * m).sum(-1) - beta[..., 0] * 0.5 * (n * n).sum(-1)
  logit = s * (sym + 0.5 * (g[..., :, None] - g[..., None, :]))
  keep = np.ones(logit.shape, bool)
  if causal:
    keep &= np.tril(np.ones(logit.shape[-2:], bool))
  if mask is not None:
    keep &= np.asarray(mask)
  w = np.where(keep, np.exp(logit - np.where(keep, logit, -np.inf).max(-1, keepdims=True)), 0.0)
  kmat = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
  theta = gamma * 0.5 * s * (dot(q, k) - dot(k, q))
  vc = v[..., 0::2] + 1j * v[..., 1::2]
  y = np.einsum("bhij,bhje->bhie", kmat * np.exp(1j * theta), vc).transpose(0, 2, 1, 3)
  out = np.empty(y.shape[:-1] + (2 * y.shape[-1],))
  out[..., 0::2], out[..., 1::2] = y.real, y.imag
  return out


def dense_out(q, k, v, beta=0.0, coupling=1.0, causal=False, mask=None):
  """The same through the library's dense complex matrix (a differentiable jnp path)."""
  kt = op.magnetic_matrix(q, k, beta=beta, coupling=coupling, causal=causal, mask=mask)
  y = jnp.einsum("bhij,bjhe->bihe", kt, v[..., 0::2] + 1j * v[..., 1::2])
  return jnp.stack([y.real, y.imag], -1).reshape(v.shape)


# ----------------------------------------------------------------------------- the operator

@pytest.mark.parametrize("impl", IMPLS)
def test_matches_complex_reference(impl):
  q, k, v = qkv()
  for beta, coupling, causal in [(0.0, 1.3, False), (0.4, np.array([0.0, -0.7, 2.5], np.float32), True)]:
    out = op.magnetic_transport(q, k, v, beta=beta, coupling=coupling, causal=causal, implementation=impl,
                                block_size=8)
    np.testing.assert_allclose(out, reference(q, k, v, beta, coupling, causal), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLS + ["paired"])
def test_huge_query_norms_match_the_float64_distance_form(impl):
  """|q| ≈ 1e20 on half the tokens made every row NaN (from 1e10 on: θ ~ 1e10 overflowed sincos's
  polynomials, and K_ij = 0 times NaN is NaN; from 1e19 on the magnitude's terms overflowed too). Far
  tokens are isolated as in DMAP (the paired kernel hands such calls to the one-sided kernel) and
  sincos is bounded: the float64 distance form (θ_ii = 0 exactly) on every row. At 1e10 (not far) the
  plain rows match it and every row is finite (the huge rows' own phase θ_ii is float32 rounding there)."""
  q, k, v = huge_and_plain_tokens()
  run = lambda q: op.magnetic_transport(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), coupling=0.7,
                                        implementation=impl, block_size=8)
  np.testing.assert_allclose(run(q), distance_form_reference(q, k, v, coupling=0.7), rtol=1e-5, atol=1e-5)
  q10 = huge_and_plain_tokens(size=1e10)[0]
  y = run(q10)
  assert np.all(np.isfinite(y))
  np.testing.assert_allclose(y[:, 8:], distance_form_reference(q10, k, v, coupling=0.7)[:, 8:], rtol=1e-5, atol=1e-5)


def test_sincos_is_bounded_for_every_finite_argument():
  x = jnp.asarray([1e5, -3e9, 1e12, 3e20, -3.4e38], jnp.float32)
  sin, cos = kernels.sincos(x)
  assert np.all(np.abs(sin) <= 1 + 1e-6) and np.all(np.abs(cos) <= 1 + 1e-6)


@pytest.mark.parametrize("impl", IMPLS)
def test_key_mask_and_fully_masked_rows(impl):
  n = 37                                                        # not a multiple of the block: padding too
  q, k, v = qkv(1, n=n)
  mask = jax.random.bernoulli(jax.random.PRNGKey(4), 0.5, (B, H, n, n))
  mask = mask.at[:, :, 5].set(False).at[0, 1, 20].set(False)   # dead rows: the family's convention is 0
  out = op.magnetic_transport(q, k, v, coupling=0.8, mask=mask, implementation=impl, block_size=16)
  np.testing.assert_array_equal(out[:, 5], 0.0)
  np.testing.assert_array_equal(out[0, 20, 1], 0.0)
  np.testing.assert_allclose(out, reference(q, k, v, 0.0, 0.8, mask=mask), atol=2e-6, rtol=1e-5)
  np.testing.assert_array_equal(op.magnetic_matrix(q, k, coupling=0.8, mask=mask)[:, :, 5], 0.0)


def test_zero_coupling_is_exactly_the_magnitude_operator():
  q, k, v = qkv(2)
  for beta in (0.0, 0.6):
    fam = op.transport(q, k, v, beta=beta, alpha=0.0, causal=True)
    np.testing.assert_array_equal(op.magnetic_transport(q, k, v, beta=beta, coupling=0.0, causal=True), fam)
    for impl in IMPLS:                     # a traced zero runs the phase kernel: θ = 0 to the last bit
      out = jax.jit(lambda g: op.magnetic_transport(q, k, v, beta=beta, coupling=g, causal=True,
                                                    implementation=impl, block_size=8))(jnp.zeros(H))
      np.testing.assert_allclose(out, fam, atol=1e-6)
  phase = op.magnetic_transport(q, k, v, coupling=0.5) - op.transport(q, k, v, beta=0.0, alpha=0.0)
  assert float(jnp.abs(phase).max()) > 1e-2


def test_depends_on_w_plus_and_the_antisymmetric_part_only():
  """q' = (1+t)q + tk, k' = (1−t)k − tq keeps m = (q+k)/√2 and q_i·k_j − k_i·q_j: CMAP (β = 0) is unchanged."""
  q, k, v = qkv(3)
  t = 0.37
  q2, k2 = (1 + t) * q + t * k, (1 - t) * k - t * q
  np.testing.assert_allclose(op.magnetic_transport(q2, k2, v), op.magnetic_transport(q, k, v), atol=2e-5)
  assert float(jnp.abs(op.transport(q2, k2, v) - op.transport(q, k, v)).max()) > 1e-2     # ATTN is not


@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_match_autodiff_of_the_complex_matrix(impl):
  """d/d(q, k, v, γ, β) through each kernel's VJP (blockwise: recomputing; einsum: from the saved P cos θ,
  P sin θ) = autodiff of the dense complex matrix (causal and key mask, a padded block)."""
  causal = True
  q, k, v = qkv(4, n=20)
  mask = jax.random.bernoulli(jax.random.PRNGKey(3), 0.5, (B, 1, 20, 20)) | jnp.eye(20, dtype=bool)
  g0, b0 = jnp.array([0.5, 1.0, -2.0]), jnp.array([0.2, 0.5, 0.9])
  f = lambda fn: (lambda *a: jnp.sum(jnp.sin(fn(*a))))
  fused = f(lambda q, k, v, g, b_: op.magnetic_transport(q, k, v, beta=b_, coupling=g, causal=causal, mask=mask,
                                                         implementation=impl, block_size=8))
  dense = f(lambda q, k, v, g, b_: dense_out(q, k, v, b_, g, causal, mask))
  args = (q, k, v, g0, b0)
  for a, b in zip(jax.jit(jax.grad(fused, range(5)))(*args), jax.jit(jax.grad(dense, range(5)))(*args)):
    assert float(jnp.abs(b).min() if b.ndim == 1 else jnp.abs(b).max()) > 1e-3       # real gradients
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-4)


def _phase_reference(q, k, v, qt, kt, c, mask, causal, scale):
  """`y_i = Σ_j P_ij e^{iθ_ij} v_j` in jnp complex arithmetic (differentiable; rows with no key are 0)."""
  t, s_ = q.shape[1], k.shape[1]
  logit = jnp.einsum("bthd,bshd->bhts", q, k) * scale
  keep = jnp.broadcast_to(mask, logit.shape) & (jnp.tril(jnp.ones((t, s_), bool)) if causal else True)
  top = jax.lax.stop_gradient(jnp.max(jnp.where(keep, logit, -1e30), -1, keepdims=True))
  w = jnp.where(keep, jnp.exp(jnp.where(keep, logit - jnp.where(keep.any(-1, keepdims=True), top, 0.0), 0.0)), 0.0)
  p = w / jnp.maximum(w.sum(-1, keepdims=True), 1e-30)
  theta = c[None, :, None, None] * jnp.einsum("bthf,bshf->bhts", qt, kt)
  y = jnp.einsum("bhts,bshe->bthe", p * jnp.exp(1j * theta), v[..., 0::2] + 1j * v[..., 1::2])
  return jnp.stack([y.real, y.imag], -1).reshape(y.shape[:-1] + (v.shape[-1],))


def test_the_phase_kernel_reads_the_bias_cotangent_off_the_dk_product():
  """As the softmax kernel (tests/test_kernels.py): dbias comes out of `[s·qᵀ; 1ᵀ]·dL`, d + 1 rows, with no sum of
  its own over a [b, h, bq, bk] block's rows; without a bias that product keeps its d rows."""
  ks = jax.random.split(jax.random.PRNGKey(31), 6)
  q, k = (jax.random.normal(kk, (B, N, H, D)) for kk in ks[:2])
  qt, kt = (jax.random.normal(kk, (B, N, H, 3)) for kk in ks[2:4])
  v, bias = jax.random.normal(ks[4], (B, N, H, E)), jax.random.normal(ks[5], (B, N, H))
  c = jnp.array([0.3, -0.8, 1.7])

  run = lambda q, b=None: jnp.sum(kernels.phase_attention(q, k, v, qt, kt, c, bias=b, implementation="blockwise",
                                                          block_size=4))
  for args in ((q, bias), (q,)):
    found = list(jaxpr_eqns(jax.make_jaxpr(jax.grad(run, range(len(args))))(*args).jaxpr))
    assert not [e for e in found if e.primitive.name == "reduce_sum" and e.invars[0].aval.shape[-2:] == (4, 4)
                and tuple(e.params["axes"]) == (2,)]
    rows = {e.outvars[0].aval.shape[2] for e in found if e.primitive.name == "dot_general"
            and e.invars[0].aval.ndim == 4 and e.invars[0].aval.shape[-1] == 4 and e.invars[1].aval.shape[-2:] == (4, 4)
            and e.invars[0].aval.shape[2] in (D, D + 1)}                        # the dk product [b, h, f, bk]
    assert rows == ({D + 1} if len(args) == 2 else {D}), rows


@pytest.mark.parametrize("impl", IMPLS)
def test_kernel_gradients_with_fewer_queries_no_bias_and_rows_emptied_by_padding_and_causality(impl):
  """The phase kernel alone at t = 11 queries, s = 20 keys, no key bias, per-head coupling, left padding
  (keys 0–2) under the causal order, so query rows 0–2 have no key: output and every gradient
  (q, k, v, qt, kt, c) against complex autodiff of the definition."""
  t, s_ = 11, 20
  ks = jax.random.split(jax.random.PRNGKey(21), 5)
  q, qt = jax.random.normal(ks[0], (B, t, H, D)), jax.random.normal(ks[1], (B, t, H, 2 * D))
  k, kt = jax.random.normal(ks[2], (B, s_, H, D)), jax.random.normal(ks[3], (B, s_, H, 2 * D))
  v = jax.random.normal(ks[4], (B, s_, H, E))
  c = jnp.array([0.3, -0.8, 1.7])
  mask = jnp.broadcast_to(jnp.arange(s_) >= 3, (B, 1, 1, s_))
  fused = lambda *a: kernels.phase_attention(*a, mask=mask, causal=True, implementation=impl, block_size=8)
  ref = lambda q, k, v, qt, kt, c: _phase_reference(q, k, v, qt, kt, c, mask, True, 1 / math.sqrt(D))
  args = (q, k, v, qt, kt, c)
  out = fused(*args)
  np.testing.assert_array_equal(out[:, :3], 0.0)
  np.testing.assert_allclose(out, ref(*args), atol=2e-6, rtol=1e-5)
  loss = lambda fn: (lambda *a: jnp.sum(jnp.sin(fn(*a))))
  for a, b in zip(jax.grad(loss(fused), range(6))(*args), jax.grad(loss(ref), range(6))(*args)):
    assert float(jnp.abs(b).max()) > 1e-3
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_gradients_on_peaked_rows_are_float32_accurate(impl):
  """Logits 4× spread (near one-hot rows, where dL = P (dP − δ) cancels): dq, dk and dc within 2e-5 of float64
  autodiff, as plain autodiff is (6e-6); normalising the dense forward by exp(s − logsumexp s) instead of
  the softmax measured 3.6e-4 here."""
  t, n, f = 8, 64, 3
  ks = jax.random.split(jax.random.PRNGKey(1), 6)
  q, k = 4 * jax.random.normal(ks[0], (1, t, 2, 4)), 4 * jax.random.normal(ks[1], (1, n, 2, 4))
  v, qt, kt = (jax.random.normal(kk, (1, m, 2, w)) for kk, m, w in zip(ks[2:5], (n, t, n), (4, f, f)))
  g, c = jax.random.normal(ks[5], (1, t, 2, 4)), jnp.array([0.5, -1.0])
  ones = jnp.ones((1, 1, 1, n), bool)
  fused = lambda q, k, c: jnp.sum(g * kernels.phase_attention(q, k, v, qt, kt, c, scale=1.5, implementation=impl,
                                                              block_size=16))
  got = jax.jit(jax.grad(fused, range(3)))(q, k, c)
  with jax.enable_x64(True):
    x64 = lambda x: jnp.asarray(np.asarray(x), jnp.float64)
    ref = lambda q, k, c: jnp.sum(x64(g) * _phase_reference(q, k, x64(v), x64(qt), x64(kt), c, ones, False, 1.5))
    want = [np.asarray(w) for w in jax.grad(ref, range(3))(x64(q), x64(k), x64(c))]
  for a, b in zip(got, want):
    assert np.abs(np.asarray(a, np.float64) - b).max() <= 2e-5 * np.abs(b).max()


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_gradients_keep_their_inputs_dtypes(impl):
  q, k, v = (x.astype(jnp.bfloat16) for x in qkv(22))
  grads = jax.grad(lambda q, k, v, g: jnp.sum(op.magnetic_transport(q, k, v, coupling=g, implementation=impl,
                                                                    block_size=8).astype(jnp.float32)),
                   range(4))(q, k, v, jnp.full((H,), 0.5))
  assert [g.dtype for g in grads] == [jnp.bfloat16] * 3 + [jnp.float32]
  assert all(bool(jnp.isfinite(g.astype(jnp.float32)).all()) and float(jnp.abs(g.astype(jnp.float32)).max()) > 0
             for g in grads)


def test_fused_sincos_is_float32_accurate():
  x = np.concatenate([np.linspace(-7, 7, 20001), np.random.default_rng(0).uniform(-1e3, 1e3, 20000),
                      [0.0, np.pi, -np.pi, np.pi / 2, 2 * np.pi]]).astype(np.float32)
  s, c = kernels.sincos(jnp.asarray(x))
  x64 = x.astype(np.float64)
  assert np.abs(np.asarray(s, np.float64) - np.sin(x64)).max() < 5e-7
  assert np.abs(np.asarray(c, np.float64) - np.cos(x64)).max() < 5e-7


@pytest.mark.parametrize("impl", IMPLS)
def test_bf16_with_float32_accumulation(impl):
  """16-bit inputs: the error of CMAP is within 3× that of ATTN on the same inputs (both against float32)."""
  ks = jax.random.split(jax.random.PRNGKey(10), 3)
  for mult in (1.0, 10.0):
    q, k, v = [(jax.random.normal(kk, (B, 64, H, 16)) * (mult if i < 2 else 1.0) / 2).astype(jnp.bfloat16)
               for i, kk in enumerate(ks)]
    q32, k32, v32 = (x.astype(jnp.float32) for x in (q, k, v))
    out = op.magnetic_transport(q, k, v, coupling=0.5, implementation=impl, block_size=16)
    assert out.dtype == jnp.bfloat16
    err = float(jnp.abs(out.astype(jnp.float32) - reference(q32, k32, v32, 0.0, 0.5)).max() / jnp.abs(v32).max())
    attn = op.transport(q, k, v, implementation=impl, block_size=16).astype(jnp.float32)
    attn_err = float(jnp.abs(attn - op.transport(q32, k32, v32, implementation="einsum")).max() / jnp.abs(v32).max())
    assert err <= 3 * attn_err + 1e-3, (mult, err, attn_err)


# ----------------------------------------------------------------------------- spectrum and gauge

def _walk(seed=6, n=16, coupling=1.5, beta=0.0):
  q, k, _ = qkv(seed, n=n, b=1)
  return q, k, op.markov_matrix(q, k, beta=beta, alpha=0.0), op.phases(q, k, coupling=coupling)


def test_the_magnetic_walk_has_a_real_spectrum_equal_to_the_hermitian_forms():
  _, _, p, theta = _walk()
  kt = np.asarray(p, np.float64) * np.exp(1j * np.asarray(theta, np.float64))            # [1, h, n, n]
  for h in range(H):
    ev = np.linalg.eigvals(kt[0, h])
    assert np.abs(ev.imag).max() < 1e-6                                # K_θ itself is not Hermitian ...
    assert np.abs(kt[0, h] - kt[0, h].conj().T).max() > 1e-2
    # ... but similar to D^{1/2} K_θ D^{-1/2}, D = diag(π) with π the left Perron vector of K (numpy)
    w, vl = np.linalg.eig(np.asarray(p[0, h], np.float64).T)
    pi = np.abs(vl[:, np.argmax(w.real)].real)
    pi /= pi.sum()
    herm = np.sqrt(pi)[:, None] * kt[0, h] / np.sqrt(pi)[None, :]
    np.testing.assert_allclose(herm, herm.conj().T, atol=1e-7)
    ref = np.linalg.eigvalsh(herm)[::-1]
    np.testing.assert_allclose(mg.hermitian_spectrum(p, theta)[0, h], ref, atol=3e-6)
    np.testing.assert_allclose(np.sort(ev.real)[::-1], ref, atol=3e-6)
  lam = mg.hermitian_spectrum(p, theta)
  assert float(lam.max()) < 1 - 1e-3 and float(lam.min()) > -1      # frustrated: λ_max < 1
  np.testing.assert_allclose(mg.hermitian_spectrum(p, jnp.zeros_like(theta))[..., 0], 1.0, atol=1e-5)   # γ = 0: λ₀ = 1


def test_spectrum_is_gauge_invariant_and_not_invariant_otherwise():
  _, _, p, theta = _walk(7)
  phi = jax.random.uniform(jax.random.PRNGKey(1), theta.shape[:-1], minval=-4, maxval=4)
  np.testing.assert_allclose(mg.hermitian_spectrum(p, mg.gauge(theta, phi)), mg.hermitian_spectrum(p, theta), atol=3e-6)
  other = jax.random.normal(jax.random.PRNGKey(2), theta.shape)
  other = theta + 0.5 * (other - jnp.swapaxes(other, -1, -2))        # an antisymmetric change that is not gauge
  assert float(jnp.abs(mg.hermitian_spectrum(p, other) - mg.hermitian_spectrum(p, theta)).max()) > 1e-2
  tri = np.array([[0, 3, 7], [2, 9, 4], [5, 1, 11]])
  np.testing.assert_allclose(mg.circulation(mg.gauge(theta, phi), *tri.T), mg.circulation(theta, *tri.T), atol=2e-5)


def test_laplacian_is_one_minus_the_hermitian_form():
  _, _, p, theta = _walk(8)
  lap = mg.laplacian(p, theta)
  np.testing.assert_allclose(lap, jnp.conj(jnp.swapaxes(lap, -1, -2)), atol=1e-6)
  np.testing.assert_allclose(jnp.linalg.eigvalsh(lap), 1 - mg.hermitian_spectrum(p, theta), atol=3e-6)   # ascending


# ----------------------------------------------------------------------------- frustration and curvature

def _triangle(flux, weights=(1.0, 1.0, 1.0)):
  """A 3-cycle walk (symmetric weights, no self-loops) with phases θ_01 = θ_12 = θ_20 = flux/3."""
  w = np.zeros((3, 3))
  for (i, j), x in zip([(0, 1), (1, 2), (2, 0)], weights):
    w[i, j] = w[j, i] = x
  t = np.zeros((3, 3))
  for i, j in [(0, 1), (1, 2), (2, 0)]:
    t[i, j], t[j, i] = flux / 3, -flux / 3
  return jnp.asarray(w / w.sum(1, keepdims=True), jnp.float32), jnp.asarray(t, jnp.float32)


def test_frustration_of_a_triangle_is_one_minus_cos_flux_over_three():
  for flux in (0.0, 1.0, 2.0, 3.0, math.pi):
    p, theta = _triangle(flux)
    fr = mg.frustration(p, theta)
    nu = 1 - math.cos(flux / 3)
    np.testing.assert_allclose(float(fr.lower), nu, atol=2e-6)
    np.testing.assert_allclose(float(fr.upper), nu, atol=2e-6)   # at Φ = π (double top eigenvalue) via the power method
    f = mg.circulation(theta, *np.array([[0], [1], [2]]))[0]
    np.testing.assert_allclose(np.exp(1j * float(f)), np.exp(1j * flux), atol=1e-6)


def test_frustration_bracket_contains_the_float64_minimum_and_the_power_method_attains_it():
  """ν by brute force in float64 (a 96³ grid over the free phases, then BFGS from the 20 best grid
  points): the spectral bound is below it, the rounded eigenvector above it, and the power method
  lands on it (without it the upper bound was 0.306 here, ν = 0.2985)."""
  import scipy.optimize
  rng = np.random.default_rng(0)
  w = rng.uniform(0.2, 1.0, (4, 4))
  w = w + w.T
  np.fill_diagonal(w, 0)
  p = jnp.asarray(w / w.sum(1, keepdims=True), jnp.float32)
  a = rng.uniform(-3, 3, (4, 4))
  theta = jnp.asarray(a - a.T, jnp.float32)
  pi = w.sum(1) / w.sum()
  flow = pi[:, None] * np.asarray(p, np.float64)
  z = np.exp(1j * np.asarray(theta, np.float64))

  def energy(phis):                     # x_0 = 1 fixes the global phase
    x = np.exp(1j * np.concatenate([np.zeros(phis.shape[:-1] + (1,)), phis], -1))
    return 0.5 * np.sum(flow * np.abs(x[..., :, None] - z * x[..., None, :]) ** 2, (-2, -1))

  grid = np.linspace(-np.pi, np.pi, 97)[:-1]
  phis = np.stack(np.meshgrid(grid, grid, grid, indexing="ij"), -1).reshape(-1, 3)
  starts = phis[np.argsort(energy(phis))[:20]]
  nu = min(scipy.optimize.minimize(energy, s0, method="BFGS", options={"gtol": 1e-12}).fun for s0 in starts)
  fr = mg.frustration(p, theta)
  assert float(fr.lower) <= nu <= float(fr.upper) + 1e-6 <= float(fr.rounded) + 1e-6
  assert abs(float(fr.upper) - nu) < 2e-6 and float(fr.rounded) - nu > 1e-3, (float(fr.upper), float(fr.rounded), nu)
  assert not bool(fr.stalled) and 0 < int(fr.steps) < 500
  np.testing.assert_allclose(float(fr.upper), energy(np.angle(np.asarray(fr.x, np.complex128)[1:] / fr.x[0])), atol=2e-6)
  assert float(fr.lower) > 0.05                                        # this θ is frustrated
  exact = mg.frustration(p, mg.gauge(jnp.zeros_like(theta), jnp.asarray(rng.normal(size=4), jnp.float32)))
  np.testing.assert_allclose([float(exact.lower), float(exact.upper)], 0.0, atol=2e-6)   # pure gauge: ν = 0


def test_frustration_power_method_never_raises_the_energy_and_reports_a_stall():
  q, k, _ = qkv(4, n=24, b=2)
  p = op.markov_matrix(q, k, beta=0.0, alpha=0.0)
  theta = op.phases(q, k, coupling=2.0)
  full = mg.frustration(p, theta)
  assert np.all(np.asarray(full.upper) <= np.asarray(full.rounded) + 1e-6)
  assert np.all(np.asarray(full.lower) <= np.asarray(full.upper) + 1e-6)
  none = mg.frustration(p, theta, max_steps=0)
  np.testing.assert_array_equal(none.upper, none.rounded)
  assert not np.any(np.asarray(none.stalled))
  one = mg.frustration(p, theta, max_steps=1)
  assert np.all(np.asarray(one.stalled)) and np.all(np.asarray(one.steps) == 1)
  for bad in (dict(xtol=0.0), dict(max_steps=2.7), dict(max_steps=-1)):
    with pytest.raises(ValueError, match="max_steps must be an integer ≥ 0 and xtol > 0"):
      mg.frustration(p, theta, **bad)


def test_frustration_stops_and_reports_each_walk_on_its_own():
  """A batch of a pure-gauge walk (settles at once) and frustrated ones: steps and stalled are per walk."""
  q, k, _ = qkv(4, n=24, b=3)
  p = op.markov_matrix(q, k, beta=0.0, alpha=0.0)[:, 0]
  theta = op.phases(q, k, coupling=2.0)[:, 0].at[0].set(0.0)
  alone = [mg.frustration(p[i], theta[i]) for i in range(3)]
  both = mg.frustration(p, theta)
  np.testing.assert_array_equal(both.steps, [int(a.steps) for a in alone])
  np.testing.assert_array_equal(both.stalled, [bool(a.stalled) for a in alone])
  np.testing.assert_allclose(both.upper, [float(a.upper) for a in alone], atol=1e-6)
  assert int(both.steps[0]) <= 2 < int(both.steps[1])
  short = mg.frustration(p, theta, max_steps=3)
  assert not bool(short.stalled[0]) and bool(short.stalled[1])


def _two_clusters(eps, seed=0, n=8):
  """Two 4-state clusters joined by weight-eps edges (a reversible K whose π is ill-conditioned) and random θ."""
  rng = np.random.default_rng(seed)
  a = rng.uniform(0.5, 1, (n, n))
  a = a + a.T
  block = np.zeros((n, n), bool)
  block[:4, :4] = block[4:, 4:] = True
  w = np.where(block, a, eps * a)
  w[:4, :4] *= 30
  t = rng.uniform(-2, 2, (n, n))
  return w / w.sum(1, keepdims=True), w.sum(1) / w.sum(), t - t.T


def test_frustration_bracket_holds_when_pi_is_only_known_to_the_solvers_error():
  """Weakly joined clusters (κ ≈ 1e5): float32 π was off by ~0.04 in ℓ¹ (it once gave upper 0.2578 <
  ν = 0.2828 for such a walk); refined from float64 residuals it is off by ~1e-8 and certified to
  7.7e-8 (the float32 residual's bound was > 1e-3). The bracket, widened by `markov.stationary`'s ℓ¹
  bound (≥ the true error, ≤ 1e-6), contains the float64 minimum, and so does the bracket from the
  float64 π (which gets the same kind of bound); λ_max is not widened."""
  import scipy.optimize
  p64, pi64, t = _two_clusters(1e-5)
  p, theta = jnp.asarray(p64, jnp.float32), jnp.asarray(t, jnp.float32)
  chain = np.asarray(p, np.float64) / np.asarray(p, np.float64).sum(1, keepdims=True)    # the chain given
  flow, z = chain_pi(p)[:, None] * chain, np.exp(1j * np.asarray(theta, np.float64))

  def energy(ph):
    x = np.exp(1j * np.concatenate([[0.0], ph]))
    return 0.5 * np.sum(flow * np.abs(x[:, None] - z * x[None, :]) ** 2)

  fr = mg.frustration(p, theta)
  rng = np.random.default_rng(1)
  starts = [np.angle(np.asarray(fr.x, np.complex128)[1:] / complex(fr.x[0]))] + [rng.uniform(-3, 3, 7) for _ in range(20)]
  nu = min(scipy.optimize.minimize(energy, s0, method="BFGS", options={"gtol": 1e-12}).fun for s0 in starts)
  pi_err = np.abs(np.asarray(markov.stationary(p).pi, np.float64) - chain_pi(p)).sum()
  assert pi_err <= float(fr.pi_error) <= 1e-6 and float(fr.lower) <= nu <= float(fr.upper)
  np.testing.assert_allclose(float(fr.lambda_max), float(mg.hermitian_spectrum(p, theta, k=1)[0]), atol=1e-6)
  given = mg.frustration(p, theta, pi=jnp.asarray(pi64, jnp.float32))
  assert float(given.pi_error) > 0 and float(given.lower) <= nu <= float(given.upper)
  for walk in (_two_clusters(1e-7)[::2], (np.eye(3), np.zeros((3, 3)))):     # π ill-determined / not unique
    hopeless = mg.frustration(*(jnp.asarray(x, jnp.float32) for x in walk))
    np.testing.assert_allclose([float(hopeless.lower), float(hopeless.upper)], [0.0, 1.0])   # ν ∈ [0, 1]


def test_a_supplied_pi_must_be_the_stationary_law():
  p, theta = _triangle(1.0, weights=(1.0, 2.0, 3.0))
  pi = markov.stationary(p).pi
  np.testing.assert_allclose(mg.hermitian_spectrum(p, theta, pi=pi), mg.hermitian_spectrum(p, theta), atol=1e-6)
  for bad, match in [(pi[:2], r"pi must be \[\.\.\., n\]"), (pi.at[0].set(-0.1), "probability vector"),
                     (jnp.full(3, 1 / 3), "stationary law")]:
    with pytest.raises(ValueError, match=match):
      mg.frustration(p, theta, pi=bad)


def test_circulation_is_the_symplectic_area_of_the_triangle():
  q, k, _ = qkv(9, n=16, b=1)
  g, s = 0.8, 1 / math.sqrt(D)
  theta = op.phases(q, k, coupling=g)
  rng = np.random.default_rng(1)
  tri = np.stack([rng.choice(16, 3, replace=False) for _ in range(40)])
  z = np.concatenate([np.asarray(q, np.float64), np.asarray(k, np.float64)], -1)[0].transpose(1, 0, 2)   # [h, n, 2d]
  dot = lambda a, c: np.einsum("htd,htd->ht", a, c)
  omega = lambda a, c: dot(a[..., :D], c[..., D:]) - dot(a[..., D:], c[..., :D])
  area = g * 0.5 * s * omega(z[:, tri[:, 1]] - z[:, tri[:, 0]], z[:, tri[:, 2]] - z[:, tri[:, 0]])
  wrapped = np.angle(np.exp(1j * area))
  np.testing.assert_allclose(np.exp(1j * np.asarray(mg.triangle_circulation(q, k, tri, coupling=g)[0])),
                             np.exp(1j * wrapped), atol=2e-5)
  np.testing.assert_allclose(np.exp(1j * np.asarray(mg.circulation(theta, *tri.T)[0])), np.exp(1j * wrapped), atol=2e-5)


def test_curvature_distribution_against_an_explicit_triangle_sum():
  q, k, p, theta = _walk(10, coupling=2.0)
  cv = mg.curvature(p, theta, bins=24)
  kk, tt = np.asarray(p, np.float64)[0], np.asarray(theta, np.float64)[0]
  for h in range(H):
    tot = wil = mabs = 0.0
    hist = np.zeros(24)
    for i, j, l in itertools.permutations(range(16), 3):                # proper triangles: distinct vertices
      w = kk[h, i, j] * kk[h, j, l] * kk[h, l, i]
      f = np.angle(np.exp(1j * (tt[h, i, j] + tt[h, j, l] + tt[h, l, i])))
      tot, wil, mabs = tot + w, wil + w * np.exp(1j * f), mabs + w * abs(f)
      hist[math.ceil((f + np.pi) / (2 * np.pi / 24)) - 1] += w          # bins (e_b, e_b+1]
    kt = kk[h] * np.exp(1j * tt[h])                                    # closed 3-walks: degenerate ones carry no flux
    np.testing.assert_allclose(wil + (np.trace(kk[h] @ kk[h] @ kk[h]) - tot), np.trace(kt @ kt @ kt), atol=1e-12)
    np.testing.assert_allclose(complex(cv.wilson[0, h]), wil / tot, atol=2e-6)
    assert abs(float(jnp.imag(cv.wilson[0, h]))) < 1e-6     # reversible K: both orientations weigh the same
    np.testing.assert_allclose(float(cv.mean_abs[0, h]), mabs / tot, atol=2e-6)
    np.testing.assert_allclose(cv.hist[0, h], hist / tot, atol=2e-6)


def test_sampled_curvature_agrees_with_the_exact_sum_within_its_standard_error():
  q, k, p, theta = _walk(10, coupling=2.0)
  exact = mg.curvature(p, theta)
  for samples in (2000, 32000):
    est = mg.sampled_curvature(p, theta, jax.random.PRNGKey(3), samples=samples)
    z_w = np.abs(np.asarray(est.wilson) - np.asarray(exact.wilson)) / np.asarray(est.wilson_se)
    z_a = np.abs(np.asarray(est.mean_abs) - np.asarray(exact.mean_abs)) / np.asarray(est.mean_abs_se)
    assert z_w.max() < 4.5 and z_a.max() < 4.5, (samples, z_w, z_a)
  small = mg.sampled_curvature(p, theta, jax.random.PRNGKey(3), samples=2000)
  ratio = np.asarray(small.mean_abs_se) / np.asarray(est.mean_abs_se)
  assert np.all((ratio > 2.8) & (ratio < 5.2))                        # √16 = 4: the error shrinks as 1/√S
  assert np.all(np.asarray(est.mean_abs_se) < 0.02 * np.asarray(exact.mean_abs))
  with pytest.raises(ValueError, match="samples must be at least 2"):
    mg.sampled_curvature(p, theta, jax.random.PRNGKey(0), samples=1)


def test_sampled_curvature_intervals_cover_on_a_nearly_diagonal_walk():
  """K = 0.999 I + 0.001 K' (the same law over proper triangles as K'): drawing j, k from the rows wasted
  nearly every sample (mean |F| read 0 ± 0 in 198 of 200 seeds). Drawing proper triangles, 100 seeds × 3
  heads of 256 samples: the nominal 95 % intervals for mean |F| cover the exact value 90–98.5 % of the
  time (a standard error off by 2× either way would give 68 % or 99.99 %)."""
  _, _, p, theta = _walk(10, coupling=2.0)
  lazy = 0.999 * jnp.eye(p.shape[-1]) + 0.001 * p
  exact = mg.curvature(lazy, theta)
  np.testing.assert_allclose(exact.mean_abs, mg.curvature(p, theta).mean_abs, rtol=1e-5)
  z, ess = [], []
  for seed in range(100):
    est = mg.sampled_curvature(lazy, theta, jax.random.PRNGKey(seed), samples=256)
    z.append((np.asarray(est.mean_abs) - np.asarray(exact.mean_abs)) / np.asarray(est.mean_abs_se))
    ess.append(np.asarray(est.ess))
  cover = float(np.mean(np.abs(np.concatenate(z, None)) < 1.96))
  assert 0.90 <= cover <= 0.985 and np.min(ess) > 100, (cover, np.min(ess))


def test_sampled_curvature_is_unbiased_on_uneven_and_sharp_walks():
  """Self-loops of uneven weight (K_ii from 0 to 0.9, so the proposal's normalisers differ by row): the
  mean of 40 estimates is the exact value within 4 standard errors of that mean. A sharp walk
  ((1 − d) I + d K', d = 1e-6: normalisers of 1e-6, weights of 1e-18) still has thousands of effective
  triangles and a finite standard error."""
  _, _, p, theta = _walk(11, coupling=2.0)
  a = jnp.linspace(0.0, 0.9, p.shape[-1])
  uneven = a[:, None] * jnp.eye(p.shape[-1]) + (1 - a)[:, None] * p
  exact = np.asarray(mg.curvature(uneven, theta).mean_abs)
  est = np.stack([np.asarray(mg.sampled_curvature(uneven, theta, jax.random.PRNGKey(s), samples=2048).mean_abs)
                  for s in range(40)])
  z = (est.mean(0) - exact) / (est.std(0, ddof=1) / np.sqrt(len(est)))
  assert np.all(np.abs(z) < 4), z
  sharp = (1 - 1e-6) * jnp.eye(p.shape[-1]) + 1e-6 * p
  s = mg.sampled_curvature(sharp, theta, jax.random.PRNGKey(0), samples=4096)
  assert np.all(np.asarray(s.ess) > 1000) and np.all(np.isfinite(np.asarray(s.mean_abs_se)))
  assert np.all(np.abs(np.asarray(s.mean_abs) - np.asarray(mg.curvature(p, theta).mean_abs)) < 4.5 * np.asarray(s.mean_abs_se))


def test_a_walk_without_proper_triangles_has_no_circulation_law():
  swap = jnp.asarray([[0.0, 1.0], [1.0, 0.0]])
  pairs = jnp.kron(jnp.eye(2), swap)                                   # two 2-cycles: no 3-cycle at all
  for p in (swap, pairs):
    theta = jnp.zeros_like(p)
    cv = mg.curvature(p, theta)
    assert np.isnan(complex(cv.wilson)) and np.isnan(float(cv.mean_abs)) and np.all(np.isnan(cv.hist))
    est = mg.sampled_curvature(p, theta, jax.random.PRNGKey(0), samples=64)
    assert float(est.ess) == 0 and np.isnan(float(est.mean_abs)) and np.isnan(float(est.mean_abs_se))


# ----------------------------------------------------------------------------- connection walk

def test_phase_rotations_are_exact_isometries():
  _, _, p, theta = _walk(11)
  np.testing.assert_allclose(mg.phase_isometry_defect(p, theta), 0.0, atol=1e-6)
  r = mg.phase_rotations(theta)
  np.testing.assert_allclose(jnp.swapaxes(r, -1, -2) @ r, jnp.broadcast_to(jnp.eye(2), r.shape), atol=1e-6)
  v = jax.random.normal(jax.random.PRNGKey(0), (2,))
  z = (v[0] + 1j * v[1]) * jnp.exp(1j * theta[0, 0, 2, 5])              # R(θ) acts as e^{iθ} on (Re, Im)
  np.testing.assert_allclose(r[0, 0, 2, 5] @ v, jnp.array([z.real, z.imag]), atol=1e-6)


def test_real_connection_laplacian_is_the_complex_one():
  _, _, p, theta = _walk(12)
  lap = np.asarray(mg.rotation_laplacian_matrix(p, theta), np.float64)[0, 1]
  kt = np.asarray(p, np.float64)[0, 1] * np.exp(1j * np.asarray(theta, np.float64)[0, 1])
  ev = 1 - np.linalg.eigvals(kt)
  ref = np.sort_complex(np.concatenate([ev, ev.conj()]))
  np.testing.assert_allclose(np.sort_complex(np.linalg.eigvals(lap)), ref, atol=1e-5)


# ----------------------------------------------------------------------------- matrix-free

def test_matrix_free_spectrum_matches_dense():
  q, k, p, theta = _walk(13, coupling=1.2, beta=0.3)
  np.testing.assert_allclose(mg.magnitude_stationary(q, k, beta=0.3, block_size=8)[0].T, markov.stationary(p).pi[0], atol=1e-6)
  matvec = mg.hermitian_operator(q, k, beta=0.3, coupling=1.2, head=2, implementation="blockwise", block_size=8)
  dense = mg.hermitian_spectrum(p, theta)[0, 2]
  np.testing.assert_allclose(mg.hermitian_eigenvalues(matvec, 16, 4), dense[:4], atol=2e-5)
  np.testing.assert_allclose(mg.hermitian_eigenvalues(matvec, 16, 3, which="SA"), dense[::-1][:3], atol=2e-5)
  emb = mg.real_embedding(matvec)
  mat = np.stack([emb(e) for e in np.eye(32)], 1)                      # [32, 32]: real symmetric, spectrum doubled
  np.testing.assert_allclose(mat, mat.T, atol=1e-6)
  np.testing.assert_allclose(np.linalg.eigvalsh(mat)[::-1], np.repeat(dense, 2), atol=2e-5)


def test_summary_reports_the_read_outs():
  q, k, _ = qkv(14, n=16, b=1)
  s = mg.readouts(q, k, coupling=1.0)
  assert set(s) == {"lambda_max", "frustration_lower", "frustration_upper", "wilson", "mean_abs_circulation",
                    "isometry_defect"}
  assert all(v.shape == (H,) for v in s.values())
  assert np.all(s["frustration_lower"] <= s["frustration_upper"] + 1e-6) and np.all(s["isometry_defect"] < 1e-6)
  zero = mg.readouts(q, k, coupling=0.0)
  np.testing.assert_allclose(zero["frustration_upper"], 0.0, atol=1e-5)       # 0 + π's error bound
  np.testing.assert_allclose(s["lambda_max"], mg.hermitian_spectrum(op.markov_matrix(q, k, beta=0.0, alpha=0.0),
                                                          op.phases(q, k), k=1)[..., 0].mean(0), atol=1e-6)
  np.testing.assert_allclose(zero["wilson"], 1.0, atol=1e-6)


# ----------------------------------------------------------------------------- the model option

def test_attention_option_and_grafting_to_and_from_the_family():
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 12, 16))
  block = lambda operator, **kw: nn.BlockConfig(width=16, num_heads=2, operator=operator, coupling=0.6, **kw)
  build = lambda operator, **kw: nn.Attention(block(operator, **kw), rngs=nnx.Rngs(0))
  att = build("ATTN")
  q, k, v = att.qkv(x)
  ref = jnp.einsum("bnhk,hkd->bnd", reference(q, k, v, 0.0, 0.6), att.wo[...])
  nn.graft(att, "CMAP")
  np.testing.assert_allclose(att(x), ref, atol=2e-5)
  np.testing.assert_allclose(build("CMAP")(x), ref, atol=2e-5)
  nn.graft(att, "DMAP")
  np.testing.assert_allclose(att(x), build("DMAP")(x), atol=1e-6)
  learn = build("CMAP", learnable_operator=True)
  learn.coupling[...] = jnp.array([0.6, -1.1])
  ref = jnp.einsum("bnhk,hkd->bnd", reference(q, k, v, 0.0, [0.6, -1.1]), att.wo[...])
  np.testing.assert_allclose(learn(x), ref, atol=2e-5)
  grads = nnx.grad(lambda m: jnp.sum(m(x) ** 2))(learn)
  assert float(jnp.abs(grads.coupling[...]).min()) > 1e-4
  cfg = nn.GPTConfig.from_depth(1, vocab_size=16, head_dim=8, width=16, operator="CMAP", coupling=0.6)
  assert nn.config_from_dict(nn.config_dict(cfg)) == cfg


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,match", [
    (dict(coupling="strong"), "coupling must be a number"),
    (dict(coupling=float("nan")), "coupling must be finite"),
    (dict(coupling=True), "coupling must be a number .* not a bool"),
    (dict(scale=True), "scale must be a finite positive number"),
    (dict(coupling=np.ones(5, np.float32)), "per-head array of shape"),
    (dict(beta=1.5), "beta must lie in"),
    (dict(implementation="xla"), "implementation must be one of .* for the magnetic operator"),
    (dict(implementation="blockwise", block_size=0), "block_size must be a positive integer"),
    (dict(implementation="paired", block_size="abc"), "block_size must be a positive integer; got 'abc'$"),
    (dict(mask=np.ones((2, 3, 4, 4), bool)), "does not broadcast"),
])
def test_bad_arguments(kwargs, match):
  q, k, v = qkv()
  with pytest.raises((ValueError, TypeError), match=match):
    op.magnetic_transport(q, k, v, **kwargs)


def test_bad_shapes_and_diagnostic_inputs():
  q, k, v = qkv()
  with pytest.raises(ValueError, match="last axis must be even"):
    op.magnetic_transport(q, k, v[..., :5])
  with pytest.raises(ValueError, match="v must be finite"):
    op.magnetic_transport(q, k, v.at[0, 0, 0, 0].set(jnp.nan))
  _, _, p, theta = _walk()
  with pytest.raises(ValueError, match="theta must be antisymmetric"):
    mg.hermitian_spectrum(p, jnp.abs(theta))
  with pytest.raises(ValueError, match="theta must have P's shape"):
    mg.frustration(p, theta[..., :4, :4])
  with pytest.raises(ValueError, match="row-stochastic"):
    mg.curvature(2 * p, theta)
  with pytest.raises(ValueError, match=r"triangles must be an integer array \[T, 3\]"):
    mg.triangle_circulation(q, k, np.zeros((4, 2), int))
  with pytest.raises(ValueError, match="which must be"):
    mg.hermitian_eigenvalues(lambda u: u, 8, 2, which="LM")
  with pytest.raises(ValueError, match="tol must be positive"):
    mg.hermitian_eigenvalues(lambda u: u, 8, 2, tol=-1)
  with pytest.raises(ValueError, match=r"matvec must map \[n\] = \[8\]"):
    mg.hermitian_eigenvalues(lambda u: np.concatenate([u, u]), 8, 2)
  with pytest.raises(ValueError, match=r"must index the n = 16 tokens"):
    mg.circulation(theta, np.array([0]), np.array([1]), np.array([99]))
  with pytest.raises(ValueError, match=r"triangles must index the n = 29 tokens"):
    mg.triangle_circulation(q, k, np.array([[0, 1, 29]]))
  with pytest.raises(ValueError, match=r"k must lie in \[1, n\]"):
    mg.hermitian_spectrum(p, theta, k=-1)
  with pytest.raises(ValueError, match="chunk must be a positive integer"):
    mg.phase_isometry_defect(p, theta, chunk=0)
  pad = jnp.arange(N) < N - 4
  with pytest.raises(ValueError, match="mask must be symmetric"):
    mg.magnitude_stationary(q, k, mask=jnp.broadcast_to(pad, (1, 1, 1, N)))
  with pytest.raises(ValueError, match="mask must be symmetric"):
    mg.hermitian_operator(q, k, mask=jnp.broadcast_to(pad, (1, 1, 1, N)))
  with pytest.raises(ValueError, match="mask leaves some tokens with no keys"):
    mg.readouts(q, k, mask=(pad[:, None] & pad[None, :])[None, None])
  with pytest.raises(ValueError, match="even head_dim"):
    nn.Attention(nn.BlockConfig(width=16, num_heads=2, head_dim=7, operator="CMAP"), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="coupling must be a finite number"):
    nn.BlockConfig(operator="CMAP", coupling=float("inf")).validate()
