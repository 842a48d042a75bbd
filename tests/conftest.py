import atexit
import fcntl
import gc
import importlib.util
import json
import os
import shutil
import sys

import pytest

# Tests run on the CPU unless JAX_PLATFORMS says otherwise (experiments/gpu_check.sh sets cuda);
# sharding tests spawn their own 8-device processes.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# JAX's persistent compilation cache, shared by the xdist workers, every subprocess a test starts (they
# read these variables at import) and every later run on this machine, clean clones included: a program
# compiled once — the same tiny model in several tests, the same CLI command in a subprocess, the same
# test in yesterday's clone — is loaded, not compiled again. Every program is kept, however fast it
# compiled: the suite is thousands of small compiles (tests/test_magnetic.py alone: 96 s cold, 28 s from
# the cache with no threshold, ~90 s with JAX's 1 s threshold or 0.2 s; 1,013 entries, 7 MB). Entries are
# keyed by the program's HLO, the jax/jaxlib version, the backend and the flags, so a changed kernel is
# compiled anew and nothing stale can be served. No size bound: JAX's LRU bookkeeping (a lock and an
# access-time file per entry, a directory scan per write) made the workers wait on each other (70 % CPU,
# the suite past 33 min against 17 min without it).
# It lives in the user's cache ($XDG_CACHE_HOME or ~/.cache, attngeo/jax-tests); ATTNGEO_TEST_JAX_CACHE
# moves it ("" turns the cache off: every run cold).
_cache = os.environ.get("ATTNGEO_TEST_JAX_CACHE",
                        os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                     "attngeo", "jax-tests"))
if _cache:
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Every process that shares that cache writes its entries atomically (tests/process_setup/sitecustomize.py says
# why): this one by importing the hook, the subprocesses tests start through PYTHONPATH.
_setup = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_setup")
os.environ["PYTHONPATH"] = os.pathsep.join([_setup] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                       if p and p != _setup])
_spec = importlib.util.spec_from_file_location("attngeo_tests_process_setup", os.path.join(_setup, "sitecustomize.py"))
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))

# Worker processes (pytest-xdist) and the subprocesses tests start use glibc's transparent huge pages,
# as the `attngeo` command does (attngeo.hugepages): XLA's fresh n × n buffers otherwise fault in
# 4 KiB at a time. Read at process start, so it reaches the processes started from here on.
from attngeo import hugepages as _hugepages  # noqa: E402

os.environ.update(_hugepages.huge_pages_env(os.environ) or {})

# One BLAS thread per test process (numpy/scipy's OpenBLAS; the float64 references): two xdist workers on two
# cores each starting a pool of two spinning threads ran the suite 100 s of CPU slower (575 against 673
# worker-seconds of tests, warm cache). Set whatever the shell exported. Subprocesses read the variable; this
# process, whose numpy may be loaded already, is limited through threadpoolctl.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
  os.environ[_var] = "1"
import threadpoolctl  # noqa: E402

threadpoolctl.threadpool_limits(1)


# ----------------------------------------------------------------------------- order

# The trainer's tests start processes (an 8-device mesh, two `jax.distributed` processes, a run killed and
# resumed: about 40 s together). Collected last (test_train.py sorts late), they ended the suite on one xdist
# worker while the other had nothing left (a 22-29 s tail in warm runs); first, the other worker fills the time.
FIRST = ("test_train.py",)


def pytest_collection_modifyitems(items):
  items.sort(key=lambda item: os.path.basename(str(item.path)) not in FIRST)       # stable: the rest keep their order


# ----------------------------------------------------------------------------- memory maps

# Every program a worker compiles or loads from the cache stays mapped while JAX's in-memory caches hold it.
# A whole warm suite left one xdist worker with 63,000 memory maps against Linux's default vm.max_map_count
# of 65,530: past it `mmap` fails, so XLA aborts while loading a cached program ("Failed to materialize
# symbols"), or a thread cannot start (orbax's "can't start new thread"), and the worker dies. Between test
# files, a worker holding more than half the limit drops JAX's caches (`jax.clear_caches`); later tests
# load their programs again from the persistent cache.
def map_count() -> int:
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:                                      # not Linux: no limit read, nothing dropped
    return 0


def map_limit() -> int:
  try:
    with open("/proc/sys/vm/max_map_count") as f:
      return int(f.read())
  except (OSError, ValueError):
    return 0


MAP_BUDGET = map_limit() // 2


@pytest.fixture(autouse=True, scope="module")
def _bounded_memory_maps():
  yield
  if MAP_BUDGET and "jax" in sys.modules and map_count() > MAP_BUDGET:
    sys.modules["jax"].clear_caches()
    gc.collect()


# ----------------------------------------------------------------------------- exit

# An xdist worker's last act is the interpreter's teardown: freeing the thousands of compiled programs and
# traced functions its tests made, then JAX's and orbax's exit handlers. That took the last 10 s of a
# 290 s warm suite, after every test had reported (3.5 → 1.6 s on four files). The worker has sent its
# reports and results by its unconfigure hook, so it leaves there: a handler registered last runs first and
# ends the process. ATTNGEO_TEST_FAST_EXIT=0 keeps the full teardown (to debug an exit handler).
def _exit_now():
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  # An xdist worker itself (not a pytest a test starts, which inherits PYTEST_XDIST_WORKER) and not under
  # coverage, whose data is saved by an exit handler.
  if (hasattr(config, "workerinput") and "coverage" not in sys.modules
          and os.environ.get("ATTNGEO_TEST_FAST_EXIT", "1") != "0"):
    atexit.register(_exit_now)


# ----------------------------------------------------------------------------- tiny runs made once


@pytest.fixture(scope="session")
def made_once(tmp_path_factory):
  """`made_once(name, make)` → (folder, value): `make(folder)` runs once per test session for all its
  xdist workers; the first to ask makes `name` in a folder the workers share (the base temp's parent
  under xdist, as xdist documents) holding an exclusive lock, the others wait for it and read the same
  folder and `value` (what `make` returned, kept as JSON). Consumers read the folder, never write to it."""
  base = tmp_path_factory.getbasetemp()
  root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "made_once"
  root.mkdir(exist_ok=True)

  def get(name, make):
    folder, done = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)             # a maker that failed part-way
        done.with_suffix(".tmp").write_text(json.dumps(make(str(folder))))
        done.with_suffix(".tmp").rename(done)
    return str(folder), json.loads(done.read_text())
  return get
