"""The Swiss-roll scan (seed "Attention Geometry", Table 1 and Figures 1–2).

    attngeo swissroll [--full] [--seeds 3] [--operators DMAP,ATTN] [--orders ffn_first] [--steps N] ...

A `PointFlow` set transformer (each point a token, bidirectional attention) learns the velocity
of the linear interpolant from Gaussian noise sets to point sets of the 4000-point Swiss roll
(flow matching, `attngeo.flow`), once per operator × sub-layer order × seed, same budget each;
samples are drawn with Heun's method from noise sets (EMA weights when `--ema` > 0). In training,
each set's noise points are paired with its points by exact optimal transport (`--coupling ot`, the
default: minibatch OT within a set — the noise is still i.i.d. Gaussian and the data unchanged, only
their pairing, so the paths are straighter; `--coupling independent` pairs them at random).

Sample quality (`attngeo.sample_metrics`; standardised coordinates), each beside its floor, the
same read-out for an oracle generator (fresh samples of the generating distribution, as many as
generated, standardised like the training set; the table's first row):

* `d_NN` — distance from each generated point to its nearest training point, mean and median;
* `coverage` — distance from each of 4000 fresh true points to its nearest generated point (mean);
* `energy` — energy distance between the generated points and the 4000 fresh points;
* `memo.` — memorisation ratio, mean d_NN to the training set ÷ mean d_NN to a held-out fresh set
  of 4000 (≈ 1 without memorisation, → 0 for copies of training points).

Transport of the trained model (attention operators at t = 1 on `probe_sets` training point
sets, averaged over layers, heads and sets; per layer in results.json): `e^H̄` (effective
neighbours) and `e^H̄/n` (÷ set size n), `ε_rev`, `ρ_skew`, `curvature` (Bakry–Émery bound of each
layer's head-averaged walk over the top-3 principal coordinates of m = (q + k)/√2, median over
points); `e^H̄` at set sizes `probe_sizes` in results.json. `loss`: the flow-matching loss (uniform
t, under the training coupling) of the final weights on a fixed evaluation batch.

With `--seeds N` every condition is trained with seeds seed, …, seed + N − 1 (initialisation,
batch order, noise; the training set stays the seed-123 roll); the table shows mean ± sd and
`differences.md` lists, per column, the pairs of conditions whose difference exceeds the
seed-to-seed spread (Welch's t-test, Holm-corrected over the pairs of each column, level 0.05).

Writes table1.{md,csv,json}, results.json, samples.png (Figure 2), heat.png (Figure 1: heat flow
under the learned DMAP and ATTN walks and their equilibria) and config.json to `--out`. Each
condition lives in `out/conditions/<op>_<order>_seed<s>-<key>/`, the key a fingerprint of every
setting that shapes its training; its result.json is reused only when the evaluation settings
match too (else it is re-evaluated from the final checkpoint), and an interrupted condition
resumes from its last checkpoint.

`--reg.<term> λ` (curvature, reversibility, skew, mixing, isometry; `attngeo.regularisers`) adds a
geometry term to the training loss; metrics.jsonl and TensorBoard log each as `reg/<term>` and the
flow-matching loss as `reg/base_loss`. Every weight 0 (the default) leaves a condition's key as it was.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np

from attngeo import config as config_lib, regularisers_config
from attngeo.experiments import report
from attngeo.experiments.report import Col

OPERATORS = ("DMAP", "DMTN", "ATAP", "ATTN", "CMAP")   # the four corners (tested) and, opt-in, the magnetic lift
ORDERS = ("ffn_first", "attn_first")                # attngeo.nn.layers.ORDERS (tested)
SOLVERS = ("euler", "heun")
TIME_LAWS = ("power", "logit_normal")
COUPLINGS = ("independent", "ot")
RESULT_VERSION = 3                                  # bump when a condition's read-outs change


@dataclasses.dataclass
class SwissRollConfig:
  operators: tuple[str, ...] = ("DMAP", "DMTN", "ATAP", "ATTN")
  orders: tuple[str, ...] = ("ffn_first", "attn_first")
  seed: int = 123                      # the training set's seed and the first training seed
  seeds: int = 1                       # training seeds per condition: seed, seed + 1, …
  num_points: int = 4000
  set_size: int = 256
  num_sets: int = 2048
  width: int = 64
  depth: int = 2
  heads: int = 2
  mlp_ratio: float = 2.0
  learnable_operator: bool = False     # train per-head (β, α), starting from each named corner
  steps: int = 2500
  batch_size: int = 8
  lr: float = 6e-3
  warmup: int = 50
  schedule: str = "cosine"
  ema: float = 0.0
  time_power: float = 1.0              # training times t = 1 − (1 − u)^p, u ~ U[0, 1): p > 1 favours t near 1
  time_law: str = "power"              # power (above) | logit_normal (t = sigmoid(N(0, 1)), SD3's)
  coupling: str = "ot"                 # ot: each set's noise matched to its points by exact OT | independent
  ckpt_every: int = 250
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
    "num_sets": "training point sets drawn from the cloud", "width": "model width", "depth": "blocks",
    "heads": "attention heads (must divide width)", "mlp_ratio": "MLP hidden ÷ width",
    "learnable_operator": "train per-head (β, α) from each named corner (true/false)",
    "steps": "training steps", "batch_size": "point sets per step", "lr": "peak learning rate",
    "warmup": "warm-up steps", "schedule": "cosine, linear or constant after warm-up",
    "time_power": "p ≥ 1 in the training-time law t = 1 − (1 − u)^p, u uniform (1: uniform t)",
    "time_law": "training-time law: power (t = 1 − (1 − u)^p) or logit_normal (t = sigmoid(z), z ~ N(0, 1))",
    "coupling": "noise–data pairing in training: independent, or ot (each set's noise points matched to its "
                "points by exact optimal transport; sampling unchanged)",
    "ema": "EMA decay of the weights used for sampling and probing, in [0, 1) (0: none)",
    "ckpt_every": "steps between checkpoints (0: only at the end)",
    "solver": f"sampler, one of {','.join(SOLVERS)}", "sample_steps": "sampler steps",
    "sample_sets": "generated point sets (× set_size points are judged)",
    "figure_times": "times in (0, 1] shown in samples.png, multiples of 1/sample_steps",
    "probe_sets": "training point sets the transport read-outs average over",
    "probe_sizes": "set sizes (≤ num_points) at which e^H̄ is also measured (results.json)",
    "heat_points": "training points in the heat figure's set", "out": "output folder",
    "progress": "progress bars (true/false)",
    **regularisers_config.HELP,
}

FULL = dict(steps=6000, ckpt_every=1000, sample_sets=16, num_sets=8192)   # 2.4× the steps (1,823 s before huge pages)

# Settings that shape a condition's training (its folder key) are every field except these.
NOT_TRAINING = ("operators", "orders", "seeds", "out", "progress", "ckpt_every", "heat_points")
EVALUATION = ("solver", "sample_steps", "sample_sets", "figure_times", "probe_sets", "probe_sizes")


def magnetic_summary(qks, mods) -> dict[str, float]:
  """CMAP's phase read-outs (`attngeo.magnetic.readouts`) on the first probe set, mean over layers and
  heads, as `cmap_*` keys: λ_max(H), frustration bounds, 3-cycle Wilson loop, mean |circulation|."""
  from attngeo import magnetic
  stats = []
  for (q, k), m in zip(qks, mods):
    coupling = m.coupling[...] if m.learnable_operator else m.coupling
    stats.append(magnetic.readouts(q[:1], k[:1], beta=m.coefficients()[0], coupling=coupling))
  return {f"cmap_{key}": float(np.mean([st[key] for st in stats])) for key in stats[0]}


def validate(cfg: SwissRollConfig) -> None:
  """Raise one ValueError line naming the first bad setting (before any work)."""
  def need(ok, name, expected):
    if not ok:
      raise ValueError(f"--{name.replace('_', '-')} must be {expected}; got {getattr(cfg, name)!r}")
  need(cfg.operators and all(o in OPERATORS for o in cfg.operators), "operators",
       f"a comma-separated list of {','.join(OPERATORS)}")
  need(cfg.orders and all(o in ORDERS for o in cfg.orders), "orders", f"a comma-separated list of {','.join(ORDERS)}")
  need(len(set(cfg.operators)) == len(cfg.operators), "operators", "a list without repeats")
  need(len(set(cfg.orders)) == len(cfg.orders), "orders", "a list without repeats")
  for name in ("seeds", "num_points", "num_sets", "width", "depth", "heads", "steps", "batch_size", "sample_steps",
               "sample_sets", "probe_sets", "heat_points"):
    need(getattr(cfg, name) >= 1, name, "a positive integer")
  for name in ("warmup", "ckpt_every"):
    need(getattr(cfg, name) >= 0, name, "a non-negative integer")
  need(1 <= cfg.set_size <= cfg.num_points, "set_size", f"in [1, num_points = {cfg.num_points}]")
  need(cfg.width % cfg.heads == 0, "heads", f"a divisor of width {cfg.width}")
  need(cfg.mlp_ratio > 0, "mlp_ratio", "positive")
  need(np.isfinite(cfg.lr) and cfg.lr > 0, "lr", "a positive finite number")
  need(0 <= cfg.ema < 1, "ema", "in [0, 1)")
  need(np.isfinite(cfg.time_power) and cfg.time_power >= 1, "time_power", "a finite number ≥ 1")
  need(cfg.time_law in TIME_LAWS, "time_law", f"one of {','.join(TIME_LAWS)}")
  need(cfg.coupling in COUPLINGS, "coupling", f"one of {','.join(COUPLINGS)}")
  need(cfg.schedule in ("cosine", "linear", "constant"), "schedule", "cosine, linear or constant")
  need(cfg.solver in SOLVERS, "solver", f"one of {','.join(SOLVERS)}")
  need(cfg.heat_points <= cfg.num_points, "heat_points", f"at most num_points = {cfg.num_points}")
  need(cfg.probe_sizes and all(1 <= n <= cfg.num_points for n in cfg.probe_sizes), "probe_sizes",
       f"set sizes in [1, num_points = {cfg.num_points}]")
  frames = [t * cfg.sample_steps for t in cfg.figure_times]
  need(cfg.figure_times and all(0 < t <= 1 and abs(f - round(f)) < 1e-9 for t, f in zip(cfg.figure_times, frames)),
       "figure_times", f"times in (0, 1] that are multiples of 1/sample_steps = 1/{cfg.sample_steps}")
  cfg.reg.validate()


def check_regularisers(cfg: SwissRollConfig) -> None:
  """A term the scan's models cannot give (no attention layers, too few heads): one ValueError line,
  from the models built abstractly (imports JAX, only when a term is on)."""
  if cfg.reg.active:
    from attngeo import regularisers
    for op in cfg.operators:
      for order in cfg.orders:
        regularisers.check_build(cfg.reg, lambda: build_model(cfg, op, order, cfg.seed))


# ----------------------------------------------------------------------------- keys and folders

def training_key(cfg: SwissRollConfig, op: str, order: str, seed: int) -> str:
  """Fingerprint of everything that shapes one condition's trained weights."""
  from attngeo import files
  from attngeo.data.points import PointSets
  fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_TRAINING + EVALUATION + ("seed",)}
  if cfg.reg == regularisers_config.Regularisers():
    del fields["reg"]              # added after runs were keyed: at its default (every term off) their key is kept
  return files.fingerprint(fields, dict(operator=op, order=order, data_seed=cfg.seed, train_seed=seed,
                                       point_sets=PointSets.VERSION))   # the record order shapes training


