"""`attngeo lm adapt`: the seed's Table 3 — one pretrained GPT adapted along a chain of operators.

    attngeo lm adapt [--source RUN_DIR] [--chain ATTN,DMTN,ATTN,DMTN] [--adapt.steps N] [--seeds 0,1,2] [--out DIR]
    attngeo lm adapt --preset induction [--out DIR]   from the induction preset's Table 2 ATTN model
    attngeo lm adapt --full [--dry-run]        the seed's d32 protocol: plan, cost estimate, launch lines

State 0 is the source under the chain's first operator; every later state grafts its operator onto
the previous state's weights (`nn.graft`), is evaluated, adapts for `--adapt.steps` steps on the
corpus (fresh optimizer, data order of each seed) and is evaluated again: bits per byte, induction,
DAC probe, and CORE with `--core-bundle` (`attngeo.lm.adapt` holds the protocol and its keys).

Without `--source`, the source is the Table 2 default ATTN model (seed 0), the very run `attngeo lm
table2` trains: read from `--table2-out` (default runs/table2) when it is there, trained there
otherwise; `--preset induction` makes it the Table 2 ATTN model of that preset (`attngeo lm table2
--preset induction`, docs/lm.md), the one model here that has passed the induction phase change, and
adapts on its own rows (the preset's CopyMix share). An imported checkpoint (`attngeo import`) needs `--tokenizer DIR` and `--data`. Writes
OUT/table3.md, table3.csv, results.json and chain.png; finished states are reused only when their
key — the source's weights, the chain so far, the adaptation config, the corpus and the seed — matches.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time

import numpy as np

from attngeo import config as config_lib, files, runlock, stats
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.interop import nanochat
from attngeo.lm import adapt, table2
from attngeo.lm.adapt import AdaptConfig, parse_chain, pm
from attngeo.lm.config import HELP as LM_HELP, PRESETS, preset

# The seed's Table 3 (depth-32 nanochat, sequentially adapted): bpb, induction, CORE per state.
SEED_TABLE3 = {"A0": (0.7650, 0.8081, 0.2853), "M1": (0.6657, 0.5735, 0.3083), "A1": (0.6619, 0.8334, 0.3275),
               "M2": (0.6690, 0.4676, 0.3082)}
SEED_CHAIN = ("ATTN", "DMTN", "ATTN", "DMTN")

# --full: the seed's d32 starting point, imported with `attngeo import nanochat ... --arch 2025-10`.
D32_META = {"sequence_len": 2048, "vocab_size": 65_536, "n_layer": 32, "n_head": 16, "n_kv_head": 16, "n_embd": 2048}
D32_ARCH = "2025-10"
FULL = dict(source="runs/d32", tokenizer="runs/d32/tokenizer", data="data/fineweb_edu", eval_rows=20_480,
            core_bundle="data/eval_bundle", out="runs/adapt_full")
FULL_ADAPT = dict(steps=500, batch_size=256, lr=0.02, warmup=40, ckpt_every=100, log_every=10, mesh=(1, 8, 1))
FULL_LM = dict(tokenizer="bpe", vocab_size=65_536, seq_len=2048)
PEAKS = {"H100 (bf16 dense)": 989e12, "TPU v4 (bf16)": 275e12}
CHIPS = {"H100 (bf16 dense)": 8, "TPU v4 (bf16)": 16}

HELP = {"chain": "operators along the chain, comma-separated: state 0 (the source under it), then one graft + "
                 "adaptation each; a corner (ATTN, DMTN, ATAP, DMAP) or beta:alpha in [0,1] (a point of the "
                 "square: CMAP is none)",
        "source": "run folder to start from (attngeo lm train, or attngeo import); none: the Table 2 default ATTN model",
        "tokenizer": "tokenizer folder (tokenizer.json) for a source that has none (imported checkpoints)",
        "data": "adaptation corpus (see --lm.data); none: the source run's own corpus",
        "seeds": "adaptation data-order seeds (mean ± sd over them)", "eval_rows": "validation rows for bpb (0: all)",
        "core_bundle": "DCLM eval bundle folder for CORE (none: CORE skipped)",
        "core_max_per_task": "CORE examples per task (-1: all)", "out": "output folder",
        "control": "also run the matched-budget control chain (the first operator in every state)",
        **{f"lm.{k}": f"{v} [the source trained when --source is none; corpus settings of an imported source]"
           for k, v in LM_HELP.items()},
        **{f"adapt.{k[len('train.'):]}": v + " [each adaptation]" for k, v in LM_HELP.items() if k.startswith("train.")}}
HELP["adapt.steps"] = "N: adaptation steps after each graft (0: graft only)"
HELP["adapt.seed"] = "unused: --seeds sets each chain's data order"


def protocol(name: str | None = None) -> AdaptConfig:
  """The default protocol: the Table 2 default model as the source (depth 2, width 128, context 128,
  byte tokenizer, Shakespeare), 200 adaptation steps of 16 rows per state, 3 seeds. With a preset
  `name` (`attngeo.lm.config.PRESETS`) the source is that preset's Table 2 ATTN model instead."""
  return AdaptConfig(lm=preset(name) if name else table2.Table2Config().lm)


