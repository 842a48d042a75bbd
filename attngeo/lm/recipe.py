"""Training a GPT language model from text (`attngeo.lm.config.LMConfig`): the run folder, and loading it back.

The model is `GPTConfig.from_depth(depth, aspect, head_dim, width)` with the tokenizer's vocabulary,
the context `seq_len`, the operator and any `model` overrides; the trainer's config is `cfg.train` as an
`attngeo.train_config.TrainConfig` (`train_config`); with `embedding_lr`/`unembedding_lr` unset, nanochat's
rates (0.3, 0.008) are scaled by its width rule `(width / 768)^−½`. Importing this module imports no JAX
(the CLI validates with it first).

A run folder holds `lm.json` (this config), `tokenizer/` (`tokenizer.json`, `token_bytes.npy`),
`corpus.json` (the tokenised corpus's key and stats: a run resumes only on the same corpus),
`config.json` (written by the trainer; `attngeo.runs.train_config` rebuilds it), `metrics.jsonl`
and `ckpt/` (written by `attngeo.train.train`, which resumes a killed run from its last checkpoint).
`train` checks everything before it writes anything (a refused run leaves the folder as it was) and
holds the folder (`attngeo.runlock`) while it writes and trains. A share `copy_mix` of the training
rows are repeated random spans (`attngeo.data.copying.CopyMix`, seeded by `train.seed`); `eval_every`
logs validation bpb and induction (`eval_hook`). The loss is the mean next-token cross-entropy over every target
of the packed rows (BOS targets included, as nanochat trains), plus the geometry terms of `reg` when one is on
(`attngeo.regularisers.regularised`: metrics.jsonl and TensorBoard log each as `reg/<term>` and the plain loss
as `reg/base_loss`); a run resumes only under the `reg` it started with (lm.json).
"""
from __future__ import annotations

import dataclasses
import os
import typing

from attngeo import config as config_lib, files, runs
from attngeo.lm.config import LMConfig, parse_operator
from attngeo.train_config import TrainConfig, check_resumable


# GPTConfig/BlockConfig fields `lm train` sets from its own flags: a `--model` override of one had raised a
# TypeError ("multiple values") or silently won over the flag while lm.json recorded the flag.
OWN_FLAGS = {"depth": "--depth", "width": "--width", "head_dim": "--head-dim",
             "num_heads": "--width and --head-dim (heads = width / head_dim)", "seq_len": "--seq-len",
             "operator": "--operator", "learnable_operator": "--learnable-operator", "vocab_size": "the tokenizer"}


def _overrides(items) -> dict:
  import argparse

  from attngeo import nn
  hints = {**typing.get_type_hints(nn.BlockConfig), **typing.get_type_hints(nn.GPTConfig)}
  out = {}
  for item in items:
    name, sep, value = item.partition("=")
    if name in OWN_FLAGS:
      raise ValueError(f"model override {item!r}: {name} is set by {OWN_FLAGS[name]}, not --model")
    if not sep or name not in hints or name == "block":
      raise ValueError(f"model override {item!r} must be name=value with a GPTConfig/BlockConfig field "
                       f"({sorted(k for k in hints if k != 'block' and k not in OWN_FLAGS)})")
    try:
      out[name] = config_lib.value_parser(hints[name])(value)
    except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
      said = str(e.args[0]) if e.args else type(e).__name__
      raise ValueError(f"model override {item!r}: {said.strip().splitlines()[0] if said.strip() else said}") from None
  return out


def model_config(cfg: LMConfig, vocab_size: int):
  """The GPTConfig of `cfg` for a tokenizer of `vocab_size` ids."""
  from attngeo import nn
  fields = dict(vocab_size=vocab_size, seq_len=cfg.seq_len, operator=parse_operator(cfg.operator),
                learnable_operator=cfg.learnable_operator)
  if cfg.compat:                                 # a public layout (export takes it); --model may still change it
    from attngeo.interop import gpt2, nanochat
    fields.update({"nanochat": nanochat, "gpt2": gpt2}[cfg.compat].family_fields())
  fields.update(_overrides(cfg.model))
  return nn.GPTConfig.from_depth(cfg.depth, aspect=cfg.aspect, head_dim=cfg.head_dim, width=cfg.width, **fields)


