"""Masked-LM evaluation of encoder runs (BERT/ALBERT imports and their twins) on SMILES (`attngeo.lm.mlm`).

    attngeo mlm eval RUN [RUN ...] [--data moses|moses-train|reactions|FILE] [--n N] [--seed 0]
                     [--mask-seed 0] [--rate 0.15] [--batch 64] [--head RUN] [--twins] [--vocab PATH] [--out runs/mlm]

Each RUN is a run folder whose model is an encoder (`attngeo import bert|albert PATH --out RUN`, or a
random-init twin); its tokenizer is the `vocab.txt` in RUN (or --vocab). The data are MOSES molecules
(`moses`: the test split, `moses-train`), the 500 committed USPTO reactions (`reactions`) or a file of
SMILES (one per line, or a CSV with a SMILES/rxn column); --n draws a fixed subset (default 2000 of
MOSES, all of the rest). 15 % of the non-special tokens of every SMILES are masked (80/10/10, the
rule in `attngeo.lm.mlm`), the same masks for every run. A run without an MLM head (the fine-tuned
rxnfp checkpoints) is scored through the head of --head (e.g. the pretrained import). --twins adds
each run's random-init twin (same config, Hugging Face's init: N(0, 0.02²) weights, zero biases, unit
LayerNorm scales; `attngeo.nn.encoder`), the baseline a trained model must beat. Prints one row
per run (masked-token loss in nats, accuracy, perplexity) and writes mlm.md / mlm.csv / mlm.json to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from attngeo import cli, config, files, runs
from attngeo.data import molecules
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.lm.smiles import SmilesTokenizer
from attngeo.nn.config import model_name

MOSES_DEFAULT_N = 2000
# `attngeo.data.molecules.SOURCES`, named here so --data is checked before `attngeo.data` (grain, JAX) is imported;
# tests/test_cli.py checks that the two agree.
DATA_SOURCES = ("moses", "moses-train", "reactions")


def eval_parser() -> argparse.ArgumentParser:
  ev = config.parser("attngeo mlm eval", __doc__)
  ev.add_argument("runs", nargs="+", metavar="RUN", help="run folders of encoders (imports or twins)")
  ev.add_argument("--data", default="moses", help="moses (test split), moses-train, reactions, or a SMILES file "
                  "(default: moses)")
  ev.add_argument("--n", type=int, default=None, help=f"SMILES drawn (a fixed subset); default: {MOSES_DEFAULT_N} "
                  "of MOSES, all of the rest")
  ev.add_argument("--seed", type=int, default=0, help="seed of the subset (default: 0)")
  ev.add_argument("--mask-seed", type=int, default=0, help="seed of the masks (default: 0)")
  ev.add_argument("--rate", type=float, default=0.15, help="share of non-special tokens masked, in (0, 1) "
                  "(default: 0.15)")
  ev.add_argument("--batch", type=int, default=64, help="SMILES per forward pass (default: 64)")
  ev.add_argument("--head", default=None, help="a run whose MLM head scores runs that have none (default: none)")
  ev.add_argument("--twins", action="store_true", help="also score each run's random-init twin: the same config "
                  "under Hugging Face's init, seed --twin-seed (default: off)")
  ev.add_argument("--twin-seed", type=int, default=0, help="seed of the random-init twins (default: 0)")
  ev.add_argument("--vocab", default=None, help="vocab.txt of every run (default: each RUN's vocab.txt)")
  ev.add_argument("--out", default="runs/mlm", help="output folder (default: runs/mlm)")
  return ev


def _model_class(run: str) -> str:
  """config.json's model class of `run` (checked without JAX), or a ValueError naming the folder."""
  path = os.path.join(run, "config.json")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"RUN must be a run folder with a config.json; no {path}")
  with open(path, encoding="utf-8") as f:
    try:
      cls = (json.load(f).get("model") or {}).get("class")
    except (json.JSONDecodeError, AttributeError):
      raise ValueError(f"{path} is not a JSON object with a model config") from None
  return cls


