"""Train-step cost of each geometry regulariser (`attngeo.regularisers`) as a ratio to the plain step.

    attngeo bench-regularisers [--preset lm|tiny] [--terms curvature,reversibility,...]
                               [--heads 0] [--sequences 0] [--test-functions 4] [--repeats 3] [--out runs/bench]

Times the jitted, donated train step of `attngeo.train` (forward, backward, nanochat's Muon/AdamW update)
of the GPT at the preset shape on random tokens: once with the plain next-token loss and once per term
alone (weight 1, through `regularisers.regularised`), interleaved (`timing.interleaved_seconds`: a slow
spell of a shared machine falls on every variant alike), median of --repeats after one warm-up. Prints
step ms and the ratio to the plain step (issue 30's target: ≤ 1.3×). `--heads s` / `--sequences s'`
sample s heads per layer / s' sequences per batch (the terms' means stay unbiased, with variance
`(1 − s/H)·S²/s` over heads: `attngeo.regularisers`). Presets: `lm` — `attngeo lm train`'s default model
(`bench_train.PRESETS["lm"]`: depth 4, width 256, 4 heads of 64, context 256, byte vocabulary 265,
batch 16); `tiny` — a smoke shape.
"""
from __future__ import annotations

import statistics

import numpy as np

from attngeo import config, runlock
from attngeo.experiments import bench_train, report, timing
from attngeo.experiments.report import Col

PRESETS = {"lm": bench_train.PRESETS["lm"], "tiny": dict(depth=1, width=32, head_dim=16, seq=16, vocab=32, batch=2)}
TERMS = ("curvature", "reversibility", "skew", "mixing", "isometry")
TARGET = 1.3


def step_call(loss_fn, shape: dict):
  """A zero-argument call running one jitted train step of the preset GPT under `loss_fn`."""
  import jax
  from flax import nnx

  from attngeo import nn, sharding, train
  cfg = nn.GPTConfig.from_depth(shape["depth"], vocab_size=shape["vocab"], seq_len=shape["seq"],
                                head_dim=shape["head_dim"], width=shape["width"])
  fields = {f: getattr(train.TrainConfig(), f) for f in ("clip", "warmup", "schedule")}
  tcfg = train.TrainConfig(steps=10, batch_size=shape["batch"], progress=False, optimizer="muon_adamw", **fields)
  mesh = sharding.make_mesh((jax.device_count(), 1, 1))
  graphdef, state, _ = train.init_state(nn.GPT(cfg, rngs=nnx.Rngs(0)), tcfg, mesh)
  step = jax.jit(train.make_step(graphdef, loss_fn, 0.0), donate_argnums=0)
  tok = np.random.default_rng(0).integers(0, shape["vocab"], (shape["batch"], shape["seq"] + 1)).astype(np.int32)
  batch = sharding.global_batch({"tokens": tok}, mesh)
  holder = {"state": state}

  def call():
    holder["state"], metrics = step(holder["state"], batch)
    return metrics["loss"]
  return call


def main(argv=None):
  ap = config.parser("attngeo bench-regularisers", __doc__)
  ap.add_argument("--preset", default="lm", choices=list(PRESETS), help="model shape (default: lm)")
  ap.add_argument("--terms", default=",".join(TERMS), help=f"comma-separated terms, each timed alone (default: all of {TERMS})")
  ap.add_argument("--heads", type=int, default=0, help="heads sampled per layer (default: 0, every head)")
  ap.add_argument("--sequences", type=int, default=0, help="sequences sampled per batch (default: 0, every sequence)")
  ap.add_argument("--test-functions", type=int, default=4, help="curvature test functions (default: 4)")
  ap.add_argument("--repeats", type=int, default=3, help="timed steps per variant after one warm-up (default: 3)")
  ap.add_argument("--out", type=config.out_folder, default="runs/bench", help="output folder (default: runs/bench)")
  a = ap.parse_args(argv)
  terms = [t for t in a.terms.split(",") if t]
  if not terms or any(t not in TERMS for t in terms):
    ap.error(f"--terms must be a comma-separated subset of {TERMS}; got {a.terms!r}")
  shape = PRESETS[a.preset]
  heads = shape["width"] // shape["head_dim"]
  for flag, ok, want in (("--repeats", a.repeats >= 1, "≥ 1"), ("--heads", 0 <= a.heads <= heads, f"in [0, {heads}]"),
                         ("--sequences", 0 <= a.sequences <= shape["batch"], f"in [0, {shape['batch']}]"),
                         ("--test-functions", a.test_functions >= 1, "≥ 1")):
    if not ok:
      ap.error(f"{flag} must be {want} at the {a.preset} preset; got {getattr(a, flag[2:].replace('-', '_'))}")
  with runlock.hold(a.out):                       # one process per --out, refused before any work
    from attngeo import regularisers as reg
    cfgs = {t: reg.Regularisers(**{t: 1.0}, heads=a.heads, sequences=a.sequences, test_functions=a.test_functions)
            for t in terms}

    import jax

    print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind} preset={a.preset} {shape} "
          f"heads={a.heads or 'all'} sequences={a.sequences or 'all'}")
    calls = {"plain": step_call(bench_train.loss_fn, shape)}
    calls.update({t: step_call(reg.regularised(cfg, bench_train.loss_fn), shape) for t, cfg in cfgs.items()})
    times = {name: statistics.median(ts) for name, ts in timing.interleaved_seconds(calls, a.repeats).items()}
    rows = [dict(term=name, seconds=t, ratio=t / times["plain"], target=None if name == "plain" else TARGET)
            for name, t in times.items()]
    for r in rows:
      r["meets"] = None if r["target"] is None else bool(r["ratio"] <= r["target"])
    cols = [Col("term"), Col("seconds", "step ms", lambda t: f"{1e3 * t:.1f}"), Col("ratio", "× plain", ".2f"),
            Col("target", "target ≤", ".2f"), Col("meets", "meets", lambda b: "yes" if b else "no")]
    report.write(a.out, f"bench_regularisers_{a.preset}", rows, cols, payload=dict(config=vars(a), rows=rows))


if __name__ == "__main__":
  main()
