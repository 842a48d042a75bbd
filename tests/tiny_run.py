"""A tiny GPT training run used by the sharding, multi-process and resume tests.

    python tests/tiny_run.py --workdir DIR [--mesh 2,2,2] [--steps 12] [--ckpt-every 0]
                             [--coordinator HOST:PORT --num-processes 2 --process-id I] [--hold-at 0]

As a script it prints one JSON line per step: {"step": s, "loss": l}; the last line holds parameter
shardings. Runs that need no other device count, process group or kill call `run(argv)` in the test's
own process: the same rows, without a second interpreter importing JAX and compiling the step again.
"""
import argparse
import json
import os
import sys
import time


def parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", default=None)
  ap.add_argument("--mesh", default="1,1,1")
  ap.add_argument("--steps", type=int, default=12)
  ap.add_argument("--ckpt-every", type=int, default=0)
  ap.add_argument("--hold-at", type=int, default=0,
                  help="after step N's update, write WORKDIR.held and wait to be killed (a kill at a known step)")
  ap.add_argument("--operator", default="DMTN")
  ap.add_argument("--coordinator", default=None)
  ap.add_argument("--num-processes", type=int, default=1)
  ap.add_argument("--process-id", type=int, default=0)
  ap.add_argument("--sharded-init", action="store_true", help="pass a constructor: parameters born sharded")
  ap.add_argument("--reg", default="", help="geometry terms added to the loss, e.g. skew=0.1,curvature=0.1")
  return ap


class CountingSource:
  """The records, counting how many this process reads."""

  def __init__(self, records):
    self.records, self.reads = records, 0

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    self.reads += 1
    return self.records[i]


class Recorder:
  """Wraps the loader: keeps the record ids of each batch this process fed."""

  def __init__(self, it):
    self.it, self.ids = it, []

  def __next__(self):
    batch = next(self.it)
    self.ids.append(batch["id"].tolist())
    return {"tokens": batch["tokens"]}

  def get_state(self):
    return self.it.get_state()

  def set_state(self, state):
    self.it.set_state(state)


def loss_fn(m, batch, rng_):
  import optax
  tok = batch["tokens"]
  logits = m(tok[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, tok[:, 1:]).mean(), {}


def regularised(spec: str, fn):
  """`fn` plus the geometry terms `spec` names (`attngeo.regularisers`; "" leaves it as it is)."""
  from attngeo import regularisers
  weights = {t: float(w) for t, w in (item.split("=") for item in spec.split(",") if item)}
  return regularisers.regularised(regularisers.Regularisers(**weights), fn)


def run(argv=()) -> tuple[list[dict], dict]:
  """The run `argv` asks for: ([{"step", "loss"}] per step, the metadata of the last line)."""
  a = parser().parse_args(list(argv))
  import jax
  if a.coordinator:  # the same environment contract as tpu/launch_gpu.sh
    os.environ.update(JAX_COORDINATOR_ADDRESS=a.coordinator, JAX_NUM_PROCESSES=str(a.num_processes),
                      JAX_PROCESS_ID=str(a.process_id))
    from attngeo import sharding as _sharding
    assert _sharding.initialize_distributed()

  import numpy as np
  from flax import nnx

  from attngeo import data, nn, train

  rng = np.random.default_rng(0)
  source = CountingSource([{"tokens": rng.integers(0, 64, 17).astype(np.int32), "id": np.int32(i)} for i in range(64)])
  it = Recorder(data.loader(source, 8, seed=1, prefetch=0, threads=0))   # on demand: reads are counted
  cfg_model = nn.GPTConfig.from_depth(2, vocab_size=64, seq_len=16, head_dim=8, width=32, operator=a.operator)
  model = (lambda: nn.GPT(cfg_model, rngs=nnx.Rngs(0))) if a.sharded_init else nn.GPT(cfg_model, rngs=nnx.Rngs(0))
  def hold(step, _):
    if step == a.hold_at:
      with open(f"{a.workdir}.held", "w"):
        pass
      time.sleep(600)
  cfg = train.TrainConfig(steps=a.steps, batch_size=8, lr=1e-2, warmup=2, mesh=tuple(int(x) for x in a.mesh.split(",")),
                          workdir=a.workdir, ckpt_every=a.ckpt_every, log_every=1, progress=False)
  res = train.train(model, regularised(a.reg, loss_fn), it, cfg, hooks=(hold,) if a.hold_at else ())
  wq = nn.attention_modules(res.model)[0].wq[...]
  params = [v.get_value() for _, v in nnx.to_flat_state(nnx.state(res.model, nnx.Param))]
  sharded = [x for x in params if any(s is not None for s in x.sharding.spec)]
  meta = {"wq_spec": str(wq.sharding.spec), "devices": jax.device_count(), "processes": jax.process_count(),
          "start_step": res.start_step, "ids": it.ids, "reads": source.reads, "sharded_params": len(sharded),
          "full_copies": sum(any(sh.data.shape == x.shape for sh in x.addressable_shards) for x in sharded)}
  return [{"step": row["step"], "loss": row["loss"]} for row in res.history], meta


if __name__ == "__main__":
  losses, meta = run(sys.argv[1:])
  for row in losses:
    print(json.dumps(row), flush=True)
  print(json.dumps(meta))
  sys.stdout.flush()
  os._exit(0) if "--coordinator" in sys.argv else None
