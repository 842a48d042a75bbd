"""`attngeo study curvature`: does a geometry term in the loss change the walk a Swiss-roll model learns?

    attngeo study curvature [--operator ATTN] [--seeds 3] [--steps 600] [--curvature 0.1]
                            [--curvature-target 0] [--reversibility 0] [--out runs/study_curvature]

A thin driver over `attngeo swissroll` (`experiments/swissroll.py`, every condition cached under its
content key): the same operator, order, data and seeds trained three ways — the flow-matching loss
alone (`none`), plus `--curvature` λ·E relu(K·Γ(f) − Γ₂(f)) (`attngeo.regularisers.curvature`, K =
`--curvature-target`, default 0; coordinate test functions), plus `--reversibility` λ·ε_rev (`regularisers.reversibility`). For each
setting it reads the per-seed Table 1 row (sample quality against the oracle floor: d_NN ÷ floor,
coverage ÷ floor; the learned walk: e^H̄, ε_rev, ρ_skew, the Bakry–Émery curvature read-out; the
held-out loss) and tests each regularised setting against `none` column by column (Welch's t over
seeds, `attngeo.stats.welch`; Holm over the columns of each setting). A term "changes the walk at
equal sample quality" when a walk read-out moves beyond the seed spread while d_NN and coverage do not.

The reversibility setting is off by default (`--reversibility 0.1` adds it). Under the exact π its loss
turned NaN at step 150, because π is not determined once a learned walk is nearly reducible. The term
now reads its flows under the damped law π_τ (`markov.damped_law`, τ = 0.01, the default of
`attngeo swissroll --reg.damping`) and trains finite.
docs/results/curvature.md has both runs.

Writes study.md, study.json and study.png (one panel per column, seeds as dots) to --out; each
setting's scan lives in --out/SETTING (its table1.md, samples.png, conditions/).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np

from attngeo import config as config_lib, files, runlock, stats
from attngeo.experiments import swissroll, swissroll_config
from attngeo.regularisers_config import Regularisers

COLUMNS = (("d_nn_ratio", "d_NN ÷ floor"), ("coverage_ratio", "coverage ÷ floor"), ("eff_neighbours", "e^H̄"),
           ("eps_rev", "ε_rev"), ("rho_skew", "ρ_skew"), ("curvature", "curvature"), ("eval_loss", "loss"))
QUALITY = ("d_nn_ratio", "coverage_ratio")


@dataclasses.dataclass(frozen=True)
class CurvatureStudyConfig:
  operator: str = "ATTN"
  order: str = "ffn_first"
  seeds: int = 3
  steps: int = 600
  curvature: float = 0.1          # λ of the curvature term (0: setting skipped)
  curvature_target: float = 0.0   # its bound K: relu(K·Γ(f) − Γ₂(f)) is inactive where the walk already holds K
  reversibility: float = 0.0      # λ of the reversibility term (0: setting skipped; see the module docstring)
  out: str = "runs/study_curvature"
  progress: bool = True


HELP = {"operator": "operator of every condition (one of DMAP, DMTN, ATAP, ATTN)",
        "order": "sub-layer order, ffn_first or attn_first", "seeds": "training seeds per setting (≥ 2)",
        "steps": "training steps of each condition", "curvature": "weight λ ≥ 0 of the curvature term (0: skip)",
        "curvature_target": "bound K of the curvature term, a finite number (above the trained walk's read-out to "
                            "ask for more curvature than training finds)",
        "reversibility": "weight λ ≥ 0 of the reversibility term (0: skip)", "out": "output folder",
        "progress": "progress bars (true/false)"}


def settings(cfg: CurvatureStudyConfig) -> dict:
  """{name: Regularisers} of the settings trained: `none` first, then each term whose λ > 0."""
  out = {"none": Regularisers()}
  if cfg.curvature > 0:
    out["curvature"] = Regularisers(curvature=cfg.curvature, curvature_target=cfg.curvature_target)
  if cfg.reversibility > 0:
    out["reversibility"] = Regularisers(reversibility=cfg.reversibility)
  return out


def scan_config(cfg: CurvatureStudyConfig, name: str, reg):
  return swissroll_config.SwissRollConfig(operators=(cfg.operator,), orders=(cfg.order,), seeds=cfg.seeds,
                                          train=swissroll_config.ScanTrain(steps=cfg.steps),
                                          reg=reg, out=os.path.join(cfg.out, name), progress=cfg.progress)


def validate(cfg: CurvatureStudyConfig) -> None:
  if cfg.operator not in swissroll_config.OPERATORS:
    raise ValueError(f"--operator must be one of {', '.join(swissroll_config.OPERATORS)}; got {cfg.operator!r}")
  if isinstance(cfg.seeds, bool) or not isinstance(cfg.seeds, int) or cfg.seeds < 2:
    raise ValueError(f"--seeds must be an integer ≥ 2 (the differences are tested over seeds); got {cfg.seeds!r}")
  for name in ("curvature", "reversibility"):
    if not getattr(cfg, name) >= 0:
      raise ValueError(f"--{name} must be a weight ≥ 0; got {getattr(cfg, name)!r}")
  if not math.isfinite(cfg.curvature_target):
    raise ValueError(f"--curvature-target must be a finite number (the bound K); got {cfg.curvature_target!r}")
  if cfg.curvature == cfg.reversibility == 0:
    raise ValueError("--curvature and --reversibility are both 0: nothing to compare with the unregularised runs")
  for name, reg in settings(cfg).items():
    swissroll_config.validate(scan_config(cfg, name, reg))


def compare(per_seed: dict[str, list[dict]]) -> dict:
  """{setting: {column: {"mean", "sd", "values", "vs_none": Welch fields + holm p}}} over the seeds."""
  out = {}
  for name, rows in per_seed.items():
    cols, tests = {}, []
    for key, _ in COLUMNS:
      values = [float(r[key]) for r in rows]
      cols[key] = dict(mean=float(np.mean(values)), sd=float(np.std(values, ddof=1)), values=values, vs_none=None)
      if name != "none":
        test = stats.welch_if_testable(values, [float(r[key]) for r in per_seed["none"]])
        if test is not None:
          cols[key]["vs_none"] = test._asdict()
          tests.append(key)
    for key, p in zip(tests, stats.holm([cols[k]["vs_none"]["p"] for k in tests]) if tests else []):
      cols[key]["vs_none"]["p_holm"] = float(p)
    out[name] = cols
  return out


def reading(result: dict) -> list[str]:
  """One plain sentence per regularised setting: which walk read-outs moved, and whether quality held."""
  lines = []
  for name, cols in result.items():
    if name == "none":
      continue
    moved = [label for key, label in COLUMNS if key not in QUALITY and (cols[key]["vs_none"] or {}).get("p_holm", 1) < 0.05]
    worse = [label for key, label in COLUMNS if key in QUALITY and (cols[key]["vs_none"] or {}).get("p_holm", 1) < 0.05]
    lines.append(f"{name}: walk read-outs beyond the seed spread (Holm 0.05): {', '.join(moved) or 'none'}; "
                 f"sample quality {'changed: ' + ', '.join(worse) if worse else 'unchanged'}.")
  return lines


def markdown(cfg: CurvatureStudyConfig, result: dict) -> str:
  head = "| setting | " + " | ".join(label for _, label in COLUMNS) + " |"
  rows = [head, "|---|" + "---:|" * len(COLUMNS)]
  for name, cols in result.items():
    cells = []
    for key, _ in COLUMNS:
      c = cols[key]
      test = c["vs_none"]
      mark = "" if test is None else f" (p={test['p_holm']:.2g})"
      cells.append(f"{c['mean']:.4g} ± {c['sd']:.2g}{mark}")
    rows.append(f"| {name} | " + " | ".join(cells) + " |")
  lam = ", ".join(f"{n} λ = {getattr(cfg, n)}" for n in ("curvature", "reversibility") if getattr(cfg, n) > 0)
  if cfg.curvature > 0:
    lam = lam.replace(f"curvature λ = {cfg.curvature}", f"curvature λ = {cfg.curvature} with K = {cfg.curvature_target:g}")
  note = (f"{cfg.operator} {cfg.order}, {cfg.steps} steps, {cfg.seeds} seeds per setting ({lam}); mean ± sd over "
          "seeds; p: Welch's t against `none`, Holm over the columns of the setting.")
  return "\n".join(rows) + "\n\n" + note + "\n\n" + "\n".join(f"* {line}" for line in reading(result)) + "\n"


def figure(result: dict, path: str) -> None:
  from attngeo.plotting import plt
  names = list(result)
  fig, axes = plt.subplots(1, len(COLUMNS), figsize=(2.1 * len(COLUMNS), 2.8), constrained_layout=True)
  for ax, (key, label) in zip(axes, COLUMNS):
    for i, name in enumerate(names):
      values = result[name][key]["values"]
      ax.plot(np.full(len(values), i), values, "o", color=f"C{i}", ms=4, alpha=0.8)
      ax.plot([i - 0.25, i + 0.25], [np.mean(values)] * 2, color=f"C{i}", lw=2)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_title(label, fontsize=9)
    ax.tick_params(labelsize=7)
  files.save_figure(fig, path, dpi=120)
  plt.close(fig)


def run(cfg: CurvatureStudyConfig) -> dict:
  """Each setting's scan (`swissroll.run`, in `--out/SETTING`), then the comparison in `--out` (held throughout)."""
  validate(cfg)
  with runlock.hold(cfg.out):
    return _run(cfg)