def _check(ap, a):
  """Every argument error, in one line, before anything imports JAX (or grain)."""
  for name, value, low in (("--batch", a.batch, 1), ("--seed", a.seed, 0), ("--mask-seed", a.mask_seed, 0),
                           ("--twin-seed", a.twin_seed, 0)):
    if value < low:
      ap.error(f"{name} must be >= {low}; got {value}")
  if a.n is not None and a.n < 1:
    ap.error(f"--n must be >= 1; got {a.n}")
  if not 0.0 < a.rate < 1.0:
    ap.error(f"--rate must lie in (0, 1); got {a.rate}")
  if a.data not in DATA_SOURCES and not os.path.isfile(a.data):
    ap.error(f"--data must be one of {', '.join(DATA_SOURCES)} or an existing SMILES file; got {a.data!r}")
  if files.blocking_file(a.out):
    ap.error(f"--out {a.out}: {files.blocking_file(a.out)} is a file, where mlm eval writes a folder; choose a "
             f"folder's path")
  if a.vocab and not os.path.isfile(a.vocab):
    ap.error(f"--vocab must be an existing vocab.txt; no file {a.vocab}")
  for run in a.runs + ([a.head] if a.head else []):
    try:
      cls = _model_class(run)
    except (ValueError, FileNotFoundError) as e:
      ap.error(str(e))
    if cls != "EncoderConfig":
      ap.error(f"{run} holds {model_name(cls)}, not an encoder; mlm eval takes BERT/ALBERT runs")
    vocab = a.vocab or os.path.join(run, "vocab.txt")
    if run != a.head and not os.path.isfile(vocab):
      ap.error(f"no vocab file {vocab}; pass --vocab PATH (the checkpoint's vocab.txt)")


def cmd_eval(a, ap):
  _check(ap, a)
  from attngeo.lm import mlm
  n = a.n if a.n is not None else (MOSES_DEFAULT_N if a.data.startswith("moses") else None)
  smiles = molecules.load(a.data, n=n, seed=a.seed)
  toks = {run: SmilesTokenizer.from_vocab(a.vocab or os.path.join(run, "vocab.txt")) for run in a.runs}
  for tok in toks.values():
    tok.batch(smiles)                                          # a SMILES it cannot split: one line, before any model
  head = runs.load_run(a.head)[0] if a.head else None
  loaded = {run: runs.load_run(run) for run in a.runs}
  for run, (model, _, _) in loaded.items():
    if not model.cfg.mlm_head and head is None:
      ap.error(f"{run} has no MLM head; pass --head RUN (a run with one, e.g. the pretrained import)")
  rows = []
  for run, (model, _, mcfg) in loaded.items():
    models = [(run, model)]
    if a.twins:
      from attngeo.nn import registry
      models.append((f"{run} (random init, seed {a.twin_seed})", registry.build(mcfg, a.twin_seed)))
    for name, m in models:
      own = m.cfg.mlm_head
      res = mlm.evaluate(m, toks[run], smiles, rate=a.rate, seed=a.mask_seed, batch_size=a.batch,
                         head=None if own else head, desc=os.path.basename(os.path.normpath(run)))
      rows.append(dict(run=name, head="own" if own else a.head, **res._asdict()))
  cols = [Col("run"), Col("head"), Col("sequences"), Col("masked", "masked tokens"), Col("loss", "loss (nats)", ".4f"),
          Col("accuracy", "accuracy", ".4f"), Col("perplexity", "perplexity", ".3f"), Col("seconds", "s", ".1f")]
  note = (f"data {a.data} ({len(smiles)} SMILES{'' if n is None else f', subset seed {a.seed}'}); {a.rate:g} of the "
          f"non-special tokens masked (80/10/10), mask seed {a.mask_seed}; the same masks for every run.")
  report.write(a.out, "mlm", rows, cols, payload=dict(rows=rows, data=a.data, n=len(smiles), seed=a.seed,
                                                       mask_seed=a.mask_seed, rate=a.rate), note=note)
  report.wrote(a.out, "mlm.md", "mlm.csv", "mlm.json")


def eval_main(argv=None):
  """`attngeo mlm eval` on `argv` (the arguments after the command's name)."""
  ap = eval_parser()
  return cmd_eval(ap.parse_args(argv), ap)


def main(argv=None):
  """`attngeo mlm SUB …` from Python (see `attngeo.cli.call_group`)."""
  return cli.call_group("mlm", sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
  main()