def train_config(cfg: LMConfig, width: int, workdir: str | None) -> TrainConfig:
  """`cfg.train` as the trainer's config (validated), nanochat's width-scaled AdamW rates filled in,
  `workdir` set."""
  scale = (width / 768) ** -0.5
  fields = dataclasses.asdict(cfg.train)
  fields["embedding_lr"] = 0.3 * scale if fields["embedding_lr"] is None else fields["embedding_lr"]
  fields["unembedding_lr"] = 0.008 * scale if fields["unembedding_lr"] is None else fields["unembedding_lr"]
  fields["mesh"] = tuple(fields["mesh"])
  fields["workdir"] = workdir
  return TrainConfig(**fields)


def loss_fn(model, batch, rng):
  from attngeo.lm import bpb
  return bpb.token_losses(model, batch["tokens"]).mean(), {}


def check(cfg: LMConfig, prefix: str = ""):
  """Refuse `cfg` before any work (one-line ValueError naming the field: `LMConfig.validate`, which
  needs no JAX, then the model's shape rule and override names, which import `attngeo.nn`, and the
  trainer's config). Returns the model config for a byte tokenizer."""
  from attngeo.lm import tokenizer as tok_lib
  cfg.validate(prefix)
  mcfg = model_config(cfg, tok_lib.ByteTokenizer().vocab_size)
  train_config(cfg, mcfg.width, None)            # TrainConfig validates its fields at construction
  if cfg.reg.active:                             # a term the model cannot give (attention-free, too few heads)
    from flax import nnx

    from attngeo import nn, regularisers
    regularisers.check_build(cfg.reg, lambda: nn.GPT(mcfg, rngs=nnx.Rngs(0)), prefix + "reg.")
  return mcfg


def tokenizer_for(cfg: LMConfig, run_dir: str | None):
  """The run's saved tokenizer, else a new one (BPE trained on the train split); nothing is written
  (`train` saves a new one into the run once every check has passed)."""
  from attngeo.data import text
  from attngeo.lm import tokenizer as tok_lib
  tdir = run_dir and os.path.join(run_dir, "tokenizer")
  if tdir and os.path.exists(os.path.join(tdir, tok_lib.FILE)):
    tok = tok_lib.load(tdir)
    if tok.kind != cfg.tokenizer or (tok.kind == "bpe" and tok.vocab_size != cfg.vocab_size):
      raise ValueError(f"{tdir}: the run's tokenizer ({tok.kind}, {tok.vocab_size} ids) differs from the config "
                       f"({cfg.tokenizer}, vocab_size {cfg.vocab_size}); use another --out")
    return tok
  return tok_lib.create(cfg.tokenizer, text.split_documents(cfg.text_spec(), "train"), cfg.vocab_size)


def recorded_corpus(run_dir: str) -> str | None:
  """The corpus key a run folder recorded in corpus.json (None: none recorded)."""
  path = os.path.join(run_dir, "corpus.json")
  if not os.path.exists(path):
    return None
  return files.read_json(path)["key"]


