"""The trainer's config and its rules, importable without JAX (the CLI checks a command line with them first).

* `TrainConfig` — what `attngeo.train.train` reads: steps, global batch, the optimizer and its schedule
  (`attngeo.optim`; nanochat's Muon/AdamW split reads its own rates and the warm-down's shape), EMA,
  mesh, seed, and how the run is watched (workdir, checkpoints, logging).
  It validates itself at construction, so a bad override fails before any work.
* `check(cfg, prefix)` — every rule below on any config that has (some of) these fields (duck-typed:
  a field the config lacks is skipped), naming the field as `prefix + name` (`train.lr`, the flag's name).
  The rules: `OPTIMIZER_RULES` (rates > 0 and finite, warm-up ≥ 0, a known schedule and optimizer, …)
  and `TRAINER_RULES` (counts ≥ 1, an EMA decay in [0, 1), a mesh of three counts, …).
* `check_resumable(workdir, **configs)` — refuse a workdir whose config.json records another run,
  naming the fields that differ; `RUN_CONTROL_FIELDS` may change on a resume.

Imports nothing of attngeo but `attngeo.files` (no JAX, no optax).
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os

from attngeo import files

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


def require(cfg, rules, prefix: str = "") -> None:
  """Each rule `(field, ok, expected)`: a one-line ValueError naming `prefix + field` unless `ok(value)`.

  Fields `cfg` does not have are skipped (configs are duck-typed).
  """
  for name, ok, expected in rules:
    if hasattr(cfg, name) and not ok(getattr(cfg, name)):
      raise ValueError(f"{prefix}{name} must be {expected}; got {getattr(cfg, name)!r}")


_positive_or_none = lambda v: v is None or (is_real(v) and v > 0)
_positive_int = lambda v: is_integer(v) and v >= 1
OPTIMIZER_RULES = (
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
    ("final_lr_frac", lambda v: is_real(v) and 0 <= v <= 1, "a fraction in [0, 1] (of the peak rate)"),
)
TRAINER_RULES = (
    ("steps", lambda v: _positive_int(v) and v < 2**31, "an integer in [1, 2³¹) (the step counter is int32)"),
    ("batch_size", _positive_int, "an integer ≥ 1 (the global batch)"),
    ("ema", lambda v: is_real(v) and 0 <= v < 1, "a decay in [0, 1) (0 disables)"),
    ("mesh", lambda v: isinstance(v, (tuple, list)) and len(v) == 3 and all(map(_positive_int, v)),
     "three integers ≥ 1 (data, fsdp, tensor)"),
    ("seed", lambda v: is_integer(v) and 0 <= v < 2**32, "an integer in [0, 2³²) (numpy's and JAX's seeds)"),
    ("workdir", lambda v: v is None or (isinstance(v, (str, os.PathLike)) and str(v) != ""),
     "a folder path or None"),
    ("ckpt_every", lambda v: is_integer(v) and v >= 0,
     "an integer ≥ 0 (steps between checkpoints; 0: only at the end)"),
    ("keep", _positive_int, "an integer ≥ 1 (checkpoints kept)"),
    ("log_every", _positive_int, "an integer ≥ 1 (steps between logged rows)"),
    ("progress", lambda v: isinstance(v, bool), "true or false"),
)

# Fields that change how a run is watched, not what it computes: a resume may change them.
RUN_CONTROL_FIELDS = ("workdir", "ckpt_every", "keep", "log_every", "progress")
# TrainConfig fields added after run folders recorded it, with the value those runs used (`attngeo.optim`
# read the split's rates with these defaults when a config lacked them): a record without one compares as
# holding it, so the earlier runs resume.
ADDED_FIELDS = {"embedding_lr": None, "unembedding_lr": None, "scalar_lr": None, "warmdown_ratio": 0.65,
                "final_lr_frac": 0.05}


def check_optimizer(cfg, prefix: str = "") -> None:
  """One-line ValueError naming the first optimizer field of `cfg` no run can use (`OPTIMIZER_RULES`)."""
  require(cfg, OPTIMIZER_RULES, prefix)


def check(cfg, prefix: str = ""):
  """One-line ValueError naming the first field of `cfg` no run can use (`OPTIMIZER_RULES`, then
  `TRAINER_RULES`); returns `cfg`."""
  check_optimizer(cfg, prefix)
  require(cfg, TRAINER_RULES, prefix)
  return cfg


@dataclasses.dataclass
class TrainConfig:
  steps: int = 1000
  batch_size: int = 32                 # global batch
  lr: float = 1e-3
  warmup: int = 50
  schedule: str = "cosine"             # cosine | linear | constant | warmdown (after warm-up)
  weight_decay: float = 0.0
  clip: float = 1.0                    # global-norm clipping (0 disables)
  optimizer: str = "adamw"             # adamw | muon | muon_adamw
  embedding_lr: float | None = None    # muon_adamw: AdamW rate of the token embedding (None: 0.3)
  unembedding_lr: float | None = None  # muon_adamw: AdamW rate of the unembedding (None: 0.008)
  scalar_lr: float | None = None       # muon_adamw: AdamW rate of norms, biases, learnable β/α (None: 0.01)
  warmdown_ratio: float = 0.65         # warmdown schedule: share of the steps in the final linear decay
  final_lr_frac: float = 0.05          # warmdown schedule: final rate as a fraction of the peak
  ema: float = 0.0                     # EMA decay of the weights (0 disables)
  mesh: tuple[int, int, int] = (1, 1, 1)  # (data, fsdp, tensor)
  seed: int = 0
  workdir: str | None = None           # checkpoints, metrics.jsonl, tb/, config.json
  ckpt_every: int = 0                  # steps between checkpoints (0: only at the end)
  keep: int = 2
  log_every: int = 10
  progress: bool = True

  def __post_init__(self):
    self.validate()

  def validate(self, prefix: str = ""):
    """One-line ValueError naming the first field no run can use (`check`).

    Runs at construction (so a command-line override fails before any work) and again in `train`
    before anything is written (a field may have been changed since).
    """
    return check(self, prefix)


def check_resumable(workdir: str, *, ignore: tuple[str, ...] = (), recorded: dict | None = None, **configs):
  """Refuse (one-line ValueError) a workdir whose config.json records another run.

  Compares every recorded config with the given ones field by field (`RUN_CONTROL_FIELDS` of the
  train config excepted, and `steps` under a constant schedule, where a longer run extends the
  same trajectory; `ignore` names further "config.field" keys that do not change results) and
  names the fields that differ. A recorded train config without an `ADDED_FIELDS` field compares as
  holding that field's earlier value. `recorded` replaces config.json's configs of those names (a record read
  in a newer layout, e.g. `sit_config.nested_record`).
  """
  saved = {**files.read_config(workdir), **(recorded or {})}
  diffs = []
  for name, cfg in configs.items():
    new = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    old = saved.get(name)
    flat_old, flat_new = files.flatten(old or {}), files.flatten(json.loads(json.dumps(new or {}, default=str)))
    if name == "train" and old:
      flat_old = {**ADDED_FIELDS, **flat_old}
    for key in sorted(set(flat_old) | set(flat_new)):
      if name == "train" and (key in RUN_CONTROL_FIELDS or (key == "steps" and flat_old.get("schedule") ==
                                                             flat_new.get("schedule") == "constant")):
        continue
      if f"{name}.{key}" in ignore:
        continue
      if flat_old.get(key) != flat_new.get(key):
        diffs.append(f"{name}.{key} {flat_old.get(key)!r} → {flat_new.get(key)!r}")
  if diffs:
    raise ValueError(f"{workdir} holds a run with another config ({'; '.join(diffs)}); "
                     f"resume with the same config or use a new workdir")
