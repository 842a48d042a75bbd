"""One training loop for every attngeo model: optax, orbax, `jax.jit` + `NamedSharding` over a mesh.

Read top to bottom: config → mesh → sharding rules → optimizer → train state → step → checkpoint
→ loop. A model is trained by giving `train` the NNX model, a loss `loss_fn(model, batch, rng) ->
(loss, metrics)` and a data iterator with `get_state()/set_state()` (a grain iterator).

* Mesh axes `(data, fsdp, tensor)`; parameters carry logical axis names (`attngeo.nn`) which
  `RULES` maps to mesh axes, dropping a mapping when the dimension does not divide.
* The global batch is split over `data × fsdp`; each process feeds its own rows
  (`jax.make_array_from_process_local_data`), so the same code runs single- and multi-host.
* Checkpoints (orbax `CheckpointManager`) hold params, optimizer state, EMA, step, the RNG key
  and the data iterator position; `train` resumes from the latest one in `workdir`, and the
  resumed run reproduces the uninterrupted one exactly (per-step keys are `fold_in(key, step)`).
* Metrics go to `workdir/metrics.jsonl` and a tqdm bar; MFU is logged when the device peak is known.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# Logical axis -> mesh axis (maxtext-style rule list; edit here or per run to change the layout).
RULES = (("batch", BATCH_AXES), ("embed", "fsdp"), ("heads", "tensor"), ("mlp", "tensor"),
         ("vocab", "tensor"), ("kv", None), ("cond", None))
# Dense bf16 peak FLOP/s per chip, for MFU.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "TPU v4": 275e12, "TPU v5 lite": 197e12,
              "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12}


@dataclasses.dataclass
class TrainConfig:
  steps: int = 1000
  batch_size: int = 32                 # global batch
  lr: float = 1e-3
  warmup: int = 50
  schedule: str = "cosine"             # cosine | linear | constant (after warm-up)
  weight_decay: float = 0.0
  clip: float = 1.0                    # global-norm clipping (0 disables)
  optimizer: str = "adamw"             # adamw | muon
  ema: float = 0.0                     # EMA decay of the weights (0 disables)
  mesh: tuple[int, int, int] = (1, 1, 1)  # (data, fsdp, tensor)
  seed: int = 0
  workdir: str | None = None           # checkpoints, metrics.jsonl, config.json
  ckpt_every: int = 0                  # steps between checkpoints (0: only at the end)
  keep: int = 2
  log_every: int = 10
  progress: bool = True


# ----------------------------------------------------------------------------- processes, mesh & sharding

def initialize_distributed() -> bool:
  """Start multi-process JAX from the environment, before any backend is touched.

  `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID` (GPU clusters via
  `tpu/launch_gpu.sh`, localhost tests; CPU collectives use gloo), or automatic detection on a
  Cloud TPU pod slice (several `TPU_WORKER_HOSTNAMES`). Returns whether it initialised.
  """
  addr = os.environ.get("JAX_COORDINATOR_ADDRESS")
  if addr:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(addr, int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"]))
    return True
  if len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1:
    jax.distributed.initialize()
    return True
  return False


def make_mesh(shape=(1, 1, 1), devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh over all devices; the product of `shape` must equal their count."""
  devices = jax.devices() if devices is None else devices
  shape = tuple(int(s) for s in shape)
  if len(shape) != 3 or any(s < 1 for s in shape):
    raise ValueError(f"mesh must be three positive sizes (data, fsdp, tensor); got {shape}")
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} devices; "
                     f"{len(devices)} are available")
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_spec(axes, shape, mesh: Mesh, rules=RULES) -> P:
  """PartitionSpec for a value of `shape` with logical `axes`: rules applied where they divide."""
  rules, used, spec = dict(rules), set(), []
  for name, dim in zip(axes, shape):
    target = rules.get(name)
    targets = (target,) if isinstance(target, str) else tuple(target or ())
    size = int(np.prod([mesh.shape[t] for t in targets])) if targets else 1
    if targets and not used & set(targets) and dim % size == 0 and size > 1:
      spec.append(targets[0] if len(targets) == 1 else targets)
      used |= set(targets)
    else:
      spec.append(None)
  return P(*spec)


def state_shardings(state, mesh: Mesh, rules=RULES):
  """NamedSharding for every leaf of an NNX state: from its `axes` metadata, else replicated."""
  def one(v):
    axes = getattr(v, "axes", None) if isinstance(v, nnx.Variable) else None
    value = v.get_value() if isinstance(v, nnx.Variable) else v
    spec = logical_to_spec(axes, np.shape(value), mesh, rules) if axes else P()
    return v.replace(NamedSharding(mesh, spec)) if isinstance(v, nnx.Variable) else NamedSharding(mesh, spec)
  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def global_batch(local, mesh: Mesh):
  """Host batch (this process's rows of every array) -> globally sharded jax.Arrays."""
  sh = batch_sharding(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sh, np.asarray(x)), local)


