"""One process per run folder: an advisory lock on `workdir/.lock`.

`hold(workdir)` takes `fcntl.flock(LOCK_EX | LOCK_NB)` on `workdir/.lock` and writes the owner's
`pid host` into it; while it is held, a hold from any other process raises `RunFolderBusy` (a
`ValueError`: the CLI prints it in one line) naming that owner, before anything is read or written.

* Re-entrant within a process: nested holds of one folder (by any spelling of its path) share the
  one lock, released when the outermost hold exits (the LM recipe holds it around `train.train`,
  which holds it again).
* A lock dies with its process (the kernel drops a flock when its last descriptor closes), so a
  folder left by a killed run is simply taken over: the pid text is information, never checked.
* The descriptor is not inherited across `exec` (Python's default), so a subprocess never keeps it.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time

LOCK_NAME = ".lock"

_held: dict[str, list] = {}          # realpath → [descriptor, depth]
_guard = threading.Lock()


class RunFolderBusy(ValueError):
  """Another process holds the run folder."""


def _owner(fd: int, tries: int = 20) -> str:
  """`pid P on HOST` as the holder wrote it (it writes just after locking, so wait briefly for it)."""
  for _ in range(tries):
    text = os.pread(fd, 4096, 0).decode(errors="replace").split()
    if len(text) >= 2:
      return f"pid {text[0]} on {text[1]}"
    time.sleep(0.01)
  return "another process"


def _acquire(workdir: str) -> int:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_NAME)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
  return fd


@contextlib.contextmanager
def hold(workdir: str):
  """Hold `workdir` (created if absent) for this process; `RunFolderBusy` if another process does."""
  key = os.path.realpath(workdir)
  with _guard:
    entry = _held.get(key)
    if entry is None:
      entry = _held[key] = [_acquire(workdir), 0]
    entry[1] += 1
  try:
    yield
  finally:
    with _guard:
      entry[1] -= 1
      if entry[1] == 0:
        del _held[key]
        os.close(entry[0])
