"""Run folders: `config.json` (what produced the run), `ckpt/` (orbax steps), `metrics.jsonl`.

`write_config` records every config of a run, and under `"classes"` the class of each one that is a
dataclass (`"train": "attngeo.lm.recipe.LMTrainConfig"`), so a reader rebuilds a config as the class
that wrote it; `load_run` rebuilds a run's model from its config.json (`attngeo.nn.registry`), its
training config as its recorded class, and restores a checkpoint's weights into the model.
"""
from __future__ import annotations

import dataclasses
import json
import os

from attngeo import config as config_lib


def write_config(workdir: str, **configs):
  """`workdir/config.json` = {name: asdict(config) or value, "classes": {name: "module.Class"}}.

  "classes" names the class of every dataclass config (kept from `configs["classes"]` for the
  others, so a config.json read and written back keeps its record)."""
  os.makedirs(workdir, exist_ok=True)
  payload = {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in configs.items()}
  classes = {k: f"{type(v).__module__}.{type(v).__qualname__}" for k, v in configs.items()
             if dataclasses.is_dataclass(v) and not isinstance(v, type)}
  if classes:
    payload["classes"] = {**(payload.get("classes") or {}), **classes}
  atomic_write(os.path.join(workdir, "config.json"), json.dumps(payload, indent=1, default=str))


def read_config(workdir: str) -> dict:
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir} is not a run folder: no config.json")
  with open(path) as f:
    return json.load(f)


def load_model(model, workdir: str, step: int | None = None, use_ema: bool = False):
  """Load the weights of checkpoint `step` (default: the newest intact one) in `workdir` into `model`.

  Only the model's weights are read (no optimizer state); `use_ema` loads their EMA instead
  (runs trained with `TrainConfig.ema`). Returns the model.
  """
  from attngeo import checkpoint
  checkpoint.restore_params(workdir, model, step, use_ema=use_ema)
  return model


# Trainer configs a run written before config.json named its classes may hold (chosen by their fields).
LEGACY_TRAIN_CLASSES = ("attngeo.train.TrainConfig", "attngeo.lm.recipe.LMTrainConfig")


def _import_class(name: str):
  """`"attngeo.lm.recipe.LMTrainConfig"` → the class; only attngeo's own modules are imported."""
  import importlib
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
  before classes were recorded, as the first of `LEGACY_TRAIN_CLASSES` that has every saved field."""
  from attngeo import train
  saved = read_config(workdir) if saved is None else saved
  fields = saved.get("train")
  if not isinstance(fields, dict):
    raise ValueError(f"{workdir}/config.json records no train config; runs written by attngeo.train record one")
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
  atomic_write(path, write)


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
  write_config(workdir, model=registry.config_dict(model), **configs)
  save_weights(model, os.path.join(workdir, WEIGHTS))


def load_run(workdir: str, step: int | None = None):
  """Rebuild the model of a run folder from its config.json and load its weights.

  A folder with `WEIGHTS` (written by `write_weights_run` or `save_weights`: SiT stages keep the EMA
  weights they sample from there, SiT/DiT imports their weights) loads those unless a checkpoint `step`
  of its `ckpt/` is asked for; a training run (`ckpt/`, orbax) loads checkpoint `step` (default the
  newest intact one). Returns (model, train config as the class that wrote it (`train_config`) or None for
  a weights-only run that records none, model config).
  """
  from attngeo.nn import registry
  saved = read_config(workdir)
  if not saved.get("model"):
    raise ValueError(f"{workdir}/config.json records no model config; runs written by attngeo.train record one")
  mcfg = registry.config_from_dict(saved["model"])
  has_ckpt, weights = os.path.isdir(os.path.join(workdir, "ckpt")), os.path.join(workdir, WEIGHTS)
  if os.path.exists(weights) and (step is None or not has_ckpt):
    if step is not None:
      raise ValueError(f"{workdir} holds one set of weights ({WEIGHTS}), not checkpoint steps; drop --step")
    tcfg = train_config(workdir, saved) if isinstance(saved.get("train"), dict) else None
    return load_weights(registry.build(mcfg), weights), tcfg, mcfg
  tcfg = train_config(workdir, saved)
  model = load_model(registry.build(mcfg), workdir, step)
  return model, tcfg, mcfg


def fingerprint(*objects) -> str:
  """A short content key (sha256 hex, 16 chars) of JSON-able objects and dataclasses (configs).

  Equal configs give equal keys; any changed field changes the key. Arrays/bytes are hashed by
  content. Use it to key cached or reused artefacts by what produced them, never by a name.
  """
  import hashlib

  import numpy as np
  h = hashlib.sha256()
  for obj in objects:
    if isinstance(obj, (bytes, bytearray)):
      h.update(bytes(obj))
    elif isinstance(obj, np.ndarray):
      h.update(str((obj.dtype.str, obj.shape)).encode())
      h.update(np.ascontiguousarray(obj).tobytes())
    else:
      value = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
      h.update(json.dumps(value, sort_keys=True, default=str).encode())
    h.update(b"\x00")
  return h.hexdigest()[:16]


def atomic_write(path: str, data) -> None:
  """Write `data` to `path` through a temporary file and a rename: never half-written.

  `data`: text, or a callable `write(tmp_path)` that writes exactly that path (through a file object
  for writers such as `np.save` that would append a suffix). The temporary is a hidden file beside
  `path` (`.name.tmp-PID`), so a kill mid-write leaves nothing a `*.json`/`*.npy` glob picks up; a
  failed write leaves no temporary.
  """
  folder, name = os.path.split(path)
  tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
  try:
    if callable(data):
      data(tmp)
    else:
      with open(tmp, "w") as f:
        f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def atomic_json(path: str, obj) -> None:
  """`atomic_write` of `obj` as indented JSON (non-JSON values as their str), creating the folder."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  atomic_write(path, json.dumps(obj, indent=1, default=str))


def atomic_npy(path: str, array) -> None:
  """`atomic_write` of `array` in `.npy` format (through a file object: `np.save` appends no suffix),
  creating the folder."""
  import numpy as np

  def save(tmp):
    with open(tmp, "wb") as f:
      np.save(f, np.asarray(array))
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  atomic_write(path, save)


def cached_result(path: str, key: str, field: str = "key") -> dict | None:
  """The JSON result at `path` if it was produced under `key` (stored in its `field`), else None:
  a result is reused only for the content and config that made it, never for its name."""
  try:
    with open(path) as f:
      row = json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):      # absent, or cut short by a crash: recompute
    return None
  return row if isinstance(row, dict) and row.get(field) == key else None


def flatten(tree: dict, prefix: str = "") -> dict:
  """{"a": {"b": 1}} -> {"a.b": 1} (lists kept as values)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out
