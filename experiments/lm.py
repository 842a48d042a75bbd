"""Language models: train a GPT on text, evaluate it, sample from it, and the seed's Table 2 at this scale.

    attngeo lm train [--data shakespeare] [--tokenizer byte|bpe] [--depth 4] [--operator DMTN] [--train.steps N] --out DIR
    attngeo lm train --preset induction --out DIR    BPE 512, depth 2, context 256, CopyMix 0.9, induction logged every 100 steps
    attngeo lm eval RUN_DIR [--core-bundle DIR] [--max-rows N]
    attngeo lm sample RUN_DIR [--prompt TEXT] [--max-tokens 200] [--temperature 0.8] [--top-k 50]
    attngeo lm table2 [--seeds 0,1,2] [--conditions ATTN,DMTN,DMAP,ATAP,learnable] [--lm.X ...] [--out DIR]
    attngeo lm table2 --full --dry-run         the seed's d12 recipe: FLOPs/token, step-time estimates, launch line
    attngeo lm adapt [--source RUN_DIR | --preset induction] [--chain ATTN,DMTN,ATTN,DMTN] [--adapt.steps N]   the seed's Table 3

`train` writes a run folder (lm.json, tokenizer/, config.json, metrics.jsonl, ckpt/) and resumes a
killed run from its last checkpoint. `eval` prints and writes RUN_DIR/eval.json: validation bits per
byte (nanochat's definition), the induction score under both token sets (`induction`: uniform over the
vocabulary, the seed's protocol; `induction_corpus`: the training corpus's tokens), the DAC probe and —
with a local DCLM eval bundle — CORE. `table2` trains every condition × seed from scratch on the same budget and reports mean ± sd.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import sys
import time

import numpy as np

from attngeo import cli, config as config_lib, files, stats
from attngeo.data import text
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.lm.config import HELP, PRESETS, LMConfig, preset
from attngeo.lm import recipe, table2, tokenizer as tok_lib
from attngeo.lm.table2 import CONDITIONS, LadderConfig, Table2Config, run_condition  # the protocol (the library's)

SEED_TABLE2 = {"ATTN": 0.8471, "DMTN": 0.8492, "DMAP": 0.8621}


# ----------------------------------------------------------------------------- train / eval / sample

def cmd_train(args, ap) -> dict:
  try:
    cfg = config_lib.from_arguments(args, LMConfig, preset(args.preset) if args.preset else None)
    if args.eval_max_rows < 1:
      raise ValueError(f"--eval-max-rows must be ≥ 1; got {args.eval_max_rows}")
    cfg.validate()                               # every field, before JAX is imported
    result = recipe.train(cfg, args.out, desc=f"lm {cfg.operator}")
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  last = result["history"][-1] if result["history"] else {}
  print(f"trained {args.out}: step {last.get('step')}, loss {last.get('loss', float('nan')):.4f}, "
        f"{last.get('tokens_per_s', 0):.0f} tokens/s")
  if not args.no_eval:
    return cmd_eval(argparse.Namespace(run_dir=args.out, core_bundle=None, max_rows=args.eval_max_rows, step=None,
                                       max_per_task=-1, no_dac=False, allow_changed_corpus=False), ap, loaded=result)
  return result


def corpus_changed(run_dir: str, key: str, data: str, allow: bool) -> bool:
  """Whether the text at `data` now differs from the corpus the run trained on (its corpus.json key):
  a one-line ValueError unless `allow`, then a warning on stderr."""
  recorded = recipe.recorded_corpus(run_dir)
  if recorded is None or recorded == key:
    return False
  message = (f"{run_dir}: the text at data {data!r} is not the corpus the run trained on (corpus.json key {recorded}, "
             f"now {key})")
  if not allow:
    raise ValueError(f"{message}; pass --allow-changed-corpus to evaluate on the new text")
  print(f"warning: {message}; evaluating on the new text (--allow-changed-corpus)", file=sys.stderr)
  return True


EVAL_COLS = [Col("metric"), Col("value", fmt=lambda v: f"{v:.4f}" if isinstance(v, float) else str(v))]


def cmd_eval(args, ap, loaded=None) -> dict:
  try:
    if args.max_rows is not None and args.max_rows < 1:
      raise ValueError(f"--max-rows must be ≥ 1 (omit it for all rows); got {args.max_rows}")
    cfg = recipe.read_config(args.run_dir)       # not a run folder: one line before JAX is imported
    from attngeo.lm import core, evals
    core.check_max_per_task(args.max_per_task)
    if loaded is None:
      model, tok, cfg, step = recipe.load(args.run_dir, args.step, with_step=True)
    else:
      model, tok, step = loaded["model"], loaded["tokenizer"], loaded.get("step")
    corpus = text.open_corpus(cfg.text_spec(), tok, cfg.data_dir)
    changed = corpus_changed(args.run_dir, corpus.key, cfg.data, args.allow_changed_corpus)
    out = evals.evaluate(model, tok, corpus.rows("val", cfg.seq_len), max_rows=args.max_rows,
                         with_dac=not args.no_dac, core_bundle=args.core_bundle, max_per_task=args.max_per_task,
                         progress=True, corpus_tokens=corpus.token_ids())
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  out.update(corpus_key=corpus.key, corpus_changed=changed, step=step)
  rows = [{"metric": "checkpoint step", "value": step if step is not None else "—"},
          {"metric": "val bpb", "value": out["bpb"]}, {"metric": "val loss (nats/token)", "value": out["val_loss"]},
          {"metric": "val tokens", "value": out["val_tokens"]}]
  for key, what in (("induction_corpus", "corpus tokens"), ("induction", "uniform over the vocabulary, the seed's")):
    if key in out:
      rows.append({"metric": f"induction acc, {what} (mean over L)", "value": out[key]})
      for L, v in out[f"{key}_per_length"].items():
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
    if args.top_k < 0:
      raise ValueError(f"--top-k must be ≥ 0 (0: all tokens); got {args.top_k}")
    generate.check_args(args.max_tokens, args.temperature, args.top_k or None, args.num_samples,
                        names=("--max-tokens", "--temperature", "--top-k", "--num-samples"))
    model, tok, _ = recipe.load(args.run_dir, args.step)
    ids = tok.encode(args.prompt, prepend=tok.bos_id)
    sampler = generate.Sampler(model)
    samples = sampler.generate(ids, args.max_tokens, args.temperature, args.top_k or None, args.num_samples,
                               args.seed, stop=tok.bos_id)
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  if args.max_tokens > sampler.room(ids):
    print(f"note: --max-tokens {args.max_tokens} capped at {sampler.room(ids)}: the prompt (BOS included) takes "
          f"{len(ids)} of the model's {sampler.seq_len}-token context", file=sys.stderr)
  texts = [args.prompt + tok.decode(s) for s in samples]
  for t in texts:
    print("-" * 72)
    print(t)
  return texts


# ----------------------------------------------------------------------------- Table 2

# The seed's depth-12 run: nanochat's d12 (width 768, 6 heads of 128, context 2048, 65,536-token BPE)
# on FineWeb-edu parquet shards, 524,288 tokens per step for 20 tokens per parameter (Chinchilla).
FULL = dict(depth=12, aspect=64, head_dim=128, seq_len=2048, tokenizer="bpe", vocab_size=65_536,
            data="data/fineweb_edu", data_dir="runs/lm_data")
FULL_TRAIN = dict(batch_size=256, lr=0.02, warmup=40, ckpt_every=500, log_every=20)
FULL_TOKENS_PER_PARAM = 20
PEAKS = {"H100 (bf16 dense)": 989e12, "TPU v4 (bf16)": 275e12}


def summarise(rows: list[dict], conditions) -> list[dict]:
  """Per condition: mean ± sd (ddof = 1) over seeds of bpb and induction accuracy (both token sets), and bpb's
  difference from ATTN with Welch's t and p (`attngeo.stats.welch`; None for ATTN itself, without an
  ATTN row, or with fewer than 2 seeds on either side)."""
  out = []
  attn = np.array([r["bpb"] for r in rows if r["condition"] == "ATTN"])
  for name in conditions:
    rs = [r for r in rows if r["condition"] == name]
    if not rs:
      continue
    bpbs, inds = np.array([r["bpb"] for r in rs]), np.array([r["induction"] for r in rs])
    corpus_inds = np.array([r["induction_corpus"] for r in rs])
    sd = lambda x: float(x.std(ddof=1)) if len(x) > 1 else float("nan")
    test = stats.welch_if_testable(bpbs, attn) if name != "ATTN" else None
    out.append(dict(condition=name, seeds=len(rs), bpb_mean=float(bpbs.mean()), bpb_sd=sd(bpbs),
                    induction_mean=float(inds.mean()), induction_sd=sd(inds),
                    induction_corpus_mean=float(corpus_inds.mean()), induction_corpus_sd=sd(corpus_inds),
                    seed_bpb=SEED_TABLE2.get(name),
                    bpb_per_seed=bpbs.tolist(), bpb_vs_attn=test and test.difference, welch_t=test and test.t,
                    welch_df=test and test.df, welch_p=test and test.p))
  return out


def vs_attn(row: dict) -> str:
  """'+0.0215 (t = 4.5, p = 0.03)' from a `summarise` row; '—' where no test was made."""
  if row["welch_t"] is None:
    return "—"
  return f"{row['bpb_vs_attn']:+.4f} (t = {row['welch_t']:.1f}, p = {row['welch_p']:.2g})"


def pm(mean_key, sd_key, digits=4):
  return lambda row: f"{row[mean_key]:.{digits}f} ± {row[sd_key]:.{digits}f}" if not math.isnan(row[sd_key]) \
      else f"{row[mean_key]:.{digits}f}"


TABLE2_COLS = [Col("condition", "Operator"), Col("seeds", "seeds"),
               Col("bpb_mean", "val bpb ↓ (mean ± sd)", align="right"),
               Col("vs_attn", "here − ATTN (Welch t, p)", align="right"),
               Col("induction_corpus_mean", "induction, corpus tokens ↑", align="right"),
               Col("induction_mean", "induction, uniform (seed's) ↑", align="right"),
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
  files.save_figure(fig, path, dpi=120)
  plt.close(fig)


def induction_figure(rows: list[dict], path: str) -> bool:
  """Induction accuracy (corpus tokens solid, uniform dashed) against the step, per run, from the
  periodic eval (`--lm.induction-lengths`, `--lm.eval-every`); False (nothing drawn) without one."""
  if not any(r.get("induction_curve") for r in rows):
    return False
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  colours = dict(zip(CONDITIONS, ("black", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red")))
  for name in dict.fromkeys(r["condition"] for r in rows):
    for i, r in enumerate(r for r in rows if r["condition"] == name and r.get("induction_curve")):
      steps, corpus, uniform = zip(*r["induction_curve"])
      ax.plot(steps, corpus, color=colours.get(name), lw=1, label=name if i == 0 else None)
      ax.plot(steps, uniform, color=colours.get(name), lw=1, ls="--")
  ax.set_xlabel("step")
  ax.set_ylabel("induction accuracy")
  ax.set_title("Induction vs step (solid: corpus tokens, dashed: uniform)")
  ax.legend()
  fig.tight_layout()
  files.save_figure(fig, path, dpi=120)
  plt.close(fig)
  return True


def vocab_size(lm: LMConfig) -> int:
  """The vocabulary a run of `lm` gets: the byte tokenizer's 265 ids, or the BPE `vocab_size`."""
  return tok_lib.ByteTokenizer().vocab_size if lm.tokenizer == "byte" else lm.vocab_size


