"""The operators' names and (β, α) specs, checked without JAX (the CLI validates with them before importing it).

The square's corners are (β, α) ∈ {0, 1}²:

    ATTN = (1, 1)   DMTN = (0, 1)   ATAP = (1, 0)   DMAP = (0, 0)

and CMAP, the magnetic (U(1)) operator, runs DMAP's kernel as its magnitude: (0, 0). `resolve` is the one
reading of an operator a model takes (`attngeo.nn.layers.resolve_operator` is it): a name (any case) or a
(β, α) pair of floats in [0, 1]. `parse` reads one operator written as text, as a chain state of
`attngeo lm adapt` is: a corner name, `β:α` or `(β,α)`; a pair that is a corner becomes its name.
Every error is one `ValueError` line naming the argument.
"""
from __future__ import annotations

import re

ATTN = (1.0, 1.0)
DMTN = (0.0, 1.0)
ATAP = (1.0, 0.0)
DMAP = (0.0, 0.0)
CORNERS = {"ATTN": ATTN, "DMTN": DMTN, "ATAP": ATAP, "DMAP": DMAP}
MAGNETIC = ("CMAP",)
NAMES = tuple(sorted(CORNERS)) + MAGNETIC            # every operator a name can give

_PAIR = re.compile(r"\(?\s*([^,:()\s]+)\s*[:,]\s*([^,:()\s]+)\s*\)?")


def corner(name: str) -> tuple[float, float]:
  """(β, α) of a named operator: one of ATTN, DMTN, ATAP, DMAP (case-insensitive)."""
  try:
    return CORNERS[name.upper()]
  except (KeyError, AttributeError):
    raise ValueError(f"operator must be one of {sorted(CORNERS)}; got {name!r}") from None


def is_magnetic(operator) -> bool:
  """True for the name of the magnetic operator ('CMAP', case-insensitive)."""
  return isinstance(operator, str) and operator.upper() in MAGNETIC


def check_pair(beta, alpha, what: str = "operator ") -> tuple[float, float]:
  """(β, α) as floats, each in [0, 1]; else one ValueError line '{what}beta must lie in [0, 1]; got …'."""
  beta, alpha = float(beta), float(alpha)
  for name, x in (("beta", beta), ("alpha", alpha)):
    if not 0.0 <= x <= 1.0:
      raise ValueError(f"{what}{name} must lie in [0, 1]; got {x:g}")
  return beta, alpha


def resolve(operator, name: str = "operator") -> tuple[float, float]:
  """A corner name ('DMAP', …), 'CMAP' (its magnitude: (0, 0)) or a (β, α) pair of floats in [0, 1] -> (β, α).

  `name` is the argument the one-line ValueError names."""
  if is_magnetic(operator):
    return DMAP
  if isinstance(operator, str):
    if operator.upper() not in CORNERS:
      raise ValueError(f"{name} must be one of {sorted(CORNERS) + list(MAGNETIC)} or a (beta, alpha) pair; "
                       f"got {operator!r}")
    return CORNERS[operator.upper()]
  try:
    beta, alpha = (float(x) for x in operator)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be an operator name or a (beta, alpha) pair of numbers; got {operator!r}") from None
  return check_pair(beta, alpha, f"{name} ")


def parse(spec):
  """One operator written as text (or a pair) -> its corner name ('DMTN') or (β, α) floats in [0, 1].

  'dmtn' → 'DMTN'; '0.5:1', '(0.5,1)' or (0.5, 1) → (0.5, 1.0); '0:1' → 'DMTN'. Names other than the
  corners (CMAP) are not specs of a point in the square. One ValueError line otherwise (the caller says
  where the spec came from)."""
  if isinstance(spec, (tuple, list)):
    pair = tuple(spec)
  else:
    m = _PAIR.fullmatch(str(spec).strip())
    pair = m.groups() if m else None
  if pair is None:
    text = str(spec).strip()
    if text.upper() not in CORNERS:
      raise ValueError(f"unknown operator; expected one of {sorted(CORNERS)} or beta:alpha with beta, alpha in [0, 1]")
    return text.upper()
  try:
    beta, alpha = (float(x) for x in pair)
  except (TypeError, ValueError):
    raise ValueError("beta:alpha must be two numbers") from None
  beta, alpha = check_pair(beta, alpha, "")
  return {v: k for k, v in CORNERS.items()}.get((beta, alpha), (beta, alpha))
