"""A tiny GPT training run used by the sharding, multi-process and resume tests (run as a script).

    python tests/tiny_run.py --workdir DIR [--mesh 2,2,2] [--steps 12] [--ckpt-every 0]
                             [--coordinator HOST:PORT --num-processes 2 --process-id I] [--sleep 0]

Prints one JSON line per step: {"step": s, "loss": l}; the last line holds parameter shardings.
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--workdir", default=None)
ap.add_argument("--mesh", default="1,1,1")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--ckpt-every", type=int, default=0)
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--operator", default="DMTN")
ap.add_argument("--coordinator", default=None)
ap.add_argument("--num-processes", type=int, default=1)
ap.add_argument("--process-id", type=int, default=0)
ap.add_argument("--sharded-init", action="store_true", help="pass a constructor: parameters born sharded")
a = ap.parse_args()

import jax  # noqa: E402

if a.coordinator:  # the same environment contract as tpu/launch_gpu.sh
  os.environ.update(JAX_COORDINATOR_ADDRESS=a.coordinator, JAX_NUM_PROCESSES=str(a.num_processes),
                    JAX_PROCESS_ID=str(a.process_id))
  from attngeo import sharding as _sharding
  assert _sharding.initialize_distributed()

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from attngeo import data, nn, train  # noqa: E402

rng = np.random.default_rng(0)
records = [{"tokens": rng.integers(0, 64, 17).astype(np.int32), "id": np.int32(i)} for i in range(64)]


class CountingSource:
  """The records, counting how many this process reads."""
  reads = 0

  def __len__(self):
    return len(records)

  def __getitem__(self, i):
    CountingSource.reads += 1
    return records[i]


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


it = Recorder(data.loader(CountingSource(), 8, seed=1, prefetch=0, threads=0))   # on demand: reads are counted
cfg_model = nn.GPTConfig.from_depth(2, vocab_size=64, seq_len=16, head_dim=8, width=32, operator=a.operator)
model = (lambda: nn.GPT(cfg_model, rngs=nnx.Rngs(0))) if a.sharded_init else nn.GPT(cfg_model, rngs=nnx.Rngs(0))


def loss_fn(m, batch, rng_):
  import optax
  tok = batch["tokens"]
  logits = m(tok[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits, tok[:, 1:]).mean(), {}


def slow(step, _):
  time.sleep(a.sleep)


cfg = train.TrainConfig(steps=a.steps, batch_size=8, lr=1e-2, warmup=2, mesh=tuple(int(x) for x in a.mesh.split(",")),
                        workdir=a.workdir, ckpt_every=a.ckpt_every, log_every=1, progress=False)
res = train.train(model, loss_fn, it, cfg, hooks=(slow,) if a.sleep else ())
for row in res.history:
  print(json.dumps({"step": row["step"], "loss": row["loss"]}), flush=True)
wq = nn.attention_modules(res.model)[0].wq[...]
params = [v.get_value() for _, v in nnx.to_flat_state(nnx.state(res.model, nnx.Param))]
sharded = [x for x in params if any(s is not None for s in x.sharding.spec)]
print(json.dumps({"wq_spec": str(wq.sharding.spec), "devices": jax.device_count(), "processes": jax.process_count(),
                  "start_step": res.start_step, "ids": it.ids, "reads": CountingSource.reads,
                  "sharded_params": len(sharded),
                  "full_copies": sum(any(sh.data.shape == x.shape for sh in x.addressable_shards) for x in sharded)}))
sys.stdout.flush()
os._exit(0) if a.coordinator else None
