"""The seed's Table 2 protocol at this scale: conditions, config, run keys, and one (condition, seed) run.

* `CONDITIONS` — name → (operator, learnable): the four corners, `learnable` (per-head (β, α) trained
  from (0.5, 0.5)) and `CMAP` (the magnetic lift, opt-in).
* `Table2Config` — conditions × seeds on one `LMConfig` (depth 2, width 128, context 128, 600 steps of
  16 rows by default), validation rows, output folder. Importable without JAX.
* `run_key(lm)` — what a run computes (every `LMConfig` field but where the text lives and the
  progress bar, plus the text's content key): names the run folder `runs/<name>_s<seed>_<run_key>`.
* `LadderConfig`, `rung(cfg, depth)` — the same protocol at several depths (width held): each rung is a
  `Table2Config` whose runs live in the same `out` as Table 2's, so the depth Table 2 used is not trained
  twice (`run_key` names each run). Importable without JAX.
* `run_condition(cfg, name, seed)` — train (or resume) and evaluate one condition; its `result.json`
  is reused only under the same `result_key` (the run, the validation rows, the evaluation's version).
  Induction is reported under both token sets (`attngeo.lm.induction`): `induction` (the seed's,
  uniform over the vocabulary) and `induction_corpus` (the training corpus's ids).

`attngeo lm table2` (`attngeo.experiments.lm`) runs every condition × seed and tabulates them; `attngeo lm
ladder` every depth × condition × seed;
`attngeo lm adapt` (`attngeo.experiments.lm_adapt`) starts from the ATTN seed-0 run.
"""
from __future__ import annotations

import dataclasses
import os
import time

from attngeo import files
from attngeo.lm.config import LMConfig, LMTrain

CONDITIONS = {"ATTN": ("ATTN", False), "DMTN": ("DMTN", False), "DMAP": ("DMAP", False), "ATAP": ("ATAP", False),
              "learnable": ("0.5,0.5", True), "CMAP": ("CMAP", False)}
DEFAULT_CONDITIONS = ("ATTN", "DMTN", "DMAP", "ATAP", "learnable")    # CMAP (the magnetic lift) is opt-in


@dataclasses.dataclass
class Table2Config:
  conditions: tuple[str, ...] = DEFAULT_CONDITIONS
  seeds: tuple[int, ...] = (0, 1, 2)
  eval_rows: int = 512                 # validation rows for bpb (0: all)
  out: str = "runs/table2"
  lm: LMConfig = dataclasses.field(default_factory=lambda: LMConfig(
      depth=2, head_dim=64, width=128, seq_len=128,
      train=LMTrain(steps=600, batch_size=16, warmup=20, ckpt_every=200, log_every=10)))


@dataclasses.dataclass
class LadderConfig:
  """Table 2's protocol at each of `depths` (blocks; the width stays `lm.width`): conditions × seeds per rung."""
  depths: tuple[int, ...] = (2, 4, 6)
  conditions: tuple[str, ...] = ("ATTN", "DMTN")
  seeds: tuple[int, ...] = (0,)
  eval_rows: int = 512                 # validation rows for bpb (0: all)
  out: str = "runs/table2"             # Table 2's folder: its runs at the same depth are reused
  lm: LMConfig = dataclasses.field(default_factory=lambda: Table2Config().lm)


def rung(cfg: LadderConfig, depth: int) -> Table2Config:
  """The ladder's Table 2 at `depth` blocks: the same conditions, seeds, validation rows, folder and protocol."""
  return Table2Config(conditions=cfg.conditions, seeds=cfg.seeds, eval_rows=cfg.eval_rows, out=cfg.out,
                      lm=dataclasses.replace(cfg.lm, depth=depth))


def condition_config(lm: LMConfig, name: str, seed: int | None = None) -> LMConfig:
  """`lm` under condition `name`'s operator (and training seed `seed`, when given)."""
  op, learnable = CONDITIONS[name]
  train = lm.train if seed is None else dataclasses.replace(lm.train, seed=seed)
  return dataclasses.replace(lm, operator=op, learnable_operator=learnable, train=train)


