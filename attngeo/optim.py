"""Optimizers and learning-rate schedules (optax): warm-up then cosine/linear/constant/warm-down, AdamW,
Muon, or nanochat's split (Muon for the blocks' matrices, AdamW for embeddings and vectors), global-norm
clipping. `cfg` is any config with the `attngeo.train.TrainConfig` fields `steps, lr, warmup, schedule,
weight_decay, clip, optimizer`; the split also reads `embedding_lr, unembedding_lr, scalar_lr` and the
warm-down schedule `warmdown_ratio, final_lr_frac` when `cfg` has them (defaults below).

* `schedule="warmdown"` is nanochat's: linear warm-up to the peak over `warmup` steps, constant, then
  a linear decay over the last `warmdown_ratio·steps` steps to `final_lr_frac·peak`.
* `optimizer="muon_adamw"` labels each parameter by its path: the token embedding (`embed`) and the
  unembedding (`unembed`) get AdamW at their own rates (β = (0.8, 0.995) and (0.8, 0.96), ε = 1e-10,
  weight decay 0.001 and 0.01, as nanochat), every other ≥2-D weight gets Muon at `lr` (Nesterov
  momentum 0.95, 5 Newton–Schulz steps on the matrix `[fan_in, fan_out]`: `[d, h·k]` for the q/k/v
  projections `[d, h, k]`, `[h·k, d]` for the output projection `wo` `[h, k, d]`), and vectors (norm
  scales, biases, learnable β/α) get AdamW at `scalar_lr` (β = (0.8, 0.95), no weight decay). All
  groups follow the same schedule multiplier.
* `check(cfg)` (`attngeo.train_config.check_optimizer`: run by `schedule`, `make_optimizer` and
  `TrainConfig` at construction) refuses a value no run can use (a rate ≤ 0 or NaN, negative
  warm-up or clipping, an unknown name) in one line naming the field.
"""
from __future__ import annotations

import jax
import optax
from optax.contrib import MuonDimensionNumbers

# The rules and names live with the config, importable without JAX (`attngeo.train_config`).
from attngeo.train_config import (OPTIMIZER_RULES as RULES, OPTIMIZERS, SCHEDULES, SPLIT_DEFAULTS,  # noqa: F401
                                  check_optimizer as check, is_integer, is_real, require)


def _get(cfg, name):
  value = getattr(cfg, name, None)
  return SPLIT_DEFAULTS[name] if value is None else value


def schedule(cfg, peak: float) -> optax.Schedule:
  """Warm-up over `cfg.warmup` steps to `peak`, then `cfg.schedule` until `cfg.steps`."""
  check(cfg)
  warmup = optax.linear_schedule(0.0, peak, cfg.warmup)
  decay_steps = max(cfg.steps - cfg.warmup, 1)
  if cfg.schedule == "warmdown":
    ratio, final = _get(cfg, "warmdown_ratio"), _get(cfg, "final_lr_frac")
    down = round(ratio * cfg.steps)
    flat = max(cfg.steps - cfg.warmup - down, 0)
    return optax.join_schedules([warmup, optax.constant_schedule(peak), optax.linear_schedule(peak, final * peak, max(down, 1))],
                                [cfg.warmup, cfg.warmup + flat])
  after = {"cosine": optax.cosine_decay_schedule(peak, decay_steps),
           "linear": optax.linear_schedule(peak, 0.0, decay_steps),
           "constant": optax.constant_schedule(peak)}[cfg.schedule]
  return optax.join_schedules([warmup, after], [cfg.warmup])


def _names(path) -> list[str]:
  return [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]


def split_label(path, x) -> str:
  """The optimizer group of one parameter: embedding | unembedding | muon | scalar (see module doc)."""
  names = [n for n in _names(path) if n != "value"]
  if names and names[0] == "embed":
    return "embedding"
  if names and names[0] == "unembed":
    return "unembedding"
  return "muon" if x.ndim >= 2 else "scalar"


def muon_dims(path, x) -> MuonDimensionNumbers | None:
  """How Muon views a weight as a matrix `[fan_in, fan_out]` (None: not a Muon parameter)."""
  if split_label(path, x) != "muon":
    return None
  names = [n for n in _names(path) if n != "value"]
  if x.ndim == 3 and names[-1] == "wo":
    return MuonDimensionNumbers(reduction_axis=(0, 1), output_axis=(2,))
  return MuonDimensionNumbers(reduction_axis=(0,), output_axis=tuple(range(1, x.ndim)))


def muon_adamw(cfg) -> optax.GradientTransformation:
  """nanochat's split: Muon for matrices, AdamW for embedding, unembedding and vectors."""
  adam = lambda lr, b2, wd: optax.adamw(schedule(cfg, lr), b1=0.8, b2=b2, eps=1e-10, weight_decay=wd)
  dims = lambda tree: jax.tree_util.tree_map_with_path(muon_dims, tree)
  groups = {"embedding": adam(_get(cfg, "embedding_lr"), 0.995, 0.001),
            "unembedding": adam(_get(cfg, "unembedding_lr"), 0.96, 0.01),
            "scalar": adam(_get(cfg, "scalar_lr"), 0.95, 0.0),
            "muon": optax.contrib.muon(schedule(cfg, cfg.lr), beta=0.95, nesterov=True, weight_decay=cfg.weight_decay,
                                       muon_weight_dimension_numbers=dims)}
  return optax.multi_transform(groups, lambda tree: jax.tree_util.tree_map_with_path(split_label, tree))


def make_optimizer(cfg) -> optax.GradientTransformation:
  """Warm-up then the schedule; AdamW, Muon or the Muon/AdamW split; global-norm clipping."""
  sched = schedule(cfg, cfg.lr)
  if cfg.optimizer == "adamw":
    opt = optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)
  elif cfg.optimizer == "muon":
    opt = optax.contrib.muon(sched, weight_decay=cfg.weight_decay)
  else:
    opt = muon_adamw(cfg)
  return optax.chain(optax.clip_by_global_norm(cfg.clip), opt) if cfg.clip else opt
