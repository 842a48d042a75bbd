"""The one timing helper of the benchmarks: wall times after warm-up (median, or several calls interleaved), and
XLA's peak memory."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `call()` (its result blocked on) over `repeats` runs after `warmup` runs."""
  return statistics.median(interleaved_seconds({"call": call}, repeats, warmup)["call"])


def interleaved_seconds(calls: dict, repeats: int, warmup: int = 1) -> dict:
  """{name: [seconds per run]} of several `call()`s timed in alternation: run r of every call before run
  r + 1 of any, so a slow spell of a shared machine falls on all of them alike and their ratios hold."""
  import jax
  for call in calls.values():
    for _ in range(warmup):
      jax.block_until_ready(call())
  times = {name: [] for name in calls}
  for _ in range(max(repeats, 1)):
    for name, call in calls.items():
      t0 = time.perf_counter()
      jax.block_until_ready(call())
      times[name].append(time.perf_counter() - t0)
  return times


def peak_bytes(compiled) -> int | None:
  """Arguments + outputs + temporaries − aliased bytes of a compiled program (None if unknown)."""
  m = compiled.memory_analysis()
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def timed(fn, args, repeats: int) -> tuple[float, int | None]:
  """(median seconds, peak bytes) of jitted `fn(*args)`; compiled once, warm-up run excluded."""
  import jax
  compiled = jax.jit(fn).lower(*args).compile()
  return median_seconds(lambda: compiled(*args), repeats), peak_bytes(compiled)
