"""attngeo.regularisers: each term against a float64 reference written from its definition, closed forms
(a Gaussian walk on a line, the complete graph), gradients against float64 central differences, jit and
vmap, the training hook, and one-line refusals."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from helpers import chain_pi, defect_from_lam

from attngeo import nn, regularisers as reg, sharding, train

CORNERS = {"ATTN": (1.0, 1.0), "DMTN": (0.0, 1.0), "ATAP": (1.0, 0.0), "DMAP": (0.0, 0.0)}


# ----------------------------------------------------------------------------- float64 references

def corner_logits64(q, k, name):
  """The corners' closed forms (../shared/DESIGN.md §1), float64 `[b, h, n, n]`, up to row shifts."""
  q, k = (np.asarray(x, np.float64).transpose(0, 2, 1, 3) for x in (q, k))     # [b, h, n, d]
  s = 1 / np.sqrt(q.shape[-1])
  dot = lambda x, y: np.einsum("...id,...jd->...ij", x, y)
  m = (q + k) / np.sqrt(2)
  if name == "ATTN":
    return s * dot(q, k)
  if name == "DMTN":
    return s * (0.5 * dot(m, m) + 0.5 * (dot(q, k) - dot(k, q)))
  if name == "ATAP":
    return -0.5 * s * np.einsum("...ijd,...ijd->...ij", q[..., :, None, :] - q[..., None, :, :],
                                k[..., :, None, :] - k[..., None, :, :])
  return -0.25 * s * np.sum((m[..., :, None, :] - m[..., None, :, :]) ** 2, -1)


def walk64(logit, causal=False):
  if causal:
    logit = np.where(np.tril(np.ones(logit.shape[-2:], bool)), logit, -np.inf)
  w = np.exp(logit - logit.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


def gamma64(p, f, g, tau):
  """Γ(f, g)_i = (1/2τ) Σ_j P_ij (f_j − f_i)(g_j − g_i)."""
  df, dg = (x[..., None, :, :] - x[..., :, None, :] for x in (f, g))
  return np.einsum("...ij,...ijm->...im", p, df * dg) / (2 * tau)


def gamma2_64(p, f, tau):
  """Γ₂(f) = ½ L Γ(f) − Γ(f, Lf), L = (P − I)/τ."""
  lap = lambda h: (p @ h - h) / tau
  return 0.5 * lap(gamma64(p, f, f, tau)) - gamma64(p, f, lap(f), tau)


def curvature64(q, k, f, name, target, tau=1.0, causal=False):
  p = walk64(corner_logits64(q, k, name), causal)
  f = np.asarray(f, np.float64)
  return np.mean(np.maximum(target * gamma64(p, f, f, tau) - gamma2_64(p, f, tau), 0.0))


def damped_law64(p, damping):
  """π_τ = τ Σ_t (1 − τ)^t u P^t by its series in float64 (an independent route to `markov.damped_law`)."""
  x = np.full(p.shape[:-1], 1.0 / p.shape[-1])
  acc, w = np.zeros_like(x), damping
  while w > 1e-18:
    acc, x, w = acc + w * x, np.einsum("...i,...ij->...j", x, p), w * (1 - damping)
  return acc / acc.sum(-1, keepdims=True)


def flows64(q, k, name, damping=reg.DAMPING):
  p = walk64(corner_logits64(q, k, name))
  return (chain_pi(p) if damping == 0 else damped_law64(p, damping))[..., :, None] * p


def eps_rev64(q, k, name, damping=reg.DAMPING):
  f = flows64(q, k, name, damping)
  return np.mean(0.5 * np.abs(f - np.swapaxes(f, -1, -2)).sum((-2, -1)))


def entropy64(q, k, name):
  f = flows64(q, k, name)
  ft = np.swapaxes(f, -1, -2)
  return np.mean(0.5 * ((f - ft) * np.log(f / ft)).sum((-2, -1)))


def skew64(q, k, name):
  lg = corner_logits64(q, k, name)
  lt = lg - lg.mean(-1, keepdims=True) - lg.mean(-2, keepdims=True) + lg.mean((-2, -1), keepdims=True)
  a = 0.5 * (lt - np.swapaxes(lt, -1, -2))
  return np.mean((a**2).sum((-2, -1)) / (lt**2).sum((-2, -1)))


def mixing64(q, k, name, target):
  p = walk64(corner_logits64(q, k, name))
  sq = np.sqrt(chain_pi(p))
  a = sq[..., :, None] * p / sq[..., None, :]
  lam = np.linalg.eigvalsh(0.5 * (a + np.swapaxes(a, -1, -2)))                      # ascending; λ₀ = 1 last
  gap = 1 - np.maximum(np.abs(lam[..., -2]), np.abs(lam[..., 0]))
  return np.mean(np.maximum(target - gap, 0.0))


def isometry64(wv, wo):
  """Mean squared defect of T^h = W_O^h W_V^h from the eigenvalues of TᵀT (helpers.defect_from_lam)."""
  t = np.einsum("dhk,hke->hed", np.asarray(wv, np.float64), np.asarray(wo, np.float64))
  return np.mean(defect_from_lam(np.linalg.eigvalsh(np.swapaxes(t, -1, -2) @ t), 1e-9) ** 2)


def qk(seed=0, shape=(2, 7, 2, 3), spread=1.0):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(spread * rng.standard_normal(shape), jnp.float32) for _ in range(2))


