"""One training loop for every attngeo model: optax, orbax, `jax.jit` + `NamedSharding` over a mesh.

Read top to bottom: config (`attngeo.train_config`, JAX-free; `TrainConfig` and `check_resumable` are
re-exported here) → train state (born sharded) → step → metrics → loop. A model is
trained by giving `train` the model (an NNX module, or a zero-argument constructor so that its
parameters are created already sharded), a loss `loss_fn(model, batch, rng) -> (loss, metrics)`
and a data iterator with `get_state()/set_state()` (`attngeo.data.loader`) that yields THIS
process's rows of each global batch.

* Mesh axes `(data, fsdp, tensor)`; parameters carry logical axis names (`attngeo.nn`) which
  `attngeo.sharding.RULES` maps to mesh axes, dropping a mapping when the dimension does not divide.
  Given a constructor, the model and optimizer state are initialised under `jax.jit` with those
  output shardings: no device ever holds a full copy of a sharded parameter.
* Each process feeds its own rows; `sharding.global_batch` assembles the global array.
* Checkpoints (`attngeo.checkpoint`: orbax, checksummed) hold params, optimizer state, EMA, step,
  the RNG key and the data iterator position; `train` resumes from the newest intact one in
  `workdir`, and the resumed run reproduces the uninterrupted one exactly (per-step keys are
  `fold_in(key, step)`). A workdir holding a run of another config is refused, naming the fields.
* One process per workdir: `train` holds its lock (`attngeo.runlock`) for the whole run, so a
  second run on the same folder is refused in one line (`RunFolderBusy`) before it reads anything;
  a run that fails before its first checkpoint (a full disk, Ctrl-C) removes the files it added.
* Every logged row goes once to `workdir/metrics.jsonl` and to TensorBoard event files in
  `workdir/tb`, both flushed with each checkpoint; after a resume (even from a kill -9) each step
  appears exactly once in both. A tqdm bar shows loss and ETA; MFU is logged when the device peak
  is known.
* The EMA of the weights is optax's Polyak average `ema ← ema + (1 − decay)(θ − ema)`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
import warnings
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from attngeo import checkpoint, event_file, files, optim, runlock, sharding
from attngeo.nn import registry
from attngeo.train_config import RUN_CONTROL_FIELDS, TrainConfig, check_resumable  # noqa: F401 (re-exported)

# Dense bf16 peak FLOP/s per chip, for MFU.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
              "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12}


# ----------------------------------------------------------------------------- train state

def _build_state(model, cfg: TrainConfig):
  optimizer = nnx.Optimizer(model, optim.make_optimizer(cfg), wrt=nnx.Param)
  graphdef, train_state = nnx.split((model, optimizer))
  ema = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param)) if cfg.ema else None  # own buffers: donated
  state = {"train": train_state, "ema": ema, "rng": jax.random.key_data(jax.random.PRNGKey(cfg.seed)),
           "step": jnp.int32(0)}
  return graphdef, state


def _shardings(state, mesh: Mesh):
  return {"train": sharding.state_shardings(state["train"], mesh),
          "ema": sharding.state_shardings(state["ema"], mesh) if state["ema"] is not None else None,
          "rng": NamedSharding(mesh, P()), "step": NamedSharding(mesh, P())}


def init_state(model, cfg: TrainConfig, mesh: Mesh):
  """(graphdef, state, shardings): the train-state pytree on `mesh`, sharded by the logical rules.

  `model` is an NNX module or a zero-argument constructor. Either way the train state (model,
  optimizer state, EMA, key, step) is built inside `jax.jit` with output shardings derived from
  the parameters' logical axes (shapes first, from `jax.eval_shape`): a constructed model is
  born sharded and never whole on one device; a given module's arrays move device-to-device.
  """
  if isinstance(model, nnx.Module):
    mgraph, mstate = nnx.split(model)
    build = lambda ms: _build_state(nnx.merge(mgraph, ms), cfg)
    args = (mstate,)
  else:
    build = lambda: _build_state(model(), cfg)
    args = ()
  holder = {}

  def state_only(*a):
    holder["graphdef"], state = build(*a)
    return state
  abstract = jax.eval_shape(state_only, *args)
  shardings = _shardings(abstract, mesh)
  state = jax.jit(state_only, out_shardings=shardings)(*args)
  return holder["graphdef"], state, shardings


def sync_model(model, graphdef, state):
  """Write the train state's weights back into the (eager) `model`."""
  nnx.update(model, nnx.state(nnx.merge(graphdef, state["train"])[0]))