def process_rows(batch, num_processes=None, index=None):
  """The rows of a global numpy batch that this process feeds (contiguous block per process)."""
  num_processes = jax.process_count() if num_processes is None else num_processes
  index = jax.process_index() if index is None else index
  def rows(x):
    if len(x) % num_processes:
      raise ValueError(f"global batch {len(x)} does not split over {num_processes} processes")
    n = len(x) // num_processes
    return x[index * n:(index + 1) * n]
  return jax.tree.map(rows, batch)


# ----------------------------------------------------------------------------- optimizer

def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  """Warm-up then cosine/linear/constant schedule; AdamW or Muon; global-norm clipping."""
  decay_steps = max(cfg.steps - cfg.warmup, 1)
  after = {"cosine": optax.cosine_decay_schedule(cfg.lr, decay_steps),
           "linear": optax.linear_schedule(cfg.lr, 0.0, decay_steps),
           "constant": optax.constant_schedule(cfg.lr)}
  if cfg.schedule not in after:
    raise ValueError(f"schedule must be one of {sorted(after)}; got {cfg.schedule!r}")
  sched = optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, cfg.warmup), after[cfg.schedule]], [cfg.warmup])
  if cfg.optimizer == "adamw":
    opt = optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)
  elif cfg.optimizer == "muon":
    opt = optax.contrib.muon(sched, weight_decay=cfg.weight_decay)
  else:
    raise ValueError(f"optimizer must be 'adamw' or 'muon'; got {cfg.optimizer!r}")
  return optax.chain(optax.clip_by_global_norm(cfg.clip), opt) if cfg.clip else opt


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
      params = nnx.state(model, nnx.Param)
      new["ema"] = jax.tree.map(lambda e, p: ema_decay * e + (1 - ema_decay) * p, state["ema"], params)
    return new, dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads))

  return step


# ----------------------------------------------------------------------------- checkpoint

def checkpoint_manager(workdir: str, cfg: TrainConfig) -> ocp.CheckpointManager:
  opts = ocp.CheckpointManagerOptions(max_to_keep=cfg.keep, create=True)
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


# ----------------------------------------------------------------------------- loop

@dataclasses.dataclass
class TrainResult:
  model: Any                      # the trained NNX model (EMA weights are in `ema` if enabled)
  ema: Any
  history: list[dict]             # metrics per logged step
  step: int


def device_peak_flops() -> float | None:
  kind = jax.devices()[0].device_kind
  return next((v for k, v in PEAK_FLOPS.items() if k in kind), None)


def write_config(workdir: str, **configs):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for k, v in configs.items()},
              f, indent=1, default=str)


def _sync(model, graphdef, state):
  """Write the train state's weights back into the (eager) `model`."""
  nnx.update(model, nnx.state(nnx.merge(graphdef, state["train"])[0]))


def init_state(model, cfg: TrainConfig, mesh: Mesh):
  """(graphdef, state, shardings): the train-state pytree placed on `mesh` by the logical rules."""
  optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=nnx.Param)
  graphdef, train_state = nnx.split((model, optimizer))
  ema = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param)) if cfg.ema else None  # own buffers: donated
  state = {"train": train_state, "ema": ema, "rng": jax.random.key_data(jax.random.PRNGKey(cfg.seed)),
           "step": jnp.int32(0)}
  shardings = {"train": state_shardings(train_state, mesh), "ema": state_shardings(ema, mesh) if ema else None,
               "rng": NamedSharding(mesh, P()), "step": NamedSharding(mesh, P())}
  return graphdef, jax.device_put(state, shardings), shardings


def load_model(model, workdir: str, cfg: TrainConfig, step: int | None = None, use_ema: bool = False):
  """Load the weights of checkpoint `step` (default: latest) in `workdir` into `model` (in place)."""
  mesh = make_mesh(cfg.mesh)
  graphdef, state, shardings = init_state(model, cfg, mesh)
  mngr = checkpoint_manager(workdir, cfg)
  step = mngr.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {os.path.join(workdir, 'ckpt')}")
  state, _ = restore(mngr, step, state, shardings)
  mngr.close()
  _sync(model, graphdef, state)
  if use_ema and state["ema"] is not None:
    nnx.update(model, state["ema"])
  return model


