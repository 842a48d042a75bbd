"""Probe benchmark: wall time and peak memory of `probe.model_report` at real-model scale, and the
training hook's overhead, against the targets of the probe issue.

    attngeo bench-probe [--cases d12,swissroll,hook,bert] [--seq 1024] [--vocab 50304] [--steps 300] [--every 50]
                        [--bert-seqs 128,512]

* `d12` — a GPT of nanochat's d12 shape (12 layers, 6 heads of 128, width 768), sequence `--seq`,
  batch 1, random init and random tokens: the whole report (every read-out of every layer, per-
  layer progress bar). Target ≤ 120 s and ≤ 4 GiB on 2 CPU cores.
* `swissroll` — the Swiss-roll PointFlow (width 64, depth 2, 2 heads), 4 sets of 256 points:
  cold (with compilation) and warm (median of 3). Target ≤ 5 s warm. Also the dense per-edge
  reference (`connection.effective_isometry_defect_dense`, batch element 0) with `--dense`.
* `hook` — the same PointFlow trained `--steps` steps (batch 8) without a hook, with `probe.hook`
  every `--every` steps deferred (default) and synchronous; overhead = extra wall time per step
  (the hook's program compiled beforehand). Target: a few per cent at every = 50.
* `bert` — the real rxnfp `bert_pretrained` checkpoint (12 layers, 4 heads of 64, width 256; read from
  the installed `rxnfp` wheel, `pip install --no-deps rxnfp==0.1.0`), batch 1 at each of `--bert-seqs`
  tokens ([CLS], random ordinary tokens of its vocabulary, [SEP]; ≤ its 512 positions), cold and warm
  (median of 3), one process per length. Target: one checkpoint's probe ≤ 60 s.

Each case runs in its own process (`--case` internally), so its peak resident memory is its own.
Time it on an otherwise idle machine. Writes bench_probe.{md,csv,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from attngeo import config, data, interop, nn, runlock
from attngeo.data import molecules
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.lm.smiles import SmilesTokenizer

CASES = ("d12", "swissroll", "hook", "bert")
TARGETS = {"d12": "≤ 120 s, ≤ 4 GiB", "swissroll": "≤ 5 s warm", "hook": "overhead ≤ 5 % at every = 50",
           "bert": "≤ 60 s cold"}


def _pointflow(seed=0):
  from flax import nnx

  return nn.PointFlow(nn.PointFlowConfig.create(width=64, depth=2, num_heads=2, mlp_ratio=2.0, order="ffn_first"),
                      rngs=nnx.Rngs(seed))


def _sets(batch, size=256, seed=0):
  cloud = data.swiss_roll(4000, 123)
  rng = np.random.default_rng(seed)
  return np.stack([cloud[rng.choice(len(cloud), size, replace=False)] for _ in range(batch)])


def _cold_and_warm(model, run, desc: str | None = None, repeats: int = 3):
  """(`probe.model_report` rows, seconds of the first call (compilation included), median of `repeats` more)."""
  from attngeo import probe
  t0 = time.perf_counter()
  rows = probe.model_report(model, run, progress=desc is not None, **({"desc": desc} if desc else {}))
  cold = time.perf_counter() - t0
  warm = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    probe.model_report(model, run, progress=False)
    warm.append(time.perf_counter() - t0)
  return rows, cold, statistics.median(warm)


def case_d12(a) -> dict:
  import jax.numpy as jnp
  from flax import nnx

  from attngeo import nn, probe
  cfg = nn.GPTConfig.from_depth(12, vocab_size=a.vocab, seq_len=a.seq)
  model = nn.GPT(cfg, rngs=nnx.Rngs(0))
  tok = jnp.asarray(np.random.default_rng(0).integers(0, a.vocab, (1, a.seq)), jnp.int32)
  t0 = time.perf_counter()
  rows = probe.model_report(model, lambda: model(tok), desc="d12 probe")
  seconds = time.perf_counter() - t0
  return dict(case="d12", shape=f"12 layers × 6 heads, width {cfg.width}, n = {a.seq}, batch 1", cold_s=seconds,
              layers=len(rows), effective_isometry_defect=float(np.mean([r["effective_isometry_defect"] for r in rows])))


def case_swissroll(a) -> dict:
  import jax.numpy as jnp

  from attngeo import connection, nn, operators
  model = _pointflow()
  x = jnp.asarray(_sets(4))
  run = lambda: model(x, jnp.ones((4,)))
  rows, cold, warm = _cold_and_warm(model, run)
  row = dict(case="swissroll", shape="PointFlow width 64, depth 2, 2 heads, 4 sets × 256", cold_s=cold,
             warm_s=warm, layers=len(rows))
  if not a.dense:
    return row
  # the dense per-edge reference on batch element 0 (what `attngeo probe` computed before the trace tables)
  _, qks = nn.capture_qk(model, run)
  layers = [(operators.markov_matrix(q[:1], k[:1], beta=m.coefficients()[0], alpha=m.coefficients()[1])[0], m)
            for (q, k), m in zip(qks, nn.attention_modules(model))]
  t0 = time.perf_counter()
  dense = [float(connection.effective_isometry_defect_dense(p, connection.head_transports(m.wv[...], m.wo[...])))
           for p, m in layers]
  dense_s = time.perf_counter() - t0
  exact = [float(connection.effective_isometry_defect(p, m.wv[...], m.wo[...]).mean) for p, m in layers]
  return dict(row, dense_defect_s=dense_s,
              dense_rel_diff=float(np.max(np.abs(np.array(exact) - dense) / np.array(dense))))


def case_hook(a) -> dict:
  import jax.numpy as jnp

  from attngeo import data, flow, probe, train
  sets = _sets(64, seed=1)
  records = [{"points": s} for s in sets]
  loss_fn = lambda m, batch, rng: (flow.loss(m, batch["points"], rng), {})
  probe_x = jnp.asarray(sets[:2])
  run_probe = lambda m, x: m(x, jnp.ones((x.shape[0],)))

  def timed_train(hook):
    model = _pointflow()
    if hook is not None:               # compile the hook's program before timing (it is cached by graph)
      hook(a.every, model)
      hook.flush()
    cfg = train.TrainConfig(steps=a.steps, batch_size=8, lr=1e-3, warmup=10, log_every=10, progress=False)
    t0 = time.perf_counter()
    train.train(model, loss_fn, data.loader(records, 8, 0), cfg, hooks=() if hook is None else (hook,))
    return (time.perf_counter() - t0) / a.steps

  base = timed_train(None)
  deferred = timed_train(probe.hook(run_probe, probe_x, every=a.every, defer=True))
  sync = timed_train(probe.hook(run_probe, probe_x, every=a.every, defer=False))
  return dict(case="hook", shape=f"PointFlow Swiss roll, {a.steps} steps, probe every {a.every}",
              step_ms=1e3 * base, deferred_overhead=deferred / base - 1, sync_overhead=sync / base - 1)


def case_bert(a) -> dict:
  import jax.numpy as jnp

  path = os.path.dirname(molecules.wheel_file("rxnfp", "models", "transformers", "bert_pretrained", "config.json"))
  model, _ = interop.load("bert", path)
  if not 2 < a.seq <= model.cfg.seq_len:
    raise ValueError(f"--bert-seqs must lie in (2, {model.cfg.seq_len}] (the checkpoint's positions); got {a.seq}")
  tok = SmilesTokenizer.from_vocab(path)
  ordinary = np.setdiff1d(np.arange(model.cfg.vocab_size), tok.special_ids)
  body = np.random.default_rng(0).choice(ordinary, a.seq - 2)
  ids = jnp.asarray(np.concatenate([[tok.cls_id], body, [tok.sep_id]])[None], jnp.int32)
  rows, cold, warm = _cold_and_warm(model, lambda: model(ids), desc=f"bert probe n={a.seq}")
  return dict(case="bert", shape=f"rxnfp bert_pretrained, 12 layers × 4 heads, width 256, n = {a.seq}, batch 1",
              cold_s=cold, warm_s=warm, layers=len(rows))


def run_case(name: str, argv: list[str]) -> dict:
  """Run one case in a child process; its peak resident memory from the kernel's accounting."""
  with subprocess.Popen([sys.executable, "-m", "attngeo.experiments.bench_probe", "--case", name] + argv,
                        stdout=subprocess.PIPE, text=True) as proc:
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode:
    raise RuntimeError(f"bench-probe case {name} failed (exit {proc.returncode})")
  row = json.loads(out.strip().splitlines()[-1])
  row["peak_gib"] = usage.ru_maxrss * 1024 / 2**30                      # ru_maxrss is in KiB on Linux
  return row


