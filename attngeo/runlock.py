"""One process per run folder: an advisory lock on `workdir/.lock`; a refused run leaves nothing behind.

`hold(workdir)` takes `fcntl.flock(LOCK_EX | LOCK_NB)` on `workdir/.lock` and writes the owner's
`pid host` into it; while it is held, a hold from any other process raises `RunFolderBusy` (a
`ValueError`: the CLI prints it in one line) naming that owner, before anything is read or written.
A folder that cannot be created or locked (a file in its place, a read-only or denied parent) raises
`RunFolderUnusable` (a `ValueError` too) naming `--out` and the reason.

* Re-entrant within a process: nested holds of one folder (by any spelling of its path) share the
  one lock, released when the outermost hold exits (the LM recipe holds it around `train.train`,
  which holds it again).
* Nothing left behind: the outermost hold unlinks `.lock` before it lets the lock go, and removes the
  folders it created (`workdir` and any missing parents) when they are empty then. A process that
  opened the old `.lock` just before re-checks, once it has the lock, that the path still names the
  file it locked, and starts again on the new one otherwise; so exactly one process holds a folder.
* `hold(workdir, started=has_checkpoint)`: a block that starts a run. When it raises (a refusal such as
  a full disk, Ctrl-C) while `started(workdir)` is false, every top-level entry it added to `workdir`
  is removed (tokenizer/, lm.json, config.json, an empty ckpt/, metrics.jsonl, tb/ …): a run that never
  reached its first checkpoint leaves the folder as it found it. Entries that were there stay.
* A lock dies with its process (the kernel drops a flock when its last descriptor closes), so a
  folder left by a killed run (kill -9: no code runs, its `.lock` stays) is simply taken over: the pid
  text is information, never checked.
* The descriptor is not inherited across `exec` (Python's default), so a subprocess never keeps it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import socket
import threading
import time
from typing import Callable

LOCK_NAME = ".lock"
# Checkpoint steps moved aside as corrupt (`attngeo.checkpoint`): evidence and possibly readable
# weights, never removed by the clean-up of a failed start.
QUARANTINE_NAME = "ckpt_corrupt"

_held: dict[str, list] = {}          # realpath → [descriptor, depth, folders this hold created]
_guard = threading.Lock()


class RunFolderBusy(ValueError):
  """Another process holds the run folder."""


class RunFolderUnusable(ValueError):
  """The run folder cannot be created or locked (a file is in its place, a read-only or denied parent)."""


def has_checkpoint(workdir: str) -> bool:
  """Whether `workdir/ckpt` holds a finished checkpoint step (`attngeo.checkpoint`: a folder named by its
  step; an unfinished one carries a suffix)."""
  ckpt = os.path.join(workdir, "ckpt")
  return os.path.isdir(ckpt) and any(name.isdigit() for name in os.listdir(ckpt))


def _owner(fd: int, tries: int = 20) -> str:
  """`pid P on HOST` as the holder wrote it (it writes just after locking, so wait briefly for it)."""
  for _ in range(tries):
    text = os.pread(fd, 4096, 0).decode(errors="replace").split()
    if len(text) >= 2:
      return f"pid {text[0]} on {text[1]}"
    time.sleep(0.01)
  return "another process"


def _missing(workdir: str) -> list[str]:
  """`workdir` and its parents that do not exist, deepest first."""
  out, path = [], os.path.abspath(workdir)
  while not os.path.exists(path):
    out.append(path)
    path = os.path.dirname(path)
  return out


def _remove_empty(folders: list[str]) -> None:
  """rmdir each folder (deepest first) while it is empty; the first one that is not (or is gone) stops it."""
  for folder in folders:
    try:
      os.rmdir(folder)
    except OSError:
      return


def _same_file(fd: int, path: str) -> bool:
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return False
  own = os.fstat(fd)
  return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _unusable(workdir: str, e: OSError) -> RunFolderUnusable:
  reason = "a file is in the way" if e.errno in (errno.EEXIST, errno.ENOTDIR) else e.strerror
  return RunFolderUnusable(f"--out {workdir} cannot be used as a run folder: {reason} "
                           f"({e.filename or workdir}); choose a writable folder")


def _acquire(workdir: str) -> int:
  """A descriptor of `workdir/.lock`, locked by this process, the path still naming it; else `RunFolderBusy`."""
  path = os.path.join(workdir, LOCK_NAME)
  while True:
    try:
      os.makedirs(workdir, exist_ok=True)
    except OSError as e:                       # a file in its place, a read-only or denied parent
      if e.errno == errno.EEXIST and (not os.path.lexists(workdir) or os.path.isdir(workdir)):
        continue                               # a holder leaving removed the folder between mkdir and its check
                                               # (and another process may have made it again since)
      raise _unusable(workdir, e) from None
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:                  # the folder was removed by a holder that just left: again
      continue
    except OSError as e:                       # a read-only or denied folder
      raise _unusable(workdir, e) from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      owner = _owner(fd)
      os.close(fd)
      raise RunFolderBusy(f"run folder {workdir} is in use by {owner} ({path}); "
                          f"wait for it or use another --out") from None
    except BaseException:
      os.close(fd)
      raise
    if _same_file(fd, path):
      break
    os.close(fd)                               # locked a file its holder unlinked on leaving: again
  try:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
  except BaseException:                        # a full disk: leave no lock file (nor the folder) behind
    with contextlib.suppress(FileNotFoundError):
      os.unlink(path)
    os.close(fd)
    raise
  return fd


def _release(folder: str, entry: list) -> None:
  with contextlib.suppress(FileNotFoundError):
    os.unlink(os.path.join(folder, LOCK_NAME))        # ours while we hold the lock
  os.close(entry[0])
  _remove_empty(entry[2])


def _remove_added(workdir: str, before: set[str]) -> None:
  """Remove the top-level entries of `workdir` that are not in `before` (the lock file and quarantined
  checkpoint steps aside)."""
  for name in sorted(set(os.listdir(workdir)) - before - {LOCK_NAME, QUARANTINE_NAME}):
    path = os.path.join(workdir, name)
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path)
    else:
      os.remove(path)


@contextlib.contextmanager
def hold(workdir: str, started: Callable[[str], bool] | None = None):
  """Hold `workdir` (created if absent) for this process; `RunFolderBusy` if another process does.

  With `started`, a block that raises while `started(workdir)` is false has the top-level entries it
  added to `workdir` removed first. On leaving the outermost hold, `.lock` and the folders it created
  (when empty) are removed."""
  key = os.path.realpath(workdir)
  with _guard:
    entry = _held.get(key)
    if entry is None:
      created = _missing(workdir)
      try:
        entry = [_acquire(workdir), 0, created]
      except BaseException:
        _remove_empty(created)
        raise
      _held[key] = entry
    entry[1] += 1
  try:
    before = set(os.listdir(workdir)) if started is not None else None
    try:
      yield
    except BaseException:
      if started is not None and not started(workdir):
        _remove_added(workdir, before)
      raise
  finally:
    with _guard:
      entry[1] -= 1
      if entry[1] == 0:
        del _held[key]
        _release(key, entry)
