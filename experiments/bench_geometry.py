"""Cost of the geometry read-outs: Γ₂ dense vs matrix-free, and each estimator's error against its reference.

    attngeo bench-geometry [--sizes 1024,4096,16384,65536] [--eps 0.05] [--estimators 1000,2000,4000] [--out DIR]

Γ₂ table: time and peak memory of Γ₂ for 8 test functions, dense vs matrix-free (Gaussian kernel
on S² ⊂ R³). Dense builds the N×N operator (`gaussian_markov`) and applies it; matrix-free
(`gaussian`) applies P through the blockwise attention kernel without materialising it. Peak memory
is XLA's compiled memory analysis (arguments + outputs + temporaries) of the whole jitted
computation, P included. Dense rows are skipped where P alone exceeds `--dense-limit-gib`.

Estimator table (`--estimators N,…`): every iterative estimator in float32 against an independent
float64 reference on the same points, with what it reports about itself and its wall time
(JIT compilation included):
* `markov.stationary` — α = 0 Gaussian walk on the Swiss roll (ε = 0.05), reference π ∝ kernel
  degree (closed form): ℓ¹ error, reported bound, converged.
* `markov.spectrum` (k = 6, restarted Arnoldi) — the same walk, reference float64 `eigvalsh` of its
  symmetric conjugate: largest eigenvalue error, largest reported residual.
* `diffmap.diffusion_map` (k = 10) — α = 1 walk on the roll, reference float64 `eigh`: largest
  relative error of 1 − λ, largest eigenvector angle.
* `ricci_estimate.ricci_estimate` — torus of revolution (R = 2, r = 1), reference K = cos θ/(r(R + r cos θ)):
  median |error| / max|K|, mean (Gauss–Bonnet: 0), reported uncertainty of the mean.
"""
from __future__ import annotations

import time

import numpy as np

from attngeo import config, data, runlock
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col


def gamma2_dense(x, f, eps):
  from attngeo import geometry as geo, walks
  return geo.gamma2(walks.gaussian_markov(x, eps), f, tau=walks.laplacian_time_scale(eps))


def gamma2_free(x, f, eps, block_size):
  from attngeo import geometry as geo, walks
  return geo.gamma2(walks.gaussian(x, eps, block_size=block_size), f)


def _kernel64(x, eps, alpha):
  """Dense float64 (K^α, d) of a cloud: the references."""
  x = np.asarray(x, np.float64)
  x = x - x.mean(0)
  sq = np.sum(x * x, 1)
  k = np.exp(-np.maximum(sq[:, None] + sq[None, :] - 2 * x @ x.T, 0.0) / eps)
  q = k.sum(1)
  k = k / np.outer(q, q) ** alpha
  return k, k.sum(1)


def _timed(fn):
  import jax
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - t0


def estimator_rows(n: int, eps: float = 0.05) -> list[dict]:
  import jax.numpy as jnp
  from attngeo import data, diffmap, markov, ricci_estimate, surfaces
  rows = []
  x = data.swiss_roll(n, 123)
  k0, d0 = _kernel64(x, eps, 0.0)
  p0 = k0 / d0[:, None]
  st, sec = _timed(lambda: markov.stationary(jnp.asarray(p0, jnp.float32)))
  err = float(np.abs(np.asarray(st.pi, np.float64) - d0 / d0.sum()).sum())
  rows.append(dict(n=n, estimator="markov.stationary", reference="π ∝ degree (closed form)", error=err,
                   error_kind="‖π − π*‖₁", reported=float(st.error_bound), reported_kind="bound",
                   converged=bool(st.converged), seconds=sec))
  ev, sec = _timed(lambda: markov.spectrum(jnp.asarray(p0, jnp.float32), 6))
  w_ref = np.linalg.eigvalsh(k0 / np.sqrt(np.outer(d0, d0)))[::-1][:6]
  rows.append(dict(n=n, estimator="markov.spectrum (k = 6)", reference="float64 eigvalsh", error=float(np.max(np.abs(
      np.sort(np.asarray(ev.values).real)[::-1] - w_ref))), error_kind="max |λ − λ*|", reported=float(np.max(ev.residuals)),
      reported_kind="max residual", converged=bool(ev.converged), seconds=sec))
  k1, d1 = _kernel64(x, eps, 1.0)
  w, u = np.linalg.eigh(k1 / np.sqrt(np.outer(d1, d1)))
  w, u = w[::-1][:11], u[:, ::-1][:, :11]
  dm, sec = _timed(lambda: diffmap.diffusion_map(x, eps, 10))
  uu = np.asarray(dm.psi, np.float64) * np.sqrt(np.asarray(dm.pi, np.float64))[:, None]
  ang = np.degrees(np.arccos(np.minimum(1.0, np.abs(np.sum(uu * u, 0)) / np.linalg.norm(uu, axis=0))))
  rows.append(dict(n=n, estimator="diffmap.diffusion_map (k = 10)", reference="float64 eigh",
                   error=float(np.max(np.abs(np.asarray(dm.rates[1:], np.float64) - (1 - w[1:])) / (1 - w[1:]))),
                   error_kind="max rel. err. 1 − λ", error2=float(ang.max()), reported=float(np.max(dm.residuals)),
                   reported_kind="max residual", converged=bool(dm.converged), seconds=sec))
  s = surfaces.torus(n, 0)
  t0 = time.perf_counter()
  est = ricci_estimate.ricci_estimate(s.points, 2)
  sec = time.perf_counter() - t0
  rows.append(dict(n=n, estimator=f"ricci_estimate (k = {est.k})", reference="torus K (closed form)",
                   error=float(np.median(np.abs(est.mean_ricci - s.curvature))), error_kind="median |K − K*| / max|K*|",
                   error2=float(est.mean_ricci.mean()), reported=est.mean_uncertainty,
                   reported_kind="± of the mean", converged=bool(est.resolved), seconds=sec))
  return rows