def family(q, k, count=3):
  return reg.coordinate_family(q, k, count, jax.random.PRNGKey(1))


# the terms of (q, k) as (package function, float64 reference), at corner `name`
def walk_terms(name):
  beta, alpha = CORNERS[name]
  return {"eps_rev": (lambda q, k: reg.reversibility(q, k, beta=beta, alpha=alpha), lambda q, k: eps_rev64(q, k, name)),
          "eps_rev_exact": (lambda q, k: reg.reversibility(q, k, beta=beta, alpha=alpha, damping=0.0),
                            lambda q, k: eps_rev64(q, k, name, 0.0)),
          "entropy": (lambda q, k: reg.reversibility(q, k, beta=beta, alpha=alpha, kind="entropy"),
                      lambda q, k: entropy64(q, k, name)),
          "skew": (lambda q, k: reg.skew(q, k, beta=beta, alpha=alpha), lambda q, k: skew64(q, k, name)),
          "mixing": (lambda q, k: reg.mixing(q, k, target=0.9, beta=beta, alpha=alpha),
                     lambda q, k: mixing64(q, k, name, 0.9)),
          "mixing_dense": (lambda q, k: reg.mixing(q, k, target=0.9, beta=beta, alpha=alpha, steps=0),
                           lambda q, k: mixing64(q, k, name, 0.9))}


# ----------------------------------------------------------------------------- values

