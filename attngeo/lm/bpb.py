"""Bits per byte (nanochat's definition) and per-token losses of a causal language model.

For rows `x` `[m, T + 1]` (inputs `x[:, :-1]`, targets `y = x[:, 1:]`) and the tokenizer's byte table
`β(v)` (UTF-8 bytes of token v, 0 for special tokens):

    bpb = Σ_{t : β(y_t) > 0} ℓ_t  /  (ln 2 · Σ_t β(y_t)),      ℓ_t = −log p(y_t | x_≤t)  (nats)

so special-token targets (BOS) count in neither sum, and the ratio does not depend on the vocabulary:
a byte-level and a BPE model are compared per byte of text. `token_losses` is the per-position
cross-entropy in float32 (`optax.softmax_cross_entropy_with_integer_labels`).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


def token_losses(model, tokens):
  """tokens [b, T + 1] int → ℓ [b, T] float32 nats of predicting tokens[:, 1:] from the prefix."""
  logits = model(tokens[:, :-1])
  return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), tokens[:, 1:])


def jitted(fn):
  """`fn(model, *arrays)` compiled once per input shape, the model passed as (graphdef, state)."""
  cache = {}

  def call(model, *args):
    graphdef, state = nnx.split(model)
    if graphdef not in cache:
      cache[graphdef] = jax.jit(lambda st, *a: fn(nnx.merge(graphdef, st), *a))
    return cache[graphdef](state, *args)
  return call


def _sums(model, tokens, token_bytes, weight):
  loss = token_losses(model, tokens)
  nbytes = token_bytes[tokens[:, 1:]] * weight[:, None]
  counted = (nbytes > 0).astype(jnp.float32)
  return {"nats": jnp.sum(loss * counted), "bytes": jnp.sum(nbytes), "loss_sum": jnp.sum(loss * weight[:, None]),
          "tokens": jnp.sum(jnp.broadcast_to(weight[:, None], loss.shape))}


_sums_jit = jitted(_sums)


def bits_per_byte(model, rows, token_bytes, batch_size: int = 16) -> dict:
  """bpb of `model` on `rows` ([m, T + 1] int array, or any sequence of {"tokens"} rows).

  Returns {"bpb", "loss" (mean nats per target token, specials included), "nats", "bytes", "tokens"}.
  """
  rows = np.asarray(rows.array() if hasattr(rows, "array") else rows)
  if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] < 2:
    raise ValueError(f"rows must be a non-empty [m, T + 1] token array (T ≥ 1); got shape {rows.shape}")
  table = jnp.asarray(np.asarray(token_bytes, np.int32))
  if int(rows.max()) >= table.shape[0]:
    raise ValueError(f"rows hold token id {int(rows.max())} but token_bytes covers {table.shape[0]} ids")
  totals = {"nats": 0.0, "bytes": 0, "loss_sum": 0.0, "tokens": 0}
  for start in range(0, len(rows), batch_size):
    chunk = rows[start:start + batch_size]
    weight = np.zeros(batch_size, np.int32)
    weight[:len(chunk)] = 1
    if len(chunk) < batch_size:   # pad the last batch (one compiled shape); padded rows weigh 0
      chunk = np.concatenate([chunk, np.zeros((batch_size - len(chunk), chunk.shape[1]), chunk.dtype)])
    out = jax.device_get(_sums_jit(model, jnp.asarray(chunk), table, jnp.asarray(weight)))
    for k in totals:
      totals[k] += float(out[k]) if k in ("nats", "loss_sum") else int(out[k])
  bpb = totals["nats"] / (math.log(2) * totals["bytes"]) if totals["bytes"] else float("inf")
  return {"bpb": bpb, "loss": totals["loss_sum"] / totals["tokens"], "nats": totals["nats"], "bytes": totals["bytes"],
          "tokens": totals["tokens"]}
