"""Sections a signal must not cut: Ctrl-C or SIGTERM inside `deferred()` takes effect when it ends.

A checkpoint write waits on orbax's background threads (the previous step's finalisation, the
array copies). A signal landing in that wait raised inside orbax, which logged the interrupted
thread join as a failed save — a 14-line absl traceback — before the command's own one line, and
left the step to the next run's clean-up. Inside `deferred()` SIGINT and SIGTERM are only
recorded; on leaving the section the previous handlers are back and the first recorded signal is
raised again (`signal.raise_signal`), so the command stops where it would have, one write later.
Only the main thread (where Python runs signal handlers) defers; sections nest. Imports nothing of
attngeo.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_state = {"depth": 0, "pending": None}


def _record(signum, frame):
  if _state["pending"] is None:
    _state["pending"] = signum


@contextlib.contextmanager
def deferred():
  """Hold SIGINT/SIGTERM for the duration of the block; deliver the first one received afterwards."""
  if threading.current_thread() is not threading.main_thread():
    yield                                    # signal handlers run in the main thread only
    return
  if _state["depth"]:                        # nested: the outermost section delivers
    _state["depth"] += 1
    try:
      yield
    finally:
      _state["depth"] -= 1
    return
  previous = {s: signal.signal(s, _record) for s in _SIGNALS}
  _state["depth"], _state["pending"] = 1, None
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    pending, _state["depth"], _state["pending"] = _state["pending"], 0, None
    if pending is not None:
      signal.raise_signal(pending)


def exit_at_once(code: int):
  """End the process now with status `code`, skipping the interpreter's teardown.

  A signal that lands while XLA compiles and loads a program (its Python handler runs as
  `backend_compile_and_load` returns) leaves the half-loaded executable to the interpreter's
  teardown, which then crashed with SIGSEGV in 15 of 36 early SIGTERMs (exit 139 after the one
  line). Call it once everything a command keeps is on disk — checkpoints finished and the run
  folder released in the `finally` blocks the interrupt passed through: it flushes and leaves.
  """
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  logging.shutdown()
  os._exit(code)


def rows_kept(prog: str, from_shell: bool, printed: bool = True) -> int:
  """Ctrl-C in a command that prints its rows as it measures them: one line on stderr (saying whether any row was
  printed), then status 130 — at once (`exit_at_once`) when run from the shell, returned otherwise."""
  print(f"{prog}: interrupted; " + ("the rows printed above are complete" if printed else "no row was finished"),
        file=sys.stderr)
  if from_shell:
    exit_at_once(130)
  return 130