@pytest.mark.parametrize("name", CORNERS)
@pytest.mark.parametrize("causal", [False, True])
def test_curvature_matches_dense_float64(name, causal):
  q, k = qk(1)
  f = family(q, k)
  beta, alpha = CORNERS[name]
  terms = reg.curvature_terms(q, k, f, beta=beta, alpha=alpha, causal=causal, tau=0.5)
  p = walk64(corner_logits64(q, k, name), causal)
  f64 = np.asarray(f, np.float64)
  np.testing.assert_allclose(terms.gamma, gamma64(p, f64, f64, 0.5), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(terms.gamma2, gamma2_64(p, f64, 0.5), rtol=1e-4, atol=1e-4)
  got = reg.curvature(q, k, f, target=1.5, beta=beta, alpha=alpha, causal=causal, tau=0.5)
  want = curvature64(q, k, f, name, 1.5, 0.5, causal)
  assert want > 0.1                                                      # the bound is active on some rows
  np.testing.assert_allclose(got, want, rtol=1e-4)


def test_gaussian_walk_on_a_line_is_flat():
  """DMAP on x_j = j/4 (d = 1, s = 1): P_ij ∝ exp(−(x_i − x_j)²/4), a Gaussian of variance 2 = ε/2 (ε = 4),
  τ = ε/4 = 1. Away from the ends, Γ(x) = Var/2τ = 1 and Γ₂(x) = 0 (|Hess x|² = Ric = 0): the penalty
  with bound K is relu(K·1 − 0) = K on those rows."""
  x = (np.arange(256) - 127.5) / 4
  q = k = jnp.asarray(x / np.sqrt(2), jnp.float32)[None, :, None, None]
  f = jnp.asarray(x - x.mean(), jnp.float32)[None, None, :, None]
  terms = reg.curvature_terms(q, k, f, beta=0.0, alpha=0.0)
  inner = slice(96, 160)                       # ≥ 24 = two 12-wide neighbourhoods from either end: tails < e^-36
  np.testing.assert_allclose(terms.gamma[0, 0, inner, 0], 1.0, atol=1e-4)
  np.testing.assert_allclose(terms.gamma2[0, 0, inner, 0], 0.0, atol=2e-3)
  row = jax.nn.relu(0.7 * terms.gamma - terms.gamma2)[0, 0, inner, 0]
  np.testing.assert_allclose(row, 0.7, atol=2e-3)


def test_complete_graph_closed_form():
  """q = k = 0: the uniform walk P = 11ᵀ/n. For centred f with v = mean f², Γ(f) = (v + f²)/2τ and
  Γ₂(f) = (3v + f²)/4τ², so the penalty is mean relu(K (v + f²)/2τ − (3v + f²)/4τ²)."""
  n, tau, target = 9, 0.5, 2.6
  q = k = jnp.zeros((1, n, 1, 4), jnp.float32)
  f = np.linspace(-1.0, 1.0, n) ** 3
  f = f - f.mean()
  v = np.mean(f * f)
  want = np.mean(np.maximum(target * (v + f**2) / (2 * tau) - (3 * v + f**2) / (4 * tau**2), 0.0))
  got = reg.curvature(q, k, jnp.asarray(f, jnp.float32)[None, None, :, None], target=target, tau=tau)
  assert 0 < want
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("name", CORNERS)
def test_walk_terms_match_dense_float64(name):
  q, k = qk(2)
  for term, (fn, ref) in walk_terms(name).items():
    np.testing.assert_allclose(fn(q, k), ref(q, k), rtol=2e-4, atol=2e-6, err_msg=term)


@pytest.mark.parametrize("name", ["DMAP", "ATAP"])
def test_exact_corners_are_reversible(name):
  """Exact A (unmasked): detailed balance, so ε_rev = σ = ρ_skew = 0 (to float32 rounding) under the exact π;
  under the damped law ε_rev is within its bound ‖π_τ − π‖₁ ≤ τ‖u − π‖₁/(1 − (1 − τ)δ(P)) of 0."""
  q, k = qk(3)
  for term in ("eps_rev_exact", "skew"):
    assert abs(float(walk_terms(name)[term][0](q, k))) < 1e-5, term
  assert abs(float(reg.reversibility(q, k, **dict(zip(("beta", "alpha"), CORNERS[name])), kind="entropy",
                                     damping=0.0))) < 1e-5
  p = walk64(corner_logits64(q, k, name))
  pi = chain_pi(p)
  dob = 0.5 * np.abs(p[..., :, None, :] - p[..., None, :, :]).sum(-1).max((-2, -1))
  bound = reg.DAMPING * np.abs(1.0 / p.shape[-1] - pi).sum(-1) / (1 - (1 - reg.DAMPING) * dob)
  got = float(walk_terms(name)["eps_rev"][0](q, k))
  assert 1e-5 < got <= float(bound.mean()), (got, bound)


def test_reversibility_stays_finite_on_a_nearly_reducible_walk():
  """Two far-apart clusters: coupling exp(−O(s²)) underflows, π is undetermined (the stationary bound is
  not finite) — the damped term still matches its float64 reference and its gradient stays finite."""
  from attngeo import markov
  q, k = qk(7, (1, 12, 1, 4))
  side = jnp.where(jnp.arange(12) < 6, 1.0, -1.0)[None, :, None, None]
  q, k = q + 20.0 * side, k + 20.0 * side
  assert not bool(markov.stationary(reg._walk(q, k, 1.0, 1.0, None)).converged.any())
  value, grad = jax.jit(jax.value_and_grad(lambda q: reg.reversibility(q, k)))(q)
  np.testing.assert_allclose(float(value), eps_rev64(q, k, "ATTN"), rtol=1e-3)     # float64 series of π_τ
  assert bool(jnp.all(jnp.isfinite(grad)))


def test_isometry_matches_eigen_defect_and_is_zero_on_isometries():
  rng = np.random.default_rng(4)
  wv, wo = rng.standard_normal((6, 3, 2)), rng.standard_normal((3, 2, 6))
  np.testing.assert_allclose(reg.isometry(jnp.asarray(wv, jnp.float32), jnp.asarray(wo, jnp.float32)),
                             isometry64(wv, wo), rtol=1e-5)
  u = np.linalg.qr(rng.standard_normal((3, 6, 6)))[0]                   # T^h = c_h · (orthonormal rows on k dims)
  wv_iso = np.transpose(u[:, :, :2], (1, 0, 2)) * np.array([1.0, 2.0, 0.5])[None, :, None]
  wo_iso = np.transpose(u[:, :, :2], (0, 2, 1)) * 3.0
  assert float(reg.isometry(jnp.asarray(wv_iso, jnp.float32), jnp.asarray(wo_iso, jnp.float32))) < 1e-6


# ----------------------------------------------------------------------------- gradients

def directional_fd(ref, args, direction, h=1e-5):
  plus = ref(*(a + h * d for a, d in zip(args, direction)))
  minus = ref(*(a - h * d for a, d in zip(args, direction)))
  return (plus - minus) / (2 * h)


def check_gradient(fn, ref, args, seed=0, rtol=2e-3):
  """⟨∇fn, u⟩ (float32 jax.grad, under jit) against float64 central differences of ref, 3 random directions."""
  grads = jax.jit(jax.grad(fn, argnums=tuple(range(len(args)))))(*args)
  args64 = [np.asarray(a, np.float64) for a in args]
  rng = np.random.default_rng(seed)
  for _ in range(3):
    u = [rng.standard_normal(a.shape) for a in args64]
    got = sum(float(np.sum(np.asarray(g, np.float64) * d)) for g, d in zip(grads, u))
    want = directional_fd(ref, args64, u)
    assert abs(got - want) <= rtol * max(abs(want), 1e-2), (got, want)


@pytest.mark.parametrize("name", ["ATTN", "DMTN", "DMAP"])
def test_curvature_gradient_matches_finite_differences(name):
  q, k = qk(5)
  f = family(q, k)
  beta, alpha = CORNERS[name]
  check_gradient(lambda q, k: reg.curvature(q, k, f, target=1.5, beta=beta, alpha=alpha, causal=True),
                 lambda q, k: curvature64(q, k, f, name, 1.5, causal=True), (q, k))


@pytest.mark.parametrize("name", ["ATTN", "DMTN"])
@pytest.mark.parametrize("term", ["eps_rev", "eps_rev_exact", "entropy", "skew", "mixing", "mixing_dense"])
def test_walk_term_gradients_match_finite_differences(name, term):
  q, k = qk(6)
  fn, ref = walk_terms(name)[term]
  check_gradient(fn, ref, (q, k))


def gap64(q, k, name):
  """The absolute gap `[b, h]` of the reversibilised walk, float64 dense (as `mixing64`)."""
  p = walk64(corner_logits64(q, k, name))
  sq = np.sqrt(chain_pi(p))
  a = sq[..., :, None] * p / sq[..., None, :]
  lam = np.linalg.eigvalsh(0.5 * (a + np.swapaxes(a, -1, -2)))
  return 1 - np.maximum(np.abs(lam[..., -2]), np.abs(lam[..., 0]))


@pytest.mark.parametrize("spread", [0.5, 2.0, 4.0])
def test_lanczos_gap_of_a_long_walk_matches_the_float64_gap(spread):
  """48 Lanczos steps on walks of 160 tokens (111 fewer dimensions than the deflated space), gaps from
  mixing fast to slowly: the estimate is the float64 dense gap to 1e-5 and never above it by more."""
  q, k = qk(12, (1, 160, 2, 4), spread)
  want = gap64(q, k, "ATTN")
  got = np.asarray(jax.jit(lambda p: reg.absolute_gap(p, np.int64(48)))(reg._walk(q, k, 1.0, 1.0, None)), np.float64)
  np.testing.assert_allclose(got, want, atol=1e-5)
  assert want.min() < 0.5 if spread == 4.0 else True                    # a slowly mixing case is among them


def test_lanczos_gap_gradient_on_a_long_walk_matches_finite_differences():
  """The Hellmann–Feynman gradient (a stopped Ritz vector, 24 steps on a 63-dimensional deflated space)."""
  q, k = qk(13, (1, 64, 1, 3), 2.0)
  check_gradient(lambda q, k: reg.mixing(q, k, target=0.99, steps=24), lambda q, k: mixing64(q, k, "ATTN", 0.99), (q, k))


def test_isometry_gradient_matches_finite_differences():
  rng = np.random.default_rng(7)
  wv, wo = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((6, 3, 2), (3, 2, 6)))
  check_gradient(reg.isometry, isometry64, (wv, wo))


