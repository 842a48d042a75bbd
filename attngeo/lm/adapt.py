"""Sequential adaptation (the seed's Table 3): one pretrained GPT carried along a chain of operators.

Given a source GPT with weights θ and a chain of operators o₀ → o₁ → … → o_K (corners or (β, α)):

    state 0   θ₀ = θ run under o₀ (a graft if the source ran another operator); evaluated, not trained;
    state k   graft: θ_{k−1} run under o_k — the same weights, only (β, α) changes (`nn.graft`); evaluated;
              adapt: N steps of `attngeo.train.train` on the corpus from the grafted weights, with a
              fresh optimizer and the data order of seed s → θ_k; evaluated again.

A graft is a pure swap of (β, α) in the operator square's logit (`attngeo.operators`, per head,
m = (q + k)/√2, n = (q − k)/√2, s = 1/√d_h):

    L_ij = s·[½ m_i·m_j − β·½ n_i·n_j + α·½(q_i·k_j − k_i·q_j) + (1 − α)·½(g_i − g_j)],
    g_i = ½‖m_i‖² − β·½‖n_i‖²,

so ATTN → DMTN (β: 1 → 0) drops the negative-definite Gram block −½ n_i·n_j of attention's
symmetric logit and keeps its free antisymmetric part; DMTN → ATTN puts the block back. The seed's
default chain ATTN → DMTN → ATTN → DMTN gives the states A0, M1, A1, M2 (`state_labels`: A for ATTN,
M for DMTN, D for DMAP, P for ATAP, S for any other (β, α); the index counts the excursions away
from ATTN). Every state is evaluated right after its graft and after its adaptation with
`attngeo.lm.evaluate` (bits per byte on the validation rows, the induction score under both token
sets — `induction`, uniform over the vocabulary as in the seed, and `induction_corpus`, the corpus's
own tokens —, the DAC probe, and CORE when an eval bundle is given).

Seeds. A seed s changes only the adaptation data order (the loader's shuffle; the trainer's step
keys are unused by a language model's loss); every seed starts from the same θ₀.

Keys and reuse. Each model along the chain has a content key (`attngeo.files.fingerprint`):

    key(θ₀)      = fp(source weights and model config, o₀)
    key(graft k) = fp(key(θ_{k−1}), o_k)
    key(θ_k)     = fp(key(graft k), adaptation config, corpus key, s[, CopyMix share when > 0])

State k trains in its own workdir `states/<label>_<operator>_s<s>_<key(θ_k)>` (held by one process:
`attngeo.runlock`): a killed run resumes
there exactly (the trainer restores weights, optimizer and data position, and refuses another
config), a finished state (its `state.json` holds the key) is read back instead of retrained, and
any change upstream — the source's weights, an earlier operator, the adaptation config, the corpus,
the seed — leads to another folder. Evaluations are stored in `evals/` under fp(model key,
evaluation settings), so the seed-independent ones (state 0 and the first graft) run once and a
changed evaluation setting (or new content in the CORE bundle's files: `core.bundle_key`) re-evaluates
without retraining.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import time

import numpy as np

from attngeo import files, runs, train_config
from attngeo.lm.config import LMConfig, LMTrain
from attngeo.nn.config import model_name

LETTERS = {"ATTN": "A", "DMTN": "M", "DMAP": "D", "ATAP": "P"}
RUN_CONTROL = train_config.RUN_CONTROL_FIELDS      # how a run is watched (and where), not what it computes


@dataclasses.dataclass
class AdaptConfig:
  """The protocol: a chain of operators, the adaptation per state, the seeds, the evaluation."""
  chain: str = "ATTN,DMTN,ATTN,DMTN"   # state 0 (the source under it), then one graft + adaptation per entry
  source: str | None = None            # run folder (attngeo lm train, or attngeo import + --tokenizer)
  tokenizer: str | None = None         # tokenizer folder for a source that has none (imported checkpoints)
  data: str | None = None              # adaptation corpus (None: the source's own; required for imported sources)
  seeds: tuple[int, ...] = (0, 1, 2)   # adaptation data orders
  eval_rows: int = 512                 # validation rows for bpb (0: all)
  core_bundle: str | None = None       # DCLM eval bundle folder for CORE (None: skipped)
  core_max_per_task: int = -1          # CORE examples per task (-1: all)
  out: str = "runs/adapt"
  control: bool = True                 # also run the matched-budget control: the chain's first operator throughout
  lm: LMConfig = dataclasses.field(default_factory=LMConfig)   # corpus settings of an imported source
  adapt: LMTrain = dataclasses.field(default_factory=lambda: LMTrain(steps=200, batch_size=16, warmup=20,
                                                                    ckpt_every=100, log_every=10))


# ----------------------------------------------------------------------------- the chain

def parse_chain(chain) -> list:
  """'ATTN,DMTN,0.5:1,(0,1)' → ['ATTN', 'DMTN', (0.5, 1.0), 'DMTN'].

  States are separated by commas; each is a corner name (ATTN, DMTN, ATAP, DMAP, any case) or
  (β, α) written `β:α` or `(β,α)` with β, α ∈ [0, 1] (a pair that is a corner becomes its name). A
  chain needs at least two states (the source's operator, then a graft). Raises a one-line
  ValueError naming the offending state otherwise.
  """
  from attngeo import operator_names
  items = list(chain) if isinstance(chain, (list, tuple)) else re.split(r",(?![^()]*\))", str(chain))
  ops = []
  for pos, item in enumerate(items):
    text = str(tuple(item)) if isinstance(item, (tuple, list)) else str(item).strip()
    try:
      ops.append(operator_names.parse(item))
    except ValueError as e:
      raise ValueError(f"chain state {pos} {text!r}: {e}") from None
  if len(ops) < 2:
    raise ValueError(f"chain {chain!r} needs at least two states (the source's operator, then a graft); got {len(ops)}")
  return ops


def operator_name(op) -> str:
  """'DMTN' → 'DMTN'; (0.5, 1.0) → 'b0.5a1' (a folder-safe name)."""
  return op if isinstance(op, str) else f"b{op[0]:g}a{op[1]:g}"


def chain_text(ops) -> str:
  """Inverse of `parse_chain`: ['ATTN', (0.5, 1.0)] → 'ATTN,0.5:1'."""
  return ",".join(op if isinstance(op, str) else f"{op[0]:g}:{op[1]:g}" for op in ops)


def operator_label(op) -> str:
  """'DMTN' → 'DMTN'; (0.5, 1.0) → '(β, α) = (0.5, 1)'."""
  return op if isinstance(op, str) else f"(β, α) = ({op[0]:g}, {op[1]:g})"


def state_labels(ops) -> list[str]:
  """The seed's state names: ATTN, DMTN, ATTN, DMTN → A0, M1, A1, M2 (letter per operator; the index
  counts the states away from ATTN so far, that state included; a repeated name gets `.k`, k the state)."""
  labels, away = [], 0
  for k, op in enumerate(ops):
    if op != "ATTN":
      away += 1
    label = f"{LETTERS.get(op, 'S') if isinstance(op, str) else 'S'}{away}"
    labels.append(label if label not in labels else f"{label}.{k}")     # repeats (ATTN, ATTN, …): A0, A0.1, …
  return labels


def check_fields(cfg: AdaptConfig) -> None:
  """One-line ValueError naming the first field of `cfg` no protocol can use (seeds, the adaptation's
  trainer fields as `adapt.NAME`, the rows, the Table 2 source's `lm.NAME`). Imports no JAX."""
  if not cfg.seeds:
    raise ValueError("seeds must name at least one adaptation seed")
  if isinstance(cfg.adapt.steps, bool) or not isinstance(cfg.adapt.steps, int) or cfg.adapt.steps < 0:
    raise ValueError(f"adapt.steps must be >= 0 (an integer; 0: graft only); got {cfg.adapt.steps!r}")
  if cfg.adapt.steps:                        # the adaptation's trainer fields (rates, schedule, batch, ...)
    train_config.check(cfg.adapt, "adapt.")
  elif cfg.adapt.batch_size < 1:
    raise ValueError(f"adapt.batch_size must be positive; got {cfg.adapt.batch_size}")
  if cfg.eval_rows < 0:
    raise ValueError(f"eval_rows must be >= 0 (0: all); got {cfg.eval_rows}")
  if cfg.source is None:                     # the Table 2 source is trained with cfg.lm
    dataclasses.replace(cfg.lm, operator="ATTN", learnable_operator=False).validate("lm.")


def check_files(cfg: AdaptConfig) -> None:
  """One-line FileNotFoundError / ValueError for a source, tokenizer, bundle or corpus that is not there.
  Imports no JAX."""
  if cfg.source is not None:
    if not os.path.isdir(cfg.source):
      raise FileNotFoundError(f"source {cfg.source!r}: no such run folder")
    if not os.path.exists(os.path.join(cfg.source, "config.json")):
      raise FileNotFoundError(f"source {cfg.source!r} is not a run folder (no config.json; attngeo lm train and "
                              f"attngeo import write one)")
    # the model first: an ALBERT source was asked for --data, then --tokenizer, then a checkpoint it has not
    kind = (files.read_config(cfg.source).get("model") or {}).get("class")
    if kind != "GPTConfig":
      raise ValueError(f"source {cfg.source!r} holds {model_name(kind)}; lm adapt takes GPT runs (attngeo lm train, "
                       f"or attngeo import gpt2|nanochat)")
    lm_run = os.path.exists(os.path.join(cfg.source, "lm.json"))
    if not lm_run and cfg.data is None:
      raise ValueError(f"source {cfg.source!r} is an imported checkpoint without a corpus: give --data (the text to "
                       f"adapt on, e.g. FineWeb-edu parquet shards)")
    tok_dir = cfg.tokenizer or os.path.join(cfg.source, "tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
      raise FileNotFoundError(f"{tok_dir}/tokenizer.json: no tokenizer for the source (an imported checkpoint carries "
                              f"none: pass --tokenizer DIR, a folder written by attngeo.lm.tokenizer save())")
  if cfg.core_bundle is not None and not os.path.isdir(cfg.core_bundle):
    raise FileNotFoundError(f"core_bundle {cfg.core_bundle!r}: no such folder")
  if cfg.data is not None and "*" not in cfg.data and cfg.data not in ("shakespeare", "pydoc") \
      and not os.path.exists(cfg.data):
    raise FileNotFoundError(f"data {cfg.data!r}: no such file or directory")


def validate(cfg: AdaptConfig) -> list:
  """Check `cfg` before any work (one-line ValueError / FileNotFoundError); returns the parsed chain.

  First what needs no JAX (`check_fields`, `check_files`), then the chain, CORE's count and the models'
  configs (the Table 2 source's, the adaptation's trainer config)."""
  from attngeo.lm import core, recipe
  check_fields(cfg)
  check_files(cfg)
  ops = parse_chain(cfg.chain)
  core.check_max_per_task(cfg.core_max_per_task)
  lm = dataclasses.replace(cfg.lm, operator="ATTN", learnable_operator=False)
  if cfg.source is None:
    recipe.check(lm, "lm.")
  if cfg.adapt.steps:
    recipe.train_config(dataclasses.replace(lm, train=cfg.adapt), 768, None)
  return ops


# ----------------------------------------------------------------------------- source

@dataclasses.dataclass
class Source:
  model: object            # attngeo.nn.GPT with the source's weights
  tokenizer: object
  text: LMConfig           # the corpus settings (data, doc_sep, text_column, utf8_errors, val_every, data_dir)
  key: str                 # content key of the weights and model config
  path: str
  kind: str                # "lm" (attngeo lm train) | "imported" (attngeo import) | "run"


def weights_key(model) -> str:
  """Content key of a model: its config and every parameter array (by path), `files.fingerprint`."""
  import jax
  from flax import nnx

  from attngeo.nn import registry
  flat = sorted(((jax.tree_util.keystr(p), np.asarray(jax.device_get(x)))
                 for p, x in jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))), key=lambda t: t[0])
  return files.fingerprint(registry.config_dict(model), [p for p, _ in flat], *[x for _, x in flat])


