"""Grain input pipelines: shuffle → repeat → batch, each process reading only its own rows.

`loader(source, batch_size, seed)` reads any random-access source (a `tfds.data_source`, a list
of records) as a grain `MapDataset`. `batch_size` is the GLOBAL batch B; with P processes, process
i yields the contiguous rows `[s·B + i·B/P, s·B + (i+1)·B/P)` of the shuffled, repeated stream at
step s — so the union over processes is exactly the global batch s, and each process reads (and
decodes) only B/P records of it (big_vision's per-host batches; `sharding.global_batch`
assembles the global array). The iterator's `get_state()/set_state()` (its position) goes into
training checkpoints, so a resumed run sees the same batches.
"""
from __future__ import annotations

import grain


def loader(source, batch_size: int, seed: int = 0, *, shuffle: bool = True, num_processes: int | None = None,
           process_index: int | None = None, prefetch: int = 16, threads: int = 4, mix=None):
  """Infinite grain iterator of this process's rows of each global batch (dicts of stacked arrays).

  Args:
    source: random-access records (`len` and `__getitem__`).
    batch_size: the global batch B; must divide by the process count P.
    seed: shuffle seed (the same on every process: they share one order).
    shuffle: shuffle the records (else read them in order).
    num_processes, process_index: default `jax.process_count()`, `jax.process_index()`.
    prefetch, threads: batches read ahead by `threads` reader threads (0, 0: read on demand).
    mix: optional `mix(k, record) -> record` applied to the k-th record of the shuffled, repeated
      stream (k = epoch·N + position, the same on every process; e.g. `attngeo.data.copying.CopyMix`).
  Returns:
    A grain `DatasetIterator` yielding batches of B/P records, with `get_state/set_state`.
  """
  if num_processes is None or process_index is None:
    import jax
    num_processes = jax.process_count() if num_processes is None else num_processes
    process_index = jax.process_index() if process_index is None else process_index
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive; got {batch_size}")
  if batch_size % num_processes:
    raise ValueError(f"batch_size {batch_size} must divide over {num_processes} processes")
  if len(source) < batch_size:
    raise ValueError(f"the source has {len(source)} records, fewer than one batch of {batch_size}")
  ds = grain.MapDataset.source(source)
  if shuffle:
    ds = ds.seed(seed).shuffle()
  ds = ds.repeat(None)
  if mix is not None:
    ds = ds.map_with_index(mix)
  local = ds.batch(batch_size // num_processes, drop_remainder=True)
  options = grain.ReadOptions(num_threads=threads, prefetch_buffer_size=prefetch)
  return iter(local[process_index::num_processes].to_iter_dataset(options))