def test_learnable_coefficients_get_gradients():
  """Per-head (β, α) arrays are traced through the kernel path (curvature) and the dense logits (the walk
  terms): the gradient matches central differences."""
  q, k = qk(8)
  f = family(q, k)
  ba = jnp.asarray([[0.3, 0.8], [0.6, 0.2]], jnp.float32)               # [β; α] per head
  total = jax.jit(lambda ba: reg.curvature(q, k, f, target=1.0, beta=ba[0], alpha=ba[1])   # the kernel path
                  + reg.skew(q, k, beta=ba[0], alpha=ba[1]))                           # the dense-logit path
  g = jax.jit(jax.grad(total))(ba)
  h = 1e-2
  fd = np.array([[(float(total(ba.at[i, j].add(h))) - float(total(ba.at[i, j].add(-h)))) / (2 * h)
                  for j in range(2)] for i in range(2)])
  np.testing.assert_allclose(g, fd, rtol=2e-2, atol=2e-4)


# ----------------------------------------------------------------------------- jit, vmap, sampling

def some_terms(q, k):
  return jnp.stack([reg.curvature(q, k, family(q, k), target=1.0), reg.reversibility(q, k, beta=0.0, alpha=1.0)])


def test_vmap_agrees_with_one_call_per_item():
  """(The value tests above run eagerly and the gradient tests under jit.)"""
  q, k = qk(9, (2, 2, 6, 2, 3))
  one = jax.jit(some_terms)
  np.testing.assert_allclose(jax.jit(jax.vmap(some_terms))(q, k), np.stack([one(q[i], k[i]) for i in range(2)]),
                             rtol=1e-5, atol=1e-7)


