"""The suite's own process setup (conftest.py, tests/process_setup/): JAX's shared compilation cache is written
atomically in every process, one BLAS thread per process, bytecode kept."""
import os
import subprocess
import sys

import numpy as np

PROBE = ("import jax\nfrom jax._src import lru_cache\nimport threadpoolctl\n"
         "print(getattr(lru_cache.LRUCache.put, 'atomic', False), "
         "max(p['num_threads'] for p in threadpoolctl.threadpool_info()))")


def test_every_process_writes_the_cache_atomically_with_one_blas_thread():
  from jax._src import lru_cache
  import threadpoolctl
  assert getattr(lru_cache.LRUCache.put, "atomic", False)
  assert max(p["num_threads"] for p in threadpoolctl.threadpool_info()) == 1
  out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
  assert out.stdout.split() == ["True", "1"], out.stderr


def test_an_entry_appears_whole_by_a_rename_and_is_written_once(tmp_path, monkeypatch):
  """A reader never sees a part of an entry: the bytes go to a temporary beside it, which is renamed over it."""
  from jax._src import lru_cache
  cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
  renames = []
  replace = os.replace
  monkeypatch.setattr(os, "replace", lambda a, b: renames.append((a, b)) or replace(a, b))
  data = np.random.default_rng(0).bytes(1 << 20)
  cache.put("k", data)
  cache.put("k", b"other")                                 # an entry is never rewritten
  (src, dst), = renames
  assert os.path.dirname(src) == str(tmp_path) and dst == os.path.join(str(tmp_path), "k-cache")
  assert cache.get("k") == data and os.listdir(tmp_path) == ["k-cache"]


def test_every_process_keeps_its_bytecode():
  assert not sys.dont_write_bytecode
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
  out = subprocess.run([sys.executable, "-c", "import sys; print(sys.dont_write_bytecode)"], env=env,
                       capture_output=True, text=True, timeout=60, check=True)
  assert out.stdout.split() == ["False"], out.stderr

