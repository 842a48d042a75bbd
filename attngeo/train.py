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
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tqdm.auto import tqdm

from attngeo import checkpoint, optim, runs, sharding
from attngeo.nn import registry

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


def sync_model(model, graphdef, state):
  """Write the train state's weights back into the (eager) `model`."""
  nnx.update(model, nnx.state(nnx.merge(graphdef, state["train"])[0]))


def init_state(model, cfg: TrainConfig, mesh: Mesh):
  """(graphdef, state, shardings): the train-state pytree placed on `mesh` by the logical rules."""
  optimizer = nnx.Optimizer(model, optim.make_optimizer(cfg), wrt=nnx.Param)
  graphdef, train_state = nnx.split((model, optimizer))
  ema = jax.tree.map(jnp.copy, nnx.state(model, nnx.Param)) if cfg.ema else None  # own buffers: donated
  state = {"train": train_state, "ema": ema, "rng": jax.random.key_data(jax.random.PRNGKey(cfg.seed)),
           "step": jnp.int32(0)}
  shardings = {"train": sharding.state_shardings(train_state, mesh), "ema": sharding.state_shardings(ema, mesh) if ema else None,
               "rng": NamedSharding(mesh, P()), "step": NamedSharding(mesh, P())}
  return graphdef, jax.device_put(state, shardings), shardings


def train(model, loss_fn: Callable, data: Iterator, cfg: TrainConfig, *, flops_per_step: float | None = None,
          hooks: tuple[Callable, ...] = (), desc: str = "train", tokens_per_step: int | None = None) -> TrainResult:
  """Train `model` in place for `cfg.steps` steps, resuming from `cfg.workdir` if it has checkpoints.

  loss_fn(model, batch, rng) -> (scalar loss, dict of scalar metrics). `data` yields global numpy
  batches (dicts) and has `get_state()/set_state(state)`. `hooks`: callables `hook(step, model)`
  returning a dict of extra metrics (or None), called at log steps. `tokens_per_step`: log and show
  tokens/s (language models).
  """
  mesh = sharding.make_mesh(cfg.mesh)
  graphdef, state, shardings = init_state(model, cfg, mesh)
  step_fn = jax.jit(make_step(graphdef, loss_fn, cfg.ema),
                    in_shardings=(shardings, sharding.batch_sharding(mesh)), out_shardings=(shardings, None),
                    donate_argnums=0)

  mngr = None
  if cfg.workdir:
    runs.write_config(cfg.workdir, train=cfg, model=registry.config_dict(model))
    mngr = checkpoint.manager(cfg.workdir, cfg.keep)
    if mngr.latest_step() is not None:
      try:
        state, data_state = checkpoint.restore(mngr, mngr.latest_step(), state, shardings)
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
    global_rows = next(data)
    batch = sharding.global_batch(jax.tree.map(lambda x: x[sharding.process_slice(len(x))], global_rows), mesh)
    state, metrics = step_fn(state, batch)
    done = step + 1
    if done % cfg.log_every == 0 or done == cfg.steps:
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      if not np.isfinite(metrics["loss"]):
        raise FloatingPointError(f"loss is {metrics['loss']} at step {done}; the last checkpoint in "
                                 f"{cfg.workdir} holds the state before it (lower the learning rate?)")
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
      history.append(row)
      bar.set_postfix(loss=f"{metrics['loss']:.4f}", **({"tok/s": f"{row['tokens_per_s']:.0f}"} if tokens_per_step else {}))
      if metrics_path and jax.process_index() == 0:
        with open(metrics_path, "a") as f:
          f.write(json.dumps(row) + "\n")
    if mngr and ((cfg.ckpt_every and done % cfg.ckpt_every == 0) or done == cfg.steps):
      checkpoint.save(mngr, done, state, data.get_state())
  bar.close()
  if mngr:
    mngr.wait_until_finished()
    mngr.close()
  sync_model(model, graphdef, state)
  return TrainResult(model=model, ema=state["ema"], history=history, step=int(state["step"]))
