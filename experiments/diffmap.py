"""Exact diffusion maps of a point cloud, matrix-free, with residuals (`attngeo.diffmap`).

    attngeo diffmap FILE [--k 10] [--eps 0.05|auto] [--alpha 1] [--t 1] [--n 4000] [--out runs/diffmap]

FILE is a `.npy` / `.csv` array [n, D] or a built-in cloud (`swiss_roll`, `sphere`, `torus`, drawn
with --n points and --seed). Builds the α-normalised Gaussian walk exp(−‖x − y‖²/ε) and solves
for its k leading nontrivial eigenpairs through the blockwise attention kernel (O(n) memory),
then prints per eigenpair: λ, 1 − λ, the residual ‖Au − λu‖ and the a posteriori bounds on the
eigenvalue and eigenvector errors, and whether every residual met --tol. Writes
`coordinates.npy` [n, k] (λ^t ψ), `diffmap.{md,csv,json}` and `diffmap.png` (the cloud coloured
by Ψ₁, Ψ₁ against Ψ₂, and the spectrum with its residuals).
"""
from __future__ import annotations

import os
import time

import numpy as np

from attngeo import config, files
from attngeo.data import load_cloud
from attngeo.experiments import report
from attngeo.experiments.report import Col

CLOUDS = ("swiss_roll", "sphere", "torus")


def _parser():
  ap = config.parser("attngeo diffmap", __doc__)
  ap.add_argument("file", help=f"a .npy or .csv file of points [n, D], or a built-in cloud: {', '.join(CLOUDS)}")
  ap.add_argument("--k", type=int, default=10, help="number of diffusion coordinates (nontrivial eigenpairs), ≥ 1 (default 10)")
  ap.add_argument("--eps", default="auto", help="kernel bandwidth ε > 0 in exp(−‖x − y‖²/ε), or 'auto' for "
                  "bandwidth.bandwidth's sheet rule (default auto)")
  ap.add_argument("--alpha", type=float, default=1.0, help="Coifman–Lafon normalisation α in [0, 1] (default 1: Laplace–Beltrami)")
  ap.add_argument("--t", type=float, default=1.0, help="diffusion time t ≥ 0, coordinates λ^t ψ (default 1)")
  ap.add_argument("--tol", type=float, default=2e-6, help="residual tolerance relative to ‖A‖ = 1, > 0 (default 2e-6; "
                  "~1e-6 is the float32 floor)")
  ap.add_argument("--n", type=int, default=4000, help="points drawn for a built-in cloud, ≥ k + 2 (default 4000)")
  ap.add_argument("--seed", type=int, default=123, help="seed of the built-in cloud and of the solver (default 123)")
  ap.add_argument("--out", type=config.out_folder, default="runs/diffmap", help="output folder (default runs/diffmap)")
  return ap


