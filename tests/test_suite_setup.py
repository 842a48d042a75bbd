"""The suite's own process setup (conftest.py, tests/process_setup/): JAX's shared compilation cache is written
atomically in every process (each process of a distributed run too), one BLAS thread per process, bytecode
kept, memory maps bounded."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import MAP_BUDGET

PROBE = ("import jax\nfrom jax._src import compiler, lru_cache\nimport threadpoolctl\n"
         "print(getattr(lru_cache.LRUCache.put, 'atomic', False), getattr(compiler._cache_write, 'every_process', False), "
         "max(p['num_threads'] for p in threadpoolctl.threadpool_info()))")


def test_every_process_writes_the_cache_atomically_with_one_blas_thread():
  from jax._src import compiler, lru_cache
  import threadpoolctl
  assert getattr(lru_cache.LRUCache.put, "atomic", False) and getattr(compiler._cache_write, "every_process", False)
  assert max(p["num_threads"] for p in threadpoolctl.threadpool_info()) == 1
  out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
  assert out.stdout.split() == ["True", "True", "1"], out.stderr


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


UNMAP = """
import gc, sys
import jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
from conftest import map_count

def loss(y, i):
  for j in range(6):
    y = jnp.tanh(y @ y.T * (i + j)) + jax.nn.softmax(y, axis=j % 2)
  return y.sum()

x = jnp.ones((64, 64))
jax.jit(jax.grad(lambda y: loss(y, -1.0)))(x).block_until_ready()    # the runtime's own first maps
for attempt in range(3):      # about one process in ten maps no new code for its programs at all: try again
  jax.clear_caches(); gc.collect()
  before = map_count()
  for i in range(12):
    jax.jit(jax.grad(lambda y, i=i: loss(y, 100 * attempt + i)))(x).block_until_ready()
  held = map_count()
  if held - before >= 12:
    break
jax.clear_caches(); gc.collect()
print(before, held, map_count())
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="memory maps are read from Linux's /proc")
def test_dropping_jax_caches_unmaps_the_programs_it_held():
  """The map bound (conftest.py) relies on JAX's caches keeping each compiled program's code mapped, and on
  `jax.clear_caches` releasing it. In a fresh process without the persistent cache: in a long-lived one the
  kernel merges new maps into neighbours of equal permissions, and the count says little."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  out = subprocess.run([sys.executable, "-c", UNMAP, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=120, check=True)
  before, held, after = map(int, out.stdout.split())
  assert held - before >= 12 and after - before <= (held - before) // 4, (before, held, after)
  assert 0 < MAP_BUDGET <= 1 << 30