def given_flags(args, skip=()) -> list[str]:
  """The Table2Config flags given on the command line, as `--name value` (names in `skip` left out)."""
  out = []
  for name, value in sorted(vars(args).items()):
    if value is None or name in skip or name in ("command", "full", "dry_run", "mfu"):
      continue
    text = ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value).lower() \
        if isinstance(value, bool) else str(value)
    out += [f"--{name.replace('_', '-')}", shlex.quote(text)]
  return out


def plan(cfg: Table2Config, mfu: float, command: str) -> dict:
  """FLOPs per token, total FLOPs and estimated step time of `cfg` (no training), and the launch lines
  that run `command` (the table2 command with the flags given) on a TPU v4-32 or one 8-GPU node."""
  from attngeo.nn import gpt
  mcfg = recipe.model_config(cfg.lm, vocab_size(cfg.lm))
  flops = gpt.flops_per_token(mcfg)
  tokens_per_step = cfg.lm.train.batch_size * cfg.lm.seq_len
  out = {"width": mcfg.width, "heads": mcfg.block.num_heads, "head_dim": mcfg.block.dh, "depth": mcfg.depth,
         "seq_len": mcfg.seq_len, "vocab_size": mcfg.vocab_size, "tokenizer": cfg.lm.tokenizer,
         "matmul_params": gpt.matmul_params(mcfg), "flops_per_token": flops, "tokens_per_step": tokens_per_step,
         "steps": cfg.lm.train.steps, "mfu_assumed": mfu, "runs": len(cfg.conditions) * len(cfg.seeds)}
  out["step_seconds"] = {chip: flops * tokens_per_step / (peak * mfu) for chip, peak in PEAKS.items()}
  # v4-32: 16 chips over 4 hosts; one 8-GPU node: 8 devices. The mesh is data-parallel over all of them.
  tail = f"--lm.data {shlex.quote(cfg.lm.data)} --out {shlex.quote(cfg.out)}"
  out["command"] = command
  out["launch"] = f"tpu/launch_tpu.sh --name attngeo-lm --zone ZONE --type v4-32 -- {command} {tail} --lm.train.mesh 16,1,1"
  out["launch_gpu"] = f"tpu/launch_gpu.sh slurm --nodes 1 --partition gpu -- {command} {tail} --lm.train.mesh 8,1,1"
  return out