def check_folder(out: str, tok, corpus, tcfg, mcfg, copy_mix: float = 0.0, reg=None) -> None:
  """Refuse (one-line ValueError) to write this run into `out` when `out` holds another run: another
  tokenizer, another corpus (corpus.json), another CopyMix share or `reg` (lm.json; a key absent: 0 and every
  term off, the runs before them), or another trainer/model config (`train_config.check_resumable`); or
  when it holds checkpoints without lm.json or corpus.json (deleted: nothing left to check against)."""
  from attngeo.regularisers_config import Regularisers
  from attngeo.lm import tokenizer as tok_lib
  from attngeo.nn import registry
  tdir = os.path.join(out, "tokenizer")
  if os.path.exists(os.path.join(tdir, tok_lib.FILE)) and tok_lib.load(tdir).to_dict() != tok.to_dict():
    raise ValueError(f"{tdir}: the run's tokenizer differs from this one (another process wrote it?); "
                     f"use another --out")
  from attngeo import runlock
  missing = [name for name in ("lm.json", "corpus.json") if not os.path.exists(os.path.join(out, name))]
  if missing and runlock.has_checkpoint(out):        # deleted: its settings and corpus could not be checked
    raise ValueError(f"{out} holds checkpoints but no {missing[0]}, which records what the run trained on; "
                     f"restore it, or use another --out")
  before = recorded_corpus(out)
  if before is not None and before != corpus.key:
    raise ValueError(f"{out}: its corpus changed since the run started (key {before} → {corpus.key}); "
                     f"resuming would read other rows — use another --out")
  recorded = os.path.join(out, "lm.json")
  if os.path.exists(recorded):
    recorded_json = files.read_json(recorded)
    share = recorded_json.get("copy_mix", 0.0)
    if share != copy_mix:
      raise ValueError(f"{out}: the run trained with copy_mix {share}, not {copy_mix}; resuming would read other "
                       f"rows — use another --out")
    reg = Regularisers() if reg is None else reg
    before_reg = config_lib.from_dict(Regularisers, recorded_json.get("reg") or {})
    if before_reg != reg:
      changed = [f for f in dataclasses.asdict(reg) if getattr(reg, f) != getattr(before_reg, f)]
      raise ValueError(f"{out}: the run trained with reg.{changed[0]} = {getattr(before_reg, changed[0])}, not "
                       f"{getattr(reg, changed[0])}; resuming would train another loss — use another --out")
  if os.path.exists(os.path.join(out, "config.json")):
    check_resumable(out, train=tcfg, model=registry.config_dict(mcfg))


def train(cfg: LMConfig, out: str, hooks=(), desc: str = "lm") -> dict:
  """Train (or resume) the run in `out`; returns {"run_dir", "history", "model", "tokenizer", "corpus", "step"}.

  Every check comes first and nothing is written before they all pass: the config (`check`), then,
  for a folder that holds a run, its tokenizer, corpus and configs (`check_folder`) — a refused
  resume leaves every file as it was. The folder is then held (`attngeo.runlock`: one process per
  run folder), checked again, and lm.json, tokenizer/ and corpus.json are written; if the run fails
  before its first checkpoint step (a full disk, Ctrl-C), every file it added is removed again.
  """
  from flax import nnx

  from attngeo import nn, regularisers, runlock, train as train_lib
  from attngeo.data import text
  from attngeo.lm import tokenizer as tok_lib
  from attngeo.nn import gpt
  check(cfg)
  for what, folder in (("--out", out), ("--data-dir", cfg.data_dir)):   # before the tokenizer and the corpus cache
    if files.blocking_file(folder):                                   # are built (a refused --out had built them)
      raise ValueError(f"{what} {folder}: {files.blocking_file(folder)} is a file, where lm train writes a folder; "
                       f"choose a folder's path")
  tok = tokenizer_for(cfg, out)
  corpus = text.open_corpus(cfg.text_spec(), tok, cfg.data_dir)
  mcfg = model_config(cfg, tok.vocab_size)
  tcfg = train_config(cfg, mcfg.width, out)
  for split in ("train", "val"):
    corpus.rows(split, cfg.seq_len)              # each split holds a row (a one-line ValueError if not)
  check_folder(out, tok, corpus, tcfg, mcfg, cfg.copy_mix, cfg.reg)
  with runlock.hold(out, started=runlock.has_checkpoint):
    check_folder(out, tok, corpus, tcfg, mcfg, cfg.copy_mix, cfg.reg)
    if not os.path.exists(os.path.join(out, "tokenizer", tok_lib.FILE)):
      tok.save(os.path.join(out, "tokenizer"))
    files.atomic_json(os.path.join(out, "corpus.json"), {"key": corpus.key, "stats": corpus.stats})
    files.atomic_json(os.path.join(out, "lm.json"), dataclasses.asdict(cfg))
    model = nn.GPT(mcfg, rngs=nnx.Rngs(tcfg.seed))
    data = text.loader(corpus, "train", cfg.seq_len, tcfg.batch_size, tcfg.seed, copy_mix=cfg.copy_mix)
    hooks = tuple(hooks) + ((eval_hook(cfg, corpus, tok, tcfg.steps),) if cfg.eval_every else ())
    tokens = tcfg.batch_size * cfg.seq_len
    result = train_lib.train(model, regularisers.regularised(cfg.reg, loss_fn), data, tcfg, flops_per_step=gpt.flops_per_token(mcfg) * tokens,
                             hooks=hooks, desc=desc, tokens_per_step=tokens)
  return {"run_dir": out, "history": result.history, "model": result.model, "tokenizer": tok, "corpus": corpus,
          "step": tcfg.steps}


