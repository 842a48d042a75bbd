"""Orbax checkpoints of a training state, with integrity data verified on restore.

A checkpoint step holds three items: `state` (the train-state pytree of `attngeo.train`: model
and optimizer state, EMA, RNG key, step), `data` (the input iterator's JSON state, so a resumed
run sees the same batches) and `integrity` (one checksum per saved array, and the sha256 of the
data state's canonical JSON).

Checksum of an array x with n elements, computed on device (sharded arrays need no gather):

    h(x) = Σ_i b_i · (2i + 1)  mod 2³²,     b_i = the bits of x_i as an unsigned integer,

(wider elements contribute each 32-bit word; narrower ones are zero-extended). Every multiplier
is odd, hence invertible mod 2³², so changing any single element always changes h; integer sums
are exact and associative, so h does not depend on the sharding or the device count. `restore`
recomputes h on what it read and compares; a corrupt, truncated or incomplete step is skipped
with a one-line `CheckpointWarning`, moved aside to `ckpt_corrupt/`, and the previous good step
is used. A state holding NaN/Inf is never written (`save` raises).

What a restore reads is covered: the arrays' data (h), the iterator state (sha256), the
integrity record (read and compared: an edit is a mismatch or unreadable), and the files that
say how to read them — `state/_METADATA`, `data/metadata`, `integrity/metadata` must exist
(`REQUIRED_FILES`; without the tree metadata orbax would read by the target's structure alone)
and any edit of the OCDBT manifests or `_METADATA` that changes what is read is a mismatch or a
read error. orbax's bookkeeping (`_CHECKPOINT_METADATA`, `commit_success.txt`, `_sharding` — the
target's shardings are used) is not read, so it cannot change a resumed run. A step lacking
its integrity record beside steps that have one is damaged, like the other kinds; a run none of
whose steps has one predates checksums and is refused in one line, never moved aside.

A disk that fills during a save (ENOSPC, or a quota or the file-size limit: `STORAGE_LIMITS`, however deep
in orbax/TensorStore and on whichever of its threads) ends in one `DiskFull` line naming the folder, the bytes the step needs (the state's
array bytes) and the bytes free; orbax's logged copies of the error are dropped, the unfinished
step's temporary folder is removed (it is never a step: orbax lists committed steps only) and
the earlier steps stay as they were. `save` starts a write, `finish` waits for it and closes.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import re
import os
import shutil
import sys
import time
import warnings
import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from attngeo import files, interrupts, runlock


class CheckpointWarning(UserWarning):
  """A checkpoint step was skipped (corrupt or incomplete)."""


class DiskFull(OSError, ValueError):
  """A write ran out of storage — disk space (ENOSPC), a quota (EDQUOT) or the file-size limit (EFBIG, `ulimit -f`);
  the message is one line (a ValueError: the CLI prints it)."""

  def __init__(self, message: str, code: int = errno.ENOSPC):
    super().__init__(message)
    self.errno = code


# errno -> (how the one line says it, what to do, the texts TensorStore and Python give it).
STORAGE_LIMITS = {
    errno.ENOSPC: ("no space left on the device of", "free some space", ("No space left on device", "os_error_code='28'")),
    errno.EDQUOT: ("disk quota exceeded on the device of", "free some space or raise the quota",
                   ("Disk quota exceeded", "os_error_code='122'")),
    errno.EFBIG: ("the file-size limit (ulimit -f) stopped a write into", "raise the limit",
                  ("File too large", "os_error_code='27'"))}


def disk_full(folder: str, needed: int, what: str, note: str = "", removed: bool = True,
              code: int = errno.ENOSPC) -> DiskFull:
  """The one-line `DiskFull` for writing `what` (about `needed` bytes; 0: a flush, no size to name) into
  `folder`, stopped by `code` (`STORAGE_LIMITS`); `removed`: the caller removed its partial write."""
  said, advice, _ = STORAGE_LIMITS.get(code, STORAGE_LIMITS[errno.ENOSPC])
  free = shutil.disk_usage(folder).free if os.path.isdir(folder) else 0
  size = f" needs about {needed:,} bytes (more with its metadata) and" if needed > 0 else ""
  after = " after its partial write was removed" if removed else ""
  return DiskFull(f"{said} {folder}: {what}{size} did not fit ({free:,} bytes free{after}){note}; {advice} and rerun "
                  f"(a run resumes from its last finished checkpoint; one with none starts again)", code)


def storage_limit(err: BaseException | None) -> int | None:
  """The errno (`STORAGE_LIMITS`: ENOSPC, EDQUOT, EFBIG) of the first storage limit in `err`'s chain — an OSError's
  errno, or TensorStore's text for it — or None."""
  while err is not None:
    for code, (_, _, texts) in STORAGE_LIMITS.items():
      if (isinstance(err, OSError) and err.errno == code) or any(mark in str(err) for mark in texts):
        return code
    err = err.__cause__ or err.__context__
  return None


