"""Files that must never be half-written, and content keys: the JSON and arrays of run folders and caches.

`atomic_write` (and `atomic_json`, `atomic_npy`) write through a hidden temporary and a rename, so a
kill or a full disk leaves the old file or the new one, never a part; `write_config`/`read_config`
are a run folder's `config.json`; `fingerprint` keys a cached result by the content and every
setting that produced it, and `cached_result` reads one back only under its key; `staged` makes a command's
outputs land together, `save_figure` writes a figure atomically. This module imports nothing of attngeo but
`interrupts` (itself a leaf), so every layer (data, interop, the trainer, experiments) can use it.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import errno
import itertools
import json
import os
import re

from attngeo import interrupts


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


def read_json(path: str):
  """The JSON value in `path`; a damaged file is one `ValueError` naming it (json's own message names
  only a line and column)."""
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON ({e}): the file is damaged or was edited by hand") from None
    except UnicodeDecodeError:
      raise ValueError(f"{path} is not valid JSON (not UTF-8 text): the file is damaged") from None


def read_config(workdir: str) -> dict:
  """`workdir/config.json` as written by `write_config`: a JSON object. A missing file is a FileNotFoundError, any
  other value (null, a list, …) a one-line ValueError naming the file."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir} is not a run folder: no config.json")
  record = read_json(path)
  if not isinstance(record, dict):
    raise ValueError(f"{path} is not a run's config (a JSON object of configs; it holds {type(record).__name__}): "
                     f"the file is damaged or was edited by hand")
  return record


def file_sha256(path: str) -> str:
  """Hex SHA-256 of the bytes of the file at `path` (read in 16 MiB pieces)."""
  import hashlib
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 24), b""):
      h.update(chunk)
  return h.hexdigest()


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


class _Stage:
  """The writes of one `staged` block: {real path: (temporary, path)} in write order; `open` until the block ends."""

  def __init__(self):
    self.writes: dict = {}
    self.open = True

  def add(self, tmp: str, path: str) -> None:
    """Stage `tmp` for `path`; a path staged before (under any spelling) drops its older temporary."""
    key = os.path.realpath(path)
    old = self.writes.pop(key, None)
    if old is not None and os.path.exists(old[0]):
      os.remove(old[0])
    self.writes[key] = (tmp, path)

  def discard(self) -> None:
    """Remove every staged temporary that is still there."""
    for tmp, _ in self.writes.values():
      if os.path.exists(tmp):
        os.remove(tmp)

  def commit(self) -> None:
    """Rename every temporary into place, in write order, with SIGINT and SIGTERM deferred until the last rename
    (`interrupts.deferred`: a Ctrl-C or SIGTERM between two renames had left new files beside old ones). A folder where a file goes is
    found before the first rename. If a rename fails all the same, the temporaries left are removed."""
    pending = list(self.writes.values())
    try:
      for _, path in pending:
        if os.path.isdir(path):
          raise IsADirectoryError(errno.EISDIR, "a folder is where this file goes", path)
      with interrupts.deferred():
        while pending:
          os.replace(*pending[0])
          pending.pop(0)
    finally:
      for tmp, _ in pending:
        if os.path.exists(tmp):
          os.remove(tmp)


# The `staged` block running in this context, or None outside one
_STAGE: contextvars.ContextVar[_Stage | None] = contextvars.ContextVar("attngeo_files_stage", default=None)
_WRITES = itertools.count()


