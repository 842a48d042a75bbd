"""Decoder-only language model (nanochat's shape: depth is the one size knob).

`GPTConfig.from_depth(d)` gives width `64·d` rounded up to whole heads of `head_dim`, heads
`width / head_dim`; blocks are pre-RMSNorm, MHSA → FFN with ReLU² MLPs, rotary positions and
QK-norm, no biases; embedding and unembedding are untied. Tokens `[b, n]` → logits `[b, n, V]`.

The forward pass, with every option that public checkpoints need (`attngeo.interop`; all off by
default), for tokens t, embedding table E [V', d] (V' = `padded_vocab` ≥ V rows), blocks B_i:

    x = E[t] (+ P[0:n] with `learned_positions`; GPT-2)        then norm(x) with `embed_norm`
    smear (`smear_channels` C > 0):  x_j ← x_j + λ_s·σ(x_j[:C]·w_s)·x_{j−1}  for j ≥ 1
    x0 = x;  for each layer i:  x ← λ_r[i]·x + λ_0[i]·x0  (`resid_mix`),
                                x ← B_i(x; sliding window w_i, value embedding VE_i[t])
    backout (`backout_layer` ℓ):  x ← x − λ_b·x^(ℓ)    (x^(ℓ): the stream after block ℓ)
    logits = norm(x)·U  (U = Eᵀ with `tie_embeddings`), first V columns, then c·tanh(logits / c)
             with `logit_softcap` c.

A sliding window w_i (`attn_windows`) lets query j see key j' iff 0 ≤ j − j' ≤ w_i. Value
embeddings (`value_embeds`: the layers that have one) enter attention's values through a gate
(`attngeo.nn.layers.Attention`). The nanochat (2025-10 / 2026-07) and GPT-2 settings are in
`attngeo.interop`.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from attngeo import _checks
from attngeo.nn.config import BlockConfig, GPTConfig  # noqa: F401  (GPTConfig's old home)
from attngeo.nn.layers import Block, make_norm, param


class GPT(nnx.Module):
  """tokens [b, n] int -> logits [b, n, vocab] (float32)."""

  def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg.validate()
    bc = cfg.block
    rows, kv_dim = cfg.table_rows, (bc.num_kv_heads or bc.num_heads) * bc.dh
    self.embed = param(rngs, (rows, bc.width), ("vocab", "embed"), std=1.0)
    gated = set(cfg.value_embeds)
    self.blocks = nnx.List([Block(bc, causal=True, value_gate=cfg.value_gate_channels if i in gated else 0, rngs=rngs)
                            for i in range(cfg.depth)])
    self.norm = make_norm(bc, bc.width, rngs)
    if not cfg.tie_embeddings:
      self.unembed = param(rngs, (bc.width, rows), ("embed", "vocab"), std=0.001)
    if cfg.learned_positions:
      self.wpe = param(rngs, (cfg.seq_len, bc.width), (None, "embed"), std=0.01)
    if cfg.embed_norm:
      self.embed_norm = make_norm(bc, bc.width, rngs)
    if cfg.resid_mix:
      self.resid_lambdas = nnx.Param(jnp.ones((cfg.depth,)), axes=(None,))
      self.x0_lambdas = nnx.Param(jnp.zeros((cfg.depth,)), axes=(None,))
    if cfg.smear_channels:
      self.smear_gate = param(rngs, (cfg.smear_channels,), (None,), zero=True)
      self.smear_lambda = param(rngs, (1,), (None,), zero=True)
    if cfg.backout_layer is not None:
      self.backout_lambda = param(rngs, (1,), (None,), zero=True)
    if cfg.value_embeds:   # one table per listed layer, stacked in the order of cfg.value_embeds
      self.value_embed = param(rngs, (len(cfg.value_embeds), rows, kv_dim), (None, "vocab", None),
                               std=bc.width ** -0.5)

  def __call__(self, tokens):
    cfg = self.cfg
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"tokens must be an integer array [b, n]; got {tokens.dtype} {tokens.shape}")
    if _checks.is_concrete(tokens) and tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size):
      raise ValueError(f"tokens must lie in [0, {cfg.vocab_size}); got [{int(tokens.min())}, {int(tokens.max())}]")
    n = tokens.shape[1]
    if cfg.learned_positions and n > cfg.seq_len:
      raise ValueError(f"tokens has {n} positions but the learned position table has seq_len={cfg.seq_len}")
    x = self.embed[...][tokens]
    if cfg.learned_positions:
      x = x + self.wpe[...][:n]
    if cfg.embed_norm:
      x = self.embed_norm(x)
    if cfg.smear_channels and n > 1:
      gate = self.smear_lambda[...] * jax.nn.sigmoid(x[:, 1:, :cfg.smear_channels] @ self.smear_gate[...])
      x = jnp.concatenate([x[:, :1], x[:, 1:] + gate[..., None] * x[:, :-1]], axis=1)
    x0, x_back = x, None
    slot = {layer: j for j, layer in enumerate(cfg.value_embeds)}
    kv_heads = cfg.block.num_kv_heads or cfg.block.num_heads
    for i, blk in enumerate(self.blocks):
      if cfg.resid_mix:
        x = self.resid_lambdas[...][i] * x + self.x0_lambdas[...][i] * x0
      ve = None
      if i in slot:
        ve = self.value_embed[...][slot[i]][tokens].reshape(*tokens.shape, kv_heads, cfg.block.dh)
      x = blk(x, mask=self._window_mask(i, n), value_embed=ve)
      if i == cfg.backout_layer:
        x_back = x
    if x_back is not None:
      x = x - self.backout_lambda[...] * x_back
    return self._logits(x)

  def _window_mask(self, layer: int, n: int):
    """[1, 1, n, n] bool (query j sees key j' iff j − j' ≤ w) for a window shorter than n − 1; else None."""
    if not self.cfg.attn_windows or self.cfg.attn_windows[layer] >= n - 1:
      return None
    pos = jnp.arange(n)
    return (pos[:, None] - pos[None, :] <= self.cfg.attn_windows[layer])[None, None]

  def init_cache(self, batch: int, length: int | None = None) -> list[dict]:
    """Per-layer KV caches (`Attention.init_cache`) for `length` positions (default the context `seq_len`)."""
    return [blk.attn.init_cache(batch, length or self.cfg.seq_len) for blk in self.blocks]

  def decode(self, tokens, caches: list[dict], pos):
    """tokens [b, n] at positions pos…pos+n−1 → (logits [b, n, vocab], updated caches).

    Equal to `self(prefix)[:, pos:pos+n]` for the prefix the caches were filled with: O(T) work per
    token. Every option of `__call__` is followed except the smear (it needs the previous token's
    embedding across calls): such models are sampled without a cache.
    """
    cfg = self.cfg
    if cfg.smear_channels:
      raise ValueError("KV-cache decoding does not support smear_channels; sample without the cache")
    n = tokens.shape[1]
    x = self.embed[...][tokens]
    if cfg.learned_positions:
      x = x + jax.lax.dynamic_slice_in_dim(self.wpe[...], pos, n, 0)
    if cfg.embed_norm:
      x = self.embed_norm(x)
    x0, x_back, out = x, None, []
    slot = {layer: j for j, layer in enumerate(cfg.value_embeds)}
    kv_heads = cfg.block.num_kv_heads or cfg.block.num_heads
    for i, (blk, cache) in enumerate(zip(self.blocks, caches)):
      if cfg.resid_mix:
        x = self.resid_lambdas[...][i] * x + self.x0_lambdas[...][i] * x0
      ve = self.value_embed[...][slot[i]][tokens].reshape(*tokens.shape, kv_heads, cfg.block.dh) if i in slot else None
      window = cfg.attn_windows[i] if cfg.attn_windows else None
      x, cache = blk.decode(x, cache, pos, value_embed=ve, window=window)
      out.append(cache)
      if i == cfg.backout_layer:
        x_back = x
    if x_back is not None:
      x = x - self.backout_lambda[...] * x_back
    return self._logits(x), out

  def _logits(self, x):
    cfg = self.cfg
    unembed = self.embed[...].T if cfg.tie_embeddings else self.unembed[...]
    logits = self.norm(x).astype(jnp.float32) @ unembed
    if cfg.padded_vocab is not None and cfg.padded_vocab != cfg.vocab_size:
      logits = logits[..., :cfg.vocab_size]
    if cfg.logit_softcap:
      logits = cfg.logit_softcap * jnp.tanh(logits / cfg.logit_softcap)
    return logits


LOOKUP_TABLES = ("embed", "wpe", "value_embed")     # read by index, never multiplied by the stream


def matmul_params(cfg: GPTConfig) -> int:
  """Parameters that multiply the token stream: every ≥2-D weight except the lookup tables (token,
  position and value embeddings); the unembedding counts (the token table again when tied).
  Counted on the abstract model."""
  model = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
  total = 0
  for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    shape = v.get_value().shape
    if len(shape) >= 2 and path[-1] not in LOOKUP_TABLES:
      total += math.prod(shape)
  return total + (cfg.vocab_size * cfg.block.width if cfg.tie_embeddings else 0)


def flops_per_token(cfg: GPTConfig) -> float:
  """nanochat's training FLOPs per token (forward + backward): `6·N + 12·L·h·d_h·T`.

  N = `matmul_params(cfg)` (2 FLOPs per parameter forward, 4 backward); the attention term counts
  the q·k and P·v products of each of L layers over the full context T (PaLM's convention). Every
  operator is credited ATTN's count: the augmented heads of DMTN/ATAP (2·d_h) are not counted, so
  MFU compares operators at equal useful work.
  """
  bc = cfg.block
  return 6.0 * matmul_params(cfg) + 12.0 * cfg.depth * bc.num_heads * bc.dh * cfg.seq_len
