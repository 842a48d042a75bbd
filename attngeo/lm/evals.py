"""All language-model evaluations in one call: bits per byte, induction, the DAC probe and CORE.

`evaluate(model, tokenizer, val_rows)` is the library entry point the commands (and sequential
adaptation) use; each metric is its own module (`bpb`, `induction`, `dac`, `core`) with its definition.
Induction is reported under both token sets of `attngeo.lm.induction`: `induction` — the seed's
protocol, uniform over the vocabulary — and, given the training corpus's ids, `induction_corpus`.
"""
from __future__ import annotations

import os

from attngeo.lm import bpb, core, dac, induction

VERSION = 1            # bump when an evaluation changes meaning: stored results keyed by it are recomputed


def evaluate(model, tokenizer, val_rows, *, seq_len: int | None = None, max_rows: int | None = None,
             batch_size: int = 16, with_induction: bool = True, with_dac: bool = True,
             core_bundle: str | None = None, max_per_task: int = -1, progress: bool = False,
             corpus_tokens=None) -> dict:
  """Evaluate a causal LM.

  Args:
    model: tokens [b, n] → logits [b, n, V] (an `attngeo.nn.GPT`; `seq_len` defaults to its context).
    tokenizer: an `attngeo.lm.tokenizer` tokenizer (its byte table and vocabulary size are used).
    val_rows: [m, T + 1] validation rows (an array or `PackedRows`); `max_rows` keeps the first ones.
    core_bundle: an eval bundle directory for CORE; None or a missing directory skips CORE with a note.
    corpus_tokens: the training corpus's ids (`Corpus.token_ids()`): adds the "corpus" induction mode.
  Returns:
    {"bpb", "val_loss", "val_tokens", "induction", "induction_per_length", "dac", "core", "core_note"}
    and, with `corpus_tokens`, "induction_corpus", "induction_corpus_per_length".
  """
  seq_len = seq_len or model.cfg.seq_len
  rows = val_rows.array(max_rows) if hasattr(val_rows, "array") else val_rows[:max_rows]
  b = bpb.bits_per_byte(model, rows, tokenizer.token_bytes(), batch_size)
  out = {"bpb": b["bpb"], "val_loss": b["loss"], "val_tokens": b["tokens"]}
  if with_induction:
    ind = induction.induction(model, tokenizer.vocab_size, seq_len)
    out.update(induction=ind["induction"], induction_per_length=ind["per_length"])
    if corpus_tokens is not None:
      ind = induction.induction(model, tokenizer.vocab_size, seq_len, pool=corpus_tokens)
      out.update(induction_corpus=ind["induction"], induction_corpus_per_length=ind["per_length"])
  if with_dac:
    out["dac"] = dac.dac_probe(model, tokenizer.vocab_size, seq_len)
  out["core"], out["core_note"] = None, None
  if core_bundle and os.path.isdir(core_bundle):
    out["core"] = core.evaluate_core(model, tokenizer, core_bundle, seq_len, max_per_task, progress)
  else:
    out["core_note"] = (f"CORE skipped: no eval bundle at {core_bundle!r} (place core.yaml, eval_data/, "
                        f"eval_meta_data.csv there)" if core_bundle else
                        "CORE skipped: no eval bundle given (--core-bundle DIR with core.yaml, eval_data/, eval_meta_data.csv)")
  return out