def main(argv=None):
  ap = config.parser("attngeo bench-geometry", __doc__)
  ap.add_argument("--sizes", default="1024,4096,16384,65536", help="comma-separated N for the Γ₂ table (default 1024,4096,16384,65536)")
  ap.add_argument("--eps", type=float, default=0.05, help="kernel bandwidth ε > 0 (default 0.05)")
  ap.add_argument("--functions", type=int, default=8, help="test functions in the Γ₂ table, 1–10 (default 8)")
  ap.add_argument("--block-size", type=int, default=1024, help="attention block size (default 1024)")
  ap.add_argument("--repeats", type=int, default=3, help="timed repeats up to N = 16384 (default 3)")
  ap.add_argument("--dense-limit-gib", type=float, default=2.0, help="skip dense rows whose P exceeds this (default 2)")
  ap.add_argument("--estimators", default="", help="comma-separated N for the estimator-error table (default: none; "
                  "e.g. 1000,2000,4000)")
  ap.add_argument("--out", type=config.out_folder, default="runs/bench", help="output folder (default runs/bench)")
  a = ap.parse_args(argv)
  try:
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else []
    est_sizes = [int(s) for s in a.estimators.split(",")] if a.estimators else []
  except ValueError:
    ap.error("--sizes and --estimators must be comma-separated integers")
  if any(n < 2 for n in sizes + est_sizes):
    ap.error(f"--sizes and --estimators must be at least 2 points each; got {sizes + est_sizes}")
  if not a.eps > 0:
    ap.error(f"--eps must be positive; got {a.eps}")
  if not 1 <= a.functions <= 10:
    ap.error(f"--functions must be in [1, 10]; got {a.functions}")
  with runlock.hold(a.out):                       # one process per --out, refused before any work
    import jax.numpy as jnp
    from tqdm import tqdm
    rows = []
    for n in tqdm(sizes, desc="bench_geometry"):
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
    if rows:
      report.write(a.out, "bench_geometry", rows, cols)
    if est_sizes:
      est = [r for n in tqdm(est_sizes, desc="estimators") for r in estimator_rows(n, a.eps)]
      cols = [Col("estimator"), Col("n", "N"), Col("reference"), Col("error_kind", "error"), Col("error", "value", ".2e"),
              Col("error2", "angle (°) / mean", ".3g"), Col("reported_kind", "self-report"), Col("reported", "value", ".1e"),
              Col("converged", "converged / resolved"), Col("seconds", "seconds", ".1f")]
      report.write(a.out, "bench_estimators", est, cols,
                   note="float32 estimators against float64 or closed-form references on the same points; seconds include JIT "
                        "compilation. Ricci 'angle / mean' column: the read-out's mean (Gauss–Bonnet value 0).")


if __name__ == "__main__":
  main()