# ----------------------------------------------------------------------------- step

def make_step(graphdef, loss_fn, ema_decay: float):
  """Pure train step on the state pytree {"train": nnx.State, "ema": params | None, "rng", "step"}."""

  def step(state, batch):
    model, opt = nnx.merge(graphdef, state["train"])
    rng = jax.random.fold_in(state["rng"], state["step"])
    (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model, batch, rng)
    opt.update(model, grads)
    new = dict(state, train=nnx.state((model, opt)), step=state["step"] + 1)
    if state["ema"] is not None:
      new["ema"] = optax.incremental_update(nnx.state(model, nnx.Param), state["ema"], 1.0 - ema_decay)
    return new, dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))

  return step


# ----------------------------------------------------------------------------- metrics

class MetricsLog:
  """Each logged row once in `metrics.jsonl` and as TensorBoard scalars in `tb/` (process 0 only).

  On resume from step s the rows after s (written by the interrupted run) are dropped from
  metrics.jsonl (and a line cut short by a kill), and `tb/` is rebuilt from the rows kept: they go
  to a fresh events file and the earlier events files — which may hold steps after s, or lack
  rows never flushed — are removed, so every step appears exactly once in both. Events are
  written on the calling thread (one per row); `flush()`, called before each checkpoint is saved,
  puts both files on disk up to that step. A full disk is one `checkpoint.DiskFull` line. `rows`
  holds the rows kept, for the returned history.
  """

  def __init__(self, workdir: str | None, resume_step: int):
    self.rows, self.path, self.events = [], None, None
    if not workdir or jax.process_index() != 0:
      return
    self.path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(self.path):
      with open(self.path) as f:
        self.rows = [r for r in map(_parse_row, f) if r is not None and r.get("step", 0) <= resume_step]
    with self._writing("the kept metrics rows", sum(len(json.dumps(r)) + 1 for r in self.rows)):
      files.atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in self.rows))
      self.events = _fresh_events(os.path.join(workdir, "tb"), self.rows)

  def write(self, row: dict):
    self.rows.append(row)
    if self.path is None:
      return
    line = json.dumps(row) + "\n"
    with self._writing(f"the metrics row of step {row['step']}", len(line)):
      self._append(line)
      self.events.scalars(row["step"], _scalars(row))

  def _append(self, line: str):
    """`line` at the end of metrics.jsonl, or the file as it was (a full disk cut no row in half)."""
    size = os.path.getsize(self.path)
    try:
      with open(self.path, "a") as f:
        f.write(line)
    except OSError:
      with contextlib.suppress(OSError):
        os.truncate(self.path, size)
      raise

  def flush(self):
    if self.path is not None:
      with self._writing("the metrics", 0):
        self.events.flush()
        with open(self.path, "a") as f:
          os.fsync(f.fileno())

  def close(self):
    if self.events is not None:
      with self._writing("the metrics", 0):
        self.events.close()

  @contextlib.contextmanager
  def _writing(self, what: str, needed: int):
    try:
      yield
    except OSError as e:
      code = checkpoint.storage_limit(e)
      if code is None:
        raise
      # a metrics row is cut back (`_append`); a TensorBoard record cut short is rebuilt from the rows on resume
      raise checkpoint.disk_full(os.path.dirname(self.path), needed, what, removed=needed > 0, code=code) from None