# LMConfig fields added after runs were keyed, with the value every earlier run had: left out of the key
# at that value, so earlier runs keep their folders; any other value keys a new run.
ADDED_FIELDS = {"copy_mix": 0.0, "induction_lengths": (), "reg": dataclasses.asdict(LMConfig().reg), "compat": ""}


def run_key(lm: LMConfig) -> str:
  """What a run computes: every LMConfig field but where the text lives (`data`, `data_dir`) and the
  progress bar and folder (and `ADDED_FIELDS` at their earlier value), and the text's content (`text.content_key`):
  new text at the same path is another run, the same text moved is the same run. Names the run's folder."""
  from attngeo.data import copying, text
  same = dataclasses.asdict(dataclasses.replace(lm, data="", data_dir="",
                                                train=dataclasses.replace(lm.train, progress=True)))
  del same["train"]["workdir"]                  # where the run is written, set by the command
  for name, before in ADDED_FIELDS.items():
    if same[name] == before:
      del same[name]
  if lm.copy_mix:
    same["copy_mix_stream"] = copying.STREAM_VERSION
  return files.fingerprint(same, text.content_key(lm.text_spec()))


# What a Table 2 result holds beyond `evals.evaluate`'s version: 2 — induction under both token sets.
RESULT_VERSION = 2


def result_key(run: str, eval_rows: int) -> str:
  """What a result holds: the run (`run_key`), the validation rows and the evaluation's versions."""
  from attngeo.lm import evals
  return files.fingerprint(run, eval_rows, evals.VERSION, RESULT_VERSION)


def run_dir(out: str, name: str, seed: int, run: str) -> str:
  """The folder of (condition, seed) whose `run_key` is `run`: `out/runs/<name>_s<seed>_<run>`."""
  return os.path.join(out, "runs", f"{name}_s{seed}_{run}")


def run_condition(cfg: Table2Config, name: str, seed: int) -> dict:
  """Train and evaluate one (condition, seed) in `run_dir`; its result.json (`key`: the run key,
  `result_key`) is reused only under the same `result_key`. A run already trained is resumed (a finished
  one trains no step) and re-evaluated when only the evaluation changed; the evaluation holds the run
  folder (`attngeo.runlock`)."""
  import numpy as np

  from attngeo import runlock
  from attngeo.lm import evals, recipe
  lm = condition_config(cfg.lm, name, seed)
  run = run_key(lm)
  key = result_key(run, cfg.eval_rows)
  folder = run_dir(cfg.out, name, seed, run)
  result_path = os.path.join(folder, "result.json")
  cached = files.cached_result(result_path, key, field="result_key")
  if cached is not None:
    return cached
  t0 = time.perf_counter()
  trained = recipe.train(lm, folder, desc=f"{name} s{seed}")
  with runlock.hold(folder):
    val = trained["corpus"].rows("val", lm.seq_len)
    ev = evals.evaluate(trained["model"], trained["tokenizer"], val, max_rows=cfg.eval_rows or None,
                        corpus_tokens=trained["corpus"].token_ids())
    hist = trained["history"]
    row = dict(condition=name, seed=seed, key=run, result_key=key, corpus=trained["corpus"].key, bpb=ev["bpb"],
               val_loss=ev["val_loss"], induction=ev["induction"], induction_corpus=ev["induction_corpus"],
               dac_max_contrast=ev["dac"]["max_contrast"],
               final_train_loss=hist[-1]["loss"] if hist else None, seconds=time.perf_counter() - t0,
               curve=[(h["step"], h["loss"]) for h in hist], induction_per_length=ev["induction_per_length"],
               induction_corpus_per_length=ev["induction_corpus_per_length"], dac=ev["dac"],
               induction_curve=[(h["step"], h["induction_corpus"], h["induction"]) for h in hist
                                if "induction_corpus" in h])
    if lm.learnable_operator:
      from attngeo import nn
      row["learned_operator"] = [[np.asarray(c).tolist() for c in m.coefficients()]
                                 for m in nn.attention_modules(trained["model"])]
    files.atomic_json(result_path, row)
  return row