def load_source(cfg: AdaptConfig) -> Source:
  """The source model, its tokenizer and corpus settings (the run's own lm.json for an `attngeo lm
  train` run, `cfg.lm`'s for an imported one; `cfg.data` overrides the corpus)."""
  from attngeo.lm import recipe, tokenizer as tok_lib
  from attngeo.nn import registry
  path = cfg.source
  if os.path.exists(os.path.join(path, "lm.json")):
    model, tok, text = recipe.load(path)
    kind = "lm"
    if cfg.tokenizer:
      tok = tok_lib.load(cfg.tokenizer)
  else:                                    # the model from config.json (an lm run's trainer config has more fields)
    saved = files.read_config(path)
    if not saved.get("model"):
      raise ValueError(f"{path}/config.json records no model config")
    model = runs.load_model(registry.build(registry.config_from_dict(saved["model"])), path)
    tok = tok_lib.load(cfg.tokenizer or os.path.join(path, "tokenizer"))
    text = cfg.lm
    kind = "imported" if saved.get("imported") else "run"
  if cfg.data is not None:
    text = dataclasses.replace(text, data=cfg.data)
  text = dataclasses.replace(text, seq_len=model.cfg.seq_len)
  if tok.vocab_size != model.cfg.vocab_size:
    raise ValueError(f"the tokenizer has {tok.vocab_size} ids but the source model's vocabulary is "
                     f"{model.cfg.vocab_size}: pass the model's own tokenizer (--tokenizer)")
  return Source(model, tok, text, weights_key(model), path, kind)