def _run(cfg: CurvatureStudyConfig) -> dict:
  t0 = time.perf_counter()
  per_seed = {}
  for name, reg in settings(cfg).items():
    print(f"== setting {name}", flush=True)
    out = swissroll.run(scan_config(cfg, name, reg))
    per_seed[name] = out["per_seed"]
  result = compare(per_seed)
  md = markdown(cfg, result)
  os.makedirs(cfg.out, exist_ok=True)
  with files.staged():                      # the tables and the figure land together (a full disk: none of them)
    files.atomic_write(os.path.join(cfg.out, "study.md"), md)
    files.atomic_write(os.path.join(cfg.out, "study.json"),
                       json.dumps(dict(config=dataclasses.asdict(cfg), settings=result,
                                       wall_seconds=time.perf_counter() - t0), indent=1))
    figure(result, os.path.join(cfg.out, "study.png"))
  print(md)
  print(f"wrote {cfg.out}/study.md, study.json, study.png; wall time {time.perf_counter() - t0:.0f} s")
  return result


def parser() -> argparse.ArgumentParser:
  ap = config_lib.parser("attngeo study curvature", __doc__)
  config_lib.add_arguments(ap, CurvatureStudyConfig, help=HELP)
  return ap


def main(argv=None):
  ap = parser()
  cfg = config_lib.from_arguments(ap.parse_args(sys.argv[1:] if argv is None else argv), CurvatureStudyConfig)
  try:
    validate(cfg)
  except ValueError as e:
    ap.error(str(e))
  return run(cfg)


if __name__ == "__main__":
  main()