def full_config(base: AdaptConfig) -> AdaptConfig:
  lm = dataclasses.replace(base.lm, data=FULL["data"], **FULL_LM)
  return dataclasses.replace(base, **FULL, lm=lm, adapt=dataclasses.replace(base.adapt, **FULL_ADAPT))


# ----------------------------------------------------------------------------- source

def default_source(cfg: AdaptConfig, table2_out: str) -> str:
  """The Table 2 default ATTN run (seed 0) in `table2_out`, trained by `attngeo lm table2`'s own
  `run_condition` (`attngeo.lm.table2`) if it is not there (reused when its config key matches)."""
  t2 = table2.Table2Config(lm=cfg.lm, out=table2_out)
  path = table2.run_dir(table2_out, "ATTN", 0, table2.run_key(table2.condition_config(cfg.lm, "ATTN", 0)))
  print(f"source: the Table 2 default ATTN model (seed 0) in {path}", flush=True)
  table2.run_condition(t2, "ATTN", 0)
  return path


# ----------------------------------------------------------------------------- table and figure

def seed_values(result: dict) -> dict:
  """The seed's Table 3 numbers by state label, when the chain is the seed's (else none)."""
  return SEED_TABLE3 if tuple(result["chain"]) == SEED_CHAIN else {}


def vs_control(row: dict, control: dict | None, metric: str) -> str | None:
  """'−0.0074 (p=0.002)': the adapted state's mean minus the control's at the same state, Welch's t over
  the seeds (`attngeo.stats.welch`, unpaired although chain and control share each seed's data order);
None without a control, '—' when either side has < 2 seeds or both sides are one model."""
  if control is None or row["phase"] != "adapted":
    return None
  if row.get("shared") and control.get("shared"):      # one model on each side (--adapt.steps 0): no spread to test
    return "—"
  test = stats.welch_if_testable([v for v in row[f"{metric}_per_seed"] if v is not None],
                                 [v for v in control[f"{metric}_per_seed"] if v is not None])
  return "—" if test is None else f"{test.difference:+.4f} (p={test.p:.2g})"