def verdict(row: dict) -> str:
  if row["case"] == "d12":
    return "met" if row["cold_s"] <= 120 and row["peak_gib"] <= 4 else "missed"
  if row["case"] == "swissroll":
    return "met" if row["warm_s"] <= 5 else "missed"
  if row["case"] == "bert":
    return "met" if row["cold_s"] <= 60 else "missed"
  return "met" if row["deferred_overhead"] <= 0.05 else "missed"


def _pct(x):
  return f"{100 * x:+.1f} %"


COLUMNS = [Col("case"), Col("shape"), Col("cold_s", "cold s (incl. compile)", ".1f"), Col("warm_s", "warm s", ".2f"),
           Col("peak_gib", "peak RSS GiB", ".2f"), Col("dense_defect_s", "dense δ_eff s", ".1f"),
           Col("dense_rel_diff", "rel. diff. to dense", ".1e"),
           Col("step_ms", "train step ms", ".1f"), Col("deferred_overhead", "hook overhead (deferred)", _pct),
           Col("sync_overhead", "hook overhead (sync)", _pct), Col("target"), Col("verdict")]


def parser() -> argparse.ArgumentParser:
  ap = config.parser("attngeo bench-probe", __doc__)
  ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {CASES} (default: all)")
  ap.add_argument("--seq", type=int, default=1024, help="d12 sequence length, ≥ 2 (default: 1024)")
  ap.add_argument("--vocab", type=int, default=50304, help="d12 vocabulary size, ≥ 2 (default: 50304)")
  ap.add_argument("--steps", type=int, default=300, help="hook case: training steps, ≥ 10 (default: 300)")
  ap.add_argument("--every", type=int, default=50, help="hook case: probe interval in steps, ≥ 10 (default: 50)")
  ap.add_argument("--bert-seqs", default="128,512", help="bert case: comma-separated token counts, each in "
                  "(2, 512] (default: 128,512)")
  ap.add_argument("--dense", action="store_true",
                  help="swissroll case: also time the dense per-edge effective defect (minutes; default: off)")
  ap.add_argument("--out", type=config.out_folder, default="runs/bench_probe", help="output folder (default: runs/bench_probe)")
  ap.add_argument("--case", default=None, choices=CASES, help=argparse.SUPPRESS)
  return ap