# ----------------------------------------------------------------------------- one state

def graft(model, op):
  """`nn.graft` plus the config record: the model runs `op`, and its `cfg` says so (run folders rebuild it)."""
  from attngeo import nn
  nn.graft(model, op)
  model.cfg = model.cfg.with_operator(op)
  return model


def train_key(cfg: AdaptConfig, seed: int) -> dict:
  """What an adaptation computes: `cfg.adapt` with the seed, without the fields that only watch the run."""
  fields = dataclasses.asdict(dataclasses.replace(cfg.adapt, seed=seed))
  return {k: v for k, v in fields.items() if k not in RUN_CONTROL}


def data_mix(text: LMConfig) -> tuple:
  """The adaptation data's mixture beyond the corpus, for the state key: `({"copy_mix": share, "stream":
  copying.STREAM_VERSION},)` when the source's rows mix in repeated spans (`LMConfig.copy_mix` > 0), else
  `()` — so the keys of states adapted on plain text, made before the share was honoured, are kept."""
  from attngeo.data import copying
  return ({"copy_mix": float(text.copy_mix), "stream": copying.STREAM_VERSION},) if text.copy_mix else ()


def adapt(model, text: LMConfig, corpus, train: LMTrain, seed: int, workdir: str, desc: str = "adapt") -> list[dict]:
  """Train `model` (in place) `train.steps` steps on `corpus`'s train rows — with the source's CopyMix share
  `text.copy_mix` of repeated-span rows, as it was trained — with data order `seed`,
  a fresh optimizer, in `workdir` (resumed from its checkpoint if it holds one). Returns the history."""
  from attngeo import train as train_lib
  from attngeo.data import text as text_lib
  from attngeo.lm import recipe
  from attngeo.nn import gpt
  lm = dataclasses.replace(text, train=dataclasses.replace(train, seed=seed))
  tcfg = recipe.train_config(lm, model.cfg.width, workdir)
  data = text_lib.loader(corpus, "train", model.cfg.seq_len, tcfg.batch_size, seed, copy_mix=text.copy_mix)
  tokens = tcfg.batch_size * model.cfg.seq_len
  result = train_lib.train(model, recipe.loss_fn, data, tcfg, flops_per_step=gpt.flops_per_token(model.cfg) * tokens,
                           desc=desc, tokens_per_step=tokens)
  return result.history


