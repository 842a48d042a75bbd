"""Device meshes, logical-axis sharding rules and per-process batches (single- and multi-host).

* Mesh axes `(data, fsdp, tensor)`. Parameters carry logical axis names in their `axes`
  metadata (`attngeo.nn`); `RULES` maps each logical name to mesh axes, maxtext-style. A mapping
  is dropped (that dimension replicated) when the dimension does not divide the mesh axes' size
  or when the mesh axis is already used by another dimension of the same value.
* The global batch is split over `data × fsdp`: each process holds `global / process_count`
  contiguous rows (`process_slice`) and `global_batch` assembles them into one global array
  with `jax.make_array_from_process_local_data`.
* `initialize_distributed` starts multi-process JAX from the environment.
"""
from __future__ import annotations

import os

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# Logical axis -> mesh axis (edit here or pass `rules=` to change the layout).
RULES = (("batch", BATCH_AXES), ("embed", "fsdp"), ("heads", "tensor"), ("mlp", "tensor"),
         ("vocab", "tensor"), ("kv", None), ("cond", None))


def initialize_distributed() -> bool:
  """Start multi-process JAX from the environment, before any backend is touched.

  `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` (GPU clusters via
  `tpu/launch_gpu.sh`, localhost tests; CPU collectives use gloo), or automatic detection on a
  Cloud TPU pod slice (several `TPU_WORKER_HOSTNAMES`). Returns whether it initialised.
  """
  addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
  if addr:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(addr, int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"]))
    return True
  if len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
    jax.distributed.initialize()
    return True
  return False


def make_mesh(shape=(1, 1, 1), devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices; the product of `shape` must equal their count."""
  devices = jax.devices() if devices is None else devices
  shape = tuple(int(s) for s in shape)
  if len(shape) != 3 or any(s < 1 for s in shape):
    raise ValueError(f"mesh must be three positive sizes (data, fsdp, tensor); got {shape}")
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} devices; "
                     f"{len(devices)} are available")
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_spec(axes, shape, mesh: Mesh, rules=RULES) -> P:
  """PartitionSpec for a value of `shape` with logical `axes`: rules applied where they divide."""
  rules, used, spec = dict(rules), set(), []
  for name, dim in zip(axes, shape):
    target = rules.get(name)
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    size = int(np.prod([mesh.shape[t] for t in targets])) if targets else 1
    if targets and not used & set(targets) and dim % size == 0 and size > 1:
      spec.append(targets[0] if len(targets) == 1 else targets)
      used |= set(targets)
    else:
      spec.append(None)
  return P(*spec)


def state_shardings(state, mesh: Mesh, rules=RULES):
  """NamedSharding for every leaf of an NNX state: from its `axes` metadata, else replicated."""
  def one(v):
    axes = getattr(v, "axes", None) if isinstance(v, nnx.Variable) else None
    value = v.get_value() if isinstance(v, nnx.Variable) else v
    if isinstance(value, tuple):   # an empty pytree node (optax.MaskedNode of a partitioned optimizer)
      return v
    spec = logical_to_spec(axes, np.shape(value), mesh, rules) if axes else P()
    return v.replace(NamedSharding(mesh, spec)) if isinstance(v, nnx.Variable) else NamedSharding(mesh, spec)
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def process_slice(global_size: int, num_processes: int | None = None, index: int | None = None) -> slice:
  """The contiguous rows `[i·B/P, (i+1)·B/P)` of a global batch of `global_size` that process i feeds."""
  num_processes = jax.process_count() if num_processes is None else num_processes
  index = jax.process_index() if index is None else index
  if global_size % num_processes:
    raise ValueError(f"global batch {global_size} does not split over {num_processes} processes")
  n = global_size // num_processes
  return slice(index * n, (index + 1) * n)


def global_batch(local, mesh: Mesh):
  """This process's rows of every array -> globally sharded jax.Arrays (rows over data × fsdp)."""
  sh = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sh, np.asarray(x)), local)
