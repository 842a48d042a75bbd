"""Training-step time of the same small GPT under each operator, as a ratio to ATTN.

    attngeo bench-train [--seq 1024] [--batch 4] [--depth 2] [--width 128] [--head-dim 64]
                                      [--repeats 5] [--implementation auto] [--dtype float32]

Times the jitted, donated train step of `attngeo.train` (forward, backward, AdamW update) on
random tokens, median of --repeats after one warm-up, and prints tokens/s, the ratio to ATTN and,
on devices with a known peak, model FLOPs utilisation (6·params·tokens + 12·depth·seq²·width
per sequence, the usual decoder count; augmented heads are not credited).
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from attngeo import kernels, nn, sharding, train
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col


def loss_fn(m, batch, rng):
  tok = batch["tokens"]
  return optax.softmax_cross_entropy_with_integer_labels(m(tok[:, :-1]), tok[:, 1:]).mean(), {}


def step_time(op, a):
  cfg = nn.GPTConfig.from_depth(a.depth, vocab_size=256, seq_len=a.seq, head_dim=a.head_dim, width=a.width,
                                operator=op, implementation=None if a.implementation == "auto" else a.implementation,
                     dtype=a.dtype)
  model = nn.GPT(cfg, rngs=nnx.Rngs(0))
  tcfg = train.TrainConfig(steps=10, batch_size=a.batch, progress=False)
  mesh = sharding.make_mesh((jax.device_count(), 1, 1))
  graphdef, state, shardings = train.init_state(model, tcfg, mesh)
  step = jax.jit(train.make_step(graphdef, loss_fn, 0.0), donate_argnums=0)
  tok = np.random.default_rng(0).integers(0, 256, (a.batch, a.seq + 1)).astype(np.int32)
  batch = sharding.global_batch({"tokens": tok}, mesh)
  holder = {"state": state}

  def one_step():
    holder["state"], m = step(holder["state"], batch)
    return m["loss"]

  seconds = timing.median_seconds(one_step, a.repeats)
  n_params = sum(int(np.prod(v.get_value().shape)) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
  flops = a.batch * (6 * n_params * a.seq + 12 * a.depth * a.seq**2 * cfg.width)
  return seconds, flops


def main(argv=None):
  ap = argparse.ArgumentParser(prog="attngeo bench-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--seq", type=int, default=1024)
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--depth", type=int, default=2)
  ap.add_argument("--width", type=int, default=128)
  ap.add_argument("--head-dim", type=int, default=64)
  ap.add_argument("--repeats", type=int, default=5)
  ap.add_argument("--implementation", default="auto", choices=["auto", *kernels.IMPLEMENTATIONS])
  ap.add_argument("--dtype", default="float32")
  ap.add_argument("--out", default="runs/bench")
  a = ap.parse_args(argv)
  peak = train.device_peak_flops()
  print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind} "
        f"implementation={kernels.default_implementation(a.seq) if a.implementation == 'auto' else a.implementation}")
  rows = []
  for op in ("ATTN", "DMAP", "DMTN", "ATAP"):
    t, flops = step_time(op, a)
    rows.append(dict(operator=op, seconds=t, tokens_per_s=a.batch * a.seq / t,
                     mfu=flops / t / (peak * jax.device_count()) if peak else None))
  for r in rows:
    r["ratio_to_attn"] = r["seconds"] / rows[0]["seconds"]
  cols = [Col("operator"), Col("seconds", "step ms", lambda t: f"{1e3 * t:.1f}"), Col("tokens_per_s", "tokens/s", ".0f"),
          Col("ratio_to_attn", "× ATTN", ".2f"), Col("mfu", "MFU", lambda x: f"{100 * x:.1f}%")]
  report.write(a.out, "bench_train", rows, cols, payload=dict(config=vars(a), rows=rows))


if __name__ == "__main__":
  main()