def _read_json(path: str):
  if not os.path.exists(path):
    return None
  return files.read_json(path)


class Evaluator:
  """`attngeo.lm.evaluate` on the validation rows, stored in `out/evals/` by fp(model key, settings)."""

  def __init__(self, cfg: AdaptConfig, tokenizer, corpus, seq_len: int, out: str):
    from attngeo.lm import core, evals
    self.cfg, self.tokenizer, self.out = cfg, tokenizer, out
    self.val_rows = corpus.rows("val", seq_len).array(cfg.eval_rows or None)
    self.corpus, self._pool = corpus, None  # the corpus's ids, for `induction_corpus`: read on the first new evaluation
    self.settings = files.fingerprint(evals.VERSION, corpus.key, seq_len, cfg.eval_rows, cfg.core_max_per_task,
                                     cfg.core_bundle and core.bundle_key(cfg.core_bundle), "induction_corpus")
    self.computed = 0

  def __call__(self, model, key: str) -> dict:
    from attngeo.lm import evals
    path = os.path.join(self.out, "evals", f"{files.fingerprint(key, self.settings)}.json")
    stored = _read_json(path)
    if stored is not None:
      return stored
    t0 = time.perf_counter()
    if self._pool is None:
      self._pool = self.corpus.token_ids()
    ev = evals.evaluate(model, self.tokenizer, self.val_rows, core_bundle=self.cfg.core_bundle,
                        max_per_task=self.cfg.core_max_per_task, corpus_tokens=self._pool)
    ev["seconds"] = time.perf_counter() - t0
    self.computed += 1
    files.atomic_json(path, ev)
    return ev


