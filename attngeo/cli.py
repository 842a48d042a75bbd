"""`attngeo` command line: one sub-command per job; each has its own `--help`.

    attngeo swissroll [--full] [...]     the Swiss-roll scan (Table 1, Figures 1–2)
    attngeo bench [...]                  operator kernel benchmark
    attngeo heat [...]                   heat flow on a sampled Swiss roll (Figure 1)
    attngeo probe CHECKPOINT [...]       per-layer geometry of a trained model
    attngeo diffmap FILE [...]           exact diffusion map of a point cloud
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "swissroll": ("attngeo.experiments.swissroll", "the Swiss-roll scan: Table 1, Figures 1-2"),
    "bench": ("attngeo.experiments.bench_operators", "forward+backward time and memory of every operator and kernel"),
    "bench-geometry": ("attngeo.experiments.bench_geometry", "dense vs matrix-free Gamma_2 time and memory"),
    "bench-train": ("attngeo.experiments.bench_train", "GPT training step time per operator"),
    "heat": ("attngeo.experiments.heat_swissroll", "heat flow of a Gaussian Markov walk on a Swiss roll (Figure 1)"),
    "curvature": ("attngeo.experiments.curvature", "Bakry-Emery estimators against the sphere and torus"),
    "diffmap": ("attngeo.experiments.diffmap", "exact matrix-free diffusion map of a point cloud, with residuals"),
    "bench-diffmap": ("attngeo.experiments.bench_diffmap", "diffusion maps vs dense float64 eigsh and datafold by N"),
    "probe": ("attngeo.experiments.probe", "per-layer Markov/Bakry-Emery/connection diagnostics of a checkpoint"),
}


def usage() -> str:
  lines = ["usage: attngeo COMMAND [--help] [options]", "", "commands:"]
  lines += [f"  {name:<15} {desc}" for name, (_, desc) in COMMANDS.items()]
  return "\n".join(lines)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if not argv or argv[0] in ("-h", "--help"):
    print(usage())
    return 0
  if argv[0] not in COMMANDS:
    print(f"attngeo: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
    return 2
  from attngeo import sharding
  sharding.initialize_distributed()
  module = importlib.import_module(COMMANDS[argv[0]][0])
  module.main(argv[1:])
  return 0


if __name__ == "__main__":
  sys.exit(main())
