"""The config of `attngeo.regularisers`, JAX-free (a command's config nests it; `--help` imports no JAX).

`Regularisers` holds the weight λ ≥ 0 of each term (0: off), the curvature bound K and gap bound g*, the
number of curvature test functions, the time scale τ, the reversibility read-out and the head/sequence
sample sizes; the terms and their equations are in `attngeo.regularisers`. Nested in a command's config
as `reg`, its fields are the flags `--reg.curvature 0.1`, `--reg.heads 1`, … (`attngeo.config`), and a
value no run can use is one ValueError line naming the flag's field at construction.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

TERMS = ("curvature", "reversibility", "skew", "mixing", "isometry")
REVERSIBILITY_KINDS = ("eps_rev", "entropy")
# The reversibility term's restart probability τ of the damped law π_τ (`attngeo.markov.damped_law`).
DAMPING = 0.01
# The mixing term's Lanczos steps (`attngeo.regularisers.absolute_gap`; 0: a dense eigensolve).
GAP_STEPS = 48

# `--reg.<field>` help of a command whose config nests `Regularisers` as `reg` (`attngeo.config.add_arguments`).
HELP = {"reg.curvature": "weight λ ≥ 0 of the curvature term E relu(K·Γ(f) − Γ₂(f)) (0: off)",
        "reg.reversibility": "weight λ ≥ 0 of the reversibility term (ε_rev or entropy production; 0: off)",
        "reg.skew": "weight λ ≥ 0 of the skew term ρ_skew² of the logits (0: off)",
        "reg.mixing": "weight λ ≥ 0 of the mixing term relu(g* − spectral gap) (0: off)",
        "reg.isometry": "weight λ ≥ 0 of the head-transport isometry-defect term δ² (0: off)",
        "reg.curvature_target": "curvature bound K of the curvature term",
        "reg.gap_target": "spectral-gap bound g* in (0, 1] of the mixing term",
        "reg.gap_steps": "Lanczos steps of the mixing term's gap estimate (0: a dense eigensolve per walk)",
        "reg.test_functions": "test functions m of the curvature term (≥ 1 when it is on)",
        "reg.tau": "time scale τ of L = (P − I)/τ (curvature term)",
        "reg.damping": "restart probability τ in [0, 1] of the reversibility term's damped law π_τ (0: exact π, "
                       "undetermined on nearly reducible walks)",
        "reg.reversibility_kind": f"reversibility read-out, one of {', '.join(REVERSIBILITY_KINDS)}",
        "reg.heads": "heads sampled per layer for the terms (0: every head)",
        "reg.sequences": "sequences of a batch sampled for the terms (0: all)"}


def _is_count(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool) and x >= 0


@dataclasses.dataclass(frozen=True)
class Regularisers:
  """Weights λ ≥ 0 of each term (0: off), the curvature and gap targets, and the sample sizes.

  `curvature_target` K, `gap_target` g*, `gap_steps` (mixing: Lanczos steps, 0: dense), `test_functions` m (curvature), `tau` τ of `L = (P − I)/τ`,
  `reversibility_kind` `"eps_rev"` | `"entropy"`, `damping` τ of its law π_τ, `heads` / `sequences` sampled per layer (0: all).
  """
  curvature: float = 0.0
  reversibility: float = 0.0
  skew: float = 0.0
  mixing: float = 0.0
  isometry: float = 0.0
  curvature_target: float = 0.0
  gap_target: float = 0.1
  gap_steps: int = GAP_STEPS
  test_functions: int = 4
  tau: float = 1.0
  reversibility_kind: str = "eps_rev"
  damping: float = DAMPING
  heads: int = 0
  sequences: int = 0

  def __post_init__(self):
    self.validate()

  def validate(self, prefix: str = "reg.") -> "Regularisers":
    """One-line ValueError naming the first field (as `prefix + name`) no run can use."""
    for term in TERMS:
      w = getattr(self, term)
      if isinstance(w, bool) or not isinstance(w, numbers.Real) or not (math.isfinite(w) and w >= 0):
        raise ValueError(f"{prefix}{term} must be a weight ≥ 0 (a finite number; 0 turns the term off); got {w!r}")
    real = lambda x: isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
    rules = (("curvature_target", real(self.curvature_target), "a finite number (the curvature bound K)"),
             ("gap_target", real(self.gap_target) and 0 < self.gap_target <= 1, "a number in (0, 1]"),
             ("gap_steps", _is_count(self.gap_steps), "an integer ≥ 0 (Lanczos steps; 0: a dense eigensolve)"),
             ("test_functions", _is_count(self.test_functions) and (self.test_functions >= 1 or not self.curvature),
              f"an integer ≥ 1 when {prefix}curvature > 0 (the curvature term needs test functions)"),
             ("tau", real(self.tau) and self.tau > 0, "a positive time scale"),
             ("damping", real(self.damping) and 0 <= self.damping <= 1, "a number in [0, 1] (0: the exact π)"),
             ("reversibility_kind", self.reversibility_kind in REVERSIBILITY_KINDS, f"one of {REVERSIBILITY_KINDS}"),
             ("heads", _is_count(self.heads), "an integer ≥ 0 (0: every head)"),
             ("sequences", _is_count(self.sequences), "an integer ≥ 0 (0: every sequence)"))
    for name, ok, want in rules:
      if not ok:
        raise ValueError(f"{prefix}{name} must be {want}; got {getattr(self, name)!r}")
    return self

  @property
  def active(self) -> tuple[str, ...]:
    """The terms with a positive weight."""
    return tuple(t for t in TERMS if getattr(self, t) > 0)