def metrics(ev: dict) -> dict:
  """The headline numbers of one evaluation."""
  core = ev.get("core")
  return {"bpb": ev["bpb"], "val_loss": ev["val_loss"], "induction": ev.get("induction"),
          "induction_corpus": ev.get("induction_corpus"),
          "dac_max_contrast": (ev.get("dac") or {}).get("max_contrast"),
          "dac_mean_contrast": (ev.get("dac") or {}).get("mean_contrast"),
          "core": core["core"] if core else None}


# ----------------------------------------------------------------------------- the protocol

def run(cfg: AdaptConfig, source: Source, log=print) -> dict:
  """Run (or read back) every state of every seed. Returns {"states": [...], "records": [...], ...}.

  Each record is one (seed, state): {"seed", "state", "label", "operator", "steps", "graft": metrics,
  "adapted": metrics, "curve": [(step, loss)], "train_seconds", "reused", "workdir", "key"}.
  """
  from flax import nnx

  from attngeo import runlock
  from attngeo.data import text as text_lib
  ops = validate(cfg)
  labels = state_labels(ops)
  corpus = text_lib.open_corpus(source.text.text_spec(), source.tokenizer, source.text.data_dir)
  evaluate = Evaluator(cfg, source.tokenizer, corpus, source.model.cfg.seq_len, cfg.out)

  base = graft(nnx.clone(source.model), ops[0])
  key0 = files.fingerprint(source.key, ops[0])
  ev0 = metrics(evaluate(base, key0))
  log(f"{labels[0]} ({operator_label(ops[0])}, the source): bpb {ev0['bpb']:.4f}, induction {ev0['induction']:.4f} (corpus tokens "
      f"{ev0['induction_corpus']:.4f})")
  records, trained = [], 0
  for seed in cfg.seeds:
    records.append(dict(seed=seed, state=0, label=labels[0], operator=ops[0], steps=0, graft=ev0, adapted=ev0,
                        curve=[], train_seconds=0.0, reused=True, workdir=None, key=key0, graft_key=key0))
    model, prev = nnx.clone(base), key0
    for k in range(1, len(ops)):
      graft(model, ops[k])
      gkey = files.fingerprint(prev, ops[k])
      skey = files.fingerprint(gkey, train_key(cfg, seed), corpus.key, *data_mix(source.text))
      workdir = os.path.join(cfg.out, "states", f"{labels[k]}_{operator_name(ops[k])}_s{seed}_{skey}")
      same = ops[k] == ops[k - 1]           # a graft onto the same operator changes nothing
      ev_graft = records[-1]["adapted"] if same else metrics(evaluate(model, gkey))
      done = _read_json(os.path.join(workdir, "state.json"))
      t0 = time.perf_counter()
      if cfg.adapt.steps == 0:
        history, reused = [], True
      elif done is not None and done.get("key") == skey:
        runs.load_model(model, workdir)
        history, reused = done["history"], True
      else:
        with runlock.hold(workdir):          # one process per state folder, its state.json included
          history = adapt(model, source.text, corpus, cfg.adapt, seed, workdir,
                          desc=f"s{seed} {labels[k]} {operator_name(ops[k])}")
          files.atomic_json(os.path.join(workdir, "state.json"),
                           {"key": skey, "graft_key": gkey, "operator": ops[k], "label": labels[k], "seed": seed,
                            "chain": ops[:k + 1], "source": source.path, "source_key": source.key,
                            "train": train_key(cfg, seed), "corpus": corpus.key, "history": history})
        reused = False
        trained += 1
      seconds = time.perf_counter() - t0
      ev = metrics(evaluate(model, skey))
      log(f"seed {seed} {labels[k]} ({operator_label(ops[k])}): graft bpb {ev_graft['bpb']:.4f} → adapted "
          f"{ev['bpb']:.4f}; induction {ev_graft['induction']:.4f} → {ev['induction']:.4f} (corpus tokens "
          f"{ev_graft['induction_corpus']:.4f} → {ev['induction_corpus']:.4f})"
          f"{' (reused)' if reused else f' ({seconds:.0f} s)'}")
      records.append(dict(seed=seed, state=k, label=labels[k], operator=ops[k], steps=cfg.adapt.steps, graft=ev_graft,
                          adapted=ev, curve=[(h["step"], h["loss"]) for h in history], train_seconds=seconds,
                          reused=reused, workdir=workdir, key=skey, graft_key=records[-1]["key"] if same else gkey))
      prev = skey
  return {"chain": ops, "labels": labels, "records": records, "trained": trained, "evaluated": evaluate.computed,
          "corpus": corpus.key, "source": {"path": source.path, "kind": source.kind, "key": source.key}}


