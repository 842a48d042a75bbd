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
* `check(cfg)` (run by `schedule`, `make_optimizer` and `TrainConfig` at construction) refuses a
  value no run can use (a rate ≤ 0 or NaN, negative warm-up or clipping, an unknown name) in one
  line naming the field.
"""
from __future__ import annotations

import math
import numbers

import jax
import optax
from optax.contrib import MuonDimensionNumbers

OPTIMIZERS = ("adamw", "muon", "muon_adamw")
SCHEDULES = ("cosine", "linear", "constant", "warmdown")
# nanochat's base_train defaults (before its width scaling; see attngeo.lm.recipe).
SPLIT_DEFAULTS = {"embedding_lr": 0.3, "unembedding_lr": 0.008, "scalar_lr": 0.01, "warmdown_ratio": 0.65,
                  "final_lr_frac": 0.05}


def is_integer(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
  """A finite real number (an integer counts; a bool does not)."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def require(cfg, rules) -> None:
  """Each rule `(field, ok, expected)`: a one-line ValueError naming `field` unless `ok(value)`.

  Fields `cfg` does not have are skipped (configs are duck-typed).
  """
  for name, ok, expected in rules:
    if hasattr(cfg, name) and not ok(getattr(cfg, name)):
      raise ValueError(f"{name} must be {expected}; got {getattr(cfg, name)!r}")


_positive_or_none = lambda v: v is None or (is_real(v) and v > 0)
RULES = (
    ("lr", lambda v: is_real(v) and v > 0, "a positive finite rate"),
    ("warmup", lambda v: is_integer(v) and v >= 0, "an integer ≥ 0 (warm-up steps)"),
    ("schedule", lambda v: v in SCHEDULES, f"one of {sorted(SCHEDULES)}"),
    ("optimizer", lambda v: v in OPTIMIZERS, f"one of {OPTIMIZERS}"),
    ("weight_decay", lambda v: is_real(v) and v >= 0, "a finite number ≥ 0"),
    ("clip", lambda v: is_real(v) and v >= 0, "a finite global-norm bound ≥ 0 (0 disables)"),
    ("embedding_lr", _positive_or_none, "a positive finite rate or None"),
    ("unembedding_lr", _positive_or_none, "a positive finite rate or None"),
    ("scalar_lr", _positive_or_none, "a positive finite rate or None"),
    ("warmdown_ratio", lambda v: is_real(v) and 0 <= v <= 1, "a fraction in [0, 1] (of the steps)"),
    ("final_lr_frac", lambda v: is_real(v) and v >= 0, "a finite fraction ≥ 0 (of the peak rate)"),
)


def check(cfg) -> None:
  """One-line ValueError naming the first optimizer field of `cfg` no run can use (`RULES`)."""
  require(cfg, RULES)


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
