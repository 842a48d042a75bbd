"""Time and peak memory of Γ₂ for 8 test functions: dense P vs matrix-free (Gaussian kernel in R³).

    attngeo bench-geometry [--sizes 1024,4096,16384,65536] [--eps 0.05] [--out DIR]

Dense builds the N×N operator (`gaussian_markov`) and applies it; matrix-free (`gaussian`) applies
P through the blockwise attention kernel without materialising it. Peak memory is XLA's compiled
memory analysis (arguments + outputs + temporaries) of the whole jitted computation, P included.
Dense rows are skipped where P alone exceeds `--dense-limit-gib`.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
from tqdm import tqdm

from attngeo import data, geometry as geo
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col


def gamma2_dense(x, f, eps):
  return geo.gamma2(geo.gaussian_markov(x, eps), f, tau=geo.laplacian_time_scale(eps))


def gamma2_free(x, f, eps, block_size):
  return geo.gamma2(geo.gaussian(x, eps, block_size=block_size), f)


def main(argv=None):
  ap = argparse.ArgumentParser(prog="attngeo bench-geometry", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="1024,4096,16384,65536")
  ap.add_argument("--eps", type=float, default=0.05)
  ap.add_argument("--functions", type=int, default=8)
  ap.add_argument("--block-size", type=int, default=1024)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--dense-limit-gib", type=float, default=2.0)
  ap.add_argument("--out", default="runs/bench")
  a = ap.parse_args(argv)
  rows = []
  for n in tqdm([int(s) for s in a.sizes.split(",")], desc="bench_geometry"):
    x = jnp.asarray(data.sphere(n, seed=0))
    f = jnp.concatenate([x, jnp.sin(3 * x), x[:, :2] * x[:, 1:]], -1)[:, :a.functions]
    reps = a.repeats if n <= 16384 else 1
    t, mem = timing.timed(lambda x, f: gamma2_free(x, f, a.eps, a.block_size), (x, f), reps)
    rows.append(dict(n=n, method="matrix-free", seconds=t, peak_bytes=mem))
    if n * n * 4 <= a.dense_limit_gib * 2**30:
      t, mem = timing.timed(lambda x, f: gamma2_dense(x, f, a.eps), (x, f), reps)
      rows.append(dict(n=n, method="dense", seconds=t, peak_bytes=mem))
    else:
      rows.append(dict(n=n, method="dense", seconds=None, peak_bytes=n * n * 4, skipped="P alone exceeds the limit"))
  dense = {r["n"]: r for r in rows if r["method"] == "dense" and r["seconds"] is not None}
  for r in rows:
    d = dense.get(r["n"])
    r["time_vs_dense"] = r["seconds"] / d["seconds"] if d and r["seconds"] else None
    r["memory_vs_dense"] = r["peak_bytes"] / d["peak_bytes"] if d and r["seconds"] else None
  for r in rows:
    if r["seconds"] is None:
      r["skipped"] = f"skipped (P alone: {r['peak_bytes'] / 2**20:.0f} MiB)"
  cols = [Col("n", "N"), Col("method"), Col("seconds", "Γ₂ time (s)", ".3f"), Col("time_vs_dense", "× dense time", ".2f"),
          Col("peak_bytes", "peak MiB", lambda b: f"{b / 2**20:.0f}"), Col("memory_vs_dense", "× dense memory", ".2f"),
          Col("skipped", "note")]
  report.write(a.out, "bench_geometry", rows, cols)


if __name__ == "__main__":
  main()