def table_rows(summary: list[dict], seed: dict, control: list[dict] | None = None) -> list[dict]:
  """Table 3's rows: per state and phase, mean ± sd over seeds; the seed's values and the control's
  (the same state of the first-operator-throughout chain) beside the adapted rows, with the adapted
  state's difference from the control and its Welch p."""
  ctrl = {r["state"]: r for r in control or () if r["phase"] != "graft"}
  rows = []
  for r in summary:
    ref = seed.get(r["label"]) if r["phase"] != "graft" else None
    c = ctrl.get(r["state"]) if r["phase"] != "graft" else None
    rows.append(dict(state=r["label"], operator=r["operator"], phase=r["phase"], steps=r["steps"], seeds=r["seeds"],
                     bpb=pm(r["bpb_mean"], r["bpb_sd"]), induction=pm(r["induction_mean"], r["induction_sd"]),
                     induction_corpus=pm(r["induction_corpus_mean"], r["induction_corpus_sd"]),
                     dac=pm(r["dac_max_contrast_mean"], r["dac_max_contrast_sd"], 3),
                     core=pm(r["core_mean"], r["core_sd"]),
                     control_bpb=c and pm(c["bpb_mean"], c["bpb_sd"]),
                     control_induction=c and pm(c["induction_mean"], c["induction_sd"]),
                     d_bpb=vs_control(r, c, "bpb"), d_induction=vs_control(r, c, "induction"),
                     seed_bpb=ref and ref[0], seed_induction=ref and ref[1], seed_core=ref and ref[2]))
  return rows


COLS = [Col("state", "State"), Col("operator", "Operator"), Col("phase", "phase"), Col("steps", "steps"),
        Col("bpb", "val bpb ↓", align="right"), Col("induction", "induction ↑", align="right"),
        Col("induction_corpus", "induction, corpus tokens ↑", align="right"),
        Col("dac", "DAC contrast (max)", align="right"), Col("core", "CORE ↑", align="right"),
        Col("control_bpb", "control bpb", align="right"), Col("control_induction", "control induction", align="right"),
        Col("d_bpb", "bpb − control (Welch p)", align="right"),
        Col("d_induction", "induction − control (Welch p)", align="right"),
        Col("seed_bpb", "seed bpb", ".4f"), Col("seed_induction", "seed induction", ".4f"),
        Col("seed_core", "seed CORE", ".4f")]

PANELS = (("bpb", "validation bits per byte ↓"), ("induction", "induction accuracy ↑"),
          ("dac_max_contrast", "DAC local contrast (max over heads)"), ("core", "CORE ↑"))


