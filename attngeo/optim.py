"""Optimizers and learning-rate schedules (optax): warm-up then cosine/linear/constant, AdamW or
Muon, global-norm clipping. `cfg` is any config with the `attngeo.train.TrainConfig` fields
`steps, lr, warmup, schedule, weight_decay, clip, optimizer`.
"""
from __future__ import annotations

import optax


def make_optimizer(cfg) -> optax.GradientTransformation:
  """Warm-up then cosine/linear/constant schedule; AdamW or Muon; global-norm clipping."""
  decay_steps = max(cfg.steps - cfg.warmup, 1)
  after = {"cosine": optax.cosine_decay_schedule(cfg.lr, decay_steps),
           "linear": optax.linear_schedule(cfg.lr, 0.0, decay_steps),
           "constant": optax.constant_schedule(cfg.lr)}
  if cfg.schedule not in after:
    raise ValueError(f"schedule must be one of {sorted(after)}; got {cfg.schedule!r}")
  sched = optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup), after[cfg.schedule]], [cfg.warmup])
  if cfg.optimizer == "adamw":
    opt = optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)
  elif cfg.optimizer == "muon":
    opt = optax.contrib.muon(sched, weight_decay=cfg.weight_decay)
  else:
    raise ValueError(f"optimizer must be 'adamw' or 'muon'; got {cfg.optimizer!r}")
  return optax.chain(optax.clip_by_global_norm(cfg.clip), opt) if cfg.clip else opt
