"""How Ctrl-C and SIGTERM stop a command (`as_interrupts`, `rows_kept`, `exit_at_once`), and the sections they must
not cut: Ctrl-C or SIGTERM inside `deferred()` takes effect when it ends.

`as_interrupts` makes SIGTERM a KeyboardInterrupt (`Terminated`), never raised inside an import (held until it is
done) and never lost in a finaliser or JAX's gc callback (sent again); the CLI and the python -m benchmarks run under
it, and `exit_at_once` ends a process after such a stop without the teardown that crashed under a half-loaded
program. The rest of this docstring is about `deferred()`.

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


class Terminated(KeyboardInterrupt):
  """SIGTERM during a command: raised in the main thread where the signal lands, handled as Ctrl-C is."""


def _importing(frame) -> bool:
  """Whether `frame` runs inside an import (a frame of importlib's bootstrap on its stack)."""
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
      return True
    frame = frame.f_back
  return False


def _interrupt(signum, frame):
  """SIGINT raises KeyboardInterrupt and SIGTERM `Terminated` — except inside an import, where the exception broke
  the module half-way (a Ctrl-C 0.1 s into `attngeo bench` ended in "ImportError: Encountered an error while
  initializing the extension", numpy's): there the signal is sent again 10 ms later, until the import is done."""
  if _importing(frame):
    threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
    return
  raise Terminated(f"signal {signum}") if signum == signal.SIGTERM else KeyboardInterrupt



@contextlib.contextmanager
def as_interrupts():
  """Inside the block SIGTERM raises `Terminated` (a KeyboardInterrupt) as Ctrl-C raises KeyboardInterrupt, neither
  inside an import (`_interrupt`), and one whose exception a finaliser swallowed is sent again (`_redeliver`); the
  previous handlers and hook are back afterwards. SIGINT keeps a handler other than Python's own (one that ignores
  it, as a shell's background job does). The main thread only: Python runs handlers there."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  mine = [signal.SIGTERM] + ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is signal.default_int_handler else [])
  previous, hook = {s: signal.signal(s, _interrupt) for s in mine}, sys.unraisablehook
  sys.unraisablehook = _redeliver(hook)
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    sys.unraisablehook = hook


def _redeliver(hook):
  """An unraisable hook that sends SIGINT or SIGTERM again when its KeyboardInterrupt (`Terminated`) was swallowed.

  Python runs a signal handler at the next bytecode of the main thread; when that bytecode belongs to a
  finaliser or a gc callback (JAX's `_xla_gc_callback` runs on every collection, most often while JAX imports and
  compiles), the exception it raises cannot propagate: Python prints "Exception ignored in …" through
  `sys.unraisablehook` and the command went on running — a Ctrl-C 0.3–0.8 s into `attngeo bench` was lost so, and
  the command ran to the end with status 0. The hook has the signal sent again 10 ms later from a timer thread (sent
  from the hook itself, it would land in the hook and be swallowed there too), until it lands where it propagates;
  any other unraisable goes to the previous hook."""
  def handle(unraisable):
    if isinstance(unraisable.exc_value, KeyboardInterrupt):    # from another thread, later: not inside this hook
      again = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
      threading.Timer(0.01, os.kill, (os.getpid(), again)).start()
    else:
      hook(unraisable)
  return handle


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


def rows_kept(prog: str, from_shell: bool, printed: bool = True, stop: BaseException | None = None) -> int:
  """Ctrl-C (or SIGTERM: `stop` a `Terminated`) in a command that prints its rows as it measures them: one line on
  stderr (saying whether any row was printed), then status 130 (143) — at once (`exit_at_once`) when run from the
  shell, returned otherwise."""
  how, code = ("terminated (SIGTERM)", 128 + signal.SIGTERM) if isinstance(stop, Terminated) else ("interrupted", 130)
  print(f"{prog}: {how}; " + ("the rows printed above are complete" if printed else "no row was finished"),
        file=sys.stderr)
  if from_shell:
    exit_at_once(code)
  return code
