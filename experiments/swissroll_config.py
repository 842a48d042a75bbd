"""The Swiss-roll scan's settings (`attngeo swissroll`): its config, their checks, and each condition's key
and folder. Imports no JAX, so the command answers `--help` and refuses bad settings at once; the scan's
work is `swissroll_run`, its command line `swissroll`.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from attngeo import files, regularisers_config
from attngeo.data.points import PointSets

OPERATORS = ("DMAP", "DMTN", "ATAP", "ATTN", "CMAP")   # the four corners (tested) and, opt-in, the magnetic lift
ORDERS = ("ffn_first", "attn_first")                # attngeo.nn.layers.ORDERS (tested)
SOLVERS = ("euler", "heun")
TIME_LAWS = ("power", "logit_normal")
COUPLINGS = ("independent", "ot")
RESULT_VERSION = 3                                  # bump when a condition's read-outs change


@dataclasses.dataclass
class ScanModel:
  """The `PointFlow` every condition trains (the operator and the sub-layer order are the scan's axes)."""
  width: int = 64
  depth: int = 2
  heads: int = 2
  mlp_ratio: float = 2.0
  learnable_operator: bool = False     # train per-head (β, α), starting from each named corner


@dataclasses.dataclass
class ScanTrain:
  """The optimisation of every condition (`attngeo.train_config.TrainConfig` fields; each condition sets its
  own seed and folder)."""
  steps: int = 2500
  batch_size: int = 8
  lr: float = 6e-3
  warmup: int = 50
  schedule: str = "cosine"
  ema: float = 0.0
  ckpt_every: int = 250


@dataclasses.dataclass
class SwissRollConfig:
  operators: tuple[str, ...] = ("DMAP", "DMTN", "ATAP", "ATTN")
  orders: tuple[str, ...] = ("ffn_first", "attn_first")
  seed: int = 123                      # the training set's seed and the first training seed
  seeds: int = 1                       # training seeds per condition: seed, seed + 1, …
  num_points: int = 4000
  set_size: int = 256
  num_sets: int = 2048
  model: ScanModel = dataclasses.field(default_factory=ScanModel)
  train: ScanTrain = dataclasses.field(default_factory=ScanTrain)
  time_power: float = 1.0              # training times t = 1 − (1 − u)^p, u ~ U[0, 1): p > 1 favours t near 1
  time_law: str = "power"              # power (above) | logit_normal (t = sigmoid(N(0, 1)), SD3's)
  coupling: str = "ot"                 # ot: each set's noise matched to its points by exact OT | independent
  solver: str = "heun"
  sample_steps: int = 40
  sample_sets: int = 8
  figure_times: tuple[float, ...] = (0.5, 0.75, 0.9, 1.0)
  probe_sets: int = 4
  probe_sizes: tuple[int, ...] = (256, 1024, 4000)
  heat_points: int = 1000
  out: str = "runs/swissroll"
  progress: bool = True
  reg: regularisers_config.Regularisers = dataclasses.field(default_factory=regularisers_config.Regularisers)


HELP = {
    "operators": f"comma-separated operators, each one of {','.join(OPERATORS)}",
    "orders": f"comma-separated sub-layer orders, each one of {','.join(ORDERS)} (FFN→MHSA, MHSA→FFN)",
    "seed": "seed of the training set and first training seed",
    "seeds": "training seeds per condition (≥ 1); > 1 adds mean ± sd and differences.md",
    "num_points": "training-set size", "set_size": "points per training set (≤ num_points)",
    "num_sets": "training point sets drawn from the cloud", "model.width": "model width", "model.depth": "blocks",
    "model.heads": "attention heads (must divide width)", "model.mlp_ratio": "MLP hidden ÷ width",
    "model.learnable_operator": "train per-head (β, α) from each named corner (true/false)",
    "train.steps": "training steps", "train.batch_size": "point sets per step", "train.lr": "peak learning rate",
    "train.warmup": "warm-up steps", "train.schedule": "cosine, linear or constant after warm-up",
    "time_power": "p ≥ 1 in the training-time law t = 1 − (1 − u)^p, u uniform (1: uniform t)",
    "time_law": "training-time law: power (t = 1 − (1 − u)^p) or logit_normal (t = sigmoid(z), z ~ N(0, 1))",
    "coupling": "noise–data pairing in training: independent, or ot (each set's noise points matched to its "
                "points by exact optimal transport; sampling unchanged)",
    "train.ema": "EMA decay of the weights used for sampling and probing, in [0, 1) (0: none)",
    "train.ckpt_every": "steps between checkpoints (0: only at the end)",
    "solver": f"sampler, one of {','.join(SOLVERS)}", "sample_steps": "sampler steps",
    "sample_sets": "generated point sets (× set_size points are judged)",
    "figure_times": "times in (0, 1] shown in samples.png, multiples of 1/sample_steps",
    "probe_sets": "training point sets the transport read-outs average over",
    "probe_sizes": "set sizes (≤ num_points) at which e^H̄ is also measured (results.json)",
    "heat_points": "training points in the heat figure's set", "out": "output folder",
    "progress": "progress bars (true/false)",
    **regularisers_config.HELP,
}

# `--full`: 2.4× the steps (1,823 s before huge pages), as dotted settings (`config.replaced`).
FULL = {"train.steps": 6000, "train.ckpt_every": 1000, "sample_sets": 16, "num_sets": 8192}

# Settings that shape a condition's training (its folder key) are every field except these (by leaf name:
# `flat_settings`).
NOT_TRAINING = ("operators", "orders", "seeds", "out", "progress", "ckpt_every", "heat_points")
EVALUATION = ("solver", "sample_steps", "sample_sets", "figure_times", "probe_sets", "probe_sizes")

ORDER_NAMES = {"ffn_first": "FFN → MHSA", "attn_first": "MHSA → FFN"}


def validate(cfg: SwissRollConfig) -> None:
  """Raise one ValueError line naming the first bad setting (its flag, e.g. `--train.steps`) before any work."""
  def need(ok, name, expected):
    if not ok:
      value = functools.reduce(getattr, name.split("."), cfg)
      shown = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else value   # as the flag took it
      raise ValueError(f"--{name.replace('_', '-')} must be {expected}; got {shown!r}")
  need(cfg.operators and all(o in OPERATORS for o in cfg.operators), "operators",
       f"a comma-separated list of {','.join(OPERATORS)}")
  need(cfg.orders and all(o in ORDERS for o in cfg.orders), "orders", f"a comma-separated list of {','.join(ORDERS)}")
  need(len(set(cfg.operators)) == len(cfg.operators), "operators", "a list without repeats")
  need(len(set(cfg.orders)) == len(cfg.orders), "orders", "a list without repeats")
  m, t = cfg.model, cfg.train
  for name in ("seeds", "num_points", "num_sets", "model.width", "model.depth", "model.heads", "train.steps",
               "train.batch_size", "sample_steps", "sample_sets", "probe_sets", "heat_points"):
    need(functools.reduce(getattr, name.split("."), cfg) >= 1, name, "a positive integer")
  for name in ("warmup", "ckpt_every"):
    need(getattr(t, name) >= 0, "train." + name, "a non-negative integer")
  need(1 <= cfg.set_size <= cfg.num_points, "set_size", f"in [1, num_points = {cfg.num_points}]")
  need(m.width % m.heads == 0, "model.heads", f"a divisor of width {m.width}")
  need(m.mlp_ratio > 0, "model.mlp_ratio", "positive")
  need(np.isfinite(t.lr) and t.lr > 0, "train.lr", "a positive finite number")
  need(0 <= t.ema < 1, "train.ema", "in [0, 1)")
  need(np.isfinite(cfg.time_power) and cfg.time_power >= 1, "time_power", "a finite number ≥ 1")
  need(cfg.time_law in TIME_LAWS, "time_law", f"one of {','.join(TIME_LAWS)}")
  need(cfg.coupling in COUPLINGS, "coupling", f"one of {','.join(COUPLINGS)}")
  need(t.schedule in ("cosine", "linear", "constant"), "train.schedule", "cosine, linear or constant")
  need(cfg.solver in SOLVERS, "solver", f"one of {','.join(SOLVERS)}")
  need(cfg.heat_points <= cfg.num_points, "heat_points", f"at most num_points = {cfg.num_points}")
  need(cfg.probe_sizes and all(1 <= n <= cfg.num_points for n in cfg.probe_sizes), "probe_sizes",
       f"set sizes in [1, num_points = {cfg.num_points}]")
  frames = [t * cfg.sample_steps for t in cfg.figure_times]
  need(cfg.figure_times and all(0 < t <= 1 and abs(f - round(f)) < 1e-9 for t, f in zip(cfg.figure_times, frames)),
       "figure_times", f"times in (0, 1] that are multiples of 1/sample_steps = 1/{cfg.sample_steps}")
  cfg.reg.validate()


def fit_to_cloud(cfg: SwissRollConfig, given=()) -> SwissRollConfig:
  """Read-out sizes left at their defaults are fitted to a smaller cloud: `heat_points` becomes
  min(heat_points, num_points) and each `probe_sizes` entry min(size, num_points) (repeats dropped).
  Values in `given` (set by the user) are kept, and `validate` refuses them if they do not fit."""
  fields = {}
  if "heat_points" not in given:
    fields["heat_points"] = min(cfg.heat_points, cfg.num_points)
  if "probe_sizes" not in given:
    fields["probe_sizes"] = tuple(sorted({min(n, cfg.num_points) for n in cfg.probe_sizes}))
  return dataclasses.replace(cfg, **fields)


def flat_settings(cfg: SwissRollConfig) -> dict:
  """Every setting under its leaf name, `model` and `train` merged into the top level: the names condition keys
  were made from before the two were nested, so folders trained then keep their keys."""
  fields = dataclasses.asdict(cfg)
  return {**{k: v for k, v in fields.items() if k not in ("model", "train")}, **fields["model"], **fields["train"]}


def training_key(cfg: SwissRollConfig, op: str, order: str, seed: int) -> str:
  """Fingerprint of everything that shapes one condition's trained weights."""
  fields = {k: v for k, v in flat_settings(cfg).items() if k not in NOT_TRAINING + EVALUATION + ("seed",)}
  if cfg.reg == regularisers_config.Regularisers():
    del fields["reg"]              # added after runs were keyed: at its default (every term off) their key is kept
  return files.fingerprint(fields, dict(operator=op, order=order, data_seed=cfg.seed, train_seed=seed,
                                       point_sets=PointSets.VERSION))   # the record order shapes training


def evaluation_key(cfg: SwissRollConfig, op: str, order: str, seed: int) -> str:
  """Fingerprint of everything that shapes one condition's result row."""
  return files.fingerprint(training_key(cfg, op, order, seed), {k: getattr(cfg, k) for k in EVALUATION},
                          RESULT_VERSION)


def condition_dir(cfg: SwissRollConfig, op: str, order: str, seed: int) -> str:
  return os.path.join(cfg.out, "conditions", f"{op}_{order}_seed{seed}-{training_key(cfg, op, order, seed)}")


def train_seeds(cfg: SwissRollConfig) -> list[int]:
  return [cfg.seed + i for i in range(cfg.seeds)]