def amount(x: float) -> str:
  """Thousands separated and whole from 10 up, two significant digits below (0.0031, never 0)."""
  return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def print_plan(plan: dict) -> None:
  print(f"d{plan['depth']}: width {plan['width']}, {plan['heads']} heads × {plan['head_dim']}, context {plan['seq_len']}, "
        f"vocab {plan['vocab_size']:,} ({plan['tokenizer']} tokenizer); "
        f"{plan['matmul_params'] / 1e6:.3g} M matmul parameters")
  print(f"FLOPs per token (6·N + 12·L·h·d_h·T, nanochat): {plan['flops_per_token'] / 1e9:.4g} G; "
        f"{plan['tokens_per_step']:,} tokens per step, {plan['steps']:,} steps, {plan['runs']} runs")
  for chip, s in plan["step_seconds"].items():
    total = s * plan["steps"] * plan["runs"] / 3600
    print(f"  {chip}: {amount(s)} s per step per chip at {100 * plan['mfu_assumed']:.0f}% MFU "
          f"({amount(total)} chip-hours for all runs)")
  print(f"run:    {plan['command']}")
  print(f"launch: {plan['launch']}")
  print(f"        {plan['launch_gpu']}")


def full_config(base: Table2Config) -> Table2Config:
  lm = dataclasses.replace(base.lm, **FULL, width=None, train=dataclasses.replace(base.lm.train, **FULL_TRAIN))
  return dataclasses.replace(base, lm=lm, eval_rows=0, out="runs/table2_full")


