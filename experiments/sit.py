"""SiT on real images, and the ATTN → DMTN → DMAP transfer (seed "Attention Geometry", Figures 3–5).

    attngeo sit train    [--data mnist] [--train.steps N] [--operator ATTN] [--out runs/sit_train] ...
    attngeo sit sample   RUN [--sampler heun] [--sample-steps 16] [--guidance 1.5] [--out DIR]
    attngeo sit sample   RUN --bench euler:32,heun:16,dopri5:16 [--eval-samples N]
    attngeo sit transfer [--full] [--seeds 0,1] [--init RUN_OR_CHECKPOINT] [--dry-run] ...
    attngeo sit import   CHECKPOINT --out RUN [--num-heads H] [--num-classes K] [--overwrite]

Each sub-command's options: `attngeo sit SUBCOMMAND --help`; its errors are one line naming it.

A class-conditional SiT (`attngeo.nn.DiT`, SiT's layout) learns the velocity of the linear
interpolant (`attngeo.flow`) with label dropout for classifier-free guidance and an EMA of the
weights; samples are drawn from the EMA weights with a chosen sampler and guidance scale.

The transfer, per seed (the seed paper starts from the released SiT-XL/2; here `--init` does that):
  1. ATTN        — the trained (or imported) model                                      (Figure 3)
  2. DMTN graft  — the same weights under DMTN, β: 1 → 0 (`nn.graft`), sampled at once   (Figure 4 left)
  3. DMTN adapted — after `adapt_steps` (N) steps of training under DMTN                 (Figure 4 right)
  4. DMAP fold   — the adapted DMTN weights folded into the distance form: W₊ = (W_Q + W_K)/√2 alone
                   (`nn.fold_distance`; the same outputs as grafting DMAP, checked and reported)  (Figure 5 left)
  5. DMAP adapted — after `fold_steps` (M) more steps                                      (Figure 5 right)
Every stage reports the metric of `attngeo.image_metrics` (a classifier trained here on the same
images, kept in `out/classifier/`: Fréchet distance on its penultimate features — NOT Inception-FID —,
precision/recall there, and the share of samples classified as their conditioning label), the
held-out flow-matching loss, the memorisation ratio (`image_metrics.memorisation`: the samples' mean
pixel distance to their nearest training image over that of held-out real images; ≈ 1 or above without
copying), and the probe's per-layer geometry (`attngeo.probe.model_report`) on
held-out images at t = 1. Each stage starts from the previous stage's EMA weights with a fresh
optimizer; the same noise and labels are sampled at every stage, so the grids are comparable slot
by slot; every grid's rows are labelled with their class. Outputs in `--out`: transfer.{md,csv,json} (metric per stage and seed, the seed mean, and
the held-out real / noise reference rows), geometry.{md,csv,json} (per layer per stage),
figures_seed<S>.png (the five stages side by side), seed<S>/<stage>/samples.png (one per stage) and
neighbours.png (its samples beside their nearest training images), weights.npz and stage.json per stage
(a rerun skips finished stages). The ATTN stage's EMA decay is `--train.ema`, the adaptation stages'
`--adapt-ema` (the average starts at the grafted weights: 0.995^1000 keeps < 1 % of them).
`sit sample --bench` times samplers (samples/s) and scores them with the run's own metric.

`--full` is the seed's SiT-XL/2 protocol as a configuration (ImageNet-256 in the latent space of the
Stable Diffusion VAE, 40k + 80k steps); it needs the pretrained checkpoint and precomputed latents
and runs on an accelerator slice; `--dry-run` prints the plan, its cost (training FLOPs from
`nn.dit.flops_per_image`, chip-hours at an assumed MFU) and the launch line without running.

`sit train --reg.<term> λ` (curvature, reversibility, skew, mixing, isometry; `attngeo.regularisers`)
adds a geometry term to the loss, logged as `reg/<term>` (metrics.jsonl, TensorBoard); all off by default.
"""
# The command line. Settings and checks: `sit_config`; the work: `sit_run`, imported once the settings are
# checked (this module imports no JAX: `--help` and argument errors answer at once).
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys

from attngeo import cli, config as config_lib, errors, files, runlock, sampler_names
from attngeo.nn import config as nn_config
from attngeo.experiments.sit_config import (FULL, FULL_NOTES, HELP, LAUNCH, MOVED, PLAN_CHIPS, TRAIN_BASE,
                                            TRAIN_ONLY, TRANSFER_ONLY, SiTConfig, check_fields, check_out_free, check_run_folder)