def eval_hook(cfg: LMConfig, corpus, tok, steps: int):
  """The periodic eval (every `cfg.eval_every` steps and at the last): `val_bpb` on the first
  `eval_rows` validation rows and, at `induction_lengths`, `induction_corpus` (tokens of the training
  corpus) and `induction` (uniform over the vocabulary: the seed's protocol) — metrics.jsonl and
  TensorBoard log them as the training loss is."""
  from attngeo.lm import bpb, induction
  val = corpus.rows("val", cfg.seq_len).array(cfg.eval_rows)
  table = tok.token_bytes()
  pool = corpus.token_ids() if cfg.induction_lengths else None

  def hook(step, m):
    if step % cfg.eval_every and step != steps:
      return None
    out = {"val_bpb": bpb.bits_per_byte(m, val, table)["bpb"]}
    if cfg.induction_lengths:
      for name, tokens in (("induction_corpus", pool), ("induction", None)):
        out[name] = induction.induction(m, tok.vocab_size, cfg.seq_len, cfg.induction_lengths, pool=tokens)["induction"]
    return out
  return hook


def read_config(run_dir: str) -> LMConfig:
  path = os.path.join(run_dir, "lm.json")
  if not os.path.exists(path):
    saved = files.read_config(run_dir) if os.path.exists(os.path.join(run_dir, "config.json")) else {}
    if (saved.get("model") or {}).get("class") == "EncoderConfig":
      raise FileNotFoundError(f"{path}: missing — {run_dir} holds an encoder (BERT/ALBERT) model; lm eval and lm "
                              f"sample take GPT runs (attngeo mlm eval evaluates an encoder)")
    if saved.get("imported"):   # an imported (or exported and re-imported) GPT carries no corpus and no tokenizer
      raise FileNotFoundError(f"{path}: missing — {run_dir} is an imported checkpoint, without the corpus and "
                              f"tokenizer lm eval and lm sample read (attngeo lm train writes lm.json); probe it "
                              f"(attngeo probe), or adapt it with attngeo lm adapt --source, --data and --tokenizer")
    raise FileNotFoundError(f"{path}: missing — {run_dir} is not a language-model run folder (attngeo lm train writes it)")
  return config_lib.from_dict(LMConfig, files.read_json(path))


def load(run_dir: str, step: int | None = None, *, with_step: bool = False):
  """(model with the checkpoint's weights, tokenizer, LMConfig) of a run folder (latest intact step by
  default); with `with_step`, the step loaded is a fourth element."""
  from attngeo import files
  from attngeo.lm import tokenizer as tok_lib
  from attngeo.nn import registry
  cfg = read_config(run_dir)
  tok = tok_lib.load(os.path.join(run_dir, "tokenizer"))
  saved = files.read_config(run_dir)
  mcfg = registry.config_from_dict(saved["model"]) if saved.get("model") else model_config(cfg, tok.vocab_size)
  model, loaded = runs.load_model(registry.build(mcfg), run_dir, step, with_step=True)
  return (model, tok, cfg, loaded) if with_step else (model, tok, cfg)
