"""Sampled manifolds with closed-form curvature: the references of the curvature estimators.

Each sampler draws points uniformly with respect to the Riemannian volume and returns them with
the exact Gaussian/sectional curvature at every point (numpy, float64 curvature, float32 points).

* `sphere(n, radius, dim)` — S^{dim−1}(r) ⊂ R^dim: sectional curvature 1/r², Ricci (dim − 2)/r².
* `torus(n, big, small)` — torus of revolution ((R + r cos θ) cos φ, (R + r cos θ) sin φ, r sin θ),
  area element r (R + r cos θ) dθ dφ, Gaussian curvature K = cos θ / (r (R + r cos θ)): positive on
  the outer half (|θ| < π/2), negative on the inner half, ∫K dA = 0 (Gauss–Bonnet, χ = 0), so the
  mean of K over uniform samples is 0.
* `swiss_roll_parameters(n, seed)` — the roll parameter t of `attngeo.data.swiss_roll(n, seed)`
  (same draws), which tells the roll's layers apart (points on different turns: |t − t'| > π).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Surface(NamedTuple):
  """points [n, D] float32; curvature [n] float64 (Gaussian curvature for surfaces, sectional for spheres);
  dimension: intrinsic dimension."""
  points: np.ndarray
  curvature: np.ndarray
  dimension: int


def sphere(n: int, seed: int = 0, radius: float = 1.0, dim: int = 3) -> Surface:
  """Uniform samples on S^{dim−1}(radius) ⊂ R^dim; constant sectional curvature 1/radius²."""
  if n < 1 or dim < 2 or not radius > 0:
    raise ValueError(f"need n ≥ 1, dim ≥ 2 and radius > 0; got n={n}, dim={dim}, radius={radius}")
  x = np.random.default_rng(seed).standard_normal((n, dim))
  x = radius * x / np.linalg.norm(x, axis=1, keepdims=True)
  return Surface(x.astype(np.float32), np.full(n, 1.0 / radius**2), dim - 1)


def torus(n: int, seed: int = 0, big: float = 2.0, small: float = 1.0) -> Surface:
  """Uniform (area) samples on the torus of revolution with radii R = `big` > r = `small`."""
  if n < 1 or not big > small > 0:
    raise ValueError(f"need n ≥ 1 and big > small > 0; got n={n}, big={big}, small={small}")
  rng = np.random.default_rng(seed)
  theta = np.empty(0)
  while theta.size < n:                       # rejection: density of θ ∝ R + r cos θ
    cand = rng.uniform(-np.pi, np.pi, 2 * n)
    theta = np.concatenate([theta, cand[rng.uniform(0, big + small, 2 * n) < big + small * np.cos(cand)]])
  theta = theta[:n]
  phi = rng.uniform(-np.pi, np.pi, n)
  ring = big + small * np.cos(theta)
  x = np.stack([ring * np.cos(phi), ring * np.sin(phi), small * np.sin(theta)], 1)
  return Surface(x.astype(np.float32), np.cos(theta) / (small * ring), 2)


def swiss_roll_parameters(n: int, seed: int = 123) -> np.ndarray:
  """t [n] of `attngeo.data.swiss_roll(n, seed)`: its first draw is u ~ U[0, 1)^n, t = 1.5π(1 + 2u)."""
  return 1.5 * np.pi * (1 + 2 * np.random.default_rng(seed).random(n))