def main(argv=None):
  ap = parser()
  argv = sys.argv[1:] if argv is None else list(argv)
  a = ap.parse_args(argv)
  for name, value, low in (("--seq", a.seq, 2), ("--vocab", a.vocab, 2), ("--steps", a.steps, 10),
                           ("--every", a.every, 10)):
    if value < low:
      ap.error(f"{name} must be at least {low}; got {value}")
  try:
    bert_seqs = [int(x) for x in a.bert_seqs.split(",") if x]
  except ValueError:
    bert_seqs = []
  if not bert_seqs or any(not 2 < n <= 512 for n in bert_seqs):
    ap.error(f"--bert-seqs must be comma-separated integers in (2, 512]; got {a.bert_seqs!r}")
  if a.case:                                             # child process: one case, one JSON line
    row = {"d12": case_d12, "swissroll": case_swissroll, "hook": case_hook, "bert": case_bert}[a.case](a)
    print(json.dumps(row), flush=True)
    return row
  cases = [c for c in a.cases.split(",") if c]
  if not cases or any(c not in CASES for c in cases):
    ap.error(f"--cases must be a comma-separated subset of {CASES}; got {a.cases!r}")
  passthrough = ["--seq", str(a.seq), "--vocab", str(a.vocab), "--steps", str(a.steps), "--every", str(a.every)]
  passthrough += ["--dense"] if a.dense else []
  if "bert" in cases:                                    # before any case runs: the checkpoint is there
    try:
      molecules.wheel_file("rxnfp", "models", "transformers", "bert_pretrained", "config.json")
    except (FileNotFoundError, ImportError, ValueError) as e:
      ap.error(f"the bert case needs the rxnfp wheel (pip install --no-deps rxnfp==0.1.0): {e}")
  with runlock.hold(a.out):                       # one process per --out, refused before any work
    rows = []
    runs = [(name, []) for name in cases if name != "bert"] + [("bert", ["--seq", str(n)]) for n in bert_seqs
                                                                if "bert" in cases]
    for name, extra in runs:
      row = run_case(name, passthrough + extra)
      row.update(target=TARGETS[name], verdict=None)
      row["verdict"] = verdict(row)
      rows.append(row)
    report.write(a.out, "bench_probe", rows, COLUMNS, note=f"{os.cpu_count()} CPU cores visible; each case in its own "
                 "process (peak RSS is that process's). Time it on an otherwise idle machine.")
    return rows


if __name__ == "__main__":
  main()
