"""Set transformer over points: the velocity field of flow matching on point clouds (Swiss roll).

Each point is a token; there are no positions, so the model is permutation-equivariant, and
attention is bidirectional over the set. `(x [b, n, dim], t [b]) -> velocity [b, n, dim]`, every
block adaLN-Zero conditioned on the time embedding.
"""
from __future__ import annotations


from flax import nnx

from attngeo.nn.embeddings import FinalLayer, TimestepEmbedder
from attngeo.nn.config import BlockConfig, PointFlowConfig  # noqa: F401  (PointFlowConfig's old home)
from attngeo.nn.layers import Block, param


class PointFlow(nnx.Module):
  """(x [b, n, dim], t [b] ∈ [0, 1]) -> velocity [b, n, dim]; bidirectional attention over the set."""

  def __init__(self, cfg: PointFlowConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    bc = cfg.block.validate()
    self.in_w = param(rngs, (cfg.dim, bc.width), (None, "embed"))
    self.in_b = param(rngs, (bc.width,), ("embed",), zero=True)
    self.t_embed = TimestepEmbedder(bc.width, rngs=rngs)
    self.blocks = nnx.List([Block(bc, cond_dim=bc.width, rngs=rngs) for _ in range(cfg.depth)])
    self.final = FinalLayer(bc.width, cfg.dim, rngs=rngs)

  def __call__(self, x, t):
    if x.ndim != 3 or x.shape[-1] != self.cfg.dim:
      raise ValueError(f"x must be [b, n, {self.cfg.dim}]; got {x.shape}")
    h = x @ self.in_w[...] + self.in_b[...]
    cond = self.t_embed(t)
    for blk in self.blocks:
      h = blk(h, cond)
    return self.final(h, cond)