def is_disk_full(err: BaseException | None) -> bool:
  """A storage limit anywhere in `err`'s chain (`storage_limit`): no space, a quota, or the file-size limit."""
  return storage_limit(err) is not None


class _DropDiskFullLogs(logging.Filter):
  """Drops orbax's log records of a storage limit — ENOSPC, EDQUOT, EFBIG (each thread logs its traceback: 189
  lines under `ulimit -f`) — `DiskFull` reports it once.

  The first such record comes from the failing write's own thread, before its leftovers (callbacks
  into the closed event loop) are reported, so it also opens the window that drops those."""

  def filter(self, record):
    full = is_disk_full(record.exc_info[1] if record.exc_info else None) or is_disk_full(Exception(record.getMessage()))
    if full:
      _quiet_leftovers()
    return not full


def manager(workdir: str, keep: int = 2, clean: bool = False) -> ocp.CheckpointManager:
  """The `CheckpointManager` of `workdir/ckpt` keeping the newest `keep` steps.

  `clean`: remove the temporary folders of steps never finished (a kill or a full disk) — only for
  the run that writes the folder (`attngeo.train` holds its lock), never a reader beside it.
  """
  absl = logging.getLogger("absl")
  if not any(isinstance(f, _DropDiskFullLogs) for f in absl.filters):
    absl.addFilter(_DropDiskFullLogs())
  opts = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  mngr = ocp.CheckpointManager(os.path.abspath(os.path.join(workdir, "ckpt")), options=opts)
  if clean:
    _remove_unfinished(mngr)
  return mngr


def _pure(state):
  return jax.tree.map(lambda v: v.get_value() if isinstance(v, nnx.Variable) else v, state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))


def _words(x):
  """The bits of x as uint32 words (one or more per element)."""
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  size = x.dtype.itemsize
  if size >= 4:
    return jax.lax.bitcast_convert_type(x, jnp.uint32)
  return jax.lax.bitcast_convert_type(x, {1: jnp.uint8, 2: jnp.uint16}[size]).astype(jnp.uint32)


def _checksum(x):
  w = _words(x).reshape(-1)
  odd = 2 * jnp.arange(w.shape[0], dtype=jnp.uint32) + 1
  return jnp.sum(w * odd, dtype=jnp.uint32)


@jax.jit
def _checksums_and_finite(leaves):
  sums = [_checksum(x) for x in leaves]
  finite = [jnp.all(jnp.isfinite(x)) for x in leaves if jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)]
  return sums, jnp.all(jnp.stack(finite)) if finite else jnp.bool_(True)


def _paths_and_leaves(pure_state):
  flat = jax.tree_util.tree_flatten_with_path(pure_state)[0]
  return [jax.tree_util.keystr(p) for p, _ in flat], [x for _, x in flat]