def full_steps(cfg: Table2Config) -> int:
  """Steps for FULL_TOKENS_PER_PARAM tokens per parameter (embeddings included)."""
  from attngeo.nn import gpt
  mcfg = recipe.model_config(cfg.lm, vocab_size(cfg.lm))
  params = gpt.matmul_params(mcfg) + mcfg.vocab_size * mcfg.width
  return round(FULL_TOKENS_PER_PARAM * params / (cfg.lm.train.batch_size * cfg.lm.seq_len))


def check_table2(cfg: Table2Config, mfu: float) -> None:
  """One-line ValueError naming the first field of `cfg` (or `mfu`) no Table 2 run can use, before any work."""
  unknown = [c for c in cfg.conditions if c not in CONDITIONS]
  if not cfg.conditions or unknown:
    raise ValueError(f"--conditions: unknown {unknown}; choose from {list(CONDITIONS)}" if unknown else
                     f"--conditions must name at least one of {list(CONDITIONS)}")
  if not cfg.seeds or len(set(cfg.seeds)) != len(cfg.seeds) or min(cfg.seeds) < 0:
    raise ValueError(f"--seeds must name distinct non-negative training seeds; got {list(cfg.seeds)}")
  if cfg.eval_rows < 0:
    raise ValueError(f"--eval-rows must be ≥ 0 (0: all); got {cfg.eval_rows}")
  if not 0 < mfu <= 1:
    raise ValueError(f"--mfu must lie in (0, 1]; got {mfu}")
  for name in cfg.conditions:                    # the fields first (no JAX), then each condition's model
    table2.condition_config(cfg.lm, name).validate("lm.")
  for name in cfg.conditions:                    # (CMAP needs an even head_dim)
    recipe.check(table2.condition_config(cfg.lm, name), "lm.")


