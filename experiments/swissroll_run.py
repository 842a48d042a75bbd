"""The Swiss-roll scan's work (`attngeo swissroll`; its settings and keys: `swissroll_config`; its command
line: `swissroll`).

`scan(cfg)` trains, samples, judges and probes every (operator, order, seed) of a
`swissroll_config.SwissRollConfig` and writes Table 1 and Figures 1–2 (`swissroll`'s docstring says what each
column means). `swissroll.run` is the entry point: it validates, holds the folder and calls `scan`;
this module imports JAX, the command module does not (so `--help` and argument errors answer at once).
The compiled model functions (`capture_qk`, `sample`, `mean_loss`, `mean_coupled_loss`) take the model
as an argument (`nnx.jit`), so models of one structure share a compilation.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy.optimize import linear_sum_assignment
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from attngeo import (checkpoint, data, files, flow, magnetic, markov, nn, operators, plotting, probe, regularisers, runs,
                     sample_metrics, stats, train)
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.experiments.swissroll_config import (ORDER_NAMES, SwissRollConfig, condition_dir, evaluation_key,
                                                  train_seeds, training_key)


def magnetic_summary(qks, mods) -> dict[str, float]:
  """CMAP's phase read-outs (`attngeo.magnetic.readouts`) on the first probe set, mean over layers and
  heads, as `cmap_*` keys: λ_max(H), frustration bounds, 3-cycle Wilson loop, mean |circulation|."""
  layers = []
  for (q, k), m in zip(qks, mods):
    coupling = m.coupling[...] if m.learnable_operator else m.coupling
    layers.append(magnetic.readouts(q[:1], k[:1], beta=m.coefficients()[0], coupling=coupling))
  return {f"cmap_{key}": float(np.mean([layer[key] for layer in layers])) for key in layers[0]}


def check_regularisers(cfg: SwissRollConfig) -> None:
  """A term the scan's models cannot give (no attention layers, too few heads): one ValueError line,
  from the models built abstractly."""
  for op in cfg.operators:
    for order in cfg.orders:
      regularisers.check_build(cfg.reg, lambda: build_model(cfg, op, order, cfg.seed))


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
  like = (cfg.num_points, cfg.seed)
  points, points_t = data.swiss_roll(cfg.num_points, cfg.seed, return_t=True)
  if not np.array_equal(points, cloud):
    raise RuntimeError("the point-set cache does not hold this Swiss roll")
  fresh, _ = data.swiss_roll_oracle(4000, cfg.seed + 10_001, like)
  heldout, _ = data.swiss_roll_oracle(cfg.num_points, cfg.seed + 10_002, like)
  oracle, oracle_t = data.swiss_roll_oracle(cfg.sample_sets * cfg.set_size, cfg.seed + 10_003, like)
  floor = sample_metrics.sample_quality(oracle, points, fresh, heldout)
  return References(points, points_t, fresh, heldout, oracle, oracle_t, floor)


def build_model(cfg: SwissRollConfig, op: str, order: str, seed: int):
  """`cfg.model` under operator `op` and sub-layer order `order`, initialised from `seed`."""
  m = cfg.model
  pcfg = nn.PointFlowConfig.create(width=m.width, depth=m.depth, num_heads=m.heads, mlp_ratio=m.mlp_ratio,
                                   order=order, operator=op, learnable_operator=m.learnable_operator)
  return nn.PointFlow(pcfg, rngs=nnx.Rngs(seed))


def train_config(cfg: SwissRollConfig, workdir: str, seed: int):
  """`cfg.train` as the trainer's config of one condition (its seed and folder)."""
  return train.TrainConfig(**dataclasses.asdict(cfg.train), seed=seed, workdir=workdir, log_every=50,
                           progress=cfg.progress)


def training_loss(cfg: SwissRollConfig):
  """Flow-matching loss of the scan (`attngeo.flow.loss` for uniform t and independent noise).

  Training times follow `time_law` (`power`: t = 1 − (1 − u)^p; `logit_normal`: t = sigmoid(z), z ~
  N(0, 1)); with `coupling="ot"` the noise is the batch's `noise` (each set's OT-matched noise set,
  `ot_noise`) instead of a fresh draw. The target is the linear interpolant's velocity x1 − x0 either
  way, so only the training pairs change, never the sampler. With a `reg` term on, the loss is
  `regularisers.regularised` of this one (the terms logged as `reg/<term>` metrics).
  """
  return regularisers.regularised(cfg.reg, _flow_loss(cfg))


