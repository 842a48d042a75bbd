"""Statistics for comparing conditions over seeds: Welch's unequal-variance t-test and Holm's correction.

For samples a (n_a values) and b (n_b values), variances with ddof 1:

    d = mean(a) − mean(b),    s_a = var(a) / n_a,    s_b = var(b) / n_b,
    t = d / √(s_a + s_b),     ν = (s_a + s_b)² / (s_a² / (n_a − 1) + s_b² / (n_b − 1))   (Welch–Satterthwaite),
    p = 2·P(T_ν > |t|)        (two-sided; `scipy.stats.t.sf`),

the t, ν and p of `scipy.stats.ttest_ind(a, b, equal_var=False)`. Two constant samples (s_a + s_b = 0,
where scipy gives NaN) are decided by their means: t = ±∞ and p = 0 if they differ, t = 0 and p = 1
if not; ν is NaN.

Holm's step-down correction of m p-values sorted p_(1) ≤ … ≤ p_(m) (`holm`): the adjusted
p̃_(i) = max_{j ≤ i} min(1, (m − j + 1)·p_(j)); rejecting p̃ < α controls the family-wise error at α.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np


class Welch(NamedTuple):
  difference: float        # mean(a) − mean(b)
  t: float
  df: float                # Welch–Satterthwaite degrees of freedom
  p: float                 # two-sided


def welch(a, b) -> Welch:
  """Welch's t-test of mean(a) − mean(b) (see the module docstring); each sample needs ≥ 2 finite values."""
  from scipy import stats
  a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
  for name, x in (("a", a), ("b", b)):
    if len(x) < 2 or not np.all(np.isfinite(x)):
      raise ValueError(f"Welch's t-test needs at least 2 finite values in sample {name}; got {x.tolist()}")
  d = float(a.mean() - b.mean())
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  if va + vb == 0:
    return Welch(d, math.copysign(math.inf, d) if d else 0.0, math.nan, 0.0 if d else 1.0)
  t = d / math.sqrt(va + vb)
  df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
  return Welch(d, float(t), float(df), float(2 * stats.t.sf(abs(t), df)))


def welch_if_testable(a, b) -> Welch | None:
  """`welch(a, b)`, or None when either sample has fewer than 2 values or a non-finite one (a diverged
  seed): a table of many comparisons reports that pair as untested instead of stopping."""
  a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
  if min(len(a), len(b)) < 2 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
    return None
  return welch(a, b)


def holm(pvalues) -> np.ndarray:
  """Holm-adjusted p-values (the module docstring), in the input's order; one line for a value outside [0, 1]."""
  p = np.asarray(pvalues, np.float64).ravel()
  if not np.all((p >= 0) & (p <= 1)):
    raise ValueError(f"p-values must lie in [0, 1]; got {p.tolist()}")
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])
  out = np.empty_like(p)
  out[order] = np.maximum.accumulate(scaled)
  return out