def cmd_table2(args, ap) -> dict:
  base = Table2Config()
  try:
    if args.preset:
      base = dataclasses.replace(base, lm=preset(args.preset))
    if args.full:
      base = full_config(base)
    cfg = config_lib.from_arguments(args, Table2Config, base)
    check_table2(cfg, args.mfu)
  except ValueError as e:
    ap.error(str(e))
  if args.full and getattr(args, "lm.train.steps") is None:
    cfg = dataclasses.replace(cfg, lm=dataclasses.replace(cfg.lm, train=dataclasses.replace(cfg.lm.train,
                                                                                            steps=full_steps(cfg))))
  if args.full or args.dry_run:
    command = " ".join(["attngeo lm table2", *(["--full"] if args.full else []),
                        *given_flags(args, skip=("out", "lm.data", "lm.train.mesh"))])
    the_plan = plan(cfg, args.mfu, command)
    print_plan(the_plan)
    if args.dry_run:
      return {"plan": the_plan}
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
    r["vs_attn"] = vs_attn(r)
    r["bpb_mean"] = pm("bpb_mean", "bpb_sd")(r)
    r["induction_mean"] = pm("induction_mean", "induction_sd", 3)(r)
    r["induction_corpus_mean"] = pm("induction_corpus_mean", "induction_corpus_sd", 3)(r)
  wall = time.perf_counter() - t0
  note = (f"Depth-{cfg.lm.depth} GPT (width {cfg.lm.width or cfg.lm.aspect * cfg.lm.depth}, context {cfg.lm.seq_len}, "
          f"{cfg.lm.tokenizer} tokenizer) trained from scratch on '{cfg.lm.data}' for {cfg.lm.train.steps} steps × "
          f"{cfg.lm.train.batch_size} rows per condition and seed; sd over {len(cfg.seeds)} seeds (ddof 1). "
          f"here − ATTN: the difference of mean bpb from ATTN's, Welch's t-test over the seeds (two-sided p). "
          f"Induction: accuracy on the second copy of [s; s], s drawn from the training corpus's tokens "
          f"(corpus) or uniformly from the vocabulary (uniform: the seed's protocol), mean over L. "
          f"CopyMix share {cfg.lm.copy_mix}. "
          f"Seed paper: depth 12, FineWeb-edu, 65,536-token BPE, one seed. Wall time {wall:.0f} s.")
  payload = dict(config=dataclasses.asdict(cfg), table=summarise(rows, cfg.conditions), runs=rows, wall_seconds=wall)
  with files.staged():                      # the tables and the figures land together (a full disk: none of them)
    md = report.write(cfg.out, "table2", table, TABLE2_COLS, payload=payload, note=note)
    loss_figure(rows, os.path.join(cfg.out, "loss_curves.png"))
    curves = ", induction_curves.png" if induction_figure(rows, os.path.join(cfg.out, "induction_curves.png")) else ""
  os.replace(os.path.join(cfg.out, "table2.json"), os.path.join(cfg.out, "results.json"))
  print(f"\nwrote {cfg.out}/table2.md, table2.csv, results.json, loss_curves.png{curves}; wall time {wall:.0f} s")
  return {"markdown": md, **payload}


# ----------------------------------------------------------------------------- the scale ladder

