"""Bidirectional encoders: BERT and ALBERT (Hugging Face's `BertModel` / `AlbertModel` forward), any operator.

Tokens t [b, n], a padding mask [b, n] (True = a real token; padded keys get weight 0) and token
types τ [b, n] (default 0). With LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + b (ε = `block.norm_eps`, HF's
`layer_norm_eps`):

    e = LN_e(E[t] + P[0:n] + T[τ])                      E [V, E'], P [seq_len, E'], T [types, E']
    x⁰ = e                      (BERT: E' = d)          x⁰ = e·W_in + b_in   (ALBERT: E' = `embed_dim`)
    x^{ℓ+1} = LN₂(y + FFN(y)),  y = LN₁(x^ℓ + Attn(x^ℓ; mask))     post-LN, FFN = W₂ gelu_erf(W₁· + b₁) + b₂
    BERT: layer ℓ has its own weights; ALBERT (`shared_layers`): one layer applied `depth` times.

`hidden_states` returns [x⁰, …, x^L] (HF's `output_hidden_states`, embedding output first). The MLM
head (BERT `cls.predictions`, ALBERT `predictions`) is
`logits = LN_h(gelu(x·W_h + b_h))·Eᵀ + c` (the decoder tied to E, or its own [E', V] when
`tie_decoder` is off), W_h [d, E'], gelu the blocks' own (`block.mlp_act`: `gelu_erf`, HF's
`gelu`; or the tanh form `gelu`, HF's `gelu_new`, the default of HF's AlbertConfig). The pooler
is `tanh(x_0·W_p + b_p)` (the first token), and a classifier (`classifier="nsp"`: BERT's
`cls.seq_relationship`; `"labels"`: `classifier`; ALBERT's `sop_classifier`) reads it:
`pooled·W_c + b_c` [b, num_labels].

Every attention layer is an `nn.Attention` (q/k/v/out biases on), so `graft`, `fold_distance`,
`capture_qk` and the probe act on these models unchanged. Random-init twins follow HF's
`_init_weights`: every weight matrix and table ~ N(0, `initializer_range`²), biases 0, LayerNorm
scales 1, the `pad_token_id` row of E zero.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from attngeo import _checks
from attngeo.nn.config import CLASSIFIERS, BlockConfig, EncoderConfig  # noqa: F401  (their old home)
from attngeo.nn.layers import Block, make_norm, param

BIASES = {"bq", "bk", "bv", "bp", "bo", "b1", "b2", "bias"}     # parameter names HF initialises to zero


class PostNormBlock(Block):
  """BERT's block on `Block`'s modules: `y = LN₁(x + attn(x))`, `x' = LN₂(y + mlp(y))` (norm_attn = LN₁)."""

  def __call__(self, x, mask=None):
    x = self.norm_attn(x + self.attn(x, mask=mask).astype(x.dtype))
    return self.norm_mlp(x + self.mlp(x).astype(x.dtype))


class Encoder(nnx.Module):
  """ids [b, n] int, mask [b, n] bool (optional) -> hidden states, MLM logits [b, n, V], pooled/classifier output."""

  def __init__(self, cfg: EncoderConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg = cfg.validate()
    d, e = cfg.width, cfg.edim
    self.embed = param(rngs, (cfg.vocab_size, e), ("vocab", "embed"), std=1.0)
    self.wpe = param(rngs, (cfg.seq_len, e), (None, "embed"), std=1.0)
    self.wtt = param(rngs, (cfg.type_vocab_size, e), (None, "embed"), std=1.0)
    self.embed_norm = make_norm(cfg.block, e, rngs)
    if cfg.embed_dim is not None:
      self.embed_proj = param(rngs, (e, d), (None, "embed"))
      self.embed_proj_bias = param(rngs, (d,), ("embed",), zero=True)
    self.layers = nnx.List([PostNormBlock(cfg.block, rngs=rngs) for _ in range(1 if cfg.shared_layers else cfg.depth)])
    if cfg.mlm_head:
      self.mlm_dense = param(rngs, (d, e), ("embed", None))
      self.mlm_dense_bias = param(rngs, (e,), (None,), zero=True)
      self.mlm_norm = make_norm(cfg.block, e, rngs)
      if not cfg.tie_decoder:
        self.mlm_decoder = param(rngs, (e, cfg.vocab_size), (None, "vocab"))
      self.mlm_bias = param(rngs, (cfg.vocab_size,), ("vocab",), zero=True)
    if cfg.pooler:
      self.pooler = param(rngs, (d, d), ("embed", None))
      self.pooler_bias = param(rngs, (d,), (None,), zero=True)
    if cfg.classifier is not None:
      self.classifier = param(rngs, (d, cfg.num_labels), ("embed", None))
      self.classifier_bias = param(rngs, (cfg.num_labels,), (None,), zero=True)
    hf_init(self, rngs, cfg.initializer_range, cfg.pad_token_id)

  def _check(self, ids, mask, token_types):
    cfg = self.cfg
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(f"ids must be an integer array [b, n]; got {ids.dtype} {ids.shape}")
    if ids.shape[1] > cfg.seq_len:
      raise ValueError(f"ids has {ids.shape[1]} positions but the learned position table has seq_len={cfg.seq_len}")
    if _checks.is_concrete(ids) and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= cfg.vocab_size):
      raise ValueError(f"ids must lie in [0, {cfg.vocab_size}); got [{int(ids.min())}, {int(ids.max())}]")
    for name, a in (("mask", mask), ("token_types", token_types)):
      if a is not None and a.shape != ids.shape:
        raise ValueError(f"{name} must have ids' shape {ids.shape}; got {a.shape}")
    if mask is not None and mask.dtype != jnp.bool_:
      raise ValueError(f"mask must be a bool array (True = a real token); got {mask.dtype}")

  def embeddings(self, ids, token_types=None):
    """x⁰ [b, n, d]: LN_e(E[t] + P[0:n] + T[τ]), projected to the width under ALBERT."""
    n = ids.shape[1]
    types = self.wtt[...][0] if token_types is None else self.wtt[...][token_types]
    x = self.embed_norm(self.embed[...][ids] + self.wpe[...][:n] + types)
    if self.cfg.embed_dim is not None:
      x = x @ self.embed_proj[...] + self.embed_proj_bias[...]
    return x

  def hidden_states(self, ids, mask=None, token_types=None) -> list:
    """[x⁰, x¹, …, x^L], each [b, n, d]: Hugging Face's `output_hidden_states` (embedding output first)."""
    self._check(ids, mask, token_types)
    keys = None if mask is None else mask[:, None, None, :]
    x = self.embeddings(ids, token_types)
    out = [x]
    for i in range(self.cfg.depth):
      x = self.layers[0 if self.cfg.shared_layers else i](x, mask=keys)
      out.append(x)
    return out

  def __call__(self, ids, mask=None, token_types=None):
    """The last hidden state x^L [b, n, d] (HF's `last_hidden_state`)."""
    return self.hidden_states(ids, mask, token_types)[-1]

  def mlm_logits(self, ids, mask=None, token_types=None):
    """Masked-LM logits [b, n, V] (float32) from the last hidden state."""
    if not self.cfg.mlm_head:
      raise ValueError("this encoder has no MLM head (its checkpoint carried none)")
    return self.head_logits(self(ids, mask, token_types))

  def head_logits(self, x):
    """The MLM head on hidden states x [b, n, d]: LN_h(gelu(x·W_h + b_h))·decoder + c."""
    h = x @ self.mlm_dense[...] + self.mlm_dense_bias[...]
    h = jax.nn.gelu(h, approximate=self.cfg.block.mlp_act == "gelu")       # the blocks' GELU (HF: hidden_act)
    decoder = self.embed[...].T if self.cfg.tie_decoder else self.mlm_decoder[...]
    return (self.mlm_norm(h) @ decoder + self.mlm_bias[...]).astype(jnp.float32)

  def pooled(self, ids, mask=None, token_types=None):
    """tanh(x^L_0·W_p + b_p) [b, d]: the pooler on the first ([CLS]) token."""
    if not self.cfg.pooler:
      raise ValueError("this encoder has no pooler (its checkpoint carried none)")
    return jnp.tanh(self(ids, mask, token_types)[:, 0] @ self.pooler[...] + self.pooler_bias[...])

  def class_logits(self, ids, mask=None, token_types=None):
    """The classifier on the pooled token [b, num_labels] (NSP / sequence labels)."""
    if self.cfg.classifier is None:
      raise ValueError("this encoder has no classifier head (its checkpoint carried none)")
    return self.pooled(ids, mask, token_types) @ self.classifier[...] + self.classifier_bias[...]


def hf_init(model, rngs: nnx.Rngs, std: float, pad_token_id: int | None = None):
  """HF's `_init_weights` in place: weights ~ N(0, std²), biases (`BIASES`, `*_bias`) 0, norm scales 1, pad row 0."""
  for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    name, shape = str(path[-1]), v.get_value().shape
    if name == "scale":
      v.set_value(jnp.ones(shape, jnp.float32))
    elif name in BIASES or name.endswith("_bias"):
      v.set_value(jnp.zeros(shape, jnp.float32))
    else:
      v.set_value(jax.random.normal(rngs.params(), shape, jnp.float32) * std)
  if pad_token_id is not None:
    model.embed.set_value(model.embed[...].at[pad_token_id].set(0.0))