def evaluation_key(cfg: SwissRollConfig, op: str, order: str, seed: int) -> str:
  """Fingerprint of everything that shapes one condition's result row."""
  from attngeo import files
  return files.fingerprint(training_key(cfg, op, order, seed), {k: getattr(cfg, k) for k in EVALUATION},
                          RESULT_VERSION)


def condition_dir(cfg: SwissRollConfig, op: str, order: str, seed: int) -> str:
  return os.path.join(cfg.out, "conditions", f"{op}_{order}_seed{seed}-{training_key(cfg, op, order, seed)}")


def train_seeds(cfg: SwissRollConfig) -> list[int]:
  return [cfg.seed + i for i in range(cfg.seeds)]


# ----------------------------------------------------------------------------- references

@dataclasses.dataclass
class References:
  """The training set and fresh samples of its distribution (standardised like it), with roll parameters."""
  train: np.ndarray          # [n, 3] the training set
  train_t: np.ndarray        # [n]
  fresh: np.ndarray          # [4000, 3] coverage / energy reference
  heldout: np.ndarray        # [n, 3] memorisation reference (as large as the training set)
  oracle: np.ndarray         # [m, 3] an oracle generator's "samples" (m = generated count)
  oracle_t: np.ndarray       # [m]
  floor: dict                # sample_quality(oracle)