def summarise_ladder(rows: list[dict], cfg: LadderConfig) -> list[dict]:
  """Per (depth, condition): matmul parameters, and the mean (sd with ddof 1 over seeds) of bpb, induction under
  both token sets and the DAC probe's max contrast."""
  out = []
  for depth in cfg.depths:
    for name in cfg.conditions:
      rs = [r for r in rows if r["depth"] == depth and r["condition"] == name]
      if not rs:
        continue
      row = dict(depth=depth, condition=name, seeds=len(rs), params_m=rs[0]["matmul_params"] / 1e6)
      for key in ("bpb", "induction", "induction_corpus", "dac_max_contrast"):
        x = np.array([r[key] for r in rs], dtype=float)
        row[f"{key}_mean"], row[f"{key}_sd"] = float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else float("nan")
      out.append(row)
  return out


LADDER_COLS = [Col("depth", "depth"), Col("params_m", "matmul params (M)", ".3f"), Col("condition", "Operator"),
               Col("seeds", "seeds"), Col("bpb", "val bpb ↓", align="right"),
               Col("induction_corpus", "induction, corpus tokens ↑", align="right"),
               Col("induction", "induction, uniform (seed's) ↑", align="right"),
               Col("dac_max_contrast", "DAC contrast (max)", align="right")]