def figure(result: dict, summary: list[dict], path: str, seed: dict, control: list[dict] | None = None) -> None:
  """Every metric along the chain: per seed (thin) and mean ± sd; the graft jumps dashed, the
  adaptations solid; the control chain (first operator throughout) in black; the seed's d32 values
  (right axis, grey) where the chain is the seed's."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = [p for p in PANELS if any(r[f"{p[0]}_mean"] is not None for r in summary)]
  fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4.0 * (len(panels) + 1), 3.6))
  labels, ops = result["labels"], result["chain"]
  x_of = lambda r: r["state"] - (0.4 if r["phase"] == "graft" else 0.0)
  seeds = sorted({r["seed"] for r in result["records"]})
  for ax, (key, title) in zip(axes, panels):
    xs = [x_of(r) for r in summary]
    for i, s in enumerate(seeds):
      ys = [r[f"{key}_per_seed"][i] if i < len(r[f"{key}_per_seed"]) else None for r in summary]
      ax.plot(xs, [np.nan if y is None else y for y in ys], color="tab:blue", alpha=0.3, lw=0.8)
    for a, b in zip(summary[:-1], summary[1:]):
      ax.plot([x_of(a), x_of(b)], [a[f"{key}_mean"], b[f"{key}_mean"]], color="tab:blue",
              ls="--" if b["phase"] == "graft" else "-", lw=1.6)
    sd = [0.0 if r[f"{key}_sd"] is None or math.isnan(r[f"{key}_sd"]) else r[f"{key}_sd"] for r in summary]
    ax.errorbar(xs, [r[f"{key}_mean"] for r in summary], yerr=sd, fmt="none", ecolor="tab:blue", capsize=3)
    ax.scatter(xs, [r[f"{key}_mean"] for r in summary], c=["tab:red" if r["phase"] == "graft" else "tab:blue"
                                                          for r in summary], zorder=3, s=22)
    ctrl = [r for r in control or () if r["phase"] != "graft" and r[f"{key}_mean"] is not None]
    if ctrl:
      ax.errorbar([r["state"] for r in ctrl], [r[f"{key}_mean"] for r in ctrl], fmt="s-", color="black", ms=3, lw=1,
                  yerr=[0.0 if r[f"{key}_sd"] is None or math.isnan(r[f"{key}_sd"]) else r[f"{key}_sd"] for r in ctrl],
                  capsize=2, label=f"control ({result['chain'][0]} throughout)")
      ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)   # below: off the data
    col = {"bpb": 0, "induction": 1, "core": 2}.get(key)
    if seed and col is not None:
      twin = ax.twinx()
      twin.plot(range(len(labels)), [seed[lab][col] for lab in labels], "o:", color="grey", mfc="none",
                label="seed paper (d32)")
      twin.set_ylabel("seed paper (d32)", color="grey")
      twin.tick_params(axis="y", colors="grey")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([f"{lab}\n{op if isinstance(op, str) else '(%g,%g)' % op}" for lab, op in zip(labels, ops)])
    ax.set_title(title, fontsize=10)
  ax = axes[-1]
  for i, s in enumerate(seeds):
    offset = 0
    for rec in sorted((r for r in result["records"] if r["seed"] == s and r["curve"]), key=lambda r: r["state"]):
      steps, losses = zip(*rec["curve"])
      ax.plot(np.asarray(steps) + offset, np.asarray(losses) / math.log(2), color=f"C{rec['state']}", lw=0.8,
              alpha=0.8, label=f"{rec['label']} {rec['operator']}" if i == 0 else None)
      offset += rec["steps"]
  ax.set_xlabel("adaptation step along the chain")
  ax.set_title("training loss (bits / token)", fontsize=10)
  if ax.lines:
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)       # right of the curves
  fig.suptitle("Sequential adaptation: red = right after the graft, blue = after adaptation (mean ± sd over seeds)",
               fontsize=10)
  fig.tight_layout()
  files.save_figure(fig, path, dpi=120, bbox_inches="tight")        # the legends outside the axes stay in the figure
  plt.close(fig)


# ----------------------------------------------------------------------------- --full plan

def full_plan(cfg: AdaptConfig, mfu: float) -> dict:
  """The d32 protocol's cost: FLOPs per token, steps, chip-hours at `mfu`, and the launch lines."""
  from attngeo.nn import gpt
  mcfg = nanochat.config(D32_META, D32_ARCH)
  ops = parse_chain(cfg.chain)
  flops = gpt.flops_per_token(mcfg)
  tokens = cfg.adapt.batch_size * mcfg.seq_len
  steps = cfg.adapt.steps * (len(ops) - 1) * len(cfg.seeds)
  evals = 2 + len(cfg.seeds) * (2 * (len(ops) - 1) - 1)
  eval_flops = evals * cfg.eval_rows * mcfg.seq_len * 2 * gpt.matmul_params(mcfg)   # forward only
  total = steps * tokens * flops + eval_flops
  plan = dict(depth=mcfg.depth, width=mcfg.width, heads=mcfg.block.num_heads, head_dim=mcfg.block.dh,
              seq_len=mcfg.seq_len, vocab_size=mcfg.vocab_size, arch=D32_ARCH, matmul_params=gpt.matmul_params(mcfg),
              flops_per_token=flops, tokens_per_step=tokens, steps_per_state=cfg.adapt.steps, states=len(ops) - 1,
              seeds=len(cfg.seeds), total_steps=steps, evaluations=evals, total_flops=total, mfu_assumed=mfu)
  plan["chip_hours"] = {chip: total / (peak * mfu) / 3600 for chip, peak in PEAKS.items()}
  plan["wall_hours"] = {chip: plan["chip_hours"][chip] / CHIPS[chip] for chip in PEAKS}
  common = f"attngeo lm adapt --full --out {cfg.out}"
  plan["prepare"] = [f"attngeo import nanochat ~/models/nanochat-d32/model_000650.pt --arch {D32_ARCH} --out {cfg.source}",
                     "(once, on a machine where you trust nanochat's own tokenizer.pkl: it is a pickle, which "
                     "attngeo never loads) "
                     f"python -c \"import pickle; from attngeo.lm.tokenizer import BPETokenizer; "
                     f"e = pickle.load(open('tokenizer.pkl', 'rb')); "
                     f"BPETokenizer(e._mergeable_ranks, e._pat_str).save('{cfg.tokenizer}')\""]
  plan["launch"] = f"tpu/launch_tpu.sh --name attngeo-adapt --zone ZONE --type v4-32 -- {common} --adapt.mesh 1,16,1"
  plan["launch_gpu"] = f"tpu/launch_gpu.sh slurm --nodes 1 --partition gpu -- {common} --adapt.mesh 1,8,1"
  return plan


