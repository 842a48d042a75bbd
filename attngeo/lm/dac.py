"""DAC probe: does the free antisymmetric logit point along induction edges?

On the induction sequences x = [s; s][:−1] of `attngeo.lm.induction` (half-length L), each layer's
post-rotary, post-QK-norm queries and keys (`attngeo.nn.capture_qk`) give per head the antisymmetric
logit

    a_ij = ½ (q_i·k_j − k_i·q_j) / √d_h

(the free skew part of the operator family at α = 1; computed from q, k whatever the operator).
For the induction edges i ∈ [L, 2L − 2], j = i − L + 1 (the token after the previous occurrence of
x_i) it averages `a_{i, j+δ}` over edges and sequences for offsets δ ∈ {−2, …, 2} (entries with
j + δ < 0 are left out), and reports per layer and head the **local contrast**

    c = ā(0) − mean_{δ ≠ 0} ā(δ),

positive when the antisymmetric logit singles out the induction target among its neighbours.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import nn
from attngeo.lm import bpb, induction as induction_lib

OFFSETS = (-2, -1, 0, 1, 2)


def edge_logits(q, k, L: int, offsets=OFFSETS):
  """q, k [b, 2L − 1, h, d] → (ā [h, len(offsets)], count [len(offsets)]): mean a_{i, i−L+1+δ} over
  edges i ∈ [L, 2L − 2] and the batch, entries with column < 0 excluded."""
  q, k = jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32)
  i = np.arange(L, 2 * L - 1)
  means, counts = [], []
  for delta in offsets:
    j = i - L + 1 + delta
    ok = j >= 0
    ii, jj = i[ok], j[ok]
    a = 0.5 * (jnp.einsum("bnhd,bnhd->bnh", q[:, ii], k[:, jj]) - jnp.einsum("bnhd,bnhd->bnh", k[:, ii], q[:, jj]))
    means.append((a / math.sqrt(q.shape[-1])).mean((0, 1)))
    counts.append(int(ok.sum()))
  return jnp.stack(means, -1), np.asarray(counts)


def local_contrast(logit, offsets=OFFSETS):
  """ā [..., len(offsets)] → ā(0) − mean of the other offsets [...]."""
  logit = np.asarray(logit)
  zero = list(offsets).index(0)
  others = [n for n in range(len(offsets)) if n != zero]
  return logit[..., zero] - logit[..., others].mean(-1)


_qk_jit = bpb.jitted(lambda model, x: nn.capture_qk(model, lambda: model(x))[1])   # [(q, k)] per layer


def dac_probe(model, vocab_size: int, seq_len: int, L: int | None = None, sequences: int = 16,
              seed: int = 1234) -> dict:
  """Per layer and head: ā(δ) and the local contrast, on `sequences` induction rows of half-length L
  (default: the longest of `induction.LENGTHS` that fits the context).

  Returns {"L", "offsets", "logit" [layers][heads][5], "contrast" [layers][heads], "max_contrast", "mean_contrast"}.
  """
  use = induction_lib.lengths_for(seq_len)
  L = L or (use[-1] if use else None)
  if L is None or 2 * L - 1 > seq_len:
    raise ValueError(f"half-length L={L} does not fit a context of {seq_len} tokens (needs 2L − 1 ≤ {seq_len})")
  rows = induction_lib.sequences(L, vocab_size, 1, sequences, seed)
  qks = _qk_jit(model, jnp.asarray(rows[:, :-1]))
  logit = np.stack([np.asarray(jax.device_get(edge_logits(q, k, L)[0])) for q, k in qks])   # [layers, h, 5]
  contrast = local_contrast(logit)
  return {"L": L, "offsets": list(OFFSETS), "logit": logit.tolist(), "contrast": contrast.tolist(),
          "max_contrast": float(contrast.max()), "mean_contrast": float(contrast.mean())}