def ladder_figure(table: list[dict], path: str) -> None:
  """Two panels against depth, one line per operator: induction (uniform solid, corpus dashed) and val bpb."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 3.6))
  colours = dict(zip(CONDITIONS, ("black", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red")))
  for name in dict.fromkeys(r["condition"] for r in table):
    rs = [r for r in table if r["condition"] == name]
    depths = [r["depth"] for r in rs]
    left.plot(depths, [r["induction_mean"] for r in rs], "o-", color=colours.get(name), label=f"{name} (uniform)")
    left.plot(depths, [r["induction_corpus_mean"] for r in rs], "s--", color=colours.get(name), alpha=0.6,
              label=f"{name} (corpus tokens)")
    right.plot(depths, [r["bpb_mean"] for r in rs], "o-", color=colours.get(name), label=name)
  depths = sorted({r["depth"] for r in table})
  for ax, label in ((left, "induction accuracy"), (right, "val bpb")):
    ax.set_xticks(depths)
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel(label)
  left.set_ylim(-0.02, 1.02)
  left.set_title("Induction vs depth")
  right.set_title("Validation bpb vs depth")
  left.legend(loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=2, fontsize=8, frameon=False)
  right.legend(loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=3, fontsize=8, frameon=False)
  fig.tight_layout()
  files.save_figure(fig, path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def check_ladder(cfg: LadderConfig) -> None:
  """One-line ValueError naming the first field of `cfg` no ladder can use, before any work."""
  if not cfg.depths or len(set(cfg.depths)) != len(cfg.depths) or min(cfg.depths) < 1:
    raise ValueError(f"--depths must name distinct depths ≥ 1; got {list(cfg.depths)}")
  for depth in cfg.depths:
    check_table2(table2.rung(cfg, depth), mfu=0.4)


def cmd_ladder(args, ap) -> dict:
  base = LadderConfig()
  try:
    if args.preset:
      base = dataclasses.replace(base, lm=preset(args.preset))
    cfg = config_lib.from_arguments(args, LadderConfig, base)
    check_ladder(cfg)
  except ValueError as e:
    ap.error(str(e))
  from attngeo.nn import gpt
  t0 = time.perf_counter()
  os.makedirs(cfg.out, exist_ok=True)
  todo = [(d, c, s) for d in cfg.depths for c in cfg.conditions for s in cfg.seeds]
  rows = []
  for i, (depth, name, seed) in enumerate(todo):
    print(f"[{i + 1}/{len(todo)}] depth {depth} {name} seed {seed}", flush=True)
    rung = table2.rung(cfg, depth)
    try:
      row = run_condition(rung, name, seed)
    except (ValueError, FileNotFoundError) as e:
      ap.error(str(e))
    mcfg = recipe.model_config(table2.condition_config(rung.lm, name), vocab_size(rung.lm))
    rows.append(dict(row, depth=depth, matmul_params=gpt.matmul_params(mcfg)))
  table = summarise_ladder(rows, cfg)
  shown = [dict(r, **{key: pm(f"{key}_mean", f"{key}_sd", digits)(r)
                      for key, digits in (("bpb", 4), ("induction", 3), ("induction_corpus", 3),
                                          ("dac_max_contrast", 2))}) for r in table]
  wall = time.perf_counter() - t0
  lm = cfg.lm
  note = (f"Table 2's protocol at depths {list(cfg.depths)} (width {lm.width or 'aspect × depth'}, {lm.head_dim}-wide "
          f"heads, context {lm.seq_len}, {lm.tokenizer} tokenizer, '{lm.data}', {lm.train.steps} steps × "
          f"{lm.train.batch_size} rows, CopyMix share {lm.copy_mix}); mean ± sd over seeds {list(cfg.seeds)} "
          f"(ddof 1). Runs are Table 2's (same folder, same run keys). Induction: accuracy on the second copy "
          f"of [s; s], s from the corpus's tokens or uniform over the vocabulary (the seed's), mean over L. DAC "
          f"contrast: the antisymmetric logit on induction edges against offsets −2…2, max over layers and heads. "
          f"Wall time {wall:.0f} s.")
  payload = dict(config=dataclasses.asdict(cfg), table=table, runs=rows, wall_seconds=wall)
  with files.staged():                      # the tables and the figure land together (a full disk: none of them)
    md = report.write(cfg.out, "ladder", shown, LADDER_COLS, payload=payload, note=note)
    ladder_figure(table, os.path.join(cfg.out, "ladder.png"))
  print(f"\nwrote {cfg.out}/ladder.md, ladder.csv, ladder.json, ladder.png; wall time {wall:.0f} s")
  return {"markdown": md, **payload}


# ----------------------------------------------------------------------------- parser

def _parser(name: str, description: str | None = None) -> argparse.ArgumentParser:
  return config_lib.parser(f"attngeo lm {name}", description or cli.COMMANDS[f"lm {name}"][1] + ".")


def add_preset(ap: argparse.ArgumentParser, flags: str) -> None:
  """`--preset NAME`: start the `flags` protocol from a preset of `attngeo.lm.config.PRESETS`."""
  ap.add_argument("--preset", default=None,
                  help=f"the {flags} protocol from a preset ({', '.join(sorted(PRESETS))}; docs/lm.md), flags override "
                       "it (default: none)")


def train_parser() -> argparse.ArgumentParser:
  tr = _parser("train")
  tr.add_argument("--out", default="runs/lm", help="run folder (default: runs/lm)")
  tr.add_argument("--preset", default=None,
                  help=f"start from a protocol preset ({', '.join(sorted(PRESETS))}; docs/lm.md), flags override it "
                       "(default: none)")
  tr.add_argument("--no-eval", action="store_true", help="skip the evaluation after training (default: evaluate)")
  tr.add_argument("--eval-max-rows", type=int, default=512, help="validation rows for the final bpb (default: 512)")
  config_lib.add_arguments(tr, LMConfig, help=HELP)
  return tr


def eval_parser() -> argparse.ArgumentParser:
  ev = _parser("eval")
  ev.add_argument("run_dir", help="a run folder written by attngeo lm train")
  ev.add_argument("--core-bundle", default=None, help="DCLM eval bundle directory (core.yaml, eval_data/, "
                                                      "eval_meta_data.csv); default: none, CORE skipped")
  ev.add_argument("--max-rows", type=int, default=None, help="validation rows for bpb (default: all)")
  ev.add_argument("--max-per-task", type=int, default=-1, help="CORE examples per task (default: -1, all)")
  ev.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  ev.add_argument("--no-dac", action="store_true", help="skip the DAC probe (default: run it)")
  ev.add_argument("--allow-changed-corpus", action="store_true",
                  help="evaluate even when the text at the run's data path differs from the corpus it trained on "
                       "(corpus.json; a warning says so); default: refuse")
  return ev


def sample_parser() -> argparse.ArgumentParser:
  sa = _parser("sample")
  sa.add_argument("run_dir", help="a run folder written by attngeo lm train")
  sa.add_argument("--prompt", default="", help="text to continue (default: empty, BOS only)")
  sa.add_argument("--max-tokens", type=int, default=200, help="new tokens at most, capped by the context (default: 200)")
  sa.add_argument("--temperature", type=float, default=0.8, help="softmax temperature, 0 = greedy (default: 0.8)")
  sa.add_argument("--top-k", type=int, default=50, help="sample among the k likeliest tokens, 0 = all (default: 50)")
  sa.add_argument("--num-samples", type=int, default=1, help="independent samples (default: 1)")
  sa.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
  sa.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
  return sa


# Said by every command whose --lm.* flags start from a protocol other than `lm train`'s.
LM_DEFAULTS = "The --lm.* defaults printed below are attngeo lm train's; the protocol's override them."


def table2_parser() -> argparse.ArgumentParser:
  proto = Table2Config()
  t2 = _parser("table2", description=f"The seed's Table 2 at this machine's scale. Default protocol: conditions "
                                     f"{list(proto.conditions)} × seeds {list(proto.seeds)}; "
                                     f"depth {proto.lm.depth}, width {proto.lm.width}, head_dim {proto.lm.head_dim}, "
                                     f"context {proto.lm.seq_len}, {proto.lm.tokenizer} tokenizer, data {proto.lm.data}, "
                                     f"{proto.lm.train.steps} steps × {proto.lm.train.batch_size} rows. {LM_DEFAULTS}")
  t2.add_argument("--full", action="store_true",
                  help="the seed's d12 recipe (depth 12, 2048 context, 65,536-token BPE, FineWeb-edu shards; "
                       "print it with --dry-run); default off")
  t2.add_argument("--dry-run", action="store_true", help="print the plan (FLOPs, step-time estimates, launch line), train nothing; default off")
  add_preset(t2, "--lm.*")
  t2.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed by the estimates (default: 0.4)")
  config_lib.add_arguments(t2, Table2Config, help={"conditions": f"from {list(CONDITIONS)} (learnable: per-head "
                                                                 "(beta, alpha) from (0.5, 0.5))",
                                                   "seeds": "training seeds", "eval_rows": "validation rows for bpb (0: all)",
                                                   "out": "output folder", **{f"lm.{k}": v for k, v in HELP.items()}})
  return t2


def ladder_parser() -> argparse.ArgumentParser:
  proto = LadderConfig()
  la = _parser("ladder", description=f"Table 2's protocol at several depths, width held (default: depths "
                                     f"{list(proto.depths)}, conditions {list(proto.conditions)}, seeds "
                                     f"{list(proto.seeds)}); its runs live beside Table 2's in --out and are reused "
                                     f"by run key. {LM_DEFAULTS}")
  add_preset(la, "--lm.*")
  config_lib.add_arguments(la, LadderConfig, help={
      "depths": "transformer blocks of each rung (width held at --lm.width)",
      "conditions": f"from {list(CONDITIONS)}", "seeds": "training seeds",
      "eval_rows": "validation rows for bpb (0: all)",
      "out": "output folder (Table 2's: runs at a depth Table 2 trained are reused)",
      **{f"lm.{k}": v for k, v in HELP.items()}}, skip=("lm.depth",))
  return la


def train_main(argv=None):
  """`attngeo lm train` on `argv` (the arguments after the command's name)."""
  ap = train_parser()
  return cmd_train(ap.parse_args(argv), ap)


def eval_main(argv=None):
  """`attngeo lm eval` on `argv` (the arguments after the command's name)."""
  ap = eval_parser()
  return cmd_eval(ap.parse_args(argv), ap)


def sample_main(argv=None):
  """`attngeo lm sample` on `argv` (the arguments after the command's name)."""
  ap = sample_parser()
  return cmd_sample(ap.parse_args(argv), ap)


def table2_main(argv=None):
  """`attngeo lm table2` on `argv` (the arguments after the command's name)."""
  ap = table2_parser()
  return cmd_table2(ap.parse_args(argv), ap)


def ladder_main(argv=None):
  """`attngeo lm ladder` on `argv` (the arguments after the command's name)."""
  ap = ladder_parser()
  return cmd_ladder(ap.parse_args(argv), ap)


def main(argv=None):
  """`attngeo lm SUB …` from Python: the sub-command's return value (see `attngeo.cli.call_group`)."""
  return cli.call_group("lm", sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
  main(sys.argv[1:])
