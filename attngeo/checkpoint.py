"""Orbax checkpoints of a training state: save, restore into a target structure and sharding.

A checkpoint step holds two items: `state` (the train-state pytree of `attngeo.train`: model
and optimizer state, EMA, RNG key, step) and `data` (the input iterator's JSON state), so a
resumed run continues with the same batches.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


def manager(workdir: str, keep: int = 2) -> ocp.CheckpointManager:
  """The `CheckpointManager` of `workdir/ckpt` keeping the newest `keep` steps."""
  opts = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  return ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "ckpt")), options=opts)


def _pure(state):
  return jax.tree.map(lambda v: v.get_value() if isinstance(v, nnx.Variable) else v, state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def save(mngr, step: int, state, data_state: dict):
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_pure(state)),
                                          data=ocp.args.JsonSave(data_state)))


def restore(mngr, step: int, state, shardings):
  """Restore into `state`'s structure and shardings; a shape mismatch fails with a clear message."""
  target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x), sharding=s),
                        _pure(state), _pure(shardings))
  try:
    out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                     data=ocp.args.JsonRestore()))
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"checkpoint at step {step} in {mngr.directory} does not match this model/optimizer "
                     f"(another model shape or config?): {e}") from e
  restored = jax.tree.map(lambda v, x: v.replace(x) if isinstance(v, nnx.Variable) else x, state, out["state"],
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
  return restored, out["data"]
