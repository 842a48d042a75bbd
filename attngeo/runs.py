"""Run folders → models: rebuild a run's model and training config from its `config.json` and load its weights.

A training run holds `config.json` (`attngeo.files.write_config`: every config of the run, and under
`"classes"` the class of each dataclass one, e.g. `"train": "attngeo.train_config.TrainConfig"`),
`ckpt/` (orbax steps, `attngeo.checkpoint`) and `metrics.jsonl`; a weights-only run `config.json` +
`weights.npz` (`write_weights_run`); an imported model is written as either (`write_checkpoint_run`: step 0
of a training run). `load_run` reads both kinds: the model (`attngeo.nn.registry`),
its training config as the class that wrote it, its weights.
"""
from __future__ import annotations

import dataclasses
import os

from attngeo import config as config_lib, files


def load_model(model, workdir: str, step: int | None = None, use_ema: bool = False, *, with_step: bool = False):
  """Load the weights of checkpoint `step` (default: the newest intact one) in `workdir` into `model`.

  Only the model's weights are read (no optimizer state); `use_ema` loads their EMA instead
  (runs trained with `TrainConfig.ema`). Returns the model, or (model, the step loaded) with
  `with_step` — a newer step may have been skipped as corrupt, or written meanwhile.
  """
  from attngeo import checkpoint
  loaded = checkpoint.restore_params(workdir, model, step, use_ema=use_ema)
  return (model, loaded) if with_step else model


# Trainer configs a run written before config.json named its classes may hold (chosen by their fields).


LEGACY_TRAIN_CLASSES = ("attngeo.train.TrainConfig",)
# Config classes run folders recorded that are now another: `LMTrainConfig`'s split rates moved into TrainConfig.
RENAMED_CLASSES = {"attngeo.lm.recipe.LMTrainConfig": "attngeo.train_config.TrainConfig"}


def _import_class(name: str):
  """`"attngeo.train_config.TrainConfig"` → the class (a renamed one: its new class); only attngeo's own modules are imported."""
  import importlib
  name = RENAMED_CLASSES.get(name, name)
  module, _, qualname = name.rpartition(".")
  if not module.startswith("attngeo."):
    raise ValueError(f"config class {name!r} is not an attngeo class")
  try:
    cls = getattr(importlib.import_module(module), qualname)
  except (ImportError, AttributeError):
    raise ValueError(f"config class {name!r} does not exist in this version of attngeo") from None
  return cls


def train_config(workdir: str, saved: dict | None = None):
  """The training config of a run folder (`saved`: its config.json, read if not given), rebuilt as the
  class recorded under "classes" — a subclass of `attngeo.train.TrainConfig` — or, for a run written
  before classes were recorded, as the first of `LEGACY_TRAIN_CLASSES` that has every saved field. Its
  `workdir` is the folder it was read from, not the one recorded: a moved or copied run folder trains on,
  and writes, where it now lies."""
  from attngeo import train
  saved = files.read_config(workdir) if saved is None else saved
  fields = saved.get("train")
  if not isinstance(fields, dict):
    raise ValueError(f"{workdir}/config.json records no train config; runs written by attngeo.train record one")
  fields = {**fields, "workdir": workdir}
  recorded = (saved.get("classes") or {}).get("train")
  if recorded:
    cls = _import_class(recorded)
    if not (isinstance(cls, type) and issubclass(cls, train.TrainConfig)):
      raise ValueError(f"{workdir}/config.json: train class {recorded!r} is not an attngeo.train.TrainConfig")
    return config_lib.from_dict(cls, fields)
  for name in LEGACY_TRAIN_CLASSES:
    cls = _import_class(name)
    if set(fields) <= {f.name for f in dataclasses.fields(cls)}:
      return config_lib.from_dict(cls, fields)
  return config_lib.from_dict(train.TrainConfig, fields)       # names the fields no class has


WEIGHTS = "weights.npz"      # a weights-only run folder (SiT stages, imports): config.json + this file


def save_weights(model, path: str) -> None:
  """Every variable of `model` (params and fixed buffers) as `path` (.npz keyed by module path), atomically."""
  import numpy as np
  from flax import nnx
  flat = {"/".join(map(str, k)): np.asarray(v.get_value()) for k, v in nnx.to_flat_state(nnx.state(model))}

  def write(tmp):
    with open(tmp, "wb") as f:
      np.savez(f, **flat)
  files.atomic_write(path, write)