def _mean_sd(values) -> tuple[float | None, float | None]:
  vals = np.asarray([v for v in values if v is not None], np.float64)
  if not len(vals):
    return None, None
  return float(vals.mean()), (float(vals.std(ddof=1)) if len(vals) > 1 else float("nan"))


METRICS = ("bpb", "induction", "induction_corpus", "dac_max_contrast", "core")


def summarise(result: dict) -> list[dict]:
  """Per state and phase (graft, adapted): mean and sd (ddof 1) over seeds of every metric.

  State 0 has one row (`phase` "source"); the others two ("graft", "adapted"). A row whose model is
  the same for every seed (state 0, the first graft) has sd None: one model, not a spread."""
  rows = []
  for k, (label, op) in enumerate(zip(result["labels"], result["chain"])):
    recs = [r for r in result["records"] if r["state"] == k]
    for phase in (("source",) if k == 0 else ("graft", "adapted")):
      field, key = ("graft", "graft_key") if phase == "graft" else ("adapted", "key")
      row = dict(state=k, label=label, operator=operator_label(op), phase=phase, seeds=len(recs),
                 steps=0 if phase != "adapted" else recs[0]["steps"], shared=len({r[key] for r in recs}) == 1)
      for m in METRICS:
        row[f"{m}_mean"], row[f"{m}_sd"] = _mean_sd(r[field][m] for r in recs)
        row[f"{m}_sd"] = None if row["shared"] else row[f"{m}_sd"]
        row[f"{m}_per_seed"] = [r[field][m] for r in recs]
      rows.append(row)
  return rows


def control_chain(ops) -> list:
  """The matched-budget control of a chain: its first operator in every state (the same grafts-free
  schedule of fresh optimizers and adaptation steps)."""
  return [ops[0]] * len(ops)


def pm(mean, sd, digits: int = 4) -> str:
  """'0.7650 ± 0.0012' (sd NaN or None: the mean alone; mean None: '—')."""
  if mean is None:
    return "—"
  if sd is None or (isinstance(sd, float) and math.isnan(sd)):
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {sd:.{digits}f}"