def references(cfg: SwissRollConfig, cloud: np.ndarray) -> References:
  """Fresh samples with seeds derived from `cfg.seed` (so every condition and seed is judged alike)."""
  from attngeo import data, sample_metrics
  like = (cfg.num_points, cfg.seed)
  train, train_t = data.swiss_roll(cfg.num_points, cfg.seed, return_t=True)
  if not np.array_equal(train, cloud):
    raise RuntimeError("the point-set cache does not hold this Swiss roll")
  fresh, _ = data.swiss_roll_oracle(4000, cfg.seed + 10_001, like)
  heldout, _ = data.swiss_roll_oracle(cfg.num_points, cfg.seed + 10_002, like)
  oracle, oracle_t = data.swiss_roll_oracle(cfg.sample_sets * cfg.set_size, cfg.seed + 10_003, like)
  floor = sample_metrics.sample_quality(oracle, train, fresh, heldout)
  return References(train, train_t, fresh, heldout, oracle, oracle_t, floor)


# ----------------------------------------------------------------------------- one condition

def build_model(cfg: SwissRollConfig, op: str, order: str, seed: int):
  from flax import nnx

  from attngeo import nn
  pcfg = nn.PointFlowConfig.create(width=cfg.width, depth=cfg.depth, num_heads=cfg.heads, mlp_ratio=cfg.mlp_ratio,
                                   order=order, operator=op, learnable_operator=cfg.learnable_operator)
  return nn.PointFlow(pcfg, rngs=nnx.Rngs(seed))


def train_config(cfg: SwissRollConfig, workdir: str, seed: int):
  from attngeo import train
  return train.TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup=cfg.warmup,
                           schedule=cfg.schedule, ema=cfg.ema, seed=seed, workdir=workdir,
                           ckpt_every=cfg.ckpt_every, log_every=50, progress=cfg.progress)


def training_loss(cfg: SwissRollConfig):
  """Flow-matching loss of the scan (`attngeo.flow.loss` for uniform t and independent noise).

  Training times follow `time_law` (`power`: t = 1 − (1 − u)^p; `logit_normal`: t = sigmoid(z), z ~
  N(0, 1)); with `coupling="ot"` the noise is the batch's `noise` (each set's OT-matched noise set,
  `ot_noise`) instead of a fresh draw. The target is the linear interpolant's velocity x1 − x0 either
  way, so only the training pairs change, never the sampler. With a `reg` term on, the loss is
  `regularisers.regularised` of this one (the terms logged as `reg/<term>` metrics).
  """
  from attngeo import regularisers
  return regularisers.regularised(cfg.reg, _flow_loss(cfg))


