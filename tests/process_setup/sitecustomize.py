"""Loaded by every Python process of the test suite (conftest.py puts this folder first on PYTHONPATH and
imports it): JAX's persistent compilation cache, which the suite shares between its xdist workers and the
subprocesses tests start, written atomically.

JAX 0.10's file cache without a size bound (`jax._src.lru_cache.LRUCache`, eviction off) writes an entry
with `Path.write_bytes` — truncate, then write — and reads entries without a lock. A process that reads an
entry while another writes it, or two processes writing one entry at once (two workers compiling the same
program: most of a cold run), get a torn file; deserialising one killed an xdist worker with SIGSEGV in
`compilation_cache.get_executable_and_time`. Here `put` writes a temporary file beside the entry and
renames it over the entry (atomic on POSIX), so a reader finds no entry or a whole one.

Every process of a `jax.distributed` run writes its entries too (`_every_process_writes`): JAX writes only
from process 0 (against contention on shared filesystems such as GCS), and the keys hold the devices, so
process 1 of tests/test_train.py's two-process run compiled every program anew each run (8 s of CPU of its
13 s; 42 programs).

It also keeps the suite's Python bytecode (`bytecode_cache` below).

The patches are applied when JAX imports `jax._src.lru_cache` and `jax._src.compiler` (an import hook), so a
process that never imports JAX (`attngeo --help`, whose tests check exactly that) still does not. Without
these internals (another JAX) nothing is changed.
"""
import importlib.abc
import importlib.machinery
import os
import sys
import tempfile

MODULE = "jax._src.lru_cache"
COMPILER = "jax._src.compiler"


def _atomic_put(put, suffix):
  def atomic_put(self, key: str, value: bytes) -> None:
    if self.eviction_enabled:                  # JAX's own locked path (a size-bounded cache; not the suite's)
      return put(self, key, value)
    if not key:
      raise ValueError("key cannot be empty")
    path = os.path.join(str(self.path), f"{key}{suffix}")
    if os.path.exists(path):
      return None
    fd, tmp = tempfile.mkstemp(dir=str(self.path), prefix=f".{key}.", suffix=".tmp")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(value)
      os.replace(tmp, path)
    except BaseException:
      if os.path.exists(tmp):
        os.unlink(tmp)
      raise
    return None
  return atomic_put


def patch(module) -> bool:
  """Replace `LRUCache.put` of the loaded `jax._src.lru_cache` (once); False if its internals differ."""
  cache = getattr(module, "LRUCache", None)
  if cache is None or not hasattr(module, "_CACHE_SUFFIX") or getattr(cache.put, "atomic", False):
    return False
  cache.put = _atomic_put(cache.put, module._CACHE_SUFFIX)
  cache.put.atomic = True
  return True


def _every_process_writes(write, module):
  def cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
    if (module.distributed.global_state.process_id == 0 or host_callbacks
            or compile_time_secs < module.config.persistent_cache_min_compile_time_secs.value):
      return write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
    try:
      module.compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                       int(compile_time_secs))
    except Exception:                        # an entry not written is compiled again next time, nothing worse
      pass
  return cache_write


def patch_compiler(module) -> bool:
  """Replace `_cache_write` of the loaded `jax._src.compiler` (once); False if its internals differ."""
  write = getattr(module, "_cache_write", None)
  if (write is None or getattr(write, "every_process", False)
          or not all(hasattr(module, a) for a in ("distributed", "config", "compilation_cache"))):
    return False
  module._cache_write = _every_process_writes(write, module)
  module._cache_write.every_process = True
  return True


PATCHES = {MODULE: patch, COMPILER: patch_compiler}


class _Hook(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name not in PATCHES:
      return None
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None:
      return spec
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      PATCHES[name](module)
    spec.loader.exec_module = exec_module
    return spec


def bytecode_cache() -> None:
  """Python's bytecode of the package and of the tests (pytest's assertion-rewritten modules) written to
  `__pycache__` (git ignores it) even where PYTHONDONTWRITEBYTECODE is set, as on this project's machines:
  there every xdist worker re-parsed and re-rewrote 190 test modules at collection (4.6 of its 9.8 s) and
  every subprocess recompiled the package. The import system checks each file against its source's mtime
  and size, so an edited module is compiled anew. ATTNGEO_TEST_BYTECODE=0 leaves the setting alone."""
  if os.environ.get("ATTNGEO_TEST_BYTECODE", "1") != "0":
    sys.dont_write_bytecode = False


bytecode_cache()
for _name, _patch in PATCHES.items():
  if _name in sys.modules:
    _patch(sys.modules[_name])
if not all(name in sys.modules for name in PATCHES) and not any(isinstance(f, _Hook) for f in sys.meta_path):
  sys.meta_path.insert(0, _Hook())