def integrity(state) -> tuple[dict[str, int], bool]:
  """({array path: checksum h}, all floating arrays finite) of a state pytree (see module doc)."""
  paths, leaves = _paths_and_leaves(_pure(state))
  sums, finite = jax.device_get(_checksums_and_finite(leaves))
  return dict(zip(paths, (int(s) for s in sums))), bool(finite)


def data_checksum(data_state) -> str:
  """sha256 of the data iterator's state as canonical JSON (sorted keys, after a JSON round trip)."""
  canonical = json.dumps(json.loads(json.dumps(data_state)), sort_keys=True)
  return hashlib.sha256(canonical.encode()).hexdigest()


def nbytes(state) -> int:
  """Bytes of a state pytree's arrays (global shapes): what one checkpoint step holds, uncompressed."""
  return sum(int(np.prod(np.shape(x))) * jnp.result_type(x).itemsize for x in jax.tree.leaves(_pure(state)))


_saving = weakref.WeakKeyDictionary()            # manager → (step, bytes) of its newest save


def save(mngr, step: int, state, data_state: dict):
  """Start saving `state` and the data iterator's state at `step`, with checksums (`finish` waits for
  it); refuse a non-finite state; a full disk (here or from the previous save) is one `DiskFull`."""
  sums, finite = integrity(state)
  if not finite:
    last = mngr.latest_step()
    raise FloatingPointError(f"the training state holds NaN/Inf at step {step}: not checkpointed; the last good "
                             f"checkpoint is {'step ' + str(last) if last is not None else 'none'} in {mngr.directory}")
  _quiet_leftovers()                # a failing write's leftovers may land before its error is seen
  with interrupts.deferred(), _writing(mngr):      # Ctrl-C/SIGTERM take effect once the write is handed over
    _saving[mngr] = (step, nbytes(state))
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(_pure(state)),
                                            data=ocp.args.JsonSave(data_state),
                                            integrity=ocp.args.JsonSave({"checksums": sums,
                                                                         "data": data_checksum(data_state)})))


def finish(mngr):
  """Wait for `mngr`'s pending save and close it; a full disk is one `DiskFull`."""
  try:
    with interrupts.deferred(), _writing(mngr):    # a signal here stops the command after the save, not in it
      mngr.wait_until_finished()
  finally:
    mngr.close()


@contextlib.contextmanager
def _writing(mngr):
  """Orbax writes of `mngr`: an ENOSPC becomes one `DiskFull`, the unfinished step's folder removed."""
  try:
    yield
    return
  except Exception as e:  # noqa: BLE001 — orbax raises ENOSPC as ValueError/OSError/RuntimeError
    code = storage_limit(e)
    if code is None:
      raise
  _settle_failed_read()             # the failed writes' late callbacks land quietly
  unfinished = _remove_unfinished(mngr) or [_saving.get(mngr, (None,))[0]]   # the step being written
  mngr.reload()
  raise disk_full(str(mngr.directory), _saving.get(mngr, (None, 0))[1], f"checkpoint step {unfinished[0]}",
                  f" (steps {sorted(mngr.all_steps())} are intact)", code=code) from None


def _remove_unfinished(mngr) -> list[int]:
  """Delete the temporary folders of unfinished steps (`<step>.orbax-checkpoint-tmp…`); their steps."""
  root, steps = str(mngr.directory), []
  if jax.process_index() == 0 and os.path.isdir(root):
    for name in sorted(os.listdir(root)):
      if ".orbax-checkpoint-tmp" in name:
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        steps += [int(name.split(".")[0])] if name.split(".")[0].isdigit() else []
  return steps


# The files a restore reads beside the arrays' data: their absence fails the step (orbax would read
# a step without the tree metadata by the target's structure alone, or not list its items).
REQUIRED_FILES = ("state/_METADATA", "data/metadata", "integrity/metadata")


def _require_files(mngr, step: int, files=REQUIRED_FILES):
  missing = [f for f in files if not os.path.exists(os.path.join(str(mngr.directory), str(step), f))]
  if missing:
    raise IOError(f"missing {', '.join(missing)}")