def _plot(x, coords, dm, path):
  """Left: the cloud (first three coordinates) coloured by Ψ₁; middle: Ψ₁ against Ψ₂ coloured by Ψ₃;
  right: 1 − λ and the residuals per eigenpair. Each colouring has its labelled colour bar."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig = plt.figure(figsize=(14, 4))
  c1 = coords[:, 0]
  if x.shape[1] >= 3:
    ax = fig.add_subplot(1, 3, 1, projection="3d")
    points = ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=1.0, c=c1, cmap="viridis")
    ax.set_xticks([]), ax.set_yticks([]), ax.set_zticks([])
  else:
    ax = fig.add_subplot(1, 3, 1)
    points = ax.scatter(x[:, 0], x[:, 1] if x.shape[1] > 1 else np.zeros(len(x)), s=1.0, c=c1, cmap="viridis")
  ax.set_title("cloud coloured by Ψ₁", fontsize=9)
  fig.colorbar(points, ax=ax, shrink=0.7, pad=0.08).set_label("Ψ₁", fontsize=9)
  ax = fig.add_subplot(1, 3, 2)
  if coords.shape[1] >= 2:
    name = "Ψ₃" if coords.shape[1] >= 3 else "Ψ₁"
    points = ax.scatter(coords[:, 0], coords[:, 1], s=1.0, c=coords[:, 2] if name == "Ψ₃" else c1, cmap="viridis")
    ax.set_xlabel("Ψ₁"), ax.set_ylabel("Ψ₂")
    fig.colorbar(points, ax=ax).set_label(name, fontsize=9)
  else:
    ax.hist(c1, bins=50)
    ax.set_xlabel("Ψ₁")
  ax.set_title(f"diffusion map, ε = {dm.eps:.3g}, t = {dm.t:g}" + (" (colour Ψ₃)" if coords.shape[1] >= 3 else ""), fontsize=9)
  ax = fig.add_subplot(1, 3, 3)
  rates = np.asarray(dm.rates[1:])
  c = np.arange(1, len(rates) + 1)
  ax.semilogy(c, rates, "o-", ms=3, label="1 − λ")
  ax.semilogy(c, np.maximum(np.asarray(dm.residuals[1:]), 1e-12), "x", ms=4, label="residual ‖Au − λu‖")
  ax.set_xlabel("eigenpair c"), ax.legend(fontsize=8)
  ax.set_title("spectrum and residuals", fontsize=9)
  fig.tight_layout()
  files.save_figure(fig, path, dpi=110)
  plt.close(fig)


def main(argv=None):
  ap = _parser()
  a = ap.parse_args(argv)
  if a.k < 1:
    ap.error(f"--k must be at least 1; got {a.k}")
  if not 0.0 <= a.alpha <= 1.0:
    ap.error(f"--alpha must lie in [0, 1]; got {a.alpha}")
  if a.t < 0:
    ap.error(f"--t must be non-negative; got {a.t}")
  if not a.tol > 0:
    ap.error(f"--tol must be positive; got {a.tol}")
  if a.eps != "auto":
    try:
      eps = float(a.eps)
    except ValueError:
      ap.error(f"--eps must be a positive number or 'auto'; got {a.eps!r}")
    if not eps > 0:
      ap.error(f"--eps must be positive; got {a.eps}")
  if a.file not in CLOUDS and not (os.path.isfile(a.file) and a.file.endswith((".npy", ".csv"))):
    ap.error(f"FILE must be an existing .npy/.csv file or one of {', '.join(CLOUDS)}; got {a.file!r}")
  if a.file in CLOUDS and a.n < a.k + 2:        # a named cloud has --n points: before JAX is imported
    ap.error(f"--n must be at least --k + 2 = {a.k + 2} (the points drawn from {a.file}); got {a.n}")
  from attngeo import bandwidth, diffmap
  try:
    x = load_cloud(a.file, a.n, a.seed)
  except ValueError as e:
    ap.error(str(e))
  if len(x) < a.k + 2:
    ap.error(f"FILE must hold at least --k + 2 = {a.k + 2} points; got {len(x)}")
  rule = "given"
  if a.eps == "auto":
    bw = bandwidth.bandwidth(x)
    eps, rule = bw.eps, f"{bw.rule} rule (intrinsic dimension {bw.dimension:.2f})"
  t0 = time.perf_counter()
  dm = diffmap.diffusion_map(x, eps, a.k, alpha=a.alpha, t=a.t, tol=a.tol, seed=a.seed)
  coords = np.asarray(dm.coordinates)
  seconds = time.perf_counter() - t0
  rows = [dict(c=c, value=float(dm.values[c]), rate=float(dm.rates[c]), residual=float(dm.residuals[c]),
               value_bound=float(dm.value_bounds[c]),
               angle_bound_deg=float(np.degrees(np.arcsin(min(1.0, float(dm.vector_bounds[c]))))))
          for c in range(a.k + 1)]
  note = (f"{len(x)} points in R^{x.shape[1]}, ε = {eps:.4g} ({rule}), α = {a.alpha:g}, t = {a.t:g}; "
          f"converged (every residual ≤ {a.tol:g}): {bool(dm.converged)}; {int(dm.matvecs)} kernel applications, "
          f"{seconds:.1f} s. c = 0 is the trivial pair (λ = 1, ψ = 1).")
  cols = [Col("c"), Col("value", "λ", ".8f"), Col("rate", "1 − λ", ".6e"), Col("residual", "‖Au − λu‖", ".1e"),
          Col("value_bound", "|λ error| ≤", ".1e"), Col("angle_bound_deg", "angle error ≤ (°)", ".3g")]
  payload = dict(rows=rows, n=len(x), dim=int(x.shape[1]), eps=eps, eps_rule=rule, alpha=a.alpha, t=a.t, tol=a.tol,
                 converged=bool(dm.converged), matvecs=int(dm.matvecs), seconds=seconds)
  os.makedirs(a.out, exist_ok=True)
  with files.staged():                      # coordinates, tables and figure land together (a full disk: none)
    files.atomic_npy(os.path.join(a.out, "coordinates.npy"), coords)
    _plot(x, coords, dm, os.path.join(a.out, "diffmap.png"))
    report.write(a.out, "diffmap", rows, cols, payload=payload, note=note)
  report.wrote(a.out, "coordinates.npy", "diffmap.md", "diffmap.csv", "diffmap.json", "diffmap.png")


if __name__ == "__main__":
  main()
