"""Language-model training-step time of the same GPT under each operator, as a ratio to ATTN.

    attngeo bench-train [--preset lm|induction|d12|custom] [--seq 1024] [--batch 4] [--depth 2] [--width 128]
                        [--head-dim 64] [--vocab 256] [--optimizer muon_adamw] [--repeats 5]
                        [--implementation auto] [--dtype float32]

Times the jitted, donated train step of `attngeo.train` (forward, backward, optimizer update) on
random tokens, the four operators' steps interleaved (run r of each before run r + 1 of any), median of
--repeats after one warm-up, and prints tokens/s, the ratio to ATTN (targets:
DMAP ≤ 1.05×, DMTN and ATAP ≤ 1.25×) and, on devices with a known peak, model FLOPs utilisation with
nanochat's count (`attngeo.nn.gpt.flops_per_token`: 6 × matmul parameters + 12·L·h·d_h·T per token;
the augmented heads of DMTN/ATAP are not credited, so MFU compares equal useful work).

Presets: `lm` — the default `attngeo lm train` model (depth 4, width 256, 4 heads of 64, context 256,
byte vocabulary 265, batch 16); `induction` — `attngeo lm train --preset induction`'s (depth 2, width
128, 2 heads of 64, context 256, BPE vocabulary 512, batch 16); both read from `attngeo.lm.config`, so
they follow the recipe; `d12` — the seed's depth-12 shape (width 768, 6 heads of 128,
context 2048, vocabulary 65,536, batch 1 here); `custom` — the size flags.
"""
from __future__ import annotations

import statistics

import numpy as np

from attngeo import config, runlock
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col
from attngeo.lm import config as lm_config


def lm_shape(cfg: lm_config.LMConfig) -> dict:
  """The timed shape of an `attngeo lm train` config: its depth, width (aspect · depth when unset), head
  dimension, context, vocabulary (256 bytes + specials for the byte tokenizer) and global batch."""
  vocab = lm_config.MIN_VOCAB if cfg.tokenizer == "byte" else cfg.vocab_size
  return dict(depth=cfg.depth, width=cfg.width or cfg.aspect * cfg.depth, head_dim=cfg.head_dim, seq=cfg.seq_len,
              vocab=vocab, batch=cfg.train.batch_size)


PRESETS = {"lm": lm_shape(lm_config.LMConfig()), "induction": lm_shape(lm_config.preset("induction")),
           "d12": dict(depth=12, width=768, head_dim=128, seq=2048, vocab=65_536, batch=1)}
TARGETS = {"DMAP": 1.05, "DMTN": 1.25, "ATAP": 1.25}


def loss_fn(m, batch, rng):
  import optax
  tok = batch["tokens"]
  return optax.softmax_cross_entropy_with_integer_labels(m(tok[:, :-1]), tok[:, 1:]).mean(), {}


def make_step(op, a):
  """`(one_step, flops per step)`: a zero-argument call running one jitted, donated train step of the GPT
  under `op` on fixed random tokens (its state carried between calls)."""
  import jax
  from flax import nnx

  from attngeo import nn, sharding, train
  from attngeo.nn import gpt
  cfg = nn.GPTConfig.from_depth(a.depth, vocab_size=a.vocab, seq_len=a.seq, head_dim=a.head_dim, width=a.width,
                                operator=op, implementation=None if a.implementation == "auto" else a.implementation,
                                dtype=a.dtype)
  model = nn.GPT(cfg, rngs=nnx.Rngs(0))
  fields = {f: getattr(train.TrainConfig(), f) for f in ("clip", "warmup", "schedule")}
  tcfg = train.TrainConfig(steps=10, batch_size=a.batch, progress=False, optimizer=a.optimizer, **fields)
  mesh = sharding.make_mesh((jax.device_count(), 1, 1))
  graphdef, state, shardings = train.init_state(model, tcfg, mesh)
  step = jax.jit(train.make_step(graphdef, loss_fn, 0.0), donate_argnums=0)
  tok = np.random.default_rng(0).integers(0, a.vocab, (a.batch, a.seq + 1)).astype(np.int32)
  batch = sharding.global_batch({"tokens": tok}, mesh)
  holder = {"state": state}

  def one_step():
    holder["state"], m = step(holder["state"], batch)
    return m["loss"]

  return one_step, gpt.flops_per_token(cfg) * a.batch * a.seq