def _flow_loss(cfg: SwissRollConfig):
  import jax

  from attngeo import flow
  if cfg.time_law == "power" and cfg.time_power == 1 and cfg.coupling == "independent":
    return lambda m, batch, rng: (flow.loss(m, batch["points"], rng), {})

  def loss(m, batch, rng):
    x1 = batch["points"]
    k0, kt = jax.random.split(rng)
    x0 = batch["noise"] if cfg.coupling == "ot" else jax.random.normal(k0, x1.shape, x1.dtype)
    if cfg.time_law == "logit_normal":
      t = jax.nn.sigmoid(jax.random.normal(kt, (x1.shape[0],)))
    else:
      t = 1 - (1 - jax.random.uniform(kt, (x1.shape[0],))) ** cfg.time_power
    return flow.matching_loss(m, x0, x1, t), {}
  return loss


class Coupled:
  """A point-set source whose records also carry their OT-matched noise set: `{"points", "noise"}`."""

  def __init__(self, source, noise: np.ndarray):
    self.source, self.noise = source, noise

  def __len__(self):
    return len(self.source)

  def __getitem__(self, i):
    return {**self.source[i], "noise": self.noise[int(i)]}


def ot_noise(points: np.ndarray, seed: int, cache_dir: str | None = None) -> np.ndarray:
  """A standard-normal noise set per point set [s, k, d], its points reordered so that noise point j
  is matched to point j by exact optimal transport (squared Euclidean cost, Hungarian algorithm).

  The noise is still i.i.d. N(0, I) per set (a permutation of an i.i.d. set); only its pairing with
  the data changes (minibatch OT within a set, which straightens the interpolant's paths). Drawn
  by `default_rng(seed)`; cached in `cache_dir` under the content key of the points and the seed.
  """
  from scipy.optimize import linear_sum_assignment
  from scipy.spatial.distance import cdist

  from attngeo import files
  path = None
  if cache_dir:
    path = os.path.join(cache_dir, f"ot_noise-{files.fingerprint(points, dict(seed=seed, version=1))}.npy")
    if os.path.exists(path):
      return np.load(path)
  noise = np.random.default_rng(seed).standard_normal(points.shape).astype(np.float32)
  for i in range(len(points)):
    _, cols = linear_sum_assignment(cdist(points[i], noise[i], "sqeuclidean"))
    noise[i] = noise[i][cols]
  if path:
    files.atomic_npy(path, noise)
  return noise


_JITTED: dict = {}


def jitted(name: str):
  """Compiled model functions taking the model as an argument (`nnx.jit`), so that models of one
  structure share a compilation: `qk(model, x)` → [(q, k)] per layer at t = 1, `sample(model, x0,
  steps, solver)` → trajectory, `loss(model, x1, keys)` → mean flow-matching loss over keys."""
  if not _JITTED:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from attngeo import flow, nn
    _JITTED["qk"] = nnx.jit(lambda model, x: nn.capture_qk(model, lambda: model(x, jnp.ones((x.shape[0],))))[1])
    _JITTED["sample"] = nnx.jit(lambda model, x, steps, solver: flow.sample(model, x, steps=steps, solver=solver,
                                                                             save_every=1)[1], static_argnums=(2, 3))
    _JITTED["loss"] = nnx.jit(lambda model, x1, keys: jax.vmap(lambda k: flow.loss(model, x1, k))(keys).mean())

    def coupled(model, x1, x0, keys):           # x0 [draws, b, n, d]: given noise, uniform t
      one = lambda noise, k: flow.matching_loss(model, noise, x1, jax.random.uniform(k, (x1.shape[0],)))
      return jax.vmap(one)(x0, keys).mean()
    _JITTED["coupled_loss"] = nnx.jit(coupled)
  return _JITTED[name]


def evaluation_loss(model, source, seed: int, coupling: str = "independent", sets: int = 16, draws: int = 8) -> float:
  """Flow-matching loss (uniform t) on the first `sets` training sets, averaged over `draws` fixed draws,
  under the training coupling: fresh noise, or (`ot`) noise sets OT-matched to each set as in training."""
  import jax
  import jax.numpy as jnp
  x1 = jnp.stack([source[i]["points"] for i in range(min(sets, len(source)))])
  keys = jax.random.split(jax.random.PRNGKey(seed + 2), draws)
  if coupling == "independent":
    return float(jitted("loss")(model, x1, keys))
  pts = np.asarray(x1)
  x0 = np.stack([ot_noise(pts, seed + 2 + 1000 * (d + 1)) for d in range(draws)])
  return float(jitted("coupled_loss")(model, x1, jnp.asarray(x0), keys))