def test_sampled_heads_carry_their_own_coefficients():
  """One sampled head of one sampled sequence under a per-head family gives that (sequence, head)'s own
  term, and different keys pick different ones."""
  q, k = qk(10, (2, 7, 3, 3))
  beta, alpha = jnp.asarray([0.0, 0.5, 1.0]), jnp.asarray([1.0, 0.4, 0.3])
  eps_rev = jax.jit(lambda q, k, b, a: reg.reversibility(q, k, beta=b, alpha=a))
  single = {(i, h): float(eps_rev(q[i:i + 1, :, h:h + 1], k[i:i + 1, :, h:h + 1], beta[h:h + 1], alpha[h:h + 1]))
            for i in range(2) for h in range(3)}

  @jax.jit
  def sampled(key):
    qs, ks, bs, als = reg.sample(q, k, beta, alpha, key, heads=1, sequences=1)
    return reg.reversibility(qs, ks, beta=bs, alpha=als)
  seen = set()
  for seed in range(6):
    got = float(sampled(jax.random.PRNGKey(seed)))
    match = [ih for ih, v in single.items() if abs(got - v) < 1e-5]
    assert len(match) == 1, (got, single)
    seen.add(match[0])
  assert len(seen) > 1
  full = reg.sample(q, k, beta, alpha, jax.random.PRNGKey(0), heads=3)
  assert full[0] is q and full[2] is beta


# ----------------------------------------------------------------------------- the config and the hook