def step_times(ops, a) -> dict:
  """{op: (median seconds, flops per step)}: every operator's step built first, then timed in
  alternation (`timing.interleaved_seconds`), so a slow spell of the machine falls on all alike."""

  steps = {op: make_step(op, a) for op in ops}
  times = timing.interleaved_seconds({op: call for op, (call, _) in steps.items()}, a.repeats)
  return {op: (statistics.median(times[op]), steps[op][1]) for op in ops}


def main(argv=None):
  ap = config.parser("attngeo bench-train", __doc__)
  ap.add_argument("--preset", default="custom", choices=["custom", *PRESETS],
                  help="model shape: lm (attngeo lm train's default), induction (its --preset induction), d12 (the seed's), custom (the flags below); default: custom")
  ap.add_argument("--seq", type=int, default=1024, help="context length (default: 1024)")
  ap.add_argument("--batch", type=int, default=4, help="sequences per step (default: 4)")
  ap.add_argument("--depth", type=int, default=2, help="blocks (default: 2)")
  ap.add_argument("--width", type=int, default=128, help="model width (default: 128)")
  ap.add_argument("--head-dim", type=int, default=64, help="head dimension (default: 64)")
  ap.add_argument("--vocab", type=int, default=256, help="vocabulary size (default: 256)")
  ap.add_argument("--optimizer", default="muon_adamw", choices=["muon_adamw", "adamw", "muon"],
                  help="optimizer of the timed step (default: muon_adamw, attngeo lm train's)")
  ap.add_argument("--repeats", type=int, default=5, help="timed steps after one warm-up; the median is reported (default: 5)")
  ap.add_argument("--implementation", default="auto", help="attention kernel: auto, einsum, xla, cudnn, blockwise (default: auto)")
  ap.add_argument("--dtype", default="float32", help="compute dtype: float32 or bfloat16 (default: float32)")
  ap.add_argument("--out", type=config.out_folder, default="runs/bench", help="output folder (default: runs/bench)")
  a = ap.parse_args(argv)
  if a.preset != "custom":
    for k, v in PRESETS[a.preset].items():
      setattr(a, k, v)

  import jax

  from attngeo import kernels, train
  if a.implementation not in ("auto", *kernels.IMPLEMENTATIONS):
    ap.error(f"--implementation must be auto or one of {kernels.IMPLEMENTATIONS}; got {a.implementation!r}")
  with runlock.hold(a.out):                       # one process per --out, refused before any work
    peak = train.device_peak_flops()
    print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind} preset={a.preset} "
          f"(depth {a.depth}, width {a.width}, head_dim {a.head_dim}, seq {a.seq}, vocab {a.vocab}, batch {a.batch}) "
          f"implementation={kernels.default_implementation(a.seq) if a.implementation == 'auto' else a.implementation}")
    rows = []
    for op, (t, flops) in step_times(("ATTN", "DMAP", "DMTN", "ATAP"), a).items():
      rows.append(dict(operator=op, seconds=t, tokens_per_s=a.batch * a.seq / t,
                       mfu=flops / t / (peak * jax.device_count()) if peak else None))
    for r in rows:
      r["ratio_to_attn"] = r["seconds"] / rows[0]["seconds"]
      r["target"] = TARGETS.get(r["operator"])
      r["meets_target"] = None if r["target"] is None else bool(r["ratio_to_attn"] <= r["target"])
    cols = [Col("operator"), Col("seconds", "step ms", lambda t: f"{1e3 * t:.1f}"), Col("tokens_per_s", "tokens/s", ".0f"),
            Col("ratio_to_attn", "× ATTN", ".2f"), Col("target", "target ≤", ".2f"),
            Col("meets_target", "meets", lambda b: "yes" if b else "no"), Col("mfu", "MFU", lambda x: f"{100 * x:.1f}%")]
    report.write(a.out, "bench_train", rows, cols, payload=dict(config=vars(a), rows=rows))


if __name__ == "__main__":
  main()