def atomic_write(path: str, data) -> None:
  """Write `data` to `path` through a temporary file and a rename: never half-written.

  `data`: text, or a callable `write(tmp_path)` that writes exactly that path (through a file object
  for writers such as `np.save` that would append a suffix). The temporary is a hidden file beside
  `path` (`.name.tmp-PID-N`, N counting this process's writes), so a kill mid-write leaves nothing a
  `*.json`/`*.npy` glob picks up; a failed write leaves no temporary. Inside a `staged` block the rename
  waits for the block's end (a write from a context copied inside the block and run after it renames at once).
  """
  folder, name = os.path.split(path)
  _remove_orphans(folder, name)
  tmp = os.path.join(folder, f".{name}.tmp-{os.getpid()}-{next(_WRITES)}")
  stage = _STAGE.get()
  stage = stage if stage is not None and stage.open else None
  try:
    if callable(data):
      data(tmp)
    else:
      with open(tmp, "w") as f:
        f.write(data)
    if stage is None:
      os.replace(tmp, path)
    else:
      stage.add(tmp, path)
  except BaseException as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    if isinstance(e, OSError) and e.errno is not None and e.filename is None:   # a failed write() names no file:
      e.filename = path                 # a full disk's one line said where only when open() failed (an OSError with
                                        # a message and no errno keeps it: a filename would replace it in str(e))
    raise


_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<pid>\d+)(?:-\d+)?$")


def target(path: str) -> str:
  """The file an `atomic_write` temporary stands for (`dir/.name.tmp-PID-N` -> `dir/name`); any other path as it is.
  Errors name the temporary the write failed on; a user knows the file."""
  folder, name = os.path.split(str(path))
  m = _TEMPORARY.match(name)
  return os.path.join(folder, m["name"]) if m else str(path)


def blocking_file(folder: str) -> str | None:
  """The existing file that stops `folder` from being (made) a folder — `folder` itself or the nearest existing
  path above it — or None where it is a folder or can be made one. Commands check their output folder with it
  before any work: `--out FILE` was refused only when the tables were written, after the work."""
  path = os.path.abspath(folder)
  while not os.path.lexists(path):
    if os.path.dirname(path) == path:
      return None
    path = os.path.dirname(path)
  return None if os.path.isdir(path) else path


def _remove_orphans(folder: str, name: str) -> None:
  """Remove the temporaries of `name` left by processes that no longer run (a kill -9 mid-write): each kill left
  one, and on a nearly full disk they made the next run fail. A live process's temporaries are kept."""
  try:
    entries = os.listdir(folder or ".")
  except OSError:
    return
  for entry in entries:
    m = _TEMPORARY.match(entry)
    if not m or m["name"] != name or int(m["pid"]) == os.getpid():
      continue
    try:
      os.kill(int(m["pid"]), 0)
    except ProcessLookupError:
      try:
        os.remove(os.path.join(folder, entry))
      except OSError:
        pass
    except (PermissionError, OverflowError, ValueError):      # alive under another user, or not a pid
      pass


def save_figure(fig, path: str, **kwargs) -> None:
  """`fig.savefig(path, **kwargs)` through `atomic_write`: a kill mid-write leaves the old figure or the new one,
  never a truncated file, and inside `staged` the figure lands with its tables. The format is `path`'s extension
  (the temporary's name has another)."""
  fmt = os.path.splitext(path)[1].lstrip(".").lower() or "png"
  atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, **kwargs))


@contextlib.contextmanager
def staged():
  """A block whose `atomic_write`s land together: each writes its temporary, and all are renamed into place
  when the block ends; if it raises (a full disk on the third file, a kill as Ctrl-C) none is and the
  temporaries are removed, so a command's outputs (a table's .md/.csv/.json and its figure) are all of one
  run, old or new. Renames need no space and run with SIGINT/SIGTERM deferred; a folder where a file goes is an error
  before the first rename; only a kill -9 within the renames (~0.1 ms) can leave new files beside old ones. A path
  written twice lands its last write.
  A block inside another joins it; threads started inside do not inherit it (their writes land at once)."""
  if _STAGE.get() is not None:
    yield
    return
  stage = _Stage()
  token = _STAGE.set(stage)
  try:
    yield
  except BaseException:
    stage.open = False
    stage.discard()
    raise
  else:
    stage.open = False
    stage.commit()
  finally:
    _STAGE.reset(token)


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
