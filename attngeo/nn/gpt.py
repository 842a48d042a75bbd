"""Decoder-only language model (nanochat's shape: depth is the one size knob).

`GPTConfig.from_depth(d)` gives width `64·d` rounded up to whole heads of `head_dim`, heads
`width / head_dim`; blocks are pre-RMSNorm, MHSA → FFN with ReLU² MLPs, rotary positions and
QK-norm, no biases; embedding and unembedding are untied. Tokens `[b, n]` → logits `[b, n, V]`.
"""
from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
from flax import nnx

from attngeo import _checks
from attngeo.nn.layers import Block, BlockConfig, NestsBlock, param


def _gpt_block() -> BlockConfig:
  return BlockConfig(width=256, num_heads=2, head_dim=128, mlp_act="relu2", use_rope=True, qk_norm=True)


@dataclasses.dataclass(frozen=True)
class GPTConfig(NestsBlock):
  """A GPT: `depth` blocks of `block`, vocabulary `vocab_size`, context `seq_len`."""
  depth: int = 4
  vocab_size: int = 256
  seq_len: int = 256
  block: BlockConfig = dataclasses.field(default_factory=_gpt_block)

  @classmethod
  def from_depth(cls, depth: int, *, aspect: int = 64, head_dim: int = 128, width: int | None = None,
                 **fields) -> "GPTConfig":
    """nanochat's rule: width = `aspect`·depth rounded up to a multiple of `head_dim` (or `width`)."""
    w = width or -(-aspect * depth // head_dim) * head_dim
    if w % head_dim:
      raise ValueError(f"head_dim={head_dim} does not divide width={w}: heads must tile the width")
    return cls.create(depth=depth, width=w, num_heads=w // head_dim, head_dim=head_dim, **fields)

  @property
  def width(self) -> int:
    return self.block.width


class GPT(nnx.Module):
  """tokens [b, n] int -> logits [b, n, vocab] (float32)."""

  def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    bc = cfg.block.validate()
    self.embed = param(rngs, (cfg.vocab_size, bc.width), ("vocab", "embed"), std=1.0)
    self.blocks = nnx.List([Block(bc, causal=True, rngs=rngs) for _ in range(cfg.depth)])
    self.norm = nnx.RMSNorm(bc.width, rngs=rngs)
    self.unembed = param(rngs, (bc.width, cfg.vocab_size), ("embed", "vocab"), std=0.001)

  def __call__(self, tokens):
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f"tokens must be an integer array [b, n]; got {tokens.dtype} {tokens.shape}")
    if _checks.is_concrete(tokens) and tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size):
      raise ValueError(f"tokens must lie in [0, {self.cfg.vocab_size}); got [{int(tokens.min())}, {int(tokens.max())}]")
    x = self.embed[...][tokens]
    for blk in self.blocks:
      x = blk(x)
    return self.norm(x).astype(jnp.float32) @ self.unembed[...]

  def init_cache(self, batch: int, length: int | None = None) -> list[dict]:
    """Per-layer KV caches (`Attention.init_cache`) for `length` positions (default the context `seq_len`)."""
    return [blk.attn.init_cache(batch, length or self.cfg.seq_len) for blk in self.blocks]

  def decode(self, tokens, caches: list[dict], pos):
    """tokens [b, n] at positions pos…pos+n−1 → (logits [b, n, vocab], updated caches).

    Equal to `self(prefix)[:, pos:pos+n]` for the prefix the caches were filled with: O(T) work per token.
    """
    x = self.embed[...][tokens]
    out = []
    for blk, cache in zip(self.blocks, caches):
      x, cache = blk.decode(x, cache, pos)
      out.append(cache)
    return self.norm(x).astype(jnp.float32) @ self.unembed[...], out


def matmul_params(cfg: GPTConfig) -> int:
  """Parameters that multiply the token stream: every ≥2-D weight except lookup tables (axes opening
  with `vocab`, i.e. the token embedding); the unembedding counts. Counted on the abstract model."""
  model = nnx.eval_shape(lambda: GPT(cfg, rngs=nnx.Rngs(0)))
  total = 0
  for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = getattr(v, "axes", None) or ()
    shape = v.get_value().shape
    if len(shape) >= 2 and (not axes or axes[0] != "vocab"):
      total += math.prod(shape)
  return total


def flops_per_token(cfg: GPTConfig) -> float:
  """nanochat's training FLOPs per token (forward + backward): `6·N + 12·L·h·d_h·T`.

  N = `matmul_params(cfg)` (2 FLOPs per parameter forward, 4 backward); the attention term counts
  the q·k and P·v products of each of L layers over the full context T (PaLM's convention). Every
  operator is credited ATTN's count: the augmented heads of DMTN/ATAP (2·d_h) are not counted, so
  MFU compares operators at equal useful work.
  """
  bc = cfg.block
  return 6.0 * matmul_params(cfg) + 12.0 * cfg.depth * bc.num_heads * bc.dh * cfg.seq_len
