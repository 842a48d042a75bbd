"""Bakry–Émery estimators against closed forms: unit sphere, sphere of radius 2, flat torus.

    python -m experiments.curvature [--sizes 1000,2000,4000] [--out DIR]

For each manifold and sample size N (uniform samples, Coifman–Lafon α = 1, τ = ε/4) it prints
the errors of: Γ(f) (median relative), Γ₂(f) (manifold mean, and pointwise median |error| /
mean |truth|) for the plain estimator and the spectral one (`geometry.spectral`, k leading
eigenfunctions), and the Ricci read-out (`geometry.ricci`, mean over points of Ric(v, v)/|v|²)
naive (dense nested Γ) vs spectral. Truths: sphere S²(r), f = a·x: Γ = 1 − f²/r²,
Γ₂ = 1/r² + f²/r⁴, Ric = 1/r²; flat torus (cos θ, sin θ, cos φ, sin φ), f = cos θ: Γ = 1 − f²,
Γ₂ = f², Ric = 0.
"""
from __future__ import annotations

import argparse

import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from attngeo import data, geometry as geo
from attngeo.experiments import report
from attngeo.experiments.report import Col

A = np.array([0.3, -0.5, 0.81]) / np.linalg.norm([0.3, -0.5, 0.81])
MANIFOLDS = {
    # name: (sampler, eps, spectral k, test function, Γ truth, Γ₂ truth, Ricci truth)
    "sphere r=1": (lambda n: data.sphere(n, 0), 0.05, 16, lambda x: x @ A, lambda f: 1 - f**2, lambda f: 1 + f**2, 1.0),
    "sphere r=2": (lambda n: data.sphere(n, 0, radius=2.0), 0.2, 16, lambda x: x @ A, lambda f: 1 - f**2 / 4,
                   lambda f: 0.25 + f**2 / 16, 0.25),
    "flat torus": (lambda n: data.flat_torus(n, 0), 0.05, 21, lambda x: x[:, 0], lambda f: 1 - f**2, lambda f: f**2, 0.0),
}


def pointwise(est, truth):
  return float(np.median(np.abs(est - truth)) / np.mean(np.abs(truth)))


def evaluate(name, n):
  sampler, eps, k, fn, g_true, g2_true, ric_true = MANIFOLDS[name]
  x = jnp.asarray(sampler(n))
  f = fn(x)
  tau = geo.laplacian_time_scale(eps)
  p = geo.gaussian_markov(x, eps)
  sp = geo.spectral(p, k, tau)
  g = np.asarray(geo.gamma(p, f[:, None], tau=tau)[:, 0])
  g2 = np.asarray(geo.gamma2(p, f[:, None], tau=tau)[:, 0])
  g2s = np.asarray(geo.gamma2(sp, f[:, None])[:, 0])
  gt, g2t = np.asarray(g_true(f)), np.asarray(g2_true(f))
  ric_naive = float(geo.ricci(p, x, 2, tau=tau).mean_ricci.mean())
  ric_spec = float(geo.ricci(sp, x, 2).mean_ricci.mean())
  return dict(manifold=name, n=n, eps=eps, k=k,
              gamma_median_rel=float(np.median(np.abs(g - gt) / np.maximum(gt, 1e-3))),
              gamma2_mean_rel=float(g2.mean() / g2t.mean() - 1), gamma2_pointwise=pointwise(g2, g2t),
              gamma2_spectral_mean_rel=float(g2s.mean() / g2t.mean() - 1), gamma2_spectral_pointwise=pointwise(g2s, g2t),
              ricci_true=ric_true, ricci_naive=ric_naive, ricci_spectral=ric_spec)


def evaluate_large(n: int, eps: float, k: int = 16):
  """Unit sphere at large N: spectral Γ₂ and Ricci from `gaussian_spectral` (P never materialised)."""
  x = jnp.asarray(data.sphere(n, 0))
  f = x @ A
  sp = geo.gaussian_spectral(x, eps, k)
  g2 = np.asarray(geo.gamma2(sp, f[:, None])[:, 0])
  g2t = np.asarray(1 + f**2)
  return dict(n=n, eps=eps, k=k, gamma2_spectral_mean_rel=float(g2.mean() / g2t.mean() - 1),
              gamma2_spectral_pointwise=pointwise(g2, g2t),
              ricci_spectral=float(geo.ricci(sp, x, 2).mean_ricci.mean()))


COLUMNS = [Col("manifold"), Col("n", "N"), Col("eps", "ε"), Col("gamma_median_rel", "Γ med. rel", ".3f"),
           Col("gamma2_mean_rel", "Γ₂ mean rel", "+.3f"), Col("gamma2_pointwise", "Γ₂ pointwise", ".3f"),
           Col("gamma2_spectral_mean_rel", "Γ₂ spectral mean", "+.3f"),
           Col("gamma2_spectral_pointwise", "Γ₂ spectral pointwise", ".3f"), Col("ricci_true", "Ric true", ".2f"),
           Col("ricci_naive", "Ric naive", ".3f"), Col("ricci_spectral", "Ric spectral", ".3f"), Col("k")]
LARGE_COLUMNS = [Col("n", "N"), Col("eps", "ε"), Col("k"), Col("gamma2_spectral_mean_rel", "Γ₂ spectral mean", "+.3f"),
                 Col("gamma2_spectral_pointwise", "Γ₂ spectral pointwise", ".3f"),
                 Col("ricci_spectral", "Ric spectral (true 1)", ".3f")]


def main(argv=None):
  ap = argparse.ArgumentParser(prog="attngeo curvature", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="1000,2000,4000")
  ap.add_argument("--manifolds", default=",".join(MANIFOLDS))
  ap.add_argument("--large", default="", help="unit-sphere sizes for the matrix-free spectral estimator, "
                  "e.g. 16384:0.02,65536:0.01 (N:ε)")
  ap.add_argument("--out", default="runs/curvature")
  a = ap.parse_args(argv)
  jobs = [(m, int(n)) for m in a.manifolds.split(",") for n in a.sizes.split(",")]
  rows = [evaluate(m, n) for m, n in tqdm(jobs, desc="curvature")]
  report.write(a.out, "curvature", rows, COLUMNS)
  if a.large:
    large = [evaluate_large(int(n), float(e)) for n, e in (s.split(":") for s in tqdm(a.large.split(","), desc="large"))]
    report.write(a.out, "curvature_large", large, LARGE_COLUMNS, note="unit sphere, matrix-free spectral estimator")


if __name__ == "__main__":
  main()