def _parser(name: str) -> argparse.ArgumentParser:
  return config_lib.parser(f"attngeo sit {name}", cli.COMMANDS[f"sit {name}"][1] + ".")


def train_parser() -> argparse.ArgumentParser:
  tr = _parser("train")
  config_lib.add_arguments(tr, SiTConfig, help=HELP, base=TRAIN_BASE, skip=TRANSFER_ONLY)
  return tr


def sample_parser() -> argparse.ArgumentParser:
  sa = _parser("sample")
  sa.add_argument("run", help="run folder written by sit train / transfer stage / import")
  sa.add_argument("--out", default=None, help="output folder (default: the run folder)")
  sa.add_argument("--per-class", type=config_lib.positive_int, default=8, help="samples per class row (default: 8)")
  sa.add_argument("--bench", type=parse_bench, default=None, metavar="SAMPLER:STEPS,...",
                  help="time each sampler at its step count instead of drawing a grid (e.g. euler:32,heun:16,"
                       "dopri5:16; dopri5's steps only place output points): samples/s after a warm-up call, and the "
                       "run's own classifier metric where it has one, at the run's guidance and seed unless given; "
                       "--sampler, --sample-steps and --per-class are not used; writes sample_bench.{md,csv,json} to "
                       "--out (default: off)")
  sa.add_argument("--eval-samples", type=at_least_4, default=None,
                  help="samples per --bench setting, >= 4 (default: the run's own evaluation count)")
  for name in ("sampler", "sample_steps", "guidance", "seeds"):
    f = SiTConfig.__dataclass_fields__[name]
    sa.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                    type=config_lib.value_parser(tuple[int, ...]) if name == "seeds" else type(f.default),
                    help=f"{HELP.get(name, name)} (default: {f.default})")
  return sa


def at_least_4(text: str) -> int:
  """argparse type: an integer ≥ 4 (precision/recall of the metric need more than k = 3 samples)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 4:
    raise argparse.ArgumentTypeError(f"expected an integer >= 4 (the metric's precision/recall need more than 3 "
                                     f"samples); got {text!r}")
  return value


def parse_bench(text: str) -> tuple[tuple[str, int], ...]:
  """'euler:32,heun:16' -> (("euler", 32), ("heun", 16)); argparse's one-line error otherwise."""
  out = []
  for item in text.split(","):
    name, _, steps = item.strip().partition(":")
    if name not in sampler_names.SAMPLERS or not steps.isdigit() or int(steps) < 1:
      names = ", ".join(sampler_names.SAMPLERS)
      raise argparse.ArgumentTypeError(f"expected SAMPLER:STEPS items, SAMPLER one of {names} and STEPS a positive "
                                       f"integer; got {item.strip()!r}")
    out.append((name, int(steps)))
  return tuple(out)


def transfer_parser() -> argparse.ArgumentParser:
  tf = _parser("transfer")
  tf.add_argument("--full", action="store_true", help="the seed's SiT-XL/2 protocol (print it with --dry-run); default off")
  tf.add_argument("--dry-run", action="store_true", help="print the configuration (with --full: its cost) and the "
                                                         "launch line; run nothing; default off")
  tf.add_argument("--mfu", type=mfu_fraction, default=0.4,
                  help="model FLOPs utilisation assumed by --full --dry-run's cost, in (0, 1] (default: 0.4)")
  config_lib.add_arguments(tf, SiTConfig, help=HELP, skip=TRAIN_ONLY)
  return tf


def mfu_fraction(text: str) -> float:
  """argparse type: a model FLOPs utilisation in (0, 1]."""
  value = config_lib.positive_float(text)
  if value > 1:
    raise argparse.ArgumentTypeError(f"expected a fraction in (0, 1] of the chips' peak; got {text!r}")
  return value


def import_parser() -> argparse.ArgumentParser:
  im = _parser("import")
  im.add_argument("checkpoint", help=".safetensors (or .pt with torch installed) in the SiT/DiT key layout")
  im.add_argument("--out", required=True, help="run folder to write (required; config.json + weights.npz; must be "
                                               "new or empty unless --overwrite)")
  im.add_argument("--num-heads", type=config_lib.positive_int, default=None,
                  help="heads per layer, a divisor of the width (default: from the width's preset)")
  im.add_argument("--num-classes", type=config_lib.positive_int, default=None,
                  help="real classes (default: table rows - 1)")
  im.add_argument("--overwrite", action="store_true", help="replace the run in an --out that holds files; default off")
  return im