def generate(model, cfg: SwissRollConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(frames [len(figure_times), m, 3] at `figure_times`, final samples [m, 3]) from fixed noise sets."""
  import jax
  noise = jax.random.normal(jax.random.PRNGKey(seed + 7), (cfg.sample_sets, cfg.set_size, 3))
  traj = jitted("sample")(model, noise, cfg.sample_steps, cfg.solver)
  traj = np.asarray(traj).reshape(cfg.sample_steps + 1, -1, 3)
  return traj[[round(t * cfg.sample_steps) for t in cfg.figure_times]], traj[-1]


_EFF = None


def _eff(q, k, beta, alpha):
  """Mean `e^H̄` of the operators of q, k [b, n, h, d] (jitted once per shape, shared by all models)."""
  global _EFF
  if _EFF is None:
    import jax
    import jax.numpy as jnp

    from attngeo import markov, operators

    def eff(q, k, beta, alpha):
      p = operators.markov_matrix(q.astype(jnp.float32), k.astype(jnp.float32), beta=beta, alpha=alpha)
      return markov.effective_neighbours(p).mean()
    _EFF = jax.jit(eff)
  return float(_EFF(q, k, beta, alpha))


def eff_neighbours_by_size(model, cloud: np.ndarray, sizes, seed: int) -> dict[str, list[float]]:
  """Per-layer head-mean `e^H̄` on sets of each size drawn from `cloud` (t = 1; ≤ 4 sets per size)."""
  import jax.numpy as jnp

  from attngeo import nn
  rng, out = np.random.default_rng(seed), {}
  for n in sizes:
    sets = max(1, min(4, len(cloud) // n))
    x = jnp.asarray(np.stack([cloud[rng.choice(len(cloud), n, replace=False)] for _ in range(sets)]))
    qks = jitted("qk")(model, x)
    h = qks[0][0].shape[2]
    out[str(n)] = [_eff(q, k, *(jnp.broadcast_to(jnp.asarray(c, jnp.float32), (h,)) for c in m.coefficients()))
                   for (q, k), m in zip(qks, nn.attention_modules(model))]
  return out


def run_condition(cfg: SwissRollConfig, op: str, order: str, seed: int, source, refs: References) -> dict:
  """Train (or resume), sample, judge and probe one (operator, order, seed); returns its result row.

  The row is cached in the condition folder's result.json under its evaluation key; a row made
  with other settings is recomputed (training resumes from the final checkpoint, so only the
  evaluation runs again).
  """
  workdir, key = condition_dir(cfg, op, order, seed), evaluation_key(cfg, op, order, seed)
  result_path = os.path.join(workdir, "result.json")
  from attngeo import files
  cached = files.cached_result(result_path, key, field="evaluation_key")
  if cached is not None:
    return cached
  import jax.numpy as jnp
  from flax import nnx

  from attngeo import data, nn, probe, sample_metrics, train
  t0 = time.perf_counter()
  model = build_model(cfg, op, order, seed)
  if cfg.coupling == "ot":
    source = Coupled(source, ot_noise(source.points, seed + 3, os.path.join(cfg.out, "data")))
  result = train.train(model, training_loss(cfg), data.loader(source, cfg.batch_size, seed),
                       train_config(cfg, workdir, seed), desc=f"{op} {order} seed {seed}")
  model = result.model
  if cfg.ema:
    nnx.update(model, result.ema)          # judge and probe the EMA weights
  t_train = time.perf_counter() - t0
  frames, final = generate(model, cfg, seed)
  quality = sample_metrics.sample_quality(final, refs.train, refs.fresh, refs.heldout)
  floor = refs.floor
  ratios = dict(d_nn_ratio=quality["d_nn_mean"] / floor["d_nn_mean"],
                coverage_ratio=quality["coverage_mean"] / floor["coverage_mean"],
                energy_ratio=quality["energy"] / floor["energy"])
  probe_x = jnp.stack([source[i]["points"] for i in range(min(cfg.probe_sets, len(source)))])
  qks, mods = jitted("qk")(model, probe_x), nn.attention_modules(model)
  per_layer = [probe.layer_stats(q, k, *m.coefficients(), causal=m.causal)     # = probe.model_stats, compiled
               for (q, k), m in zip(qks, mods)]
  summary = probe.summarise(per_layer)
  if op == "CMAP":                      # the transport columns above read its magnitude (a DMAP walk)
    summary.update(magnetic_summary(qks, mods))
  row = dict(operator=op, order=order, seed=seed, **quality, **ratios, **summary,
             eff_neighbours_norm=summary["eff_neighbours"] / cfg.set_size,
             eff_neighbours_by_size=eff_neighbours_by_size(model, refs.train, cfg.probe_sizes, seed),
             eval_loss=evaluation_loss(model, source, seed, cfg.coupling), train_seconds=t_train,
             seconds=time.perf_counter() - t0, evaluation_key=key, training_key=training_key(cfg, op, order, seed),
             per_layer=[{k: np.asarray(v).tolist() for k, v in layer.items()} for layer in per_layer])
  np.save(os.path.join(workdir, "samples.npy"), frames)
  files.atomic_write(result_path, json.dumps(row, indent=1))
  return row


# ----------------------------------------------------------------------------- figures

def samples_figure(cfg: SwissRollConfig, rows: list[dict], refs: References, path: str) -> None:
  """Figure 2: a row per condition (first seed), a panel per time; colour = position t along the roll.

  Generated points are coloured by the roll parameter of the nearest training point to the
  trajectory's final sample (so a colour follows a particle through time).
  """
  import jax

  from attngeo import plotting, sample_metrics
  from scipy.spatial import cKDTree
  first = [r for r in rows if r["seed"] == cfg.seed]
  grid = []
  for r in first:
    frames = np.load(os.path.join(condition_dir(cfg, r["operator"], r["order"], r["seed"]), "samples.npy"))
    colour = refs.train_t[cKDTree(refs.train).query(frames[-1])[1]]
    grid.append((f"{r['operator']}\n{ORDER_NAMES[r['order']]}", [(f, colour) for f in frames]))
  noise = np.asarray(jax.random.normal(jax.random.PRNGKey(cfg.seed + 7), (cfg.sample_sets, cfg.set_size, 3)))
  m = len(refs.oracle)
  top = [(f"training set\n({len(refs.train)} points)", refs.train, refs.train_t),
         (f"oracle: {m} fresh\npoints of the roll", refs.oracle, refs.oracle_t)]
  dists = {"oracle": sample_metrics.nn_distance(refs.oracle, refs.train)}
  for r in first:
    frames = np.load(os.path.join(condition_dir(cfg, r["operator"], r["order"], r["seed"]), "samples.npy"))
    dists[f"{r['operator']} {ORDER_NAMES[r['order']]}"] = sample_metrics.nn_distance(frames[-1], refs.train)
  plotting.sample_grid(
      path, grid, [f"t = {t:g}" for t in cfg.figure_times], top=top, noise=noise.reshape(-1, 3)[:m], nn_cdfs=dists,
      colour_label="roll parameter t (generated: t of the final sample's nearest training point)",
      title=f"Swiss-roll flow matching: {m} samples per condition at generative time t\n(x–z plane, looking down the "
            f"roll's axis; {cfg.steps} training steps, seed {cfg.seed})")


def heat_figure(cfg: SwissRollConfig, refs: References, path: str) -> dict:
  """Figure 1: heat from one point under the learned DMAP and ATTN walks, and their equilibria.

  The walk is the last layer's head-averaged operator `W = (1/H) Σ_h P^h` of the trained
  FFN → MHSA model (first seed, EMA weights if any), evaluated on `heat_points` training points
  as one set at t = 1; heat after s steps is `δ_source W^s`.
  """
  import jax.numpy as jnp

  from attngeo import markov, nn, operators, plotting, runs
  order = "ffn_first" if "ffn_first" in cfg.orders else cfg.orders[0]
  ops = [op for op in ("DMAP", "ATTN") if op in cfg.operators] or list(cfg.operators[:2])
  rng = np.random.default_rng(cfg.seed)
  pts = refs.train[rng.choice(len(refs.train), cfg.heat_points, replace=False)]
  source = int(np.argmin(pts[:, 0] ** 2 + (pts[:, 2] - pts[:, 2].max()) ** 2))  # a point on the outer turn
  rows, out = [], {}
  steps = (1, 4, 16)
  for op in ops:
    workdir = condition_dir(cfg, op, order, cfg.seed)
    model = runs.load_model(build_model(cfg, op, order, cfg.seed), workdir, use_ema=cfg.ema > 0)
    x = jnp.asarray(pts)[None]
    _, qks = nn.capture_qk(model, lambda: model(x, jnp.ones((1,))))
    q, k = qks[-1]
    beta, alpha = nn.attention_modules(model)[-1].coefficients()
    w = operators.markov_matrix(q, k, beta=beta, alpha=alpha)[0].mean(0)      # head-averaged walk [n, n]
    pi = np.asarray(markov.stationary(w).pi)
    delta = jnp.zeros(len(pts)).at[source].set(1.0)
    panels = [(f"after {s} step{'s' if s > 1 else ''}", np.asarray(markov.propagate(w, delta, s))) for s in steps]
    panels.append(("equilibrium π", pi))
    rows.append((f"{op}, {ORDER_NAMES[order]}", panels))
    out[op] = {"pi_max_over_min": float(pi.max() / max(pi.min(), 1e-30))}
  plotting.heat_panels(
      pts, rows, path, source=source,
      title=(f"Heat from one point (★) under the learned walk W = mean over heads of P, last layer ({cfg.depth} of "
             f"{cfg.depth}) of the trained PointFlow, on {cfg.heat_points} training points as one set at t = 1; "
             "a step is one application of W"))
  return out


# ----------------------------------------------------------------------------- tables

ORDER_NAMES = {"ffn_first": "FFN → MHSA", "attn_first": "MHSA → FFN"}
NUMBERS = [Col("d_nn_mean", "d_NN", ".4f"), Col("d_nn_median", "d_NN med.", ".4f"),
           Col("d_nn_ratio", "÷ floor", ".3f"),
           Col("coverage_mean", "coverage", ".4f"), Col("coverage_ratio", "÷ floor", ".3f"),
           Col("energy_ratio", "energy ÷ floor", ".2f"), Col("memorisation", "memo.", ".3f"),
           Col("eff_neighbours", "e^H̄", ".2f"), Col("eff_neighbours_norm", "e^H̄/n", ".4f"),
           Col("eps_rev", "ε_rev", ".3g"), Col("rho_skew", "ρ_skew", ".3g"), Col("curvature", "curvature", ".3g"),
           Col("eval_loss", "loss", ".4f")]
COLUMNS = [Col("operator", "Operator"), Col("order", "Order", lambda o: ORDER_NAMES.get(o, o))] + NUMBERS


def oracle_row(refs: References) -> dict:
  f = refs.floor
  return dict(operator="oracle (floor)", order="—", **f, d_nn_ratio=1.0, coverage_ratio=1.0, energy_ratio=1.0)


def aggregate(rows: list[dict]) -> list[dict]:
  """Per (operator, order): mean, sd (ddof 1) and the per-seed values of every numeric column."""
  out = []
  for op, order in dict.fromkeys((r["operator"], r["order"]) for r in rows):
    group = [r for r in rows if r["operator"] == op and r["order"] == order]
    agg = dict(operator=op, order=order, seeds=[r["seed"] for r in group])
    for c in NUMBERS:
      vals = np.array([r[c.key] for r in group], float)
      agg[c.key], agg[c.key + "_sd"] = float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0
      agg[c.key + "_values"] = vals.tolist()
    out.append(agg)
  return out


def differences(agg: list[dict], keys, level: float = 0.05) -> dict[str, list[dict]]:
  """Per column, the pairs of conditions whose means differ beyond the seed-to-seed spread.

  Welch's t-test (`attngeo.stats.welch`) on the per-seed values of each pair, Holm-corrected over
  the pairs of a column (family-wise level `level`).
  """
  from attngeo import stats
  found = {}
  for key in keys:
    tests = []
    for i in range(len(agg)):
      for j in range(i + 1, len(agg)):
        test = stats.welch_if_testable(agg[i][key + "_values"], agg[j][key + "_values"])
        if test is not None:                          # a pair with a diverged seed is not tested
          tests.append((test.p, i, j))
    tests.sort()
    rows, m = [], len(tests)
    for rank, (p, i, j) in enumerate(tests):          # Holm: stop at the first non-rejection
      if p > level / (m - rank):
        break
      hi, lo = (i, j) if agg[i][key] > agg[j][key] else (j, i)
      rows.append(dict(higher=label(agg[hi]), lower=label(agg[lo]), p=p, ratio=agg[hi][key] / agg[lo][key]
                       if agg[lo][key] else float("inf")))
    found[key] = rows
  return found


def label(row: dict) -> str:
  return f"{row['operator']} {ORDER_NAMES.get(row['order'], row['order'])}"


def write_tables(cfg: SwissRollConfig, rows: list[dict], refs: References) -> tuple[str, dict]:
  """table1.{md,csv,json}: one row per condition (mean ± sd over seeds when seeds > 1), oracle first."""
  from scipy.spatial import cKDTree
  spacing = float(np.median(cKDTree(refs.train).query(refs.train, k=2)[0][:, 1]))
  m = len(refs.oracle)
  note = (f"Sample quality of {m} generated points per condition in standardised coordinates; the oracle row is "
          f"{m} fresh points of the generating distribution (the floor every ratio divides by); coverage and energy "
          f"against 4000 further fresh points, memo. = mean d_NN to the training set ÷ to {cfg.num_points} held-out "
          f"fresh points. e^H̄/n: ÷ the set size n = {cfg.set_size}. Training-set median nearest-neighbour spacing: "
          f"{spacing:.4f}.")
  extra = {}
  if cfg.seeds == 1:
    table = [oracle_row(refs)] + rows
    payload = dict(oracle=refs.floor, conditions=rows)
  else:
    agg = aggregate(rows)
    fmt = {c.key: c.fmt for c in NUMBERS}
    table = [{**{k: format(v, fmt[k]) for k, v in oracle_row(refs).items() if k in fmt},
              "operator": "oracle (floor)", "order": "—"}]
    for a in agg:
      table.append(dict(operator=a["operator"], order=a["order"],
                        **{c.key: f"{a[c.key]:{c.fmt}} ± {a[c.key + '_sd']:{c.fmt}}" for c in NUMBERS}))
    extra["differences"] = differences(agg, [c.key for c in NUMBERS])
    extra["aggregated"] = agg
    payload = dict(oracle=refs.floor, conditions=agg, per_seed=rows, differences=extra["differences"])
    note += f" Mean ± sd over {cfg.seeds} training seeds {train_seeds(cfg)}."
  cols = COLUMNS if cfg.seeds == 1 else COLUMNS[:2] + [Col(c.key, c.label, align="right") for c in NUMBERS]
  md = report.write(cfg.out, "table1", table, cols, payload=payload, note=note, quiet=True)
  if "differences" in extra:
    lines = [f"Differences beyond the seed-to-seed spread ({cfg.seeds} seeds; Welch t-test, Holm over the "
             f"{len(agg) * (len(agg) - 1) // 2} pairs of each column, level 0.05):", ""]
    for c in NUMBERS:
      pairs = extra["differences"][c.key]
      lines.append(f"* {c.key}: " + (
          "; ".join(f"{d['higher']} > {d['lower']} (×{d['ratio']:.3g}, p={d['p']:.2g})" for d in pairs) or "none"))
    with open(os.path.join(cfg.out, "differences.md"), "w") as f:
      f.write("\n".join(lines) + "\n")
    md += "\n\n" + "\n".join(lines)
  extra["median_spacing"] = spacing
  return md, extra


def verdict(rows: list[dict], refs: References, tolerance: float = 0.05) -> dict:
  """Whether every condition is within `tolerance` of the oracle floor on both directions, unmemorised."""
  worst_dnn = max(r["d_nn_ratio"] for r in rows)
  worst_cov = max(r["coverage_ratio"] for r in rows)
  lowest_memo = min(r["memorisation"] for r in rows)
  ok = (worst_dnn <= 1 + tolerance and worst_cov <= 1 + tolerance
        and lowest_memo >= refs.floor["memorisation"] - tolerance)
  return dict(within_floor=bool(ok), worst_d_nn_ratio=worst_dnn, worst_coverage_ratio=worst_cov,
              lowest_memorisation=lowest_memo, oracle_memorisation=refs.floor["memorisation"], tolerance=tolerance)


# ----------------------------------------------------------------------------- the scan

def run(cfg: SwissRollConfig) -> dict:
  """The scan in `cfg.out`, held by this process for the whole run (`attngeo.runlock`)."""
  validate(cfg)
  check_regularisers(cfg)
  from attngeo import runlock
  with runlock.hold(cfg.out):
    return _run(cfg)


def _run(cfg: SwissRollConfig) -> dict:
  from attngeo import data, files
  t0 = time.perf_counter()
  os.makedirs(cfg.out, exist_ok=True)
  files.write_config(cfg.out, swissroll=cfg)
  source, cloud = data.point_sets(cloud="swiss_roll", num_points=cfg.num_points, seed=cfg.seed,
                                  set_size=cfg.set_size, num_sets=cfg.num_sets)
  refs = references(cfg, cloud)
  conditions = [(op, order, s) for s in train_seeds(cfg) for order in cfg.orders for op in cfg.operators]
  rows = []
  for i, (op, order, s) in enumerate(conditions):
    print(f"[{i + 1}/{len(conditions)}] {op} {order} seed {s}", flush=True)
    rows.append(run_condition(cfg, op, order, s, source, refs))
  md, extra = write_tables(cfg, rows, refs)
  samples_figure(cfg, rows, refs, os.path.join(cfg.out, "samples.png"))
  heat = heat_figure(cfg, refs, os.path.join(cfg.out, "heat.png"))
  check = verdict(rows, refs)
  wall = time.perf_counter() - t0
  agg = extra.pop("aggregated", None)
  results = dict(config=dataclasses.asdict(cfg), oracle=refs.floor, conditions=agg or rows, verdict=check, heat=heat,
                 wall_seconds=wall, **extra)
  if agg:
    results["per_seed"] = rows
  with open(os.path.join(cfg.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  print(md)
  print(f"\nevery condition within {check['tolerance']:.0%} of the oracle floor on d_NN and coverage, memorisation "
        f"ratio ≥ oracle's − {check['tolerance']}: {'yes' if check['within_floor'] else 'NO'} (worst d_NN ÷ floor "
        f"{check['worst_d_nn_ratio']:.3f}, worst coverage ÷ floor {check['worst_coverage_ratio']:.3f}, lowest "
        f"memo. {check['lowest_memorisation']:.3f} vs oracle {check['oracle_memorisation']:.3f})")
  report.wrote(cfg.out, "table1.md", "table1.csv", "table1.json", "results.json", "samples.png", "heat.png",
               *(["differences.md"] if cfg.seeds > 1 else []), "config.json", "conditions/",
               *(["data/"] if cfg.coupling == "ot" else []),                  # the OT-noise cache
               suffix=f"; wall time {wall:.0f} s")
  return results


def parser() -> argparse.ArgumentParser:
  ap = config_lib.parser("attngeo swissroll", __doc__)
  ap.add_argument("--full", action="store_true",
                  help=f"the longer budget, {FULL}, into runs/swissroll_full unless --out is given (default: off)")
  config_lib.add_arguments(ap, SwissRollConfig, help=HELP)
  return ap


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


def config_from_argv(argv=None, ap: argparse.ArgumentParser | None = None) -> SwissRollConfig:
  """Parse and validate; a bad setting exits with one line (code 2) before any work."""
  ap = ap or parser()
  args = ap.parse_args(argv)
  base = dataclasses.replace(SwissRollConfig(), **FULL) if args.full else SwissRollConfig()
  if args.full and args.out is None:
    base = dataclasses.replace(base, out="runs/swissroll_full")
  try:
    cfg = fit_to_cloud(config_lib.from_arguments(args, SwissRollConfig, base),
                       given={k for k in ("heat_points", "probe_sizes") if getattr(args, k, None) is not None})
    validate(cfg)
    check_regularisers(cfg)
  except ValueError as e:
    ap.error(str(e))
  return cfg


def main(argv=None):
  return run(config_from_argv(argv))


if __name__ == "__main__":
  main()
