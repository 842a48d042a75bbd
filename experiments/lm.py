"""Language models: train a GPT on text, evaluate it, sample from it, and the seed's Table 2 at this scale.

    attngeo lm train [--data shakespeare] [--tokenizer byte|bpe] [--depth 4] [--operator DMTN] [--train.steps N] --out DIR
    attngeo lm eval RUN_DIR [--core-bundle DIR] [--max-rows N]
    attngeo lm sample RUN_DIR [--prompt TEXT] [--max-tokens 200] [--temperature 0.8] [--top-k 50]
    attngeo lm table2 [--seeds 0,1,2] [--conditions ATTN,DMTN,DMAP,ATAP,learnable] [--lm.X ...] [--out DIR]
    attngeo lm table2 --full --dry-run         the seed's d12 recipe: FLOPs/token, step-time estimates, launch line
    attngeo lm adapt [--source RUN_DIR] [--chain ATTN,DMTN,ATTN,DMTN] [--adapt.steps N]   the seed's Table 3

`train` writes a run folder (lm.json, tokenizer/, config.json, metrics.jsonl, ckpt/) and resumes a
killed run from its last checkpoint. `eval` prints and writes RUN_DIR/eval.json: validation bits per
byte (nanochat's definition), the induction score, the DAC probe and — with a local DCLM eval bundle —
CORE. `table2` trains every condition × seed from scratch on the same budget and reports mean ± sd.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time

import numpy as np

from attngeo import config as config_lib, runs
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.lm.config import HELP, LMConfig, LMTrain

CONDITIONS = {"ATTN": ("ATTN", False), "DMTN": ("DMTN", False), "DMAP": ("DMAP", False), "ATAP": ("ATAP", False),
              "learnable": ("0.5,0.5", True), "CMAP": ("CMAP", False)}
DEFAULT_CONDITIONS = ("ATTN", "DMTN", "DMAP", "ATAP", "learnable")    # CMAP (the magnetic lift) is opt-in
SEED_TABLE2 = {"ATTN": 0.8471, "DMTN": 0.8492, "DMAP": 0.8621}


# ----------------------------------------------------------------------------- train / eval / sample

def cmd_train(args, ap) -> dict:
  from attngeo.lm import recipe
  cfg = config_lib.from_arguments(args, LMConfig)
  try:
    cfg.text_spec()
    result = recipe.train(cfg, args.out, desc=f"lm {cfg.operator}")
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  last = result["history"][-1] if result["history"] else {}
  print(f"trained {args.out}: step {last.get('step')}, loss {last.get('loss', float('nan')):.4f}, "
        f"{last.get('tokens_per_s', 0):.0f} tokens/s")
  if not args.no_eval:
    return cmd_eval(argparse.Namespace(run_dir=args.out, core_bundle=None, max_rows=args.eval_max_rows, step=None,
                                       max_per_task=-1, no_dac=False), ap, loaded=result)
  return result


EVAL_COLS = [Col("metric"), Col("value", fmt=lambda v: f"{v:.4f}" if isinstance(v, float) else str(v))]


def cmd_eval(args, ap, loaded=None) -> dict:
  from attngeo.data import text
  from attngeo.lm import evals, recipe
  try:
    if loaded is None:
      model, tok, cfg = recipe.load(args.run_dir, args.step)
    else:
      model, tok, cfg = loaded["model"], loaded["tokenizer"], recipe.read_config(args.run_dir)
    corpus = text.open_corpus(cfg.text_spec(), tok, cfg.data_dir)
    out = evals.evaluate(model, tok, corpus.rows("val", cfg.seq_len), max_rows=args.max_rows,
                         with_dac=not args.no_dac, core_bundle=args.core_bundle, max_per_task=args.max_per_task,
                         progress=True)
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  rows = [{"metric": "val bpb", "value": out["bpb"]}, {"metric": "val loss (nats/token)", "value": out["val_loss"]},
          {"metric": "val tokens", "value": out["val_tokens"]}]
  if "induction" in out:
    rows.append({"metric": "induction acc (mean over L)", "value": out["induction"]})
    for L, v in out["induction_per_length"].items():
      rows.append({"metric": f"  L={L}: induction acc / loss / random-half loss",
                   "value": f"{v['induction_acc']:.4f} / {v['induction_loss']:.3f} / {v['random_half_loss']:.3f}"})
  if out.get("dac"):
    rows.append({"metric": f"DAC local contrast (L={out['dac']['L']}), max / mean over heads",
                 "value": f"{out['dac']['max_contrast']:.4f} / {out['dac']['mean_contrast']:.4f}"})
  if out["core"]:
    rows.append({"metric": "CORE", "value": out["core"]["core"]})
  report.write(args.run_dir, "eval", rows, EVAL_COLS, payload=out, note=out["core_note"] or "")
  return out


def cmd_sample(args, ap) -> list[str]:
  from attngeo.lm import generate, recipe
  try:
    model, tok, _ = recipe.load(args.run_dir, args.step)
    ids = tok.encode(args.prompt, prepend=tok.bos_id)
    samples = generate.Sampler(model).generate(ids, args.max_tokens, args.temperature, args.top_k or None,
                                               args.num_samples, args.seed, stop=tok.bos_id)
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  texts = [args.prompt + tok.decode(s) for s in samples]
  for t in texts:
    print("-" * 72)
    print(t)
  return texts


# ----------------------------------------------------------------------------- Table 2

@dataclasses.dataclass
class Table2Config:
  conditions: tuple[str, ...] = DEFAULT_CONDITIONS
  seeds: tuple[int, ...] = (0, 1, 2)
  eval_rows: int = 512                 # validation rows for bpb (0: all)
  out: str = "runs/table2"
  lm: LMConfig = dataclasses.field(default_factory=lambda: LMConfig(
      depth=2, head_dim=64, width=128, seq_len=128,
      train=LMTrain(steps=600, batch_size=16, warmup=20, ckpt_every=200, log_every=10)))


# The seed's depth-12 run: nanochat's d12 (width 768, 6 heads of 128, context 2048, 65,536-token BPE)
# on FineWeb-edu parquet shards, 524,288 tokens per step for 20 tokens per parameter (Chinchilla).
FULL = dict(depth=12, aspect=64, head_dim=128, seq_len=2048, tokenizer="bpe", vocab_size=65_536,
            data="data/fineweb_edu", data_dir="runs/lm_data")
FULL_TRAIN = dict(batch_size=256, lr=0.02, warmup=40, ckpt_every=500, log_every=20)
FULL_TOKENS_PER_PARAM = 20
PEAKS = {"H100 (bf16 dense)": 989e12, "TPU v4 (bf16)": 275e12}


def run_key(lm: LMConfig) -> str:
  """What makes two runs the same: every LMConfig field except display-only ones."""
  return runs.fingerprint(dataclasses.replace(lm, train=dataclasses.replace(lm.train, progress=True)))


def run_condition(cfg: Table2Config, name: str, seed: int) -> dict:
  """Train and evaluate one (condition, seed); reused when its result.json holds the same config key."""
  from attngeo.lm import evals, recipe
  op, learnable = CONDITIONS[name]
  lm = dataclasses.replace(cfg.lm, operator=op, learnable_operator=learnable,
                           train=dataclasses.replace(cfg.lm.train, seed=seed))
  key = run_key(lm)
  run_dir = os.path.join(cfg.out, "runs", f"{name}_s{seed}_{key}")
  result_path = os.path.join(run_dir, "result.json")
  cached = runs.cached_result(result_path, key)
  if cached is not None:
    return cached
  t0 = time.perf_counter()
  trained = recipe.train(lm, run_dir, desc=f"{name} s{seed}")
  val = trained["corpus"].rows("val", lm.seq_len)
  ev = evals.evaluate(trained["model"], trained["tokenizer"], val, max_rows=cfg.eval_rows or None)
  hist = trained["history"]
  row = dict(condition=name, seed=seed, key=key, bpb=ev["bpb"], val_loss=ev["val_loss"], induction=ev["induction"],
             dac_max_contrast=ev["dac"]["max_contrast"], final_train_loss=hist[-1]["loss"] if hist else None,
             seconds=time.perf_counter() - t0, curve=[(h["step"], h["loss"]) for h in hist],
             induction_per_length=ev["induction_per_length"], dac=ev["dac"])
  if learnable:
    from attngeo import nn
    row["learned_operator"] = [[np.asarray(c).tolist() for c in m.coefficients()]
                               for m in nn.attention_modules(trained["model"])]
  runs.atomic_json(result_path, row)
  return row


def summarise(rows: list[dict], conditions) -> list[dict]:
  """Per condition: mean ± sd (ddof = 1) over seeds of bpb and induction accuracy."""
  out = []
  for name in conditions:
    rs = [r for r in rows if r["condition"] == name]
    if not rs:
      continue
    bpbs, inds = np.array([r["bpb"] for r in rs]), np.array([r["induction"] for r in rs])
    sd = lambda x: float(x.std(ddof=1)) if len(x) > 1 else float("nan")
    out.append(dict(condition=name, seeds=len(rs), bpb_mean=float(bpbs.mean()), bpb_sd=sd(bpbs),
                    induction_mean=float(inds.mean()), induction_sd=sd(inds), seed_bpb=SEED_TABLE2.get(name),
                    bpb_per_seed=bpbs.tolist()))
  return out


def pm(mean_key, sd_key, digits=4):
  return lambda row: f"{row[mean_key]:.{digits}f} ± {row[sd_key]:.{digits}f}" if not math.isnan(row[sd_key]) \
      else f"{row[mean_key]:.{digits}f}"


TABLE2_COLS = [Col("condition", "Operator"), Col("seeds", "seeds"),
               Col("bpb_mean", "val bpb ↓ (mean ± sd)", align="right"), Col("induction_mean", "induction ↑ (mean ± sd)", align="right"),
               Col("seed_bpb", "seed paper bpb (d12, FineWeb-edu)", ".4f")]


def loss_figure(rows: list[dict], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  colours = dict(zip(CONDITIONS, ("black", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red")))
  for name in dict.fromkeys(r["condition"] for r in rows):
    for i, r in enumerate(r for r in rows if r["condition"] == name):
      steps, losses = zip(*r["curve"])
      ax.plot(steps, np.asarray(losses) / math.log(2), color=colours.get(name), alpha=0.8, lw=1,
              label=name if i == 0 else None)
  ax.set_xlabel("step")
  ax.set_ylabel("train loss (bits / token)")
  ax.set_title("Training loss per operator (every seed)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def full_plan(cfg: Table2Config, mfu: float) -> dict:
  """FLOPs per token, total FLOPs and estimated step time of the --full recipe (no training)."""
  from attngeo.lm import recipe
  from attngeo.nn import gpt
  mcfg = recipe.model_config(cfg.lm, cfg.lm.vocab_size)
  flops = gpt.flops_per_token(mcfg)
  tokens_per_step = cfg.lm.train.batch_size * cfg.lm.seq_len
  plan = {"width": mcfg.width, "heads": mcfg.block.num_heads, "head_dim": mcfg.block.dh, "depth": mcfg.depth,
          "seq_len": mcfg.seq_len, "vocab_size": mcfg.vocab_size, "matmul_params": gpt.matmul_params(mcfg),
          "flops_per_token": flops, "tokens_per_step": tokens_per_step, "steps": cfg.lm.train.steps,
          "mfu_assumed": mfu, "runs": len(cfg.conditions) * len(cfg.seeds)}
  plan["step_seconds"] = {chip: flops * tokens_per_step / (peak * mfu) for chip, peak in PEAKS.items()}
  # v4-32: 16 chips over 4 hosts; one 8-GPU node: 8 devices. The mesh is data-parallel over all of them.
  plan["launch"] = ("tpu/launch_tpu.sh --name attngeo-lm --zone ZONE --type v4-32 -- attngeo lm table2 --full "
                    f"--lm.data {cfg.lm.data} --lm.train.mesh 16,1,1 --out {cfg.out}")
  plan["launch_gpu"] = ("tpu/launch_gpu.sh slurm --nodes 1 --partition gpu -- attngeo lm table2 --full "
                        f"--lm.data {cfg.lm.data} --lm.train.mesh 8,1,1 --out {cfg.out}")
  return plan


def print_plan(plan: dict) -> None:
  print(f"d{plan['depth']}: width {plan['width']}, {plan['heads']} heads × {plan['head_dim']}, context {plan['seq_len']}, "
        f"vocab {plan['vocab_size']:,}; {plan['matmul_params'] / 1e6:.1f} M matmul parameters")
  print(f"FLOPs per token (6·N + 12·L·h·d_h·T, nanochat): {plan['flops_per_token'] / 1e9:.3f} G; "
        f"{plan['tokens_per_step']:,} tokens per step, {plan['steps']:,} steps, {plan['runs']} runs")
  for chip, s in plan["step_seconds"].items():
    total = s * plan["steps"] * plan["runs"] / 3600
    print(f"  {chip}: {s:.2f} s per step per chip at {100 * plan['mfu_assumed']:.0f}% MFU "
          f"({total:,.0f} chip-hours for all runs)")
  print(f"launch: {plan['launch']}")
  print(f"        {plan['launch_gpu']}")


def full_config(base: Table2Config) -> Table2Config:
  lm = dataclasses.replace(base.lm, **FULL, width=None, train=dataclasses.replace(base.lm.train, **FULL_TRAIN))
  return dataclasses.replace(base, lm=lm, eval_rows=0, out="runs/table2_full")


def full_steps(cfg: Table2Config) -> int:
  """Steps for FULL_TOKENS_PER_PARAM tokens per parameter (embeddings included)."""
  from attngeo.lm import recipe
  from attngeo.nn import gpt
  mcfg = recipe.model_config(cfg.lm, cfg.lm.vocab_size)
  params = gpt.matmul_params(mcfg) + mcfg.vocab_size * mcfg.width
  return round(FULL_TOKENS_PER_PARAM * params / (cfg.lm.train.batch_size * cfg.lm.seq_len))


def cmd_table2(args, ap) -> dict:
  base = Table2Config()
  if args.full:
    base = full_config(base)
  cfg = config_lib.from_arguments(args, Table2Config, base)
  if args.full and getattr(args, "lm.train.steps") is None:
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, train=dataclasses.replace(cfg.lm.train,
                                                                                            steps=full_steps(cfg))))
  unknown = [c for c in cfg.conditions if c not in CONDITIONS]
  if unknown:
    ap.error(f"--conditions: unknown {unknown}; choose from {list(CONDITIONS)}")
  if args.full or args.dry_run:
    plan = full_plan(cfg, args.mfu)
    print_plan(plan)
    if args.dry_run:
      return {"plan": plan}
  try:
    cfg.lm.text_spec()
  except ValueError as e:
    ap.error(str(e))
  if args.full and not os.path.exists(cfg.lm.data):
    ap.error(f"--lm.data {cfg.lm.data!r}: no such file or directory (place the FineWeb-edu parquet shards there)")
  t0 = time.perf_counter()
  os.makedirs(cfg.out, exist_ok=True)
  todo = [(c, s) for c in cfg.conditions for s in cfg.seeds]
  rows = []
  for i, (name, seed) in enumerate(todo):
    print(f"[{i + 1}/{len(todo)}] {name} seed {seed}", flush=True)
    try:
      rows.append(run_condition(cfg, name, seed))
    except (ValueError, FileNotFoundError) as e:
      ap.error(str(e))
  table = summarise(rows, cfg.conditions)
  for r in table:
    r["bpb_mean"] = pm("bpb_mean", "bpb_sd")(r)
    r["induction_mean"] = pm("induction_mean", "induction_sd", 3)(r)
  wall = time.perf_counter() - t0
  note = (f"Depth-{cfg.lm.depth} GPT (width {cfg.lm.width or cfg.lm.aspect * cfg.lm.depth}, context {cfg.lm.seq_len}, "
          f"{cfg.lm.tokenizer} tokenizer) trained from scratch on '{cfg.lm.data}' for {cfg.lm.train.steps} steps × "
          f"{cfg.lm.train.batch_size} rows per condition and seed; sd over {len(cfg.seeds)} seeds (ddof 1). "
          f"Seed paper: depth 12, FineWeb-edu, 65,536-token BPE, one seed. Wall time {wall:.0f} s.")
  payload = dict(config=dataclasses.asdict(cfg), table=summarise(rows, cfg.conditions), runs=rows, wall_seconds=wall)
  md = report.write(cfg.out, "table2", table, TABLE2_COLS, payload=payload, note=note)
  os.replace(os.path.join(cfg.out, "table2.json"), os.path.join(cfg.out, "results.json"))
  loss_figure(rows, os.path.join(cfg.out, "loss_curves.png"))
  print(f"\nwrote {cfg.out}/table2.md, table2.csv, results.json, loss_curves.png; wall time {wall:.0f} s")
  return {"markdown": md, **payload}


# ----------------------------------------------------------------------------- parser

def parser() -> argparse.ArgumentParser:
  ap = config_lib.Parser(prog="attngeo lm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="command", required=True)
  tr = sub.add_parser("train", help="train a GPT on text (resumes a killed run)", prog="attngeo lm train")
  tr.add_argument("--out", default="runs/lm", help="run folder (default: runs/lm)")
  tr.add_argument("--no-eval", action="store_true", help="skip the evaluation after training (default: evaluate)")
  tr.add_argument("--eval-max-rows", type=int, default=512, help="validation rows for the final bpb (default: 512)")
  config_lib.add_arguments(tr, LMConfig, help=HELP)
  ev = sub.add_parser("eval", help="bpb, induction, DAC probe and CORE of a run", prog="attngeo lm eval")
  ev.add_argument("run_dir", help="a run folder written by attngeo lm train")
  ev.add_argument("--core-bundle", default=None, help="DCLM eval bundle directory (core.yaml, eval_data/, "
                                                      "eval_meta_data.csv); default: none, CORE skipped")
  ev.add_argument("--max-rows", type=int, default=None, help="validation rows for bpb (default: all)")
  ev.add_argument("--max-per-task", type=int, default=-1, help="CORE examples per task (default: -1, all)")
  ev.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  ev.add_argument("--no-dac", action="store_true", help="skip the DAC probe (default: run it)")
  sa = sub.add_parser("sample", help="sample text from a run (KV-cached)", prog="attngeo lm sample")
  sa.add_argument("run_dir", help="a run folder written by attngeo lm train")
  sa.add_argument("--prompt", default="", help="text to continue (default: empty, BOS only)")
  sa.add_argument("--max-tokens", type=int, default=200, help="new tokens at most, capped by the context (default: 200)")
  sa.add_argument("--temperature", type=float, default=0.8, help="softmax temperature, 0 = greedy (default: 0.8)")
  sa.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens, 0 = all (default: 50)")
  sa.add_argument("--num-samples", type=int, default=1, help="independent samples (default: 1)")
  sa.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
  sa.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  proto = Table2Config()
  t2 = sub.add_parser("table2", help="the seed's Table 2 at this machine's scale", prog="attngeo lm table2",
                      description=f"Default protocol: conditions {list(proto.conditions)} × seeds {list(proto.seeds)}; "
                                  f"depth {proto.lm.depth}, width {proto.lm.width}, head_dim {proto.lm.head_dim}, "
                                  f"context {proto.lm.seq_len}, {proto.lm.tokenizer} tokenizer, data {proto.lm.data}, "
                                  f"{proto.lm.train.steps} steps × {proto.lm.train.batch_size} rows. The --lm.* "
                                  f"defaults printed below are attngeo lm train's; the protocol's override them.")
  t2.add_argument("--full", action="store_true",
                  help="the seed's d12 recipe (depth 12, 2048 context, 65,536-token BPE, FineWeb-edu shards; "
                       "print it with --dry-run); default off")
  t2.add_argument("--dry-run", action="store_true", help="print the plan (FLOPs, step-time estimates, launch line), train nothing; default off")
  t2.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed by the estimates (default: 0.4)")
  config_lib.add_arguments(t2, Table2Config, help={"conditions": f"from {list(CONDITIONS)} (learnable: per-head "
                                                                 "(beta, alpha) from (0.5, 0.5))",
                                                   "seeds": "training seeds", "eval_rows": "validation rows for bpb (0: all)",
                                                   "out": "output folder", **{f"lm.{k}": v for k, v in HELP.items()}})
  from attngeo.experiments import lm_adapt
  lm_adapt.add_parser(sub)
  return ap


def main(argv=None):
  ap = parser()
  args = ap.parse_args(argv)
  sub = {a.dest: a for a in ap._actions if isinstance(a, argparse._SubParsersAction)}["command"].choices[args.command]
  from attngeo.experiments import lm_adapt
  return {"train": cmd_train, "eval": cmd_eval, "sample": cmd_sample, "table2": cmd_table2,
          "adapt": lm_adapt.cmd_adapt}[args.command](args, sub)


if __name__ == "__main__":
  main(sys.argv[1:])
