"""The flow samplers' names and the sampling arguments, checked without JAX (the CLI checks them before it).

`attngeo.flow.sample` integrates with one of `SAMPLERS` (`euler`, `heun`, `dopri5`, `sde`; the methods are
described in `attngeo.flow`), and classifier-free guidance takes a scale s ≥ 1 (`flow.guided`). Every
error is one `ValueError` line naming the argument.
"""
from __future__ import annotations

import math

SAMPLERS = ("euler", "heun", "dopri5", "sde")


def check_sampler(solver: str, steps: int):
  """One-line errors for an unknown sampler or a non-positive step count."""
  if solver not in SAMPLERS:
    raise ValueError(f"sampler must be one of {SAMPLERS}; got {solver!r}")
  if steps < 1:
    raise ValueError(f"steps must be positive; got {steps}")


def check_guidance(scale: float, null_label: int | None = None):
  """One-line errors for a guidance scale < 1 or infinite, or > 1 without a null label."""
  if not scale >= 1.0:
    raise ValueError(f"guidance scale must be >= 1 (1 = no guidance); got {scale}")
  if not math.isfinite(scale):
    raise ValueError(f"guidance scale must be finite (an infinite scale makes every sample NaN); got {scale}")
  if scale > 1.0 and null_label is None:
    raise ValueError("guidance scale > 1 needs a null label (a model built with class_dropout_prob > 0)")