def tiny_gpt():
  return nn.GPT(nn.GPTConfig.from_depth(2, vocab_size=32, head_dim=8, width=16, operator="DMTN"), rngs=nnx.Rngs(0))


def gpt_loss(m, b, r):
  return optax.softmax_cross_entropy_with_integer_labels(m(b["tokens"][:, :-1]), b["tokens"][:, 1:]).mean(), {"n": 1.0}


TOKENS = np.random.default_rng(0).integers(0, 32, (2, 13)).astype(np.int32)
CHEAP = reg.Regularisers(curvature=0.5, skew=0.2, isometry=0.1, curvature_target=2.0, test_functions=2)
ALL = reg.Regularisers(curvature=0.5, reversibility=0.3, skew=0.2, mixing=0.4, isometry=0.1, curvature_target=2.0,
                       gap_target=0.9, test_functions=2)
# each term but curvature (its test functions are drawn inside) on a DMTN layer's (q, k) and (wv, wo)
LAYER_TERMS = {"reversibility": lambda q, k, w: reg.reversibility(q, k, beta=0.0, alpha=1.0),
               "skew": lambda q, k, w: reg.skew(q, k, beta=0.0, alpha=1.0),
               "mixing": lambda q, k, w: reg.mixing(q, k, target=0.9, beta=0.0, alpha=1.0),
               "isometry": lambda q, k, w: reg.isometry(*w)}


@pytest.mark.parametrize("cfg", [CHEAP, pytest.param(ALL, marks=pytest.mark.slow)])
def test_penalty_is_the_weighted_mean_over_layers(cfg):
  """`regularised` (under nnx.jit): loss + Σ λ·R, each R the layer mean of the term on the captured (q, k)."""
  model = tiny_gpt()
  batch = {"tokens": jnp.asarray(TOKENS)}
  (base, _), qks = nn.capture_qk(model, lambda: gpt_loss(model, batch, None))
  loss, metrics = nnx.jit(reg.regularised(cfg, gpt_loss))(model, batch, jax.random.PRNGKey(3))
  weights = [(m.wv[...], m.wo[...]) for m in nn.attention_modules(model)]
  terms = [t for t in cfg.active if t != "curvature"]
  means = jax.jit(lambda qks, weights: {t: jnp.mean(jnp.stack([LAYER_TERMS[t](q, k, w) for (q, k), w in zip(qks, weights)]))
                                        for t in terms})(qks, weights)
  for term, value in means.items():
    np.testing.assert_allclose(metrics[f"reg/{term}"], value, rtol=1e-5, err_msg=term)
  assert float(metrics["reg/curvature"]) > 0 and metrics["n"] == 1.0
  np.testing.assert_allclose(metrics["reg/base_loss"], base, rtol=1e-6)
  total = sum(getattr(cfg, t) * float(metrics[f"reg/{t}"]) for t in cfg.active)
  np.testing.assert_allclose(loss, float(base) + total, rtol=1e-5)
  assert reg.regularised(reg.Regularisers(), gpt_loss) is gpt_loss


@pytest.mark.slow
def test_train_step_with_the_hook():
  """The regularised loss inside the jitted `train.make_step` (one sampled head): every term comes back
  as a finite metric and the loss is the plain loss plus the penalty."""
  cfg = train.TrainConfig(steps=1, batch_size=2, progress=False)
  mesh = sharding.make_mesh((1, 1, 1))
  model = tiny_gpt()
  plain = float(gpt_loss(model, {"tokens": jnp.asarray(TOKENS)}, None)[0])
  graphdef, state, _ = train.init_state(model, cfg, mesh)
  step = jax.jit(train.make_step(graphdef, reg.regularised(dataclasses.replace(CHEAP, heads=1), gpt_loss), 0.0))
  _, metrics = step(state, sharding.global_batch({"tokens": TOKENS}, mesh))
  terms = {t: float(metrics[f"reg/{t}"]) for t in CHEAP.active}
  assert all(np.isfinite(list(terms.values()))) and np.isfinite(float(metrics["grad_norm"]))
  np.testing.assert_allclose(float(metrics["loss"]), plain + sum(getattr(CHEAP, t) * v for t, v in terms.items()),
                             rtol=1e-5)