def print_plan(plan: dict) -> None:
  print(f"d{plan['depth']} (nanochat --arch {plan['arch']}): width {plan['width']}, {plan['heads']} heads × "
        f"{plan['head_dim']}, context {plan['seq_len']}, vocab {plan['vocab_size']:,}; "
        f"{plan['matmul_params'] / 1e9:.2f} B matmul parameters")
  print(f"{plan['states']} grafts × {plan['steps_per_state']} adaptation steps × {plan['seeds']} seeds = "
        f"{plan['total_steps']:,} steps of {plan['tokens_per_step']:,} tokens; {plan['evaluations']} evaluations; "
        f"{plan['flops_per_token'] / 1e9:.2f} GFLOPs per token (6·N + 12·L·h·d_h·T)")
  for chip, hours in plan["chip_hours"].items():
    print(f"  {chip}: {hours:,.0f} chip-hours at {100 * plan['mfu_assumed']:.0f}% MFU "
          f"({plan['wall_hours'][chip]:.1f} h on {CHIPS[chip]} chips; CORE not counted)")
  for line in plan["prepare"]:
    print(f"prepare: {line}")
  print(f"launch: {plan['launch']}")
  print(f"        {plan['launch_gpu']}")


# ----------------------------------------------------------------------------- command

def parser() -> argparse.ArgumentParser:
  proto = AdaptConfig()
  ap = config_lib.parser("attngeo lm adapt", __doc__ + f"\nDefault protocol: chain {proto.chain}, {proto.adapt.steps} steps × "
                         f"{proto.adapt.batch_size} rows per state, seeds {list(proto.seeds)}; source: Table 2's "
                         f"default model (the --lm.* defaults printed below are attngeo lm train's; the protocol's "
                         f"are Table 2's).")
  ap.add_argument("--table2-out", default="runs/table2",
                  help="where the Table 2 runs live, for the default source (default: runs/table2)")
  ap.add_argument("--full", action="store_true", help="the seed's d32 protocol (print it with --dry-run); default off")
  ap.add_argument("--dry-run", action="store_true", help="print the plan (cost, launch lines) and train nothing; default off")
  ap.add_argument("--preset", default=None,
                  help=f"the source from a protocol preset ({', '.join(sorted(PRESETS))}; docs/lm.md): its Table 2 "
                       "ATTN model, --lm.* flags override it (default: none)")
  ap.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed by --full's estimate "
                                                         "(default: 0.4)")
  config_lib.add_arguments(ap, AdaptConfig, help=HELP)
  return ap


