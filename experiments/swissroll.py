"""The Swiss-roll scan (seed "Attention Geometry", Table 1 and Figures 1–2).

    attngeo swissroll [--full] [--operators DMAP,ATTN] [--orders ffn_first] [--seed 123] [--steps N] ...

A `PointFlow` set transformer (each point a token, bidirectional attention) learns the velocity
of the linear interpolant from Gaussian noise sets to point sets of the 4000-point Swiss roll
(flow matching, `attngeo.flow`), once per operator × sub-layer order, same budget each. Per
condition it reports

* `d_NN` — mean Euclidean distance from each generated point to its nearest training point
  (standardised coordinates), samples drawn with Heun's method from noise sets;
* `e^{H̄}`, `ε_rev`, `ρ_skew` — of the trained model's attention operators evaluated on data point
  sets at t = 1, averaged over layers, heads and sets (per layer in results.json);
* `curvature` — the Bakry–Émery bound of each layer's head-averaged walk over the top-3 principal
  coordinates of m = (q + k)/√2 (median over points; `attngeo.probe`), averaged over layers;

and writes table1.{md,csv}, results.json, samples.png (Figure 2), heat.png (Figure 1, heat flow
under the learned DMAP walk vs ATTN's and the equilibrium π) and config.json to `--out`.
Finished conditions are kept in `out/conditions/*/result.json` and skipped on a rerun; an
interrupted condition resumes from its last orbax checkpoint.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy.spatial import cKDTree

from attngeo import config as config_lib, data, flow, markov, nn, operators, plotting, probe, runs, train
from attngeo.experiments import report
from attngeo.experiments.report import Col


@dataclasses.dataclass
class SwissRollConfig:
  operators: tuple[str, ...] = ("DMAP", "DMTN", "ATAP", "ATTN")
  orders: tuple[str, ...] = ("ffn_first", "attn_first")
  seed: int = 123
  num_points: int = 4000
  set_size: int = 256
  num_sets: int = 2048
  width: int = 64
  depth: int = 2
  heads: int = 2
  mlp_ratio: float = 2.0
  learnable_operator: bool = False     # train per-head (β, α), starting from each named corner
  steps: int = 1500
  batch_size: int = 8
  lr: float = 3e-3
  warmup: int = 50
  ckpt_every: int = 250
  solver: str = "heun"
  sample_steps: int = 40
  sample_sets: int = 8
  probe_sets: int = 4
  heat_points: int = 1000
  out: str = "runs/swissroll"
  progress: bool = True


FULL = dict(steps=20_000, width=128, depth=4, heads=4, batch_size=16, lr=1e-3, warmup=500, ckpt_every=2000,
            sample_steps=100, sample_sets=16, num_sets=8192)


def condition_name(op: str, order: str) -> str:
  return f"{op}_{order}"


def nn_distance(points: np.ndarray, reference: np.ndarray) -> np.ndarray:
  """Distance from each of `points` [m, 3] to its nearest neighbour in `reference` [n, 3]."""
  return cKDTree(reference).query(points, k=1)[0]


def median_spacing(reference: np.ndarray) -> float:
  """Median distance from each reference point to its nearest other reference point."""
  return float(np.median(cKDTree(reference).query(reference, k=2)[0][:, 1]))


def build_model(cfg: SwissRollConfig, op: str, order: str, seed: int) -> nn.PointFlow:
  pcfg = nn.PointFlowConfig.create(width=cfg.width, depth=cfg.depth, num_heads=cfg.heads, mlp_ratio=cfg.mlp_ratio,
                                   order=order, operator=op, learnable_operator=cfg.learnable_operator)
  return nn.PointFlow(pcfg, rngs=nnx.Rngs(seed))


def train_config(cfg: SwissRollConfig, workdir: str) -> train.TrainConfig:
  return train.TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, warmup=cfg.warmup, seed=cfg.seed,
                           workdir=workdir, ckpt_every=cfg.ckpt_every, log_every=50, progress=cfg.progress)


def run_condition(cfg: SwissRollConfig, op: str, order: str, source, cloud: np.ndarray) -> dict:
  """Train, sample and probe one (operator, order); returns its result row (cached on disk)."""
  workdir = os.path.join(cfg.out, "conditions", condition_name(op, order))
  result_path = os.path.join(workdir, "result.json")
  if os.path.exists(result_path):
    with open(result_path) as f:
      return json.load(f)
  t0 = time.perf_counter()
  model = build_model(cfg, op, order, cfg.seed)
  tcfg = train_config(cfg, workdir)
  loss_fn = lambda m, batch, rng: (flow.loss(m, batch["points"], rng), {})
  result = train.train(model, loss_fn, data.loader(source, cfg.batch_size, cfg.seed), tcfg,
                       desc=condition_name(op, order))
  model = result.model

  noise = jax.random.normal(jax.random.PRNGKey(cfg.seed + 7), (cfg.sample_sets, cfg.set_size, 3))
  _, traj = jax.jit(lambda x: flow.sample(model, x, steps=cfg.sample_steps, solver=cfg.solver,
                                          save_every=cfg.sample_steps // 4))(noise)
  traj = np.asarray(traj).reshape(traj.shape[0], -1, 3)
  d_nn = nn_distance(traj[-1], cloud)

  probe_x = jnp.stack([source[i]["points"] for i in range(cfg.probe_sets)])
  per_layer = probe.model_stats(model, lambda: model(probe_x, jnp.ones((cfg.probe_sets,))))
  row = dict(operator=op, order=order, d_nn=float(d_nn.mean()), **probe.summarise(per_layer),
             final_loss=result.history[-1]["loss"], seconds=time.perf_counter() - t0,
             per_layer=[{k: v.tolist() for k, v in layer.items()} for layer in per_layer])
  np.save(os.path.join(workdir, "samples.npy"), traj)
  with open(result_path, "w") as f:
    json.dump(row, f, indent=1)
  return row


def heat_figure(cfg: SwissRollConfig, cloud: np.ndarray, path: str) -> dict:
  """Figure 1: heat from one point under the learned DMAP and ATTN walks, and their equilibria.

  The walk is the last layer's head-averaged operator `W = (1/H) Σ_h P^h` of the trained
  `ffn_first` model, evaluated on `heat_points` training points as one set at t = 1.
  """
  rng = np.random.default_rng(cfg.seed)
  pts = cloud[rng.choice(len(cloud), cfg.heat_points, replace=False)]
  source = int(np.argmin(pts[:, 0] ** 2 + (pts[:, 2] - pts[:, 2].max()) ** 2))  # a point on the outer sheet
  rows, out = [], {}
  for op in ("DMAP", "ATTN"):
    if op not in cfg.operators or "ffn_first" not in cfg.orders:
      continue
    workdir = os.path.join(cfg.out, "conditions", condition_name(op, "ffn_first"))
    model = build_model(cfg, op, "ffn_first", cfg.seed)
    model = runs.load_model(model, workdir)
    x = jnp.asarray(pts)[None]
    _, qks = nn.capture_qk(model, lambda: model(x, jnp.ones((1,))))
    q, k = qks[-1]
    beta, alpha = nn.attention_modules(model)[-1].coefficients()
    w = operators.markov_matrix(q, k, beta=beta, alpha=alpha)[0].mean(0)      # head-averaged walk
    pi = np.asarray(markov.stationary(w).pi)
    delta = jnp.zeros(len(pts)).at[source].set(1.0)
    panels = [(f"t = {t}", np.asarray(markov.propagate(w, delta, t))) for t in (1, 4, 16)]
    panels.append(("equilibrium π", pi))
    rows.append((op, panels))
    out[op] = {"pi_max_over_min": float(pi.max() / max(pi.min(), 1e-30))}
  if rows:
    plotting.heat_panels(pts, rows, path, source=source)
  return out


ORDER_NAMES = {"ffn_first": "FFN → MHSA", "attn_first": "MHSA → FFN"}
COLUMNS = [Col("operator", "Operator"), Col("order", "Order", ORDER_NAMES.get), Col("d_nn", "d_NN", ".4f"),
           Col("eff_neighbours", "e^H̄", ".2f"), Col("eps_rev", "ε_rev", ".3g"), Col("rho_skew", "ρ_skew", ".3g"),
           Col("curvature", "curvature", ".3g"), Col("final_loss", "final loss", ".3f")]


def write_tables(rows: list[dict], out: str, spacing: float) -> str:
  note = f"Training-set median nearest-neighbour spacing: {spacing:.4f} (standardised coordinates)."
  return report.write(out, "table1", rows, COLUMNS, payload=rows, note=note, quiet=True)


def run(cfg: SwissRollConfig) -> dict:
  t0 = time.perf_counter()
  os.makedirs(cfg.out, exist_ok=True)
  runs.write_config(cfg.out, swissroll=cfg)
  source, cloud = data.point_sets(os.path.join(cfg.out, "data"), cloud="swiss_roll", num_points=cfg.num_points,
                                  seed=cfg.seed, set_size=cfg.set_size, num_sets=cfg.num_sets)
  conditions = [(op, order) for order in cfg.orders for op in cfg.operators]
  rows = []
  for i, (op, order) in enumerate(conditions):
    print(f"[{i + 1}/{len(conditions)}] {op} {order}", flush=True)
    rows.append(run_condition(cfg, op, order, source, cloud))
  spacing = median_spacing(cloud)
  md = write_tables(rows, cfg.out, spacing)
  sample_rows = [("training set", [("4000 points", cloud)])]
  for r in rows:
    traj = np.load(os.path.join(cfg.out, "conditions", condition_name(r["operator"], r["order"]), "samples.npy"))
    times = np.linspace(0, 1, len(traj))
    sample_rows.append((f"{r['operator']} {r['order']}", [(f"t = {t:.2f}", x) for t, x in zip(times, traj)]))
  plotting.point_panels(sample_rows, os.path.join(cfg.out, "samples.png"))
  heat = heat_figure(cfg, cloud, os.path.join(cfg.out, "heat.png"))
  wall = time.perf_counter() - t0
  results = dict(config=dataclasses.asdict(cfg), conditions=rows, median_spacing=spacing, heat=heat, wall_seconds=wall)
  with open(os.path.join(cfg.out, "results.json"), "w") as f:
    json.dump(results, f, indent=1)
  print(md)
  print(f"\nwrote {cfg.out}/table1.md, table1.csv, results.json, samples.png, heat.png; wall time {wall:.0f} s")
  return results


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(prog="attngeo swissroll", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--full", action="store_true", help=f"paper-size budget: {FULL}")
  config_lib.add_arguments(ap, SwissRollConfig)
  return ap


def main(argv=None):
  args = parser().parse_args(argv)
  base = dataclasses.replace(SwissRollConfig(), **FULL) if args.full else SwissRollConfig()
  if args.full and args.out is None:
    base = dataclasses.replace(base, out="runs/swissroll_full")
  return run(config_lib.from_arguments(args, SwissRollConfig, base))


if __name__ == "__main__":
  main()