def _flow_loss(cfg: SwissRollConfig):
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


@nnx.jit
def capture_qk(model, x):
  """[(q, k)] per attention layer of `model` on point sets x [b, n, 3] at t = 1."""
  return nn.capture_qk(model, lambda: model(x, jnp.ones((x.shape[0],))))[1]


@functools.partial(nnx.jit, static_argnums=(2, 3))
def sample(model, x0, steps: int, solver: str):
  """The trajectory [steps + 1, b, n, 3] from noise sets x0 (`flow.sample`, every step saved)."""
  return flow.sample(model, x0, steps=steps, solver=solver, save_every=1)[1]


@nnx.jit
def mean_loss(model, x1, keys):
  """Mean flow-matching loss (uniform t, fresh noise) over one draw per key."""
  return jax.vmap(lambda k: flow.loss(model, x1, k))(keys).mean()


@nnx.jit
def mean_coupled_loss(model, x1, x0, keys):
  """Mean flow-matching loss (uniform t) with the given noise x0 [draws, b, n, d], one draw per key."""
  one = lambda noise, k: flow.matching_loss(model, noise, x1, jax.random.uniform(k, (x1.shape[0],)))
  return jax.vmap(one)(x0, keys).mean()


def evaluation_loss(model, source, seed: int, coupling: str = "independent", sets: int = 16, draws: int = 8) -> float:
  """Flow-matching loss (uniform t) on the first `sets` training sets, averaged over `draws` fixed draws,
  under the training coupling: fresh noise, or (`ot`) noise sets OT-matched to each set as in training."""
  x1 = jnp.stack([source[i]["points"] for i in range(min(sets, len(source)))])
  keys = jax.random.split(jax.random.PRNGKey(seed + 2), draws)
  if coupling == "independent":
    return float(mean_loss(model, x1, keys))
  pts = np.asarray(x1)
  x0 = np.stack([ot_noise(pts, seed + 2 + 1000 * (d + 1)) for d in range(draws)])
  return float(mean_coupled_loss(model, x1, jnp.asarray(x0), keys))