def _verify(expected: dict, got: dict, data_state=None, partial: bool = False):
  """IOError unless the arrays read match their recorded checksums (and the data state its own);
  `partial`: only some arrays were read, each must match."""
  sums = expected["checksums"]
  bad = sorted(k for k in (got if partial else sums) if got.get(k) != sums.get(k))
  bad += [] if partial else sorted(set(got) - set(sums))
  if data_state is not None and "data" in expected and data_checksum(data_state) != expected["data"]:
    bad.append("the data iterator state")
  if bad:
    raise IOError(f"checksum mismatch in {len(bad)} item(s), first {bad[0]}")


def _restore_step(mngr, step: int, state, shardings):
  _require_files(mngr, step)
  target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x), sharding=s),
                        _pure(state), _pure(shardings))
  out = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target),
                                                   data=ocp.args.JsonRestore(),
                                                   integrity=ocp.args.JsonRestore()))
  _verify(out["integrity"], integrity(out["state"])[0], out["data"])
  restored = jax.tree.map(lambda v, x: v.replace(x) if isinstance(v, nnx.Variable) else x, state, out["state"],
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
  return restored, out["data"]


def _check_verifiable(mngr, step: int):
  """A run saved with its arrays but without integrity data (an attngeo release before checksums)
  cannot be verified: a one-line error, never a "corrupt" verdict that would move it aside. (One
  step without it beside steps that have it lost it: its restore fails and the previous one is used.)"""
  root = str(mngr.directory)
  verifiable = lambda s: os.path.exists(os.path.join(root, str(s), "integrity"))
  if os.path.isdir(os.path.join(root, str(step), "state")) and not any(map(verifiable, mngr.all_steps())):
    raise ValueError(f"checkpoint step {step} in {mngr.directory} has no integrity data (saved before attngeo "
                     f"verified checkpoints), so it cannot be verified; retrain or re-save it with this version")


def restore_step(mngr, step: int, state, shardings):
  """Restore exactly `step` (checksums verified): (state, data_state); one-line errors otherwise."""
  if step not in mngr.all_steps():
    raise FileNotFoundError(f"no checkpoint step {step} in {mngr.directory}; steps: {sorted(mngr.all_steps())}")
  _check_verifiable(mngr, step)
  out, failure = _attempt(lambda: _restore_step(mngr, step, state, shardings))
  if failure:
    kind = "holds arrays of other shapes than this model/optimizer" if failure.shape else "is corrupt or incomplete"
    raise ValueError(f"checkpoint step {step} in {mngr.directory} {kind} ({failure})")
  return out


def newest_step_key(workdir: str) -> str | None:
  """A content key of the newest finished step in `workdir/ckpt`: `files.fingerprint` of its step and integrity
  record (a checksum of every saved array), or None without one. A result computed from a run's weights is reused
  only beside the same weights: a checkpoint copied in from another run changes the key (a fault pass swapped one
  and was served the old row)."""
  root = os.path.join(workdir, "ckpt")
  steps = sorted(int(n) for n in os.listdir(root) if n.isdigit()) if os.path.isdir(root) else []
  if not steps:
    return None
  try:
    with open(os.path.join(root, str(steps[-1]), "integrity", "metadata"), encoding="utf-8") as f:
      record = json.load(f)
  except (OSError, ValueError):                 # unreadable: no key, so nothing is reused on its strength
    return None
  return files.fingerprint(steps[-1], record)


def _step_folders(workdir: str) -> set[int]:
  """The finished step folders of `workdir/ckpt` on disk now (orbax renames a finished step to its number)."""
  root = os.path.join(workdir, "ckpt")
  return {int(n) for n in os.listdir(root) if n.isdigit()} if os.path.isdir(root) else set()


def restore_params(workdir: str, model, step: int | None = None, use_ema: bool = False):
  """Load a run's model weights (or their EMA) into `model` in place, reading nothing else.

  Only the model's part of the train state is read (orbax partial restore): no optimizer state is
  allocated, so a model whose Adam moments would not fit can still be loaded. Its checksums are
  verified. `step` None: the newest intact step. Returns the step loaded.

  A trainer beside this reader (`--train.keep 1`) can remove a step while it is listed or read: a failure during
  which the step folders changed — one vanished, or a newer one appeared (the trainer saves the next step before
  it removes the old one, whose integrity/ can be gone while its folder is still there) — is that, not damage (it
  was called corrupt, "has no integrity data", or a bare ENOENT), and the read starts again on the steps there are
  then (up to `_REMOVED_RETRIES` times); an asked-for `step` that vanished is one line saying so.
  """
  for attempt in range(_REMOVED_RETRIES + 1):
    before = _step_folders(workdir)
    try:
      return _restore_params(workdir, model, step, use_ema)
    except (OSError, ValueError):
      after = _step_folders(workdir)
      if step is not None and step in before - after:
        raise FileNotFoundError(f"checkpoint step {step} in {os.path.join(workdir, 'ckpt')} was removed while it "
                                f"was read (a running trainer keeps only its newest steps); load another --step"
                                ) from None
      if step is not None or after == before:   # the asked step is there, or nothing was saved or removed beside
        raise                                    # the read: the failure is the verdict
      if attempt == _REMOVED_RETRIES:
        raise FileNotFoundError(f"the steps in {os.path.join(workdir, 'ckpt')} were removed while they were read, "
                                f"{attempt + 1} times (a running trainer keeps only its newest steps); try again"
                                ) from None


def _restore_params(workdir: str, model, step: int | None, use_ema: bool):
  """`restore_params`' one attempt."""
  mngr = manager(workdir)
  try:
    steps = sorted(mngr.all_steps(), reverse=True) if step is None else [step]
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {mngr.directory}")
    if step is not None and step not in mngr.all_steps():
      raise FileNotFoundError(f"no checkpoint step {step} in {mngr.directory}; steps: {sorted(mngr.all_steps())}")
    graphdef, mstate = nnx.split(model)
    pure = _pure(mstate if not use_ema else nnx.state(model, nnx.Param))
    target = {"ema": pure} if use_ema else {"train": {0: pure}}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)), target)
    def read(s):
      _require_files(mngr, s, ("state/_METADATA", "integrity/metadata"))
      out = mngr.restore(s, args=ocp.args.Composite(
          state=ocp.args.PyTreeRestore(abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                                       partial_restore=True),
          integrity=ocp.args.JsonRestore()))
      _verify(out["integrity"], integrity(out["state"])[0], partial=True)
      return out

    queue, removed = list(steps), 0
    while queue:
      s = queue.pop(0)
      _check_verifiable(mngr, s)
      out, failure = _attempt(lambda: read(s))
      if failure and not failure.shape and not os.path.isdir(os.path.join(str(mngr.directory), str(s))):
        # removed while it was read — a trainer beside this reader keeps only its newest steps — not corrupt
        # (a probe beside `--train.keep 1` called healthy steps corrupt): read the newest steps there are now
        if step is not None or removed == _REMOVED_RETRIES:
          raise FileNotFoundError(f"checkpoint step {s} in {mngr.directory} was removed while it was read (a "
                                  f"running trainer keeps only its newest steps); "
                                  f"{'load another --step' if step is not None else 'try again'}")
        removed += 1
        mngr.reload()
        queue = sorted(mngr.all_steps(), reverse=True)
        continue
      if failure:
        if failure.shape:
          raise ValueError(f"cannot load the weights of step {s} in {mngr.directory} into this model ({failure})")
        if step is not None or not queue:
          raise ValueError(f"checkpoint step {s} in {mngr.directory} is corrupt or incomplete ({failure}); "
                           f"{'no earlier step to load' if step is None else 'load another --step'}")
        warnings.warn(f"checkpoint step {s} in {mngr.directory} is corrupt or incomplete; trying step {queue[0]}",
                      CheckpointWarning, stacklevel=2)
        continue
      loaded = out["state"]["ema"] if use_ema else out["state"]["train"][0]
      if use_ema:
        nnx.update(model, jax.tree.map(lambda v, x: v.replace(x) if isinstance(v, nnx.Variable) else x,
                                       nnx.state(model, nnx.Param), loaded,
                                       is_leaf=lambda x: isinstance(x, nnx.Variable)))
      else:
        nnx.update(model, jax.tree.map(lambda v, x: v.replace(x) if isinstance(v, nnx.Variable) else x, mstate, loaded,
                                       is_leaf=lambda x: isinstance(x, nnx.Variable)))
      return s
  finally:
    mngr.close()


