"""Self-attention on one product and its transpose: the β = 1 edge of the family (ATTN–ATAP), and DMAP's Gram.

For self-attention (queries and keys of the same n tokens) member (β, α) has, up to a row constant,
the logits (`attngeo.operators`; m = (q + k)/√2, n = (q − k)/√2)

    L_ij = s·[ (1 − β)·½ m_i·m_j + β·½ (q_i·k_j + k_i·q_j) + α·½ (q_i·k_j − k_i·q_j) ] + bias_j,

since ½ m_i·m_j − β·½ n_i·n_j = (1 − β)·½ m_i·m_j + β·½ (q_i·k_j + k_i·q_j). On the edge β = 1 (ATAP at
α = 0) the Gram term vanishes and, with A = q·kᵀ,

    L = s·(w·A + w_t·Aᵀ) + bias_j,        w = (1 + α)/2,  w_t = (1 − α)/2,
    Ā = s·(w·L̄ + w_t·L̄ᵀ)   ⇒   q̄ = Ā·k,  k̄ = Āᵀ·q,

one n × n × d product where the augmented heads (`operators.augment`) run one 2·d wide. Counted in
n × n × d products, forward + backward with P·v and its two cotangents: ATTN 6, the augmented edge 9,
this kernel 6 plus two n × n transposes (one per pass), and a third where its k̄ reads the cotangent's
transpose (`_blocks.logits_product`, up to 384² entries a head). At α = 0 (ATAP, w = w_t) L and Ā = s·w·(L̄ + L̄ᵀ)
are symmetric, and the backward is one 2·d-wide product, [q̄, k̄] = Ā·[k, q] (`symmetric_logits`), every product
contracting its n × n operand on the last axis. `jax.grad` of Σ w ⊙ y on the kernel, 256 keys, batch 8, 8 heads
of 64, three runs (old and new kernel interleaved, fastest of 150): 26.3–26.5 → 21.2–21.8 ms, ÷ ATTN 1.44–1.49 →
1.18–1.23, gradients bitwise equal.

Measured (`attngeo bench --operators ATTN,DMTN,ATAP --seqs 128,256 --long 0 --repeats 25
--implementations einsum`, batch 8, 8 heads of 64, float32, two runs on this 2-core CPU, against DMTN,
which this kernel does not touch): ATAP ÷ DMTN 1.07, 0.97 → 0.92, 0.88 at 128 keys and 1.08, 1.10 →
0.99, 0.95 at 256. An n × n transpose-add costs about a quarter of a product here, and from 1024 keys
(256 MiB logit arrays) the transposes cost more than the products they save (ATAP ÷ ATTN on einsum
1.26 → 1.96 in one run), so `operators.transport` runs this kernel only below `dispatch.BLOCKWISE_FROM`
keys (`dispatch.runs_split`). Off the edge the logits keep a Gram term (1 − β)·½ m·mᵀ of rank d beside
the antisymmetric one; splitting it too (m·mᵀ with the one-product VJP (Ḡ + Ḡᵀ)·m, plus A) saves one
product of 9 and adds three transposes, and measured no gain for DMTN, so DMTN and the mixed members keep
the augmented form. The kernel needs every pair (i, j) and (j, i), so it is dense: a causal or masked
call computes all of A and masks after, as the einsum kernel does.

DMAP (β = α = 0) runs on the augmented heads (m, m/2) with a key bias: its logits (s/2)·m·mᵀ are a symmetric
Gram, and `gram_attention` takes m̄ = (s/2)·(L̄ + L̄ᵀ)·m as one d-wide product where the einsum kernel takes two
— 5 product units to ATTN's 6. `operators.transport` runs it where the dense split runs, up to
`_blocks.TRANSPOSED_COTANGENT_UP_TO` entries per head (blockwise, from `dispatch.PAIRED_GRAM_FROM_TILES` tiles, the same
Gram runs on pairs of tiles, `split_paired`). `jax.grad` of Σ w ⊙ DMAP (`transport`, its far-token guard
included), batch 8, 8 heads of 64, the einsum kernel on the augmented heads → `gram_attention`, ÷ ATTN, one process
each: 128 keys 1.21 → 1.09; 192 keys 1.21 → 1.02; 256 keys 1.11, 1.11, 1.12 → 1.12, 1.12, 1.12 (a tie: at 256 the
pass L̄ + L̄ᵀ reads its transposed operand at a power-of-two stride, 3.9 ms for 32 MiB against 1.6 ms for 50 MiB at
320); 320 keys 1.04, 1.09 → 1.02, 1.02; 384 keys 1.10, 1.14 → 1.01, 1.05; 448 keys 1.05, 1.07 → 1.11, 1.10.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from attngeo.errors import InputTypeError
from attngeo.kernels._blocks import apply_masks, check_mask, logits_product, scale_queries, zero_empty_rows


def split_weights(alpha):
  """(w, w_t) = ((1 + α)/2, (1 − α)/2) on the β = 1 edge: floats for a static α, else arrays ([] or [h])."""
  if isinstance(alpha, float):
    return (1.0 + alpha) / 2, (1.0 - alpha) / 2
  a_ = jnp.asarray(alpha, jnp.float32)
  return (1 + a_) / 2, (1 - a_) / 2


def _per_head(w):
  """A weight as a static float or a [] / [h] array broadcast over [b, h, n, n]."""
  return w if isinstance(w, float) else jnp.asarray(w, jnp.float32).reshape(-1, 1, 1)


def split_logits(q, k, w, w_t, scale):
  """s·(w·q·kᵀ + w_t·k·qᵀ): [b, h, n, n] float32 from q, k [b, n, h, d]. Static equal weights (ATAP, α = 0)
  take `symmetric_logits`, whose backward is one product; others are differentiated as written."""
  if isinstance(w, float) and isinstance(w_t, float) and w == w_t and isinstance(scale, (int, float)):
    return symmetric_logits(q, k, scale * w)
  a = logits_product(q, k)
  return scale * (_per_head(w) * a + _per_head(w_t) * jnp.swapaxes(a, -1, -2))


def _head_major(x):
  """[b, n, h, e] -> [b, h, n, e] float32: the operands of a tangent product that keeps its n × n result row-major."""
  return jnp.transpose(x, (0, 2, 1, 3)).astype(jnp.float32)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def symmetric_logits(q, k, c):
  """L = c·(q·kᵀ + k·qᵀ): [b, h, n, n] float32 from q, k [b, n, h, d], c a Python float; L = Lᵀ.

  Forward A = (c·q)·kᵀ, L = A + Aᵀ (one product, one transpose pass). Tangent dL = S + Sᵀ with
  S = c·[dq, dk]·[k, q]ᵀ, so reverse mode is, with Ā = L̄ + L̄ᵀ (symmetric),

      q̄ = c·(L̄ + L̄ᵀ)·k,   k̄ = c·(L̄ᵀ + L̄)·q   ⇒   [q̄, k̄] = Ā·(c·[k, q]),

  one product 2·d wide whose n × n operand contracts its own last axis, where differentiating `A + Aᵀ` gave
  Ā·k and Āᵀ·q — the second contracting Ā's row axis, which XLA:CPU hands to Eigen, not YNNPACK (4.1–4.5 ms of a
  20 ms program at 256 keys, batch 8, 8 heads of 64). Same product count (2·d wide = two d-wide units).
  """
  qs, rest = scale_queries(q, c)
  a = logits_product(qs, k)
  a = a if rest is None else a * rest
  return a + jnp.swapaxes(a, -1, -2)


@symmetric_logits.defjvp
def _symmetric_jvp(c, primals, tangents):
  q, k = primals
  dq, dk = tangents
  # head-major operands: the transposed product writes [b, h, n, 2d] and keeps Ā row-major (against a product
  # writing [b, n, h, 2d] directly, ATAP ÷ ATTN 0.98–1.05 against 1.22–1.30 at 256 keys, before `logits_product`)
  s = jnp.einsum("bhie,bhje->bhij", _head_major(jnp.concatenate([dq, dk], -1)) * c,
                 _head_major(jnp.concatenate([k, q], -1)), preferred_element_type=jnp.float32)
  return symmetric_logits(q, k, c), s + jnp.swapaxes(s, -1, -2)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def gram_logits(m, c):
  """L = c·m·mᵀ: [b, h, n, n] float32 from m [b, n, h, d], c a Python float; L = Lᵀ (DMAP's distance form,
  `operators.augment`: heads m and m/2, c = s/2).

  Tangent dL = S + Sᵀ with S = c·dm·mᵀ, so reverse mode is m̄ = c·(L̄ + L̄ᵀ)·m: one d-wide product on a
  row-major operand, where the einsum kernel on the heads (m, m/2) runs two (q̄ = L̄·k and k̄ = L̄ᵀ·q) and a
  transpose pass (`_blocks.logits_product`). 5 product units to ATTN's 6, forward + backward.
  """
  ms, rest = scale_queries(m, c)
  a = logits_product(ms, m)
  return a if rest is None else a * rest


@gram_logits.defjvp
def _gram_jvp(c, primals, tangents):
  (m,), (dm,) = primals, tangents
  s = jnp.einsum("bhie,bhje->bhij", _head_major(dm) * c, _head_major(m), preferred_element_type=jnp.float32)
  return gram_logits(m, c), s + jnp.swapaxes(s, -1, -2)


def _attend(s, v, bias, mask, causal):
  """`softmax(s + bias_j, masked)·v`: [b, n, h, e] in v's dtype from logits s [b, h, n, n]; empty rows 0."""
  if bias is not None:
    s = s + jnp.transpose(bias, (0, 2, 1))[:, :, None, :]
  p = jax.nn.softmax(apply_masks(s, mask, causal), axis=-1)
  out = jnp.einsum("bhts,bshe->bthe", p.astype(v.dtype), v, preferred_element_type=jnp.float32).astype(v.dtype)
  return zero_empty_rows(out, mask, causal, v.shape[1])


