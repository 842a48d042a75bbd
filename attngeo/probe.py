"""Geometry probe of a model: per-layer Markov, Bakry–Émery and connection-walk read-outs.

For each attention layer (q, k captured during a forward pass; dense P per head, so small n):

* `eff_neighbours` `e^{H̄}`, `eps_rev` `ε_rev`, `rho_skew` `ρ_skew` (parametric logits, double
  centred) — per head, averaged over the batch;
* `curvature` — median over tokens of the Bakry–Émery bound (`geometry.family_curvature`, n = ∞,
  τ = 1) of the head-averaged walk W over the family of the top-3 principal coordinates of
  `m = (q + k)/√2` (the coordinates in which DMAP is a Gaussian kernel);
* with the layer's value/output weights (`model_report`): spectral gap `1 − |λ₁(W)|`, walk
  reversibility, isometry defect of headwise and effective transports (`attngeo.connection`), and
  stability of W to the next layer.

Causal note: under a causal mask the walk drains into token 0 (π = δ₀, ε_rev = 0 by definition);
read ρ_skew and the transports there, not ε_rev.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import connection, geometry, markov, nn, operators


def _principal_coordinates(x, k: int = 3):
  """Top-k principal coordinates of x `[n, D]` (centred): `[n, k]`."""
  x = x - x.mean(0)
  u, s, _ = jnp.linalg.svd(x, full_matrices=False)
  return u[:, :k] * s[:k]


@jax.jit
def _curvature(w, m):
  """Median Bakry–Émery bound of walks w `[b, n, n]` over the top-3 PCs of m `[b, n, D]`."""
  f = jax.vmap(_principal_coordinates)(m)
  return jnp.median(geometry.family_curvature(w, f, tau=1.0), -1)


@functools.partial(jax.jit, static_argnames="causal")
def _stats(q, k, beta, alpha, causal):
  lg = operators.logits(q, k, beta=beta, alpha=alpha).full
  p = operators.rownorm(lg, causal=causal)
  m = ((q + k) / jnp.sqrt(2.0)).reshape(q.shape[0], q.shape[1], -1)
  return p, {"eff_neighbours": markov.effective_neighbours(p).mean(0),
             "eps_rev": markov.reversibility(p).mean(0),
             "rho_skew": markov.skew_share(lg).mean(0),
             "curvature": _curvature(p.mean(1), m).mean()}


def _dense(q, k, beta, alpha, causal):
  h = q.shape[2]
  beta = jnp.broadcast_to(jnp.asarray(beta, jnp.float32), (h,))
  alpha = jnp.broadcast_to(jnp.asarray(alpha, jnp.float32), (h,))
  p, stats = _stats(q.astype(jnp.float32), k.astype(jnp.float32), beta, alpha, causal)
  return p, {key: np.asarray(v) for key, v in stats.items()}


def layer_stats(q, k, beta, alpha, causal: bool = False) -> dict[str, np.ndarray]:
  """Per-head [h] `eff_neighbours`, `eps_rev`, `rho_skew` and the scalar `curvature` of one layer."""
  return _dense(q, k, beta, alpha, causal)[1]


def model_stats(model, run) -> list[dict[str, np.ndarray]]:
  """Per-layer `layer_stats` of every Attention in `model` while `run()` executes it."""
  _, qks = nn.capture_qk(model, run)
  mods = nn.attention_modules(model)
  return [layer_stats(q, k, *m.coefficients(), causal=m.causal) for (q, k), m in zip(qks, mods)]


def summarise(per_layer: list[dict]) -> dict[str, float]:
  """Mean over layers (and heads) of each numeric statistic."""
  keys = [k for k, v in per_layer[0].items() if np.ndim(v) <= 1]
  return {key: float(np.mean([np.mean(layer[key]) for layer in per_layer])) for key in keys}


def model_report(model, run, sample: int = 0) -> list[dict]:
  """Full per-layer report (stats + walk + transports + stability) on batch element `sample`."""
  _, qks = nn.capture_qk(model, run)
  mods = nn.attention_modules(model)
  rows, walks = [], []
  for (q, k), m in zip(qks, mods):
    p, stats = _dense(q, k, *m.coefficients(), m.causal)
    ph = p[sample]                                                           # [h, n, n]
    w = connection.walk(ph)
    t = connection.head_transports(m.wv[...], m.wo[...])
    head_defect, _ = connection.isometry_defect(t)
    row = {key: v.tolist() for key, v in stats.items()}
    row.update(spectral_gap=float(markov.spectral_gap(w).gap), walk_eps_rev=float(markov.reversibility(w)),
               head_isometry_defect=np.asarray(head_defect).tolist(),
               effective_isometry_defect=float(connection.effective_isometry_defect(ph, t)))
    rows.append(row)
    walks.append(w)
  for row, st in zip(rows, connection.stability(walks)):
    row.update({f"next_{key}": v for key, v in st.items()})
  return rows


def hook(inputs_fn, every: int = 100):
  """A `train.train` hook: every `every` steps, the layer-mean probe summary of `inputs_fn(model)`.

  `inputs_fn(model)` returns a zero-argument callable running the model on a small fixed batch.
  Logged keys are prefixed `probe/`.
  """
  def fn(step, model):
    if step % every:
      return None
    return {f"probe/{k}": v for k, v in summarise(model_stats(model, inputs_fn(model))).items()}
  return fn
