"""The one timing helper of the benchmarks: wall times after warm-up (median, or several calls interleaved), the
ratio of two interleaved calls with its interval (`paired_ratio`), XLA's peak memory, and what a process really
holds (`status_bytes`, `bounded_data`)."""
from __future__ import annotations

import contextlib
import fractions
import math
import os
import statistics
import time
from typing import Callable, NamedTuple

try:
  import resource
except ImportError:                                    # not POSIX: no data limit to set
  resource = None


def median_seconds(call: Callable[[], object], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `call()` (its result blocked on) over `repeats` runs after `warmup` runs."""
  return statistics.median(interleaved_seconds({"call": call}, repeats, warmup)["call"])


def interleaved_seconds(calls: dict, repeats: int, warmup: int = 1) -> dict:
  """{name: [seconds per run]} of several `call()`s timed in alternation: run r of every call before run
  r + 1 of any, so a slow spell of a shared machine falls on all of them alike and their ratios hold; every
  other round runs them in reverse order, so that no call always runs right after the same one (the last of a
  round runs again first in the next, each call in turn). Run r of two calls is a pair (`paired_ratio`)."""
  import jax
  for call in calls.values():
    for _ in range(warmup):
      jax.block_until_ready(call())
  times = {name: [] for name in calls}
  for r in range(max(repeats, 1)):
    for name, call in (list(calls.items()) if r % 2 == 0 else list(calls.items())[::-1]):
      t0 = time.perf_counter()
      jax.block_until_ready(call())
      times[name].append(time.perf_counter() - t0)
  return times


class Interval(NamedTuple):
  """A median and a distribution-free confidence interval for it (`low`, `high`: NaN where too few values)."""
  median: float
  low: float
  high: float


def median_interval(values, level: float = 0.95) -> Interval:
  """The median of `values` and the sign-test interval for it: with x_(1) ≤ … ≤ x_(n) and K ~ Binomial(n, ½),
  [x_(k), x_(n+1−k)] for the largest k with P(K < k) ≤ (1 − level)/2, which covers the median of any continuous
  distribution the values are drawn from independently with probability 1 − 2·P(K < k) ≥ `level`. NaN bounds
  where n is too small for `level` (n < 6 at 95 %: even [x_(1), x_(n)] misses with probability 2^(1−n))."""
  x = sorted(float(v) for v in values)
  n = len(x)
  if any(math.isnan(v) for v in x):
    raise ValueError(f"median_interval: values must be numbers; got NaN among {n}")
  if n == 0:
    return Interval(math.nan, math.nan, math.nan)
  tail, k, below = fractions.Fraction((1 - level) / 2), 0, 0      # below = 2^n·P(K ≤ k), exact for any n
  while k < n // 2:
    below += math.comb(n, k)
    if fractions.Fraction(below, 2 ** n) > tail:
      break
    k += 1
  if k == 0:
    return Interval(statistics.median(x), math.nan, math.nan)
  return Interval(statistics.median(x), x[k - 1], x[n - k])


def paired_ratio(times, reference, level: float = 0.95) -> Interval:
  """`median_interval` of the run-by-run ratios times[r] / reference[r] of two interleaved calls
  (`interleaved_seconds`): a slow spell that falls on run r falls on both, so their ratio keeps it out, where
  the ratio of the two fastest runs takes each from its own moment. The interval assumes the runs' ratios are
  independent draws (a drift slower than one round cancels in them)."""
  if len(times) != len(reference):
    raise ValueError(f"paired runs: {len(times)} times against {len(reference)} reference times")
  if not all(r > 0 for r in reference):
    raise ValueError(f"paired runs: reference times must be > 0 seconds; got {min(reference)}")
  return median_interval([t / r for t, r in zip(times, reference)], level)


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


def status_bytes(field: str) -> int | None:
  """A `/proc/self/status` size in bytes ("VmRSS", "VmHWM", "VmData"), or None where it cannot be read."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        name, _, value = line.partition(":")
        if name == field:
          return int(value.split()[0]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def reset_peak() -> bool:
  """Restart VmHWM (the resident high-water mark) at the current resident size (Linux `clear_refs` 5)."""
  try:
    with open("/proc/self/clear_refs", "w") as f:
      f.write("5")
    return True
  except OSError:
    return False


@contextlib.contextmanager
def bounded_data(limit: int):
  """Inside, this process's data segment (RLIMIT_DATA: its private writable mappings, which is where malloc and
  XLA:CPU's buffers come from) may grow by at most `limit − VmRSS` beyond its current size, so the memory a
  program allocates cannot take the process past `limit` bytes (pages of files, and memory mapped before,
  are not counted). An allocation past the cap fails: XLA:CPU reports it as a runtime error of the program
  that asked, and the process lives on instead of the kernel's OOM killer ending it. The cap is the
  process's, not the program's: another thread allocating at that moment fails too (tqdm's monitor would
  raise MemoryError; a C++ allocation failure in a library can abort), and child processes inherit it, so keep
  the block to the timed calls. Never loosens a soft or hard limit already set; the previous one is
  restored on leaving. Yields the data-segment cap in bytes, or None where it cannot be set (not Linux)."""
  rss, data = status_bytes("VmRSS"), status_bytes("VmData")
  if resource is None or rss is None or data is None:
    yield None
    return
  old = resource.getrlimit(resource.RLIMIT_DATA)
  cap = data + max(limit - rss, 0)
  for bound in old:
    if bound != resource.RLIM_INFINITY:
      cap = min(cap, bound)
  resource.setrlimit(resource.RLIMIT_DATA, (cap, old[1]))
  try:
    yield cap
  finally:
    resource.setrlimit(resource.RLIMIT_DATA, old)


def add_lengths(parser, seqs: list[int], batches: list[int]) -> None:
  """`--seqs` (key counts) and `--batches` (one batch per length) on a benchmark's parser; `check_lengths` after
  parsing."""
  from attngeo import config
  parser.add_argument("--seqs", type=config.int_list, default=tuple(seqs),
                      help=f"key counts (default {','.join(map(str, seqs))})")
  parser.add_argument("--batches", type=config.int_list, default=tuple(batches),
                      help=f"batch per length (default {','.join(map(str, batches))})")


def check_lengths(parser, args, arrays: int, width: int) -> None:
  """One line, exit 2, unless `args` has one batch per length (`add_lengths`) and each length's `arrays` float32
  arrays of [batch, n, width] (inputs and gradients) fit in this machine's memory."""
  if len(args.batches) != len(args.seqs):
    parser.error(f"--batches must give one batch per --seqs length ({len(args.seqs)}); got {len(args.batches)}")
  try:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (AttributeError, ValueError, OSError):       # not POSIX: no guard
    return
  for n, batch in zip(args.seqs, args.batches):
    need = 4 * arrays * batch * n * width
    if need > memory:
      parser.error(f"--seqs {n} at batch {batch} needs {need / 2**30:.0f} GiB for its inputs and gradients alone; "
                   f"this machine has {memory / 2**30:.0f} GiB")


def print_rows(parser, argv, rows, cpu_only: bool = False) -> int:
  """A table benchmark's run: glibc's huge pages (`hugepages.reexec`), SIGTERM as Ctrl-C, JAX started (`start_jax`),
  then `rows()`, a generator that prints a row of the table for each item it yields. Ctrl-C or SIGTERM ends it with
  one line saying whether a row was finished (`interrupts.rows_kept`: exit 130 or 143); else 0."""
  from attngeo import hugepages, interrupts
  hugepages.reexec()
  printed = False
  try:
    with interrupts.as_interrupts():          # SIGTERM as Ctrl-C; neither lost in an import or a gc callback
      start_jax(parser, cpu_only)
      for _ in rows():
        printed = True
  except KeyboardInterrupt as stop:                 # Ctrl-C, or SIGTERM (`interrupts.Terminated`)
    return interrupts.rows_kept(parser.prog, from_shell=argv is None, printed=printed, stop=stop)
  return 0


def start_jax(parser, cpu_only: bool = False) -> str:
  """Import JAX and start its backend, with Ctrl-C held until it has (`interrupts.deferred`: a signal landing in
  JAX's import or garbage-collection callbacks was lost or broke the import); returns the backend's name. A backend
  that cannot start (a `JAX_PLATFORMS` this machine lacks) is one line, exit 2, as is one other than the CPU where
  `cpu_only`."""
  from attngeo import interrupts
  with interrupts.deferred():
    import jax
    try:
      backend = jax.default_backend()
    except Exception as e:                           # RuntimeError, or a bare AssertionError for an absent CUDA
      why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      platforms = os.environ.get("JAX_PLATFORMS", "")
      parser.error(f"JAX could not start a backend (JAX_PLATFORMS={platforms!r}): {why}")
  if cpu_only and backend != "cpu":
    parser.error(f"this benchmark reads XLA:CPU's profile; the backend is {backend}")
  return backend
