"""Geometry probe of a trained model: per-layer Markov diagnostics of its attention operators.

`layer_stats(q, k, beta, alpha)` reads one layer's operator (dense P per head, small n only):
`e^{H̄}` (effective neighbours), `ε_rev` (reversibility defect), `ρ_skew` (skew share of the
parametric logit, double-centred), each averaged over the batch, per head.
`model_stats(model, run)` runs `run()` with q, k capture on and returns the per-layer list.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import markov, nn, operators


@jax.jit
def _stats(q, k, beta, alpha):
  p = operators.markov_matrix(q, k, beta=beta, alpha=alpha)
  lg = operators.logits(q, k, beta=beta, alpha=alpha).full
  return {"eff_neighbours": markov.effective_neighbours(p).mean(0),
          "eps_rev": markov.reversibility(p).mean(0),
          "rho_skew": markov.skew_share(lg).mean(0)}


def layer_stats(q, k, beta, alpha) -> dict[str, np.ndarray]:
  """Per-head [h] diagnostics of the (unmasked) operator (β, α) on q, k [b, n, h, d]."""
  h = q.shape[2]
  beta = jnp.broadcast_to(jnp.asarray(beta, jnp.float32), (h,))
  alpha = jnp.broadcast_to(jnp.asarray(alpha, jnp.float32), (h,))
  return {key: np.asarray(v) for key, v in _stats(q.astype(jnp.float32), k.astype(jnp.float32), beta, alpha).items()}


def model_stats(model, run) -> list[dict[str, np.ndarray]]:
  """Per-layer `layer_stats` of every Attention in `model` while `run()` executes it."""
  _, qks = nn.capture_qk(model, run)
  mods = nn.attention_modules(model)
  return [layer_stats(q, k, *m.coefficients()) for (q, k), m in zip(qks, mods)]


def summarise(per_layer: list[dict[str, np.ndarray]]) -> dict[str, float]:
  """Mean over layers and heads of each statistic."""
  return {key: float(np.mean([layer[key] for layer in per_layer])) for key in per_layer[0]}