# Steps a reader finds removed under it (a trainer's keep policy) before it gives up: each retry reads the newest.
_REMOVED_RETRIES = 8

_READ_FAILURES = ("DATA_LOSS", "Error opening", "Error reading", "NOT_FOUND", "OUT_OF_RANGE", "checksum", "corrupt",
                  "truncat")


def _shape_mismatch(err: Exception) -> bool:
  """Whether a restore failed because the target has other shapes/structure (not unreadable data)."""
  text = str(err)
  if isinstance(err, OSError) or any(token in text for token in _READ_FAILURES):
    return False
  return isinstance(err, (ValueError, TypeError)) and any(w in text.lower() for w in ("shape", "structure", "tree"))


class _Failure(NamedTuple):
  """Why a restore failed, kept without the exception (whose frames hold orbax's pending reads)."""
  kind: str
  detail: str
  shape: bool                     # the target has other shapes/structure (vs unreadable data)

  def __str__(self):
    return f"{self.kind}: {self.detail}"


def _attempt(fn):
  """`(fn(), None)`, or `(None, _Failure)` once the failed read's frames are released and settled.

  The quiet window opens before the read: a loaded machine lands a failing read's first leftovers
  while its error is still on its way out of orbax."""
  failure = None
  _quiet_leftovers()
  with warnings.catch_warnings():
    # a failed read abandons orbax coroutines; their "never awaited" RuntimeWarning, finalised within the
    # call, is the same leftover `_leftover_filter` drops when warnings are errors (it reached the user, and
    # a test's pytest.warns, as a plain warning otherwise)
    warnings.filterwarnings("ignore", message=_UNAWAITED, category=RuntimeWarning)
    try:
      return fn(), None
    except Exception as e:  # noqa: BLE001 — any failure to read a step means the step is unusable
      lines = str(e).strip().splitlines()
      detail = lines[0].split("See full TensorStore details")[0].split("[source locations")[0].strip(" ;,")
      failure = _Failure(type(e).__name__, detail[:200] or "no detail", _shape_mismatch(e))   # TensorStore's repr tail off
    _settle_failed_read()
  return None, failure


