"""Repeated random sequences mixed into a stream of text rows: a curriculum that makes copying pay.

`CopyMix(fraction, vocab_size, width)` acts on the k-th row of the shuffled, repeated training
stream (k = epoch·N + position: `attngeo.data.pipeline.loader`'s `mix`). Stream row k becomes a
synthetic row exactly when

    ⌊(k + 1)·f⌋ > ⌊k·f⌋                (f = fraction: rows ⌈1/f⌉ − 1, … evenly spread)

so the first K rows of the stream hold exactly ⌊K·f⌋ synthetic ones (and any run of k consecutive
rows ⌊k·f⌋ or ⌈k·f⌉): the share is what was asked, not a binomial draw around it. A synthetic row is

    s = (s_0 … s_{L−1}) uniform over the ids [0, V),  L uniform over [min_len, max_len],
    row = (s, s, s, …)[:T + 1]        (s repeated to fill the row of T + 1 tokens)

— the distribution the induction score draws from (`attngeo.lm.induction`: uniform over the whole
vocabulary, special ids included), so a model trained on it learns to copy every id. Its content
comes from `np.random.default_rng([seed, k])`: every stream row gets fresh spans (a model cannot
memorise them over epochs), while the mixture stays a fixed function of the stream index, so a
resumed loader (same position, same k) sees the same rows. Every other row is the text row the
shuffle put at k, unchanged (the replaced text rows differ from epoch to epoch, so no text is
dropped for good).
"""
from __future__ import annotations

import numpy as np

# The mixture's definition, for keys of runs trained on it: 1 — spans fixed by the row index (every
# epoch the same rows); 2 — spans drawn per stream row (this module).
STREAM_VERSION = 2


class CopyMix:
  """`mix(k, row)`: stream row k, or a repeated random sequence of `width` tokens in its place
  (see the module docstring)."""

  def __init__(self, fraction: float, vocab_size: int, width: int, min_len: int = 8, max_len: int | None = None,
               seed: int = 0):
    self.fraction, self.vocab_size, self.width, self.seed = float(fraction), int(vocab_size), int(width), int(seed)
    self.min_len, self.max_len = int(min_len), int(max_len or max(self.width // 2, min_len))
    if not 0.0 <= self.fraction <= 1.0:
      raise ValueError(f"copy fraction must lie in [0, 1]; got {fraction}")
    if not 1 <= self.min_len <= self.max_len:
      raise ValueError(f"copy lengths need 1 <= min_len <= max_len; got {self.min_len}, {self.max_len}")
    if self.vocab_size < 1:
      raise ValueError(f"vocab_size must be positive; got {vocab_size}")
    if self.width < 1:
      raise ValueError(f"width must be positive; got {width}")

  def synthetic(self, k: int) -> np.ndarray | None:
    """Stream row k's repeated random sequence int32[width], or None when row k keeps its text."""
    if np.floor((k + 1) * self.fraction) <= np.floor(k * self.fraction):
      return None
    rng = np.random.default_rng([self.seed, k])
    s = rng.integers(0, self.vocab_size, rng.integers(self.min_len, self.max_len + 1))
    return np.resize(s, self.width).astype(np.int32)

  def __call__(self, k: int, row: dict) -> dict:
    synthetic = self.synthetic(k)
    return row if synthetic is None else {"tokens": synthetic}
