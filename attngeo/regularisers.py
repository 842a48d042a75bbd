"""The geometry of an attention walk as a differentiable training signal: scalar regularisers.

Each term is a pure function of one layer's queries and keys `q, k` `[b, n, h, d]` under its operator
(β, α) (or of its value/output weights), returns a scalar and is jit-, vmap- and grad-compatible, so it
can sit inside any loss. Conventions are those of `attngeo.operators` (the walk `P = rownorm(exp(L))`),
`attngeo.geometry` (`L = (P − I)/τ`, Γ, Γ₂) and `attngeo.markov` (π, ε_rev, σ); means run over the
batch, heads, tokens and test functions.

* **curvature** — a soft lower bound K (`target`) on the Bakry–Émery curvature of the walk over a
  family of test functions f_c (`curvature_terms`):

      R_curv = E_{b,h,i,c} relu(K·Γ(f_c)_i − Γ₂(f_c)_i)          (0 iff CD(K, ∞) holds on the family)

  Matrix-free: Γ is one application of P (to `[f, f²]`), Γ₂ two more (`geometry.gamma2`), all through
  the operator's fused/blockwise attention kernel (`walks.attention`): O(n) memory, the cost of
  one attention with 10·m value channels (m test functions), about the same again backward. The
  causal mask is kept (Γ and Γ₂ of the masked walk). The default family (`coordinate_family`) is m
  random directions of `m = (q + k)/√2`, centred and scaled to unit RMS over the tokens and held
  fixed (`stop_gradient`): the term moves the walk, not the family.
* **reversibility** — `ε_rev = ½ Σ_ij |π_i P_ij − π_j P_ji|` (`markov.reversibility`) or the entropy
  production `σ = ½ Σ_ij (F_ij − F_ji) log(F_ij/F_ji)`, `F_ij = π_i P_ij` (`markov.entropy_production`).
  The law is the damped one, `π_τ (I − (1 − τ)P) = τ/n · 1ᵀ` (`markov.damped_law`, τ = `damping`, default
  0.01): the exact π is undetermined once a learned walk is nearly reducible (spectral gap ≲ 1e-6 in
  float32), and training through its LU solve diverged (loss NaN at step 150 on the Swiss roll); π_τ
  is unique and well conditioned for every walk, and |ε_rev(π_τ) − ε_rev(π)| ≤ ‖π_τ − π‖₁ ≤
  τ‖u − π‖₁/(1 − (1 − τ)δ(P)) (δ Dobrushin's coefficient) where π is unique. `damping = 0`: the exact π.
  Dense: P `[b, h, n, n]` and one linear solve per (b, h), O(n²) memory and O(n³) time each.
* **skew** — `ρ_skew² = ‖antisym(H L H)‖_F² / ‖H L H‖_F²` of the parametric logits (`markov.skew_share`,
  squared so that it is smooth at the exact-A corners, where ρ_skew = 0), without forming L: with
  `z_i = [q_i, k_i]` centred over the tokens (`Z̃ = HZ`) the double-centred logit is `s Z̃ C Z̃ᵀ`,
  `C = [[c, c' + α/2], [c' − α/2, c]] ⊗ I_d` (c = (1 − β)/4, c' = (1 + β)/4: `operators.augment`), its
  antisymmetric part `s Z̃ C_a Z̃ᵀ`, `C_a = [[0, α/2], [−α/2, 0]] ⊗ I_d`, and `‖Z̃ C Z̃ᵀ‖_F² =
  Σ C₀[k, l] C₀[k', l'] ⟨G_kk', G_ll'⟩` (C = C₀ ⊗ I_d, `G_kk'` the d × d blocks of `Z̃ᵀZ̃`): one Gram
  per head, O(n·d²) time and O(n) memory, never n × n.
* **mixing** — a soft lower bound `g*` (`target`) on the absolute spectral gap of the walk's additive
  reversibilisation `A = ½(Π^{½} P Π^{−½} + Π^{−½} Pᵀ Π^{½})` (`markov.eigenbasis`; for a reversible P
  this is P's own spectrum): `R_mix = E_{b,h} relu(g* − (1 − max(|λ₁|, |λ_{n−1}|)))`. By default
  (`steps` m = 48) matrix-free in A: A's Perron vector √π is known, so m Lanczos steps on
  `A' = A − √π√πᵀ` from a start ⟂ √π (`eigen.lanczos`) give the Ritz pair (θ, x) of largest |θ|, and
  the gap is `1 − |xᵀA'x|` with x held fixed — Hellmann–Feynman: for a simple eigenvalue
  `dλ = xᵀ dA' x`, the exact gradient once x is the eigenvector, with an error of O(r), r = ‖A'x − θx‖.
  Ritz values never overshoot (|θ| ≤ max|λ|), so the estimated gap is ≥ the true gap up to rounding
  (r bounds θ's distance to some eigenvalue, not necessarily the extreme one); tests/test_regularisers
  holds 48 steps to 1e-5 of the float64 dense gap on 160-token walks with gaps from fast to slow. π is
  `markov.law` (an LU solve, refined; its gradient one more solve). Cost per (b, h): the LU, O(n³)
  with a small constant, m matvecs and the orthogonalisation, O(m·n² + m²·n). `steps = 0`: one dense
  symmetric eigensolve per (b, h) as well, O(n³) with a constant about ten times an LU's (the
  definition).
* **isometry** — the squared scaled-isometry defect of each head transport `T^h = W_O^h W_V^h`
  (`attngeo.connection`): `δ² = 1 − (tr M)²/(r ‖M‖_F²)`, `M = T^hᵀT^h`, r = min(k, d) its generic rank,
  with `tr M = tr(AB)`, `‖M‖_F² = tr(ABAB)`, `A = O_hᵀO_h`, `B = V_h V_hᵀ` (k × k: O(h·k²·d), no
  eigensolve, smooth). Exact where T^h has full rank r (any trained weights); `connection.
  head_isometry_defect` is the numerical-rank read-out.

The walk terms (reversibility, skew, mixing) read the chain of the layer's logits WITHOUT the causal
mask: under the mask π = δ₀, ε_rev ≡ 0 and the spectrum is the diagonal (`attngeo.probe`), so there
is nothing to train; unmasked, ε_rev = ρ_skew = 0 exactly at the exact-A corners (DMAP, ATAP). A CMAP
(magnetic) layer is read through its magnitude `K = P(β, α = 0)` and its transports at θ = 0.

**Sampling.** `sample` keeps s of the H heads of a layer (and s' of its b sequences), drawn uniformly
without replacement. A term's layer mean over the kept heads is then unbiased for the mean over all
heads, with variance `(1 − s/H)·S²/s` (S² the variance of the per-head values across the H heads;
likewise for sequences), and the cost falls by s/H. Rows cannot be sampled to save work: Γ₂ at token
i needs Γ on every token i attends to.

`Regularisers` (weights λ ≥ 0, targets, sample sizes; JAX-free, in `attngeo.regularisers_config`, so a
command's config can nest it and still answer `--help` without importing JAX) is the config; `penalty` applies it to the
(q, k) captured from a model (`nn.capture_qk`) and returns `(Σ λ·R, {"reg/<term>": R})`;
`regularised(cfg, loss_fn)` turns a trainer loss `loss_fn(model, batch, rng) -> (loss, metrics)` into
the regularised one (the terms logged as metrics).
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp

from attngeo import eigen, geometry, markov, nn, operators, walks
from attngeo.regularisers_config import DAMPING, GAP_STEPS, REVERSIBILITY_KINDS, TERMS, Regularisers

_HI = jax.lax.Precision.HIGHEST

__all__ = ["REVERSIBILITY_KINDS", "TERMS", "Regularisers", "absolute_gap", "check_build", "check_model",
           "coordinate_family", "curvature", "curvature_terms", "isometry", "mixing", "penalty", "regularised",
           "reversibility", "sample", "skew"]


# ----------------------------------------------------------------------------- test functions and sampling

def coordinate_family(q, k, count: int, key) -> jax.Array:
  """`count` random directions of `m = (q + k)/√2` per head, centred and unit-RMS over tokens: `[b, h, n, count]`.

  `f_c = m·r_c` with `r_c ~ N(0, I_d)` drawn per head from `key`, held fixed (`stop_gradient`).
  """
  b, n, h, d = q.shape
  m = jax.lax.stop_gradient((q.astype(jnp.float32) + k.astype(jnp.float32)) / math.sqrt(2))
  f = jnp.einsum("bnhd,hdc->bhnc", m, jax.random.normal(key, (h, d, count)))
  f = f - f.mean(-2, keepdims=True)
  return f / jnp.sqrt(jnp.mean(f * f, -2, keepdims=True) + 1e-12)


def _heads_of(x, idx):
  """β or α (a float, or an array [h] / [1]) restricted to the kept heads `idx`."""
  if isinstance(x, float) or jnp.ndim(x) == 0 or jnp.shape(x)[0] == 1:
    return x
  return jnp.asarray(x)[idx]


def sample(q, k, beta, alpha, key, *, heads: int = 0, sequences: int = 0):
  """(q, k, β, α) restricted to `heads` of the H heads and `sequences` of the b sequences (0: all),
  drawn uniformly without replacement from `key` (the estimator's variance: module docstring)."""
  kh, kb = jax.random.split(key)
  if heads and heads < q.shape[2]:
    idx = jax.random.choice(kh, q.shape[2], (heads,), replace=False)
    q, k, beta, alpha = q[:, :, idx], k[:, :, idx], _heads_of(beta, idx), _heads_of(alpha, idx)
  if sequences and sequences < q.shape[0]:
    idx = jax.random.choice(kb, q.shape[0], (sequences,), replace=False)
    q, k = q[idx], k[idx]
  return q, k, beta, alpha


# ----------------------------------------------------------------------------- the terms

class Curvature(NamedTuple):
  """`gamma` Γ(f_c)_i and `gamma2` Γ₂(f_c)_i of the walk, each `[b, h, n, m]`."""
  gamma: jax.Array
  gamma2: jax.Array


def curvature_terms(q, k, f, *, beta=1.0, alpha=1.0, causal: bool = False, tau: float = 1.0, scale=None,
                    implementation=None) -> Curvature:
  """Γ(f) and Γ₂(f) of the walk (β, α) on q, k `[b, n, h, d]` for test functions f `[b, h, n, m]`,
  matrix-free (three applications of P through the attention kernel; `walks.attention`)."""
  op = walks.attention(q, k, beta=beta, alpha=alpha, causal=causal, scale=scale, tau=tau,
                          implementation=implementation)
  return Curvature(geometry.gamma(op, f), geometry.gamma2(op, f))


def curvature(q, k, f, *, target: float = 0.0, beta=1.0, alpha=1.0, causal: bool = False, tau: float = 1.0,
              scale=None, implementation=None) -> jax.Array:
  """`E_{b,h,i,c} relu(K·Γ(f_c)_i − Γ₂(f_c)_i)` with K = `target` (module docstring); f `[b, h, n, m]`."""
  terms = curvature_terms(q, k, f, beta=beta, alpha=alpha, causal=causal, tau=tau, scale=scale,
                          implementation=implementation)
  return jnp.mean(jax.nn.relu(target * terms.gamma - terms.gamma2))


def _walk(q, k, beta, alpha, scale):
  """The unmasked dense walk P `[b, h, n, n]` (the walk terms' chain: module docstring)."""
  return operators.markov_matrix(q, k, beta=beta, alpha=alpha, scale=scale)


def reversibility(q, k, *, beta=1.0, alpha=1.0, kind: str = "eps_rev", damping: float = DAMPING,
                  scale=None) -> jax.Array:
  """Mean over (b, h) of ε_rev (`kind="eps_rev"`) or the entropy production σ (`"entropy"`) of the walk,
  its flows `π_i P_ij` under the damped law π_τ (`markov.damped_law`, τ = `damping`; 0: the exact π)."""
  if kind not in REVERSIBILITY_KINDS:
    raise ValueError(f"kind must be one of {REVERSIBILITY_KINDS}; got {kind!r}")
  if isinstance(damping, bool) or not isinstance(damping, (int, float)) or not 0 <= damping <= 1:
    raise ValueError(f"damping must be a number in [0, 1] (0: the exact stationary law); got {damping!r}")
  p = _walk(q, k, beta, alpha, scale)
  pi = markov.damped_law(p, damping) if damping else None
  return jnp.mean(markov.reversibility(p, pi) if kind == "eps_rev" else markov.entropy_production(p, pi))


def _skew_norm(c0, t):
  """`‖Z̃ (C₀ ⊗ I) Z̃ᵀ‖_F² = Σ C₀[k, l] C₀[k', l'] ⟨G_kk', G_ll'⟩` `[b, h]` from the table t `[b, h, 2, 2, 2, 2]`."""
  return jnp.einsum("hkl,hKL,bhkKlL->bh", c0, c0, t, precision=_HI)


def skew(q, k, *, beta=1.0, alpha=1.0) -> jax.Array:
  """Mean over (b, h) of `ρ_skew²` of the parametric logits, from Gram matrices (module docstring; the
  scale s cancels). With the d × d blocks `G_kk' = Σ_i z̃_i^k z̃_i^k'ᵀ` (k, k' ∈ {q, k}) and
  `‖Z̃ (C₀ ⊗ I) Z̃ᵀ‖_F² = Σ C₀[k, l] C₀[k', l'] ⟨G_kk', G_ll'⟩`, one Gram per head (n·4d²) and a 16-entry
  table (16·d²) give both norms."""
  z = jnp.stack([x.astype(jnp.float32) - x.astype(jnp.float32).mean(1, keepdims=True) for x in (q, k)], -2)
  g = jnp.einsum("bnhkd,bnhle->bhkdle", z, z, precision=_HI)                    # [b, h, 2, d, 2, d]
  t = jnp.einsum("bhkdKe,bhldLe->bhkKlL", g, g, precision=_HI)                 # ⟨G_kK, G_lL⟩
  b_, a_ = jnp.broadcast_arrays(*(jnp.broadcast_to(jnp.asarray(x, jnp.float32), (q.shape[2],)) for x in (beta, alpha)))
  c, cp, zero = (1 - b_) / 4, (1 + b_) / 4, jnp.zeros_like(b_)
  mat = lambda a, b, c, d: jnp.stack([jnp.stack([a, b], -1), jnp.stack([c, d], -1)], -2)   # [h, 2, 2]
  full, anti = mat(c, cp + a_ / 2, cp - a_ / 2, c), mat(zero, a_ / 2, -a_ / 2, zero)
  return jnp.mean(_skew_norm(anti, t) / jnp.maximum(_skew_norm(full, t), 1e-30))


def _conjugate(p, sq, v):
  """`A'v = ½(Π^{½}PΠ^{−½} + Π^{−½}PᵀΠ^{½}) v − √π(√π·v)` for v `[..., n]`, `sq` = √π `[..., n]`."""
  mv = lambda m, x: jnp.einsum("...ij,...j->...i", m, x, precision=_HI)
  return 0.5 * (sq * mv(p, v / sq) + mv(jnp.swapaxes(p, -1, -2), v * sq) / sq) - sq * jnp.sum(sq * v, -1, keepdims=True)


def _krylov_gap(p, steps: int):
  """The Lanczos gap (module docstring, mixing) of P `[..., n, n]` from `steps` Krylov steps."""
  sq = jnp.sqrt(jnp.maximum(markov.law(p), jnp.finfo(p.dtype).tiny))
  fixed_p, fixed_sq = jax.lax.stop_gradient(p), jax.lax.stop_gradient(sq)
  v0 = jax.random.normal(jax.random.PRNGKey(0), p.shape[:-1], p.dtype)
  v0 = v0 - fixed_sq * jnp.sum(fixed_sq * v0, -1, keepdims=True)
  ritz = eigen.lanczos(lambda v: _conjugate(fixed_p, fixed_sq, v), v0, max(1, min(steps, p.shape[-1] - 1)))
  top = jnp.argmax(jnp.abs(ritz.values), -1)
  x = jax.lax.stop_gradient(jnp.take_along_axis(ritz.vectors, top[..., None, None], -2)[..., 0, :])
  return 1.0 - jnp.abs(jnp.sum(x * _conjugate(p, sq, x), -1))


def absolute_gap(p, steps: int = 0) -> jax.Array:
  """`1 − max(|λ₁|, |λ_{n−1}|)` `[...]` of the additive reversibilisation of P `[..., n, n]`: dense
  (`markov.eigenbasis`) at `steps = 0`, else `steps` Lanczos steps (module docstring, mixing)."""
  if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
    raise ValueError(f"steps must be an integer ≥ 0 (Lanczos steps; 0: a dense eigensolve); got {steps!r}")
  if steps:
    return _krylov_gap(p, int(steps))
  lam = markov.eigenbasis(p)[0]
  return 1.0 - jnp.maximum(jnp.abs(lam[..., 1]), jnp.abs(lam[..., -1]))


def mixing(q, k, *, target: float = 0.1, beta=1.0, alpha=1.0, scale=None, steps: int = GAP_STEPS) -> jax.Array:
  """`E_{b,h} relu(g* − gap)` with g* = `target` and gap = `absolute_gap(P, steps)` of the walk."""
  return jnp.mean(jax.nn.relu(target - absolute_gap(_walk(q, k, beta, alpha, scale), steps)))


def isometry(wv, wo) -> jax.Array:
  """Mean over heads of the squared defect `δ² = 1 − tr(AB)²/(r·tr(ABAB))` of `T^h = W_O^h W_V^h`;
  `wv` `[d, h, k]`, `wo` `[h, k, d]` (`attngeo.connection` layouts), r = min(k, d)."""
  a = jnp.einsum("hke,hle->hkl", wo, wo, precision=_HI)                    # O_hᵀO_h  [h, k, k]
  b = jnp.einsum("dhk,dhl->hkl", wv, wv, precision=_HI)                    # V_h V_hᵀ [h, k, k]
  ab = jnp.matmul(a, b, precision=_HI)
  trace, frob2 = jnp.trace(ab, axis1=-2, axis2=-1), jnp.sum(ab * jnp.swapaxes(ab, -1, -2), (-2, -1))
  rank = min(wv.shape[0], wv.shape[2])
  return jnp.mean(1.0 - trace**2 / (rank * jnp.maximum(frob2, 1e-30)))


# ----------------------------------------------------------------------------- config and application

def check_model(cfg: Regularisers, model, prefix: str = "reg.") -> list:
  """The model's `nn.Attention` layers, after refusing (one-line ValueError) a term the model cannot give:
  no attention layers, or more sampled heads than a layer has."""
  mods = nn.attention_modules(model)
  if cfg.active and not mods:
    term = cfg.active[0]
    raise ValueError(f"{prefix}{term} = {getattr(cfg, term)} asks for the attention walk, but the model has no "
                     "attention layers")
  for m in mods:
    if cfg.heads > m.num_heads:
      raise ValueError(f"{prefix}heads must be ≤ the {m.num_heads} heads of every attention layer; got {cfg.heads}")
  return mods


def check_build(cfg: Regularisers, build, prefix: str = "reg.") -> None:
  """`check_model` on the model `build()` would make, built abstractly (`nnx.eval_shape`: no weights are
  computed), so a command refuses a term its model cannot give before any work. Nothing to do when no
  term is on."""
  if cfg.active:
    from flax import nnx
    check_model(cfg, nnx.eval_shape(build), prefix)


def _transports(m):
  """(wv [d, h, k], wo [h, k, d]) of an Attention, grouped value heads repeated to h."""
  wv = m.wv[...]
  return jnp.repeat(wv, m.num_heads // wv.shape[1], axis=1), m.wo[...]


def _layer_terms(cfg: Regularisers, m, q, k, key) -> dict:
  """{term: R} of one layer for the active terms."""
  kf, ks = jax.random.split(key)
  beta, alpha = m.coefficients()
  q, k, beta, alpha = sample(q, k, beta, alpha, ks, heads=cfg.heads, sequences=cfg.sequences)
  fns = {"curvature": lambda: curvature(q, k, coordinate_family(q, k, cfg.test_functions, kf),
                                        target=cfg.curvature_target, beta=beta, alpha=alpha, causal=m.causal,
                                        tau=cfg.tau, implementation=m.implementation),
         "reversibility": lambda: reversibility(q, k, beta=beta, alpha=alpha, kind=cfg.reversibility_kind,
                                                damping=cfg.damping),
         "skew": lambda: skew(q, k, beta=beta, alpha=alpha),
         "mixing": lambda: mixing(q, k, target=cfg.gap_target, beta=beta, alpha=alpha, steps=cfg.gap_steps),
         "isometry": lambda: isometry(*_transports(m))}
  return {term: fns[term]() for term in cfg.active}


def penalty(cfg: Regularisers, model, qks, key) -> tuple[jax.Array, dict]:
  """`(Σ_t λ_t R_t, {"reg/<t>": R_t})` over the active terms t, each R_t the mean over the model's
  attention layers; `qks` the per-layer (q, k) of `nn.capture_qk(model, ...)`, `key` the sampling key."""
  mods = check_model(cfg, model)
  if len(qks) != len(mods):
    raise ValueError(f"qks must hold one (q, k) per attention layer ({len(mods)}); got {len(qks)}")
  per_layer = [_layer_terms(cfg, m, q, k, jax.random.fold_in(key, i)) for i, (m, (q, k)) in enumerate(zip(mods, qks))]
  terms = {t: jnp.mean(jnp.stack([layer[t] for layer in per_layer])) for t in cfg.active}
  total = sum((getattr(cfg, t) * v for t, v in terms.items()), jnp.zeros((), jnp.float32))
  return total, {f"reg/{t}": v for t, v in terms.items()}


def regularised(cfg: Regularisers, loss_fn):
  """`loss_fn(model, batch, rng) -> (loss, metrics)` plus the penalty: the layers' (q, k) are captured
  during `loss_fn`'s own forward pass (its first call of each layer), the sampling key is drawn from
  `rng`, and the terms join the metrics as `reg/<term>`, the unregularised loss as `reg/base_loss`
  (the trainer's `loss` is then the total). With no active term, `loss_fn` itself."""
  if not cfg.active:
    return loss_fn

  def fn(model, batch, rng):
    (loss, metrics), qks = nn.capture_qk(model, lambda: loss_fn(model, batch, rng))
    total, terms = penalty(cfg, model, qks, jax.random.fold_in(rng, 0x5E6))
    return loss + total, {**metrics, **terms, "reg/base_loss": loss}
  return fn