_UNAWAITED = r"coroutine '[^']+' was never awaited"


def _settle_failed_read(seconds: float = 0.5):
  """Let the reads of a failed orbax restore land quietly.

  TensorStore reads still in flight when a restore fails complete on their own threads and try
  to post to the restore's event loop, which is already closed; Python reports each as an ignored
  `RuntimeError('Event loop is closed')` (or an orbax read coroutine never awaited). This silences
  exactly those reports for `_LEFTOVER_WINDOW_S` after each failed read — however late a loaded
  machine lands them — and waits `seconds` (then collects garbage) so most land within the call.
  A skipped checkpoint prints one warning, not a page, and none lands later. A save that fails
  (a full disk) leaves the same leftovers from its writes.
  """
  import gc
  _quiet_leftovers()
  time.sleep(seconds)
  gc.collect()


def _quiet_leftovers():
  """Open the window in which failed orbax I/O's leftover reports are dropped (see `_settle_failed_read`)."""
  global _leftovers_quiet_until
  _leftovers_quiet_until = time.monotonic() + _LEFTOVER_WINDOW_S
  if not getattr(sys.unraisablehook, "_attngeo_read_leftovers", False):
    sys.unraisablehook = _leftover_filter(sys.unraisablehook)
  asyncio_logs = logging.getLogger("asyncio")
  if not any(isinstance(f, _DropUnretrievedLogs) for f in asyncio_logs.filters):
    asyncio_logs.addFilter(_DropUnretrievedLogs())