def split_attention(q, k, v, *, weights, bias=None, mask=None, causal=False, scale):
  """`softmax(split_logits + bias_j, masked)·v` for self-attention: [b, n, h, e] in v's dtype.

  q, k: [b, n, h, d] (the same n tokens); v: [b, n, h, e]; weights: (w, w_t) of `split_weights`;
  bias: [b, n, h] per-key logit bias or None; mask: bool broadcastable to [b, h, n, n] (True = attend).
  A query row with no key returns 0, as on every kernel.
  """
  if q.shape != k.shape:
    raise ValueError(f"split attention is self-attention: q and k must have the same shape; got {q.shape}, {k.shape}")
  check_mask(mask)
  return _attend(split_logits(q, k, *weights, scale), v, bias, mask, causal)


def gram_attention(m, v, *, c: float, bias=None, mask=None, causal=False):
  """`softmax(c·m·mᵀ + bias_j, masked)·v` (self-attention on one set of heads): [b, n, h, e] in v's dtype.

  m: [b, n, h, d]; v: [b, n, h, e]; c: the logit scale, a real number (not traced); bias: [b, n, h] per-key logit bias or
  None; mask: bool broadcastable to [b, h, n, n] (True = attend). The backward is one product (`gram_logits`).
  A query row with no key returns 0, as on every kernel.
  """
  if m.ndim != 4 or v.ndim != 4:
    raise ValueError(f"m and v must be 4-D, [b, n, h, ·]; got shapes {m.shape}, {v.shape}")
  if m.shape[:3] != v.shape[:3]:
    raise ValueError(f"gram attention is self-attention: m and v must share [b, n, h]; got {m.shape}, {v.shape}")
  if bias is not None and bias.shape != m.shape[:3]:
    raise ValueError(f"bias must have shape [b, n, h] = {m.shape[:3]}; got {bias.shape}")
  if isinstance(c, (bool, np.bool_)) or not isinstance(c, (int, float, np.integer, np.floating)):
    raise InputTypeError(f"c must be a real number known at trace time (the logit scale); got {type(c).__name__}")
  check_mask(mask)
  return _attend(gram_logits(m, float(c)), v, bias, mask, causal)
