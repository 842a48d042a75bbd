"""The Swiss-roll scan (seed "Attention Geometry", Table 1 and Figures 1–2).

    attngeo swissroll [--full] [--seeds 3] [--operators DMAP,ATTN] [--orders ffn_first] [--train.steps N] [--model.depth N] ...

A `PointFlow` set transformer (each point a token, bidirectional attention) learns the velocity
of the linear interpolant from Gaussian noise sets to point sets of the 4000-point Swiss roll
(flow matching, `attngeo.flow`), once per operator × sub-layer order × seed, same budget each;
samples are drawn with Heun's method from noise sets (EMA weights when `--train.ema` > 0). In training,
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
# The command line. Settings, keys and folders: `swissroll_config`; the work: `swissroll_run`, imported by
# `run` once the settings are checked (this module imports no JAX: `--help` and errors answer at once).
from __future__ import annotations

import argparse
import dataclasses

from attngeo import config as config_lib, runlock
from attngeo.experiments.swissroll_config import FULL, HELP, SwissRollConfig, fit_to_cloud, validate


def run(cfg: SwissRollConfig) -> dict:
  """The scan in `cfg.out` (`swissroll_run.scan`), held by this process for the whole run (`attngeo.runlock`).

  Settings are checked first (`validate`, then the geometry terms against the models built abstractly),
  so a refused scan changes nothing on disk; JAX is imported here, after parsing."""
  validate(cfg)
  check_regularisers(cfg)
  from attngeo.experiments import swissroll_run
  with runlock.hold(cfg.out):
    return swissroll_run.scan(cfg)


def check_regularisers(cfg: SwissRollConfig) -> None:
  """A geometry term the scan's models cannot give (no attention layers, too few heads): one ValueError
  line, from the models built abstractly (`swissroll_run.check_regularisers`: JAX, only when a term is on)."""
  if cfg.reg.active:
    from attngeo.experiments import swissroll_run
    swissroll_run.check_regularisers(cfg)


def parser() -> argparse.ArgumentParser:
  ap = config_lib.parser("attngeo swissroll", __doc__)
  ap.add_argument("--full", action="store_true",
                  help=f"the longer budget, {', '.join(f'--{k} {v}' for k, v in FULL.items())}, into runs/swissroll_full "
                       "unless --out is given (default: off)")
  config_lib.add_arguments(ap, SwissRollConfig, help=HELP)
  return ap


def config_from_argv(argv=None, ap: argparse.ArgumentParser | None = None) -> SwissRollConfig:
  """Parse and validate; a bad setting exits with one line (code 2) before any work."""
  ap = ap or parser()
  args = ap.parse_args(argv)
  base = config_lib.replaced(SwissRollConfig(), FULL) if args.full else SwissRollConfig()
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