class _DropUnretrievedLogs(logging.Filter):
  """asyncio's "<Future class> exception was never retrieved" records (each with an orbax traceback, ~160 lines
  in one resume of three from a corrupt step) of the failed reads' futures, collected after the restore
  gave up on them: dropped inside the leftover window, logged outside it."""

  def filter(self, record):
    unretrieved = re.match(r"\w+ exception was never retrieved", record.getMessage()) is not None  # _GatheringFuture…
    return not (unretrieved and time.monotonic() < _leftovers_quiet_until)


_LEFTOVER_WINDOW_S = 120.0
_leftovers_quiet_until = 0.0


def _is_read_leftover(report) -> bool:
  """A report from a failed restore's late reads: the closed-loop error, or an unawaited orbax coroutine."""
  closed_loop = isinstance(report.exc_value, RuntimeError) and "Event loop is closed" in str(report.exc_value)
  code = getattr(report.object, "cr_code", None)
  return closed_loop or (code is not None and "orbax" in code.co_filename)


def _leftover_filter(previous):
  """`sys.unraisablehook` that drops read leftovers inside the quiet window and passes the rest on."""
  def hook(report):
    if not (time.monotonic() < _leftovers_quiet_until and _is_read_leftover(report)):
      previous(report)
  hook._attngeo_read_leftovers = True
  return hook


def _quarantine(mngr, step: int):
  """Move a bad step aside to `<workdir>/ckpt_corrupt/<step>-<time>` so it is never resumed or overwritten."""
  src = os.path.join(str(mngr.directory), str(step))
  if jax.process_index() == 0 and os.path.exists(src):
    dst = os.path.join(os.path.dirname(str(mngr.directory)), runlock.QUARANTINE_NAME, f"{step}-{int(time.time())}")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.move(src, dst)
  mngr.reload()


def restore_latest(mngr, state, shardings):
  """Restore the newest intact step into `state`'s structure and shardings.

  Returns (state, data_state, step), or None when the manager has no step. Corrupt or incomplete
  steps (checksum mismatch, unreadable or truncated arrays, missing items) are skipped with a
  one-line `CheckpointWarning` and moved aside; a step whose arrays have other shapes than the
  model's raises a one-line `ValueError` (another model), since older steps would not match either.
  """
  mngr.reload()
  steps = sorted(mngr.all_steps(), reverse=True)
  if not steps:
    return None
  for i, step in enumerate(steps):
    _check_verifiable(mngr, step)
    out, failure = _attempt(lambda: _restore_step(mngr, step, state, shardings))
    if failure is None:
      return out[0], out[1], step
    if failure.shape:
      raise ValueError(f"checkpoint step {step} in {mngr.directory} holds arrays of other shapes than this "
                       f"model/optimizer ({failure})")
    nxt = steps[i + 1] if i + 1 < len(steps) else None
    warnings.warn(f"checkpoint step {step} in {mngr.directory} is corrupt or incomplete ({failure}); "
                  f"{'falling back to step ' + str(nxt) if nxt is not None else 'no earlier step'}",
                  CheckpointWarning, stacklevel=2)
    _quarantine(mngr, step)
  raise ValueError(f"no intact checkpoint in {mngr.directory}: every step was corrupt (moved to ckpt_corrupt/)")