def generate(model, cfg: SwissRollConfig, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(frames [len(figure_times), m, 3] at `figure_times`, final samples [m, 3]) from fixed noise sets."""
  noise = jax.random.normal(jax.random.PRNGKey(seed + 7), (cfg.sample_sets, cfg.set_size, 3))
  traj = sample(model, noise, cfg.sample_steps, cfg.solver)
  traj = np.asarray(traj).reshape(cfg.sample_steps + 1, -1, 3)
  return traj[[round(t * cfg.sample_steps) for t in cfg.figure_times]], traj[-1]


@jax.jit
def _eff(q, k, beta, alpha):
  """Mean `e^H̄` of the operators of q, k [b, n, h, d] (compiled once per shape, shared by all models)."""
  p = operators.markov_matrix(q.astype(jnp.float32), k.astype(jnp.float32), beta=beta, alpha=alpha)
  return markov.effective_neighbours(p).mean()


def eff_neighbours_by_size(model, cloud: np.ndarray, sizes, seed: int) -> dict[str, list[float]]:
  """Per-layer head-mean `e^H̄` on sets of each size drawn from `cloud` (t = 1; ≤ 4 sets per size)."""
  rng, out = np.random.default_rng(seed), {}
  for n in sizes:
    sets = max(1, min(4, len(cloud) // n))
    x = jnp.asarray(np.stack([cloud[rng.choice(len(cloud), n, replace=False)] for _ in range(sets)]))
    qks = capture_qk(model, x)
    h = qks[0][0].shape[2]
    out[str(n)] = [float(_eff(q, k, *(jnp.broadcast_to(jnp.asarray(c, jnp.float32), (h,)) for c in m.coefficients())))
                   for (q, k), m in zip(qks, nn.attention_modules(model))]
  return out


def run_condition(cfg: SwissRollConfig, op: str, order: str, seed: int, source, refs: References) -> dict:
  """Train (or resume), sample, judge and probe one (operator, order, seed); returns its result row.

  The row is cached in the condition folder's result.json under its evaluation key and the content key of the
  weights it judged (`checkpoint.newest_step_key`); a row made with other settings, or beside other weights (a
  checkpoint copied in), is recomputed (training resumes from the final checkpoint, so only the evaluation runs
  again).
  """
  workdir, key = condition_dir(cfg, op, order, seed), evaluation_key(cfg, op, order, seed)
  result_path = os.path.join(workdir, "result.json")
  cached, weights = files.cached_result(result_path, key, field="evaluation_key"), checkpoint.newest_step_key(workdir)
  if cached is not None and weights is not None and cached.get("checkpoint_key") == weights:   # the same weights
    return cached

  t0 = time.perf_counter()
  model = build_model(cfg, op, order, seed)
  if cfg.coupling == "ot":
    source = Coupled(source, ot_noise(source.points, seed + 3, os.path.join(cfg.out, "data")))
  result = train.train(model, training_loss(cfg), data.loader(source, cfg.train.batch_size, seed),
                       train_config(cfg, workdir, seed), desc=f"{op} {order} seed {seed}")
  model = result.model
  if cfg.train.ema:
    nnx.update(model, result.ema)          # judge and probe the EMA weights
  t_train = time.perf_counter() - t0
  frames, final = generate(model, cfg, seed)
  quality = sample_metrics.sample_quality(final, refs.train, refs.fresh, refs.heldout)
  floor = refs.floor
  ratios = dict(d_nn_ratio=quality["d_nn_mean"] / floor["d_nn_mean"],
                coverage_ratio=quality["coverage_mean"] / floor["coverage_mean"],
                energy_ratio=quality["energy"] / floor["energy"])
  probe_x = jnp.stack([source[i]["points"] for i in range(min(cfg.probe_sets, len(source)))])
  qks, mods = capture_qk(model, probe_x), nn.attention_modules(model)
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
             checkpoint_key=checkpoint.newest_step_key(workdir),
             per_layer=[{k: np.asarray(v).tolist() for k, v in layer.items()} for layer in per_layer])
  np.save(os.path.join(workdir, "samples.npy"), frames)
  files.atomic_write(result_path, json.dumps(row, indent=1))
  return row


def samples_figure(cfg: SwissRollConfig, rows: list[dict], refs: References, path: str) -> None:
  """Figure 2: a row per condition (first seed), a panel per time; colour = position t along the roll.

  Generated points are coloured by the roll parameter of the nearest training point to the
  trajectory's final sample (so a colour follows a particle through time).
  """
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
            f"roll's axis; {cfg.train.steps} training steps, seed {cfg.seed})")


def heat_figure(cfg: SwissRollConfig, refs: References, path: str) -> dict:
  """Figure 1: heat from one point under the learned DMAP and ATTN walks, and their equilibria.

  The walk is the last layer's head-averaged operator `W = (1/H) Σ_h P^h` of the trained
  FFN → MHSA model (first seed, EMA weights if any), evaluated on `heat_points` training points
  as one set at t = 1; heat after s steps is `δ_source W^s`.
  """
  order = "ffn_first" if "ffn_first" in cfg.orders else cfg.orders[0]
  ops = [op for op in ("DMAP", "ATTN") if op in cfg.operators] or list(cfg.operators[:2])
  rng = np.random.default_rng(cfg.seed)
  pts = refs.train[rng.choice(len(refs.train), cfg.heat_points, replace=False)]
  source = int(np.argmin(pts[:, 0] ** 2 + (pts[:, 2] - pts[:, 2].max()) ** 2))  # a point on the outer turn
  rows, out = [], {}
  steps = (1, 4, 16)
  for op in ops:
    workdir = condition_dir(cfg, op, order, cfg.seed)
    model = runs.load_model(build_model(cfg, op, order, cfg.seed), workdir, use_ema=cfg.train.ema > 0)
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
      title=(f"Heat from one point (★) under the learned walk W = mean over heads of P, last layer ({cfg.model.depth} of "
             f"{cfg.model.depth}) of the trained PointFlow, on {cfg.heat_points} training points as one set at t = 1; "
             "a step is one application of W"))
  return out


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


def scan(cfg: SwissRollConfig) -> dict:
  """Every condition of `cfg`, then the tables and figures in `cfg.out` (the caller holds the folder)."""
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
