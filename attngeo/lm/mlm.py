"""Masked-language-model evaluation of encoders (BERT/ALBERT) on SMILES.

**Masking** (BERT's rule, stated exactly). For a row with real tokens `mask` and the vocab's special
ids `special` ([PAD] [UNK] [CLS] [SEP] [MASK] and the [unusedN] placeholders), the eligible positions
are `E = {j : mask_j ∧ ¬special[t_j]}`, `m = |E|`. Exactly `k = max(1, round(rate · m))` of them
(`rate` = 0.15; round half to even; `k = 0` when `m = 0`) are selected, uniformly without replacement
(the `k` largest of i.i.d. uniform scores). Each selected token is replaced, independently, by
`[MASK]` with probability 0.8, by a random token with probability 0.1 — uniform over the ordinary ids
(`¬special`; Hugging Face's collator draws from the whole vocab) — and kept with probability 0.1.
Row `i` of a data set draws from `fold_in(PRNGKey(seed), i)`, so the masks depend on the seed and the
SMILES list only (not on batch size or order).

**Scores** on the selected positions `S` (targets = the original tokens, logits in float32):

    loss = (1/|S|) Σ_{j∈S} −log softmax(z_j)[t_j]      (nats per masked token)
    accuracy = (1/|S|) Σ_{j∈S} [argmax z_j = t_j]

`mlm_sums` returns the sums (nll, correct, count) of one batch, so batches add exactly; `evaluate`
runs a model over a SMILES list in length-sorted batches (each padded to a multiple of 32 positions,
the last one completed with copies of its first row that count for nothing) and returns `MLMResult`.
A model without an MLM head (the fine-tuned rxnfp checkpoints) is scored through another model's head:
`head.head_logits(model(ids, mask))`.
"""
from __future__ import annotations

import math
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

RATE = 0.15
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1      # of the selected tokens; the remaining 0.1 are kept
PAD_TO = 32                              # batch lengths are rounded up to a multiple of this


class Masked(NamedTuple):
  inputs: jax.Array    # [b, n] int32: the corrupted ids the model reads
  targets: jax.Array   # [b, n] int32: the original ids
  selected: jax.Array  # [b, n] bool: the positions scored


class MLMSums(NamedTuple):
  nll: jax.Array       # Σ_S −log p(t_j)  (nats, float32)
  correct: jax.Array   # Σ_S [argmax = t_j]
  count: jax.Array     # |S|


class MLMResult(NamedTuple):
  loss: float          # nats per masked token
  accuracy: float      # top-1 accuracy on the masked tokens
  perplexity: float    # exp(loss)
  masked: int          # |S|, the tokens scored
  tokens: int          # eligible (non-special) tokens in the data
  sequences: int
  seconds: float


def _mask_row(key, ids, mask, special, mask_id, rate):
  eligible = mask & ~special[ids]
  m = jnp.sum(eligible)
  k = jnp.where(m > 0, jnp.maximum(1, jnp.round(rate * m)), 0)
  u = jax.random.uniform(key, (3,) + ids.shape)                # score, rule, random token
  rank = jnp.argsort(jnp.argsort(-jnp.where(eligible, u[0], -1.0)))   # 0 = the largest score
  selected = eligible & (rank < k)
  ordinary = jnp.argsort(special, stable=True)                 # the ordinary ids first, in id order
  random_ids = ordinary[jnp.floor(u[2] * jnp.sum(~special)).astype(jnp.int32)]
  inputs = jnp.where(selected & (u[1] < MASK_SHARE), mask_id,
                     jnp.where(selected & (u[1] < MASK_SHARE + RANDOM_SHARE), random_ids, ids))
  return Masked(inputs.astype(jnp.int32), ids.astype(jnp.int32), selected)


@jax.jit
def mask_tokens(key, ids, mask, special, mask_id, rate=RATE) -> Masked:
  """BERT masking of ids [b, n] (mask [b, n] bool, special [V] bool); row i uses fold_in(key, i)."""
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(ids.shape[0]))
  return jax.vmap(_mask_row, in_axes=(0, 0, 0, None, None, None))(keys, ids, mask, special, mask_id, rate)


