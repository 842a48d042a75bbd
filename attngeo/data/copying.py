"""Repeated random sequences mixed into text rows: a curriculum that makes copying (induction) pay.

Row r of `CopyMix(rows, fraction, vocab_size)` is a synthetic row instead of `rows[r]` exactly when

    ⌊(r + 1)·f⌋ > ⌊r·f⌋                (f = fraction: rows ⌈1/f⌉ − 1, … evenly spread)

so the first N rows hold exactly ⌊N·f⌋ synthetic ones (and any run of k consecutive rows ⌊k·f⌋ or
⌈k·f⌉): the share is what was asked, not a binomial draw around it. A synthetic row is

    s = (s_0 … s_{L−1}) uniform over the ids [0, V),  L uniform over [min_len, max_len],
    row = (s, s, s, …)[:T + 1]        (s repeated to fill the row of T + 1 tokens)

— the distribution the induction score draws from (`attngeo.lm.induction`: uniform over the whole
vocabulary, special ids included), so a model trained on it learns to copy every id. The content of
row r comes from `np.random.default_rng([seed, r])`: the mixture is a fixed function of the row
index, so any shuffle or resumption of the loader sees the same rows. Every other row is `rows[r]`
unchanged (the text of the replaced rows is not trained on).
"""
from __future__ import annotations

import numpy as np


class CopyMix:
  """Random-access rows {"tokens": int32[T + 1]}: `rows` with a `fraction` replaced by repeated random
  sequences (see the module docstring)."""

  def __init__(self, rows, fraction: float, vocab_size: int, min_len: int = 8, max_len: int | None = None,
               seed: int = 0):
    self.rows, self.fraction, self.vocab_size, self.seed = rows, float(fraction), int(vocab_size), int(seed)
    self.width = len(rows[0]["tokens"]) if len(rows) else 0
    self.min_len, self.max_len = int(min_len), int(max_len or max(self.width // 2, min_len))
    if not 0.0 <= self.fraction <= 1.0:
      raise ValueError(f"copy fraction must lie in [0, 1]; got {fraction}")
    if not 1 <= self.min_len <= self.max_len:
      raise ValueError(f"copy lengths need 1 <= min_len <= max_len; got {self.min_len}, {self.max_len}")
    if self.vocab_size < 1:
      raise ValueError(f"vocab_size must be positive; got {vocab_size}")

  def __len__(self) -> int:
    return len(self.rows)

  def synthetic(self, r: int) -> np.ndarray | None:
    """Row r's repeated random sequence [T + 1], or None when row r keeps its text."""
    if np.floor((r + 1) * self.fraction) <= np.floor(r * self.fraction):
      return None
    rng = np.random.default_rng([self.seed, r])
    s = rng.integers(0, self.vocab_size, rng.integers(self.min_len, self.max_len + 1))
    return np.resize(s, self.width).astype(np.int32)

  def __getitem__(self, r: int) -> dict:
    row = self.synthetic(r)
    return self.rows[r] if row is None else {"tokens": row}