def load_weights(model, path: str):
  """Inverse of `save_weights`: names and shapes must match (one line naming the first mismatch); a
  damaged file (a zip that does not open, a member whose CRC fails) is one line naming it, never loaded."""
  import zipfile

  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  try:
    with open(path, "rb") as fh, np.load(fh) as f:     # our own handle: closed when the zip does not open
      saved = {k: f[k] for k in f.files}
  except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
    raise ValueError(f"{path} is damaged ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'unreadable'})") from e
  for k, v in nnx.to_flat_state(nnx.state(model)):
    name = "/".join(map(str, k))
    if name not in saved or saved[name].shape != v.get_value().shape:
      raise ValueError(f"{path} does not fit this model: {name} {saved[name].shape if name in saved else 'missing'} "
                       f"(model {v.get_value().shape})")
    v.set_value(jnp.asarray(saved[name]))
  return model


def write_weights_run(workdir: str, model, **configs) -> None:
  """A weights-only run folder: config.json (the model's config and `configs`) + `WEIGHTS`."""
  from attngeo.nn import registry
  files.write_config(workdir, model=registry.config_dict(model), **configs)
  save_weights(model, os.path.join(workdir, WEIGHTS))


def write_checkpoint_run(workdir: str, model, **configs):
  """A training run folder at step 0 holding `model`: config.json (the model's config, a default TrainConfig
  and `configs`) and an orbax train state `ckpt/0` with a fresh optimizer state, which `load_run`, the probe
  and a resumed training read as any run's. `workdir` must hold no finished checkpoint step yet (one ValueError
  line); the caller holds its lock (`runlock.hold`), so an unfinished step a failed write left is removed. A full
  disk is one `checkpoint.DiskFull`. Returns the TrainConfig."""
  from attngeo import checkpoint, runlock, sharding, train
  from attngeo.nn import registry
  tcfg = train.TrainConfig(workdir=workdir, progress=False)
  if runlock.has_checkpoint(workdir):
    raise ValueError(f"{workdir} already holds checkpoints ({os.path.join(workdir, 'ckpt')}); choose an empty folder")
  _, state, _ = train.init_state(model, tcfg, sharding.make_mesh(tcfg.mesh))
  files.write_config(workdir, train=tcfg, model=registry.config_dict(model), **configs)
  mngr = checkpoint.manager(workdir, tcfg.keep, clean=True)
  try:
    checkpoint.save(mngr, 0, state, {})
  except BaseException:
    mngr.close()
    raise
  checkpoint.finish(mngr)
  return tcfg


def load_run(workdir: str, step: int | None = None, *, with_step: bool = False):
  """Rebuild the model of a run folder from its config.json and load its weights.

  A folder with `WEIGHTS` (written by `write_weights_run` or `save_weights`: SiT stages keep the EMA
  weights they sample from there, SiT/DiT imports their weights) loads those unless a checkpoint `step`
  of its `ckpt/` is asked for; a training run (`ckpt/`, orbax) loads checkpoint `step` (default the
  newest intact one). Returns (model, train config as the class that wrote it (`train_config`) or None for
  a weights-only run that records none, model config), and with `with_step` the checkpoint step loaded
  (None for `WEIGHTS`): a newer step skipped as corrupt makes it older than the newest on disk.
  """
  from attngeo.nn import registry
  saved = files.read_config(workdir)
  if not saved.get("model"):
    raise ValueError(f"{workdir}/config.json records no model config; runs written by attngeo.train record one")
  mcfg = registry.config_from_dict(saved["model"])
  has_ckpt, weights = os.path.isdir(os.path.join(workdir, "ckpt")), os.path.join(workdir, WEIGHTS)
  if os.path.exists(weights) and (step is None or not has_ckpt):
    if step is not None:
      raise ValueError(f"{workdir} holds one set of weights ({WEIGHTS}), not checkpoint steps; drop --step")
    tcfg = train_config(workdir, saved) if isinstance(saved.get("train"), dict) else None
    loaded = (load_weights(registry.build(mcfg), weights), tcfg, mcfg)
    return (*loaded, None) if with_step else loaded
  tcfg = train_config(workdir, saved)
  model, loaded_step = load_model(registry.build(mcfg), workdir, step, with_step=True)
  return (model, tcfg, mcfg, loaded_step) if with_step else (model, tcfg, mcfg)