def model_config_dict(model) -> dict | None:
  """`{"class": "GPTConfig", **fields}` of a model built from a config dataclass (`model.cfg`)."""
  cfg = getattr(model, "cfg", None)
  return None if cfg is None else {"class": type(cfg).__name__, **dataclasses.asdict(cfg)}


def load_run(workdir: str, step: int | None = None):
  """Rebuild the model of a run folder from its config.json and load checkpoint `step` (default latest).

  Returns (model, train config, model config).
  """
  from attngeo import nn  # the trainer does not depend on the model zoo otherwise
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"{workdir} is not a run folder: no config.json")
  with open(path) as f:
    saved = json.load(f)
  if not saved.get("model"):
    raise ValueError(f"{path} records no model config; runs written by attngeo.train record one")
  fields = dict(saved["model"])
  cls_name = fields.pop("class")
  model_cls, cfg_cls = getattr(nn, cls_name.removesuffix("Config"), None), getattr(nn, cls_name, None)
  if model_cls is None or cfg_cls is None:
    raise ValueError(f"unknown model config class {cls_name!r} in {path}")
  mcfg = cfg_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
  tfields = {k: tuple(v) if isinstance(v, list) else v for k, v in saved["train"].items()}
  tcfg = TrainConfig(**tfields)
  model = load_model(model_cls(mcfg, rngs=nnx.Rngs(0)), workdir, tcfg, step)
  return model, tcfg, mcfg


def train(model, loss_fn: Callable, data: Iterator, cfg: TrainConfig, *, flops_per_step: float | None = None,
          hooks: tuple[Callable, ...] = (), desc: str = "train") -> TrainResult:
  """Train `model` in place for `cfg.steps` steps, resuming from `cfg.workdir` if it has checkpoints.

  loss_fn(model, batch, rng) -> (scalar loss, dict of scalar metrics). `data` yields global numpy
  batches (dicts) and has `get_state()/set_state(state)`. `hooks`: callables `hook(step, model)`
  returning a dict of extra metrics (or None), called at log steps.
  """
  mesh = make_mesh(cfg.mesh)
  graphdef, state, shardings = init_state(model, cfg, mesh)
  step_fn = jax.jit(make_step(graphdef, loss_fn, cfg.ema),
                    in_shardings=(shardings, batch_sharding(mesh)), out_shardings=(shardings, None),
                    donate_argnums=0)

  mngr = None
  if cfg.workdir:
    write_config(cfg.workdir, train=cfg, model=model_config_dict(model))
    mngr = checkpoint_manager(cfg.workdir, cfg)
    if mngr.latest_step() is not None:
      try:
        state, data_state = restore(mngr, mngr.latest_step(), state, shardings)
      except ValueError:
        mngr.close()
        raise
      data.set_state(data_state)
  start = int(state["step"])
  history, metrics_path = [], cfg.workdir and os.path.join(cfg.workdir, "metrics.jsonl")
  peak = device_peak_flops()
  bar = tqdm(range(start, cfg.steps), desc=desc, disable=not cfg.progress, initial=start, total=cfg.steps,
             dynamic_ncols=True, leave=False)
  t0 = time.perf_counter()
  for step in bar:
    batch = global_batch(process_rows(next(data)), mesh)
    state, metrics = step_fn(state, batch)
    done = step + 1
    if done % cfg.log_every == 0 or done == cfg.steps:
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      if not np.isfinite(metrics["loss"]):
        raise FloatingPointError(f"loss is {metrics['loss']} at step {done}; the last checkpoint in "
                                 f"{cfg.workdir} holds the state before it (lower the learning rate?)")
      dt = (time.perf_counter() - t0) / (done - start)
      row = dict(step=done, **metrics, step_s=dt, samples_per_s=cfg.batch_size / dt)
      if flops_per_step and peak:
        row["mfu"] = flops_per_step / dt / (peak * jax.device_count())
      if hooks:
        _sync(model, graphdef, state)
        for hook in hooks:
          row.update(hook(done, model) or {})
      history.append(row)
      bar.set_postfix(loss=f"{metrics['loss']:.4f}")
      if metrics_path and jax.process_index() == 0:
        with open(metrics_path, "a") as f:
          f.write(json.dumps(row) + "\n")
    if mngr and ((cfg.ckpt_every and done % cfg.ckpt_every == 0) or done == cfg.steps):
      save(mngr, done, state, data.get_state())
  bar.close()
  if mngr:
    mngr.wait_until_finished()
    mngr.close()
  _sync(model, graphdef, state)
  return TrainResult(model=model, ema=state["ema"], history=history, step=int(state["step"]))
