"""Induction score (the seed author's protocol): can the model copy a random sequence it has seen once?

For half-length L, draw s = (s_0 … s_{L−1}) i.i.d. uniformly from a token set and feed
x = [s; s][:−1] (length 2L − 1, no BOS). Two token sets (`tokens`):

* `"uniform"` — the whole vocabulary [0, V), as the seed author's code does (special ids included);
* `"corpus"` — the ids that occur in the training corpus (`attngeo.data.text.Corpus.token_ids`):
  s_t = pool[u_t], u_t uniform over [0, |pool|). A byte model never sees most bytes, so under
  "uniform" it is asked to copy tokens it has no embedding for; "corpus" asks only for tokens it
  trained on.

Position i predicts x_{i+1}:

* `induction_loss`, `induction_acc` — mean cross-entropy and argmax accuracy over i ∈ [L, 2L − 2]
  (targets s_1 … s_{L−1} of the second copy, each predictable by finding the previous occurrence of
  s_{i−L} at position i − L and copying the token after it, at j = i − L + 1);
* `random_half_loss` — mean cross-entropy over i ∈ [0, L − 2] (targets inside the first copy, which
  nothing predicts: about ln V for a calibrated model).

L ∈ {32, 64, 128, 256, 512} with 2L − 1 ≤ the model's context; per L, 4 batches × 16 sequences from
a fresh `np.random.default_rng(1234)` (the same seed for every L; the author's code uses torch's
generator, so the draws differ while the protocol is the same). Means run over every scored position
of the 64 sequences. The headline `induction` is the mean of `induction_acc` over the lengths evaluated.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from attngeo.lm import bpb
from attngeo.lm.config import INDUCTION_LENGTHS as LENGTHS   # defined with the config (its check needs no JAX)


def lengths_for(seq_len: int, lengths=LENGTHS) -> tuple[int, ...]:
  """The half-lengths L whose input (2L − 1 tokens) fits a context of `seq_len`."""
  return tuple(L for L in lengths if 2 * L - 1 <= seq_len)


def sequences(L: int, vocab_size: int, batches: int = 4, per_batch: int = 16, seed: int = 1234,
              pool=None) -> np.ndarray:
  """[batches·per_batch, 2L] int32: rows [s; s] with s uniform over ids [0, vocab_size), or over the
  ids in `pool` (the "corpus" mode) when given."""
  n = vocab_size if pool is None else len(pool)
  s = np.random.default_rng(seed).integers(0, n, (batches * per_batch, L))
  s = s if pool is None else np.asarray(pool)[s]
  return np.concatenate([s, s], 1).astype(np.int32)


def _positions(L: int):
  return slice(L, 2 * L - 1), slice(0, L - 1)


def _batch_stats(model, tokens):
  """tokens [b, 2L] = [s; s] → the three means over their positions."""
  logits = model(tokens[:, :-1])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:])
  hit = (jnp.argmax(logits, -1) == tokens[:, 1:]).astype(jnp.float32)
  ind, rnd = _positions(tokens.shape[1] // 2)
  return {"induction_loss": loss[:, ind].mean(), "induction_acc": hit[:, ind].mean(),
          "random_half_loss": loss[:, rnd].mean()}


_batch_jit = bpb.jitted(_batch_stats)


def induction(model, vocab_size: int, seq_len: int, lengths=LENGTHS, batches: int = 4, per_batch: int = 16,
              seed: int = 1234, pool=None) -> dict:
  """{"induction": mean acc, "per_length": {L: {induction_loss, induction_acc, random_half_loss}}}.

  Args:
    model: a causal LM, tokens [b, n] → logits [b, n, V].
    vocab_size: tokens are drawn from [0, vocab_size) (the model's vocabulary: the "uniform" mode).
    seq_len: the model's context; lengths with 2L − 1 > seq_len are skipped.
    pool: the ids to draw from instead (the "corpus" mode: `Corpus.token_ids()`); None: uniform.
  """
  use = lengths_for(seq_len, lengths)
  if not use:
    raise ValueError(f"no induction length {tuple(lengths)} fits a context of {seq_len} tokens (needs 2L − 1 ≤ {seq_len})")
  if pool is not None and not len(pool):
    raise ValueError("the induction token pool is empty (a corpus with no tokens?)")
  per = {}
  for L in use:
    rows = sequences(L, vocab_size, batches, per_batch, seed, pool)
    stats = [jax.device_get(_batch_jit(model, jnp.asarray(rows[b * per_batch:(b + 1) * per_batch])))
             for b in range(batches)]
    per[L] = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
  return {"induction": float(np.mean([v["induction_acc"] for v in per.values()])), "per_length": per}