def cmd_adapt(args, ap) -> dict:
  if args.preset and args.full:
    ap.error("--preset and --full are two protocols; give one")
  if args.preset and getattr(args, "source", None) is not None:
    ap.error("--preset picks the source (its Table 2 ATTN model); give --preset or --source, not both")
  try:
    base = protocol(args.preset)
  except ValueError as e:
    ap.error(str(e))
  if args.full:
    base = full_config(base)
  cfg = config_lib.from_arguments(args, AdaptConfig, base)
  if args.dry_run and not args.full:
    ap.error("--dry-run plans the --full (d32) protocol; add --full")
  try:
    ops = adapt.parse_chain(cfg.chain)      # first, without JAX: check_fields' text spec imports attngeo.data (grain)
    adapt.check_fields(cfg)                 # then the fields and files
    if not args.dry_run:
      adapt.check_files(cfg)
    if args.full:
      plan = full_plan(cfg, args.mfu)
      print_plan(plan)
      if args.dry_run:
        return {"plan": plan}
    adapt.validate(cfg)
    cfg.lm.text_spec()
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  t0 = time.perf_counter()
  try:
    with runlock.hold(cfg.out):             # one process per output folder, before any work (its states hold their own)
      if cfg.source is None:
        cfg = dataclasses.replace(cfg, source=default_source(cfg, args.table2_out))
      return finish(cfg, ops, adapt.load_source(cfg), t0)
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))


def finish(cfg: AdaptConfig, ops, source, t0: float) -> dict:
  """Run the chain (and its control) from `source`, then write Table 3, results.json and the figure."""
  print(f"source {cfg.source} ({source.kind}, key {source.key}); chain {' → '.join(map(adapt.operator_label, ops))}; "
        f"{cfg.adapt.steps} steps per state; seeds {list(cfg.seeds)}", flush=True)
  result = adapt.run(cfg, source, log=lambda line: print(line, flush=True))
  control = None
  if cfg.control and adapt.control_chain(ops) != ops:
    print(f"control: {' → '.join(map(adapt.operator_label, adapt.control_chain(ops)))}", flush=True)
    control = adapt.run(dataclasses.replace(cfg, chain=adapt.chain_text(adapt.control_chain(ops))),
                        source, log=lambda line: print(line, flush=True))
  wall = time.perf_counter() - t0
  summary = adapt.summarise(result)
  control_summary = adapt.summarise(control) if control else None
  seed = seed_values(result)
  model = source.model.cfg
  note = (f"Source: {cfg.source} ({source.kind}; depth {model.depth}, width {model.width}, context {model.seq_len}, "
          f"vocab {model.vocab_size}). Each state after the first: graft, then {cfg.adapt.steps} steps × "
          f"{cfg.adapt.batch_size} rows ({cfg.adapt.optimizer}, peak rate {cfg.adapt.lr:g}, {cfg.adapt.schedule}) "
          f"with a fresh optimizer; mean ± sd (ddof 1) over {len(cfg.seeds)} adaptation data orders; bpb on "
          f"{cfg.eval_rows or 'all'} validation rows. Control: the same schedule with {adapt.operator_label(ops[0])} in "
          f"every state (no graft). {result['trained'] + (control or {}).get('trained', 0)} adaptations trained and "
          f"{result['evaluated'] + (control or {}).get('evaluated', 0)} evaluations run in this call; "
          f"wall time {wall:.0f} s."
          + (" Seed paper: nanochat d32, sequentially adapted (its Table 3)." if seed else ""))
  payload = dict(config=dataclasses.asdict(cfg), summary=summary, control=control, control_summary=control_summary,
                 wall_seconds=wall, **result)
  with files.staged():                      # the tables and the figure land together (a full disk: none of them)
    md = report.write(cfg.out, "table3", table_rows(summary, seed, control_summary), COLS, payload=payload,
                      note=note)
    figure(result, summary, os.path.join(cfg.out, "chain.png"), seed, control_summary)
  os.replace(os.path.join(cfg.out, "table3.json"), os.path.join(cfg.out, "results.json"))
  print(f"\nwrote {cfg.out}/table3.md, table3.csv, results.json, chain.png; wall time {wall:.0f} s")
  return {"markdown": md, **payload}


def main(argv=None):
  """`attngeo lm adapt` on `argv` (the arguments after the command's name)."""
  ap = parser()
  return cmd_adapt(ap.parse_args(argv), ap)