def print_plan(plan: dict) -> None:
  print(f"cost: SiT-{plan['preset']} on {plan['tokens']} tokens, {plan['flops_per_image'] / 1e9:.0f} GFLOPs per training "
        f"image (6·N + 12·L·T²·d); {plan['images']:,} images = {plan['total_flops']:.2e} FLOPs")
  for chip, hours in plan["chip_hours"].items():
    print(f"  {chip}: {hours:,.0f} chip-hours at {100 * plan['mfu_assumed']:.0f}% MFU "
          f"({plan['wall_hours'][chip]:.1f} h on {PLAN_CHIPS[chip]} chips; sampling and evaluation not counted)")


def import_main(argv=None):
  """`attngeo sit import` on `argv` (the arguments after the command's name)."""
  sp = import_parser()
  args = sp.parse_args(argv)
  try:
    check_out_free(args.out, args.overwrite)
    return _work().import_run(args.checkpoint, args.out, args.num_heads, args.num_classes)
  except (ValueError, FileNotFoundError, ImportError) as e:
    sp.error(str(e))


def sample_main(argv=None):
  """`attngeo sit sample` on `argv`."""
  sp = sample_parser()
  args = sp.parse_args(argv)
  cfg = config_lib.from_arguments(args, SiTConfig, SiTConfig())
  try:
    check_fields(cfg)
    kind = (files.read_config(args.run).get("model") or {}).get("class")   # not a run folder: one line before JAX
    if kind not in ("DiTConfig", None):                                     # (None: load_run says what is missing)
      raise ValueError(f"{args.run} holds {nn_config.model_name(kind)}; sit sample takes SiT runs "
                       f"(sit train, sit transfer, or an imported DiT checkpoint)")
    work = _work()
    model, names = work.load_for_sampling(args.run, cfg)
  except (ValueError, FileNotFoundError) as e:
    sp.error(str(e))
  if args.bench:
    return work.bench_samplers(model, args.run, args, args.out or args.run)
  return work.sample_run(model, cfg, args.out or args.run, args.per_class, names)


def train_main(argv=None):
  """`attngeo sit train` on `argv`."""
  return _train_or_transfer("train", train_parser(), list(argv or []))


def transfer_main(argv=None):
  """`attngeo sit transfer` on `argv`."""
  return _train_or_transfer("transfer", transfer_parser(), list(argv or []))


def _train_or_transfer(command: str, sp: argparse.ArgumentParser, argv: list[str]):
  for arg in argv:                    # a flag of the flat layout (before `model` and `train` were nested)
    name = arg.split("=")[0][2:].replace("-", "_") if arg.startswith("--") else ""
    if name in MOVED:
      sp.error(f"{arg.split('=')[0]} is now --{MOVED[name]}.{name.replace('_', '-')} (the model's and the "
               f"optimisation's settings are nested)")
  args = sp.parse_args(argv)
  base = TRAIN_BASE if command == "train" else config_lib.replaced(SiTConfig(), FULL) if args.full else SiTConfig()
  try:
    cfg = config_lib.from_arguments(args, SiTConfig, base)    # a bad --reg.* value is its one-line ValueError
    if getattr(cfg, "init", None) and getattr(args, "train.steps", None) is None:
      cfg = config_lib.replaced(cfg, {"train.steps": 0})      # --init: the checkpoint is the ATTN stage
    check_fields(cfg)
    if command == "train" and cfg.train.steps < 1:
      raise ValueError(f"train.steps must be >= 1 for sit train (0 steps is the random initialisation); "
                       f"got {cfg.train.steps}")
    if command == "transfer" and args.dry_run:
      print(json.dumps(dataclasses.asdict(cfg), indent=1))
      if args.full:
        print(FULL_NOTES)
        if cfg != config_lib.replaced(SiTConfig(), FULL):
          print("  (settings given on the command line override these notes: the JSON above is what would run)")
        print_plan(_work().full_plan(cfg, args.mfu))
        print("launch: " + LAUNCH)
      else:
        print("local: attngeo sit transfer " + " ".join(shlex.quote(a) for a in argv if a != "--dry-run"))
      return cfg
    check_run_folder(cfg, command)
    work = _work()
    work.check_data(cfg)
  except (ValueError, errors.InputTypeError, FileNotFoundError, ImportError) as e:
    sp.error(str(e))
  with runlock.hold(cfg.out):        # one process per --out: data, training, samples and probe alike
    return work.transfer(cfg) if command == "transfer" else work.train_one(cfg)


def _work():
  """`sit_run`, the module that does the work, imported once a command's settings are checked (it imports JAX)."""
  from attngeo.experiments import sit_run
  return sit_run


def main(argv=None):
  """`attngeo sit SUB …` from Python (see `attngeo.cli.call_group`)."""
  return cli.call_group("sit", sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
  main()