@jax.jit
def mlm_sums(logits, targets, selected) -> MLMSums:
  """Σ cross-entropy, Σ correct and the count over the selected positions of logits [b, n, V]."""
  logits = logits.astype(jnp.float32)
  nll = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, targets[..., None], -1)[..., 0]
  correct = jnp.argmax(logits, -1) == targets
  return MLMSums(jnp.sum(jnp.where(selected, nll, 0.0)), jnp.sum(selected & correct), jnp.sum(selected))


@nnx.jit
def _batch_sums(model, head, inputs, mask, targets, selected):
  logits = model.mlm_logits(inputs, mask) if head is None else head.head_logits(model(inputs, mask))
  return mlm_sums(logits, targets, selected)


def _has_head(model) -> bool:
  return bool(getattr(getattr(model, "cfg", None), "mlm_head", False))


def evaluate(model, tokenizer, smiles, *, rate: float = RATE, seed: int = 0, batch_size: int = 64, head=None,
             progress: bool = True, desc: str = "mlm") -> MLMResult:
  """Masked-token loss and accuracy of `model` (an encoder: `mlm_logits(ids, mask)`) on `smiles`.

  tokenizer: a `SmilesTokenizer` of the model's vocab; head: a model whose `head_logits` scores
  `model`'s last hidden states (for a model without an MLM head), else None.
  """
  if not 0.0 < rate < 1.0:
    raise ValueError(f"rate must lie in (0, 1); got {rate!r}")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative int; got {seed!r}")
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f"batch_size must be an int >= 1; got {batch_size!r}")
  if head is None and not _has_head(model):
    raise ValueError("the model has no MLM head; pass head= a model with one (e.g. the pretrained checkpoint)")
  if head is not None and not _has_head(head):
    raise ValueError("head has no MLM head")
  vocab = getattr(getattr(model, "cfg", None), "vocab_size", tokenizer.vocab_size)
  if vocab != tokenizer.vocab_size:
    raise ValueError(f"the tokenizer's vocab has {tokenizer.vocab_size} tokens but the model's {vocab}")
  t0 = time.perf_counter()
  ids, mask = tokenizer.batch(smiles if isinstance(smiles, (str, list)) else list(smiles))
  special = tokenizer.special_ids
  masked = jax.device_get(mask_tokens(jax.random.PRNGKey(seed), jnp.asarray(ids), jnp.asarray(mask),
                                      jnp.asarray(special), tokenizer.mask_id, rate))
  if not masked.selected.any():
    raise ValueError("smiles hold no token to mask: every token is special or [UNK]")
  totals = np.zeros(3)
  for rows, real in _batches(mask.sum(1), batch_size, progress, desc):
    n = min(ids.shape[1], PAD_TO * math.ceil(int(mask[rows].sum(1).max()) / PAD_TO))
    take = lambda a: jnp.asarray(a[rows, :n])                  # noqa: E731
    out = _batch_sums(model, head, take(masked.inputs), take(mask), take(masked.targets),
                      jnp.asarray(masked.selected[rows, :n] & real[:, None]))
    totals += [float(out.nll), int(out.correct), int(out.count)]
  nll, correct, count = totals
  return MLMResult(loss=nll / count, accuracy=correct / count, perplexity=math.exp(nll / count), masked=int(count),
                   tokens=int((mask & ~special[ids]).sum()), sequences=len(ids), seconds=time.perf_counter() - t0)


def _batches(lengths, batch_size, progress, desc):
  """(rows, real) of length-sorted batches of exactly batch_size rows: the last is completed with copies of
  its first row, `real` False on those."""
  from tqdm.auto import tqdm
  order = np.argsort(lengths, kind="stable")
  for start in tqdm(range(0, len(order), batch_size), desc=desc, disable=not progress, leave=False,
                    dynamic_ncols=True):
    rows = order[start:start + batch_size]
    yield np.concatenate([rows, np.full(batch_size - len(rows), rows[0])]), np.arange(batch_size) < len(rows)
