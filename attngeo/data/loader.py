"""Grain input pipelines: shuffle → repeat → batch, per process, with checkpointable iterator state.

`loader(source, batch_size, seed)` reads any random-access source (a `tfds.data_source`, a list
of records) as a grain `MapDataset`; the iterator's `get_state()/set_state()` goes into training
checkpoints, so a resumed run sees the same batches.
"""
from __future__ import annotations

import grain


def loader(source, batch_size: int, seed: int = 0, *, shuffle: bool = True):
  """Infinite grain iterator of batches (dicts of stacked numpy arrays) with `get_state/set_state`."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive; got {batch_size}")
  ds = grain.MapDataset.source(source)
  if shuffle:
    ds = ds.seed(seed).shuffle()
  return iter(ds.repeat(None).batch(batch_size, drop_remainder=True))