@pytest.mark.parametrize("kwargs,needle", [
  (dict(curvature=-0.1), "reg.curvature must be a weight ≥ 0"),
  (dict(isometry=True), "reg.isometry must be a weight ≥ 0"),
  (dict(mixing=float("nan")), "reg.mixing must be a weight ≥ 0"),
  (dict(curvature=1.0, test_functions=0), "reg.test_functions must be an integer ≥ 1 when reg.curvature > 0"),
  (dict(gap_target=0.0), "reg.gap_target must be a number in (0, 1]"),
  (dict(gap_steps=-1), "reg.gap_steps must be an integer ≥ 0"),
  (dict(tau=0.0), "reg.tau must be a positive time scale"),
  (dict(reversibility_kind="kl"), "reg.reversibility_kind must be one of"),
  (dict(damping=-0.1), "reg.damping must be a number in [0, 1]"),
  (dict(damping=1.5), "reg.damping must be a number in [0, 1]"),
  (dict(heads=-1), "reg.heads must be an integer ≥ 0"),
  (dict(sequences=1.5), "reg.sequences must be an integer ≥ 0"),
])
def test_bad_config_is_one_line(kwargs, needle):
  with pytest.raises(ValueError) as err:
    reg.Regularisers(**kwargs)
  assert needle in str(err.value) and "\n" not in str(err.value)


def test_no_test_functions_is_fine_without_the_curvature_term():
  assert reg.Regularisers(reversibility=1.0, test_functions=0).active == ("reversibility",)


def test_a_model_without_attention_or_with_too_few_heads_is_refused():
  mlp = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"^reg\.skew = 1\.0 asks for the attention walk, but the model has no attention layers$"):
    reg.check_model(reg.Regularisers(skew=1.0), mlp)
  assert reg.check_model(reg.Regularisers(), mlp) == []
  with pytest.raises(ValueError, match=r"^reg\.heads must be ≤ the 2 heads of every attention layer; got 3$"):
    reg.check_model(reg.Regularisers(skew=1.0, heads=3), tiny_gpt())
  with pytest.raises(ValueError, match="kind must be one of"):
    reg.reversibility(*qk(), kind="kl")


@pytest.mark.parametrize("argv,needle", [(["--terms", "curvature,foo"], "--terms must be a comma-separated subset"),
                                         (["--heads", "5"], "--heads must be in [0, 4] at the lm preset; got 5"),
                                         (["--preset", "tiny", "--test-functions", "0"], "--test-functions must be ≥ 1")])
def test_bench_refuses_bad_flags_before_any_work(argv, needle, capsys):
  from attngeo.experiments import bench_regularisers
  with pytest.raises(SystemExit) as err:
    bench_regularisers.main(argv)
  lines = capsys.readouterr().err.strip().splitlines()
  assert err.value.code == 2 and len(lines) == 1 and needle in lines[0]


def test_the_config_is_jax_free_and_nests_as_dotted_flags():
  """`attngeo.regularisers_config` imports no JAX; nested in a command's config it gives `--reg.<field>`
  flags, and a negative weight there is the config's one-line ValueError."""
  import subprocess
  import sys
  code = ("import sys; import attngeo.regularisers_config as c; c.Regularisers(curvature=1.0); "
          "print('JAX' if 'jax' in sys.modules else 'NO_JAX')")
  assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "NO_JAX"
  from attngeo import config
  from attngeo.regularisers_config import Regularisers

  @dataclasses.dataclass
  class Command:
    steps: int = 1
    reg: Regularisers = dataclasses.field(default_factory=Regularisers)
  ap = config.Parser(prog="attngeo demo")
  config.add_arguments(ap, Command)
  got = config.from_arguments(ap.parse_args(["--reg.curvature", "0.5", "--reg.heads", "1"]), Command)
  assert got.reg == reg.Regularisers(curvature=0.5, heads=1)
  with pytest.raises(ValueError, match=r"^reg\.isometry must be a weight ≥ 0 .*; got -1\.0$"):
    config.from_arguments(ap.parse_args(["--reg.isometry", "-1"]), Command)