def _parse_row(line: str) -> dict | None:
  """A metrics.jsonl row, or None for a blank line or one a kill cut short."""
  try:
    return json.loads(line) if line.strip() else None
  except json.JSONDecodeError:
    return None


def _scalars(row: dict) -> dict[str, float]:
  """The row's numbers, the TensorBoard scalars of its step."""
  return {k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


def _fresh_events(folder: str, rows: list[dict]):
  """An events writer on a new file in `folder` holding `rows`; the folder's earlier events files removed."""
  os.makedirs(folder, exist_ok=True)
  old = [os.path.join(folder, f) for f in os.listdir(folder) if f.startswith("events.out.tfevents.")]
  events = event_file.EventsWriter(folder, f".{os.getpid()}.{time.time_ns()}")
  for row in rows:
    events.scalars(row["step"], _scalars(row))
  events.flush()                     # the kept rows are on disk before the old copies go
  for path in old:
    os.remove(path)
  return events


# ----------------------------------------------------------------------------- loop

@dataclasses.dataclass
class TrainResult:
  model: Any                      # the trained NNX model (EMA weights are in `ema` if enabled)
  ema: Any
  history: list[dict]             # metrics per logged step (those of an interrupted run included)
  step: int
  start_step: int = 0             # the step this call resumed from (0: a fresh run)


def device_peak_flops() -> float | None:
  kind = jax.devices()[0].device_kind
  return next((v for k, v in PEAK_FLOPS.items() if k in kind), None)


def _resume(cfg: TrainConfig, state, shardings, data, model_cfg):
  """Check the workdir's config (before opening anything), then restore the newest intact step."""
  if runlock.has_checkpoint(cfg.workdir) and os.path.exists(os.path.join(cfg.workdir, "config.json")):
    check_resumable(cfg.workdir, train=cfg, model=model_cfg)
  mngr = checkpoint.manager(cfg.workdir, cfg.keep, clean=True)      # the lock is held: unfinished steps are ours
  try:
    restored = checkpoint.restore_latest(mngr, state, shardings)
  except BaseException:
    mngr.close()
    raise
  if restored is not None:
    state, data_state, _ = restored
    data.set_state(data_state)
  elif jax.process_index() == 0 and _quarantined(cfg.workdir):   # after an all-corrupt refusal: say it starts over
    warnings.warn(f"no intact checkpoint in {mngr.directory}: training from step 0 (the corrupt steps stay in "
                  f"{os.path.join(cfg.workdir, runlock.QUARANTINE_NAME)})", checkpoint.CheckpointWarning, stacklevel=2)
  recorded = (files.read_config(cfg.workdir) if os.path.exists(os.path.join(cfg.workdir, "config.json")) else {})
  files.write_config(cfg.workdir, **{**recorded, "train": cfg, "model": model_cfg})   # an experiment's own config stays
  return mngr, state


def _quarantined(workdir: str) -> bool:
  folder = os.path.join(workdir, runlock.QUARANTINE_NAME)
  return os.path.isdir(folder) and bool(os.listdir(folder))


def _run_folder(workdir: str | None):
  """The run folder's lock (`attngeo.runlock`), held by process 0 (the processes of one run share it)."""
  return (runlock.hold(workdir, started=runlock.has_checkpoint) if workdir and jax.process_index() == 0 else
          contextlib.nullcontext())


def _kept(mngr, cfg: TrainConfig, log) -> str:
  """What a run stopped by a non-finite loss leaves: its last checkpoint, or nothing (a run folder without a
  checkpoint is removed as the run found it, `_run_folder`), and the last finite loss it logged."""
  last = mngr.latest_step() if mngr else None
  rows = [r for r in log.rows if np.isfinite(r.get("loss", np.nan))]
  seen = f"; the last finite loss logged was {rows[-1]['loss']:.4g} at step {rows[-1]['step']}" if rows else ""
  if last is not None:
    return f"the last checkpoint in {cfg.workdir} (step {last}) holds the state before it{seen}"
  due = f", the first was due at step {cfg.ckpt_every}" if cfg.ckpt_every else ""
  return f"no checkpoint was written before it{due}{seen}"


def train(model, loss_fn: Callable, data: Iterator, cfg: TrainConfig, *, flops_per_step: float | None = None,
          hooks: tuple[Callable, ...] = (), desc: str = "train", tokens_per_step: int | None = None) -> TrainResult:
  """Train for `cfg.steps` steps, resuming from `cfg.workdir` if it holds an intact checkpoint.

  Args:
    model: an NNX module (trained in place) or a zero-argument constructor (initialised sharded;
      the trained model is `result.model`).
    loss_fn: `loss_fn(model, batch, rng) -> (scalar loss, dict of scalar metrics)`.
    data: iterator of this process's rows of each global batch (dicts of arrays), with
      `get_state()/set_state(state)`.
    cfg: the `TrainConfig`.
    flops_per_step: model FLOPs of one step (for MFU, where the device peak is known).
    hooks: callables `hook(step, model) -> dict | None` of extra metrics, called at log steps.
    tokens_per_step: tokens in one global batch, to log and show tokens/s (language models).
  Returns:
    `TrainResult` (model, EMA params, metrics history, final step).
  """
  cfg.validate()
  with contextlib.ExitStack() as closing:             # closed in reverse order, each even if one fails
    closing.enter_context(_run_folder(cfg.workdir))
    mesh = sharding.make_mesh(cfg.mesh)
    graphdef, state, shardings = init_state(model, cfg, mesh)
    if not isinstance(model, nnx.Module):
      model = nnx.merge(graphdef, state["train"])[0]
    step_fn = jax.jit(make_step(graphdef, loss_fn, cfg.ema),
                      in_shardings=(shardings, sharding.batch_sharding(mesh)), out_shardings=(shardings, None),
                      donate_argnums=0)
    mngr = None
    if cfg.workdir:
      mngr, state = _resume(cfg, state, shardings, data, registry.config_dict(model))
      closing.callback(checkpoint.finish, mngr)
    start = int(jax.device_get(state["step"]))
    log = MetricsLog(cfg.workdir, start)
    closing.callback(log.close)
    peak = device_peak_flops()
    bar = closing.enter_context(tqdm(range(start, cfg.steps), desc=desc, disable=not cfg.progress, initial=start,
                                     total=cfg.steps, dynamic_ncols=True, leave=False))
    t0 = time.perf_counter()
    for step in bar:
      batch = sharding.global_batch(next(data), mesh)
      state, metrics = step_fn(state, batch)
      done = step + 1
      if done % cfg.log_every == 0 or done == cfg.steps:
        metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
        if not np.isfinite(metrics["loss"]):
          raise FloatingPointError(f"loss is {metrics['loss']} at step {done}; {_kept(mngr, cfg, log)} "
                                   "(lower the learning rate?)")
        dt = (time.perf_counter() - t0) / (done - start)
        row = dict(step=done, **metrics, step_s=dt, samples_per_s=cfg.batch_size / dt)
        if tokens_per_step:
          row["tokens_per_s"] = tokens_per_step / dt
        if flops_per_step and peak:
          row["mfu"] = flops_per_step / dt / (peak * jax.device_count())
        if hooks:
          sync_model(model, graphdef, state)
          for hook in hooks:
            row.update(hook(done, model) or {})
        log.write(row)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}",
                        **({"tok/s": f"{row['tokens_per_s']:.0f}"} if tokens_per_step else {}))
      if mngr and ((cfg.ckpt_every and done % cfg.ckpt_every == 0) or done == cfg.steps):
        log.flush()                  # every row up to `done` on disk before the step that resumes after it
        checkpoint.save(mngr, done, state, data.get_state())
  sync_model(model, graphdef, state)
  return TrainResult(model=model, ema=state["ema"], history=log.rows, step=int(jax.device_get(state["step"])),
                     start_step=start)
