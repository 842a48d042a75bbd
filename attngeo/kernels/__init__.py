"""Attention kernels: `softmax(scale·q·kᵀ + bias_j, masked)·v` and the magnetic operator's phase kernels.

Every operator of `attngeo.operators` and every matrix-free geometry operator runs on these, behind
one dispatcher (`choose`: a kernel by name, else by backend and length — the only place that
chooses; callers pass `implementation` through):

* `softmax` — `attention` (einsum, XLA/cuDNN fused SDPA, blockwise with a recomputing custom VJP) and
  `log_normaliser`; the derivation of the blockwise backward in its docstring.
* `phase` — `phase_attention`, `y_i = Σ_j P_ij e^{iθ_ij} v_j` (CMAP's one-sided kernels: einsum and
  blockwise, both custom VJPs), and `sincos`.
* `pallas` — `pallas_sdpa`, the same attention as one Pallas flash kernel (forward and backward; Triton,
  Mosaic, or interpret mode on CPU), implementation "pallas"; `layout`: the blocks and head-dim padding
  each backend needs.
* `pallas_phase` — `pallas_phase_attention`, phase attention as Pallas flash kernels (`phase_attention`'s "pallas").
* `split` — `split_attention`, the dense kernel of the β = 1 edge (ATAP) on one product and its transpose
  (d wide, where the augmented heads are 2·d); `gram_attention`, DMAP's symmetric Gram m·mᵀ with a one-product
  backward.
* `split_paired` — `split_paired_attention`, the same edge blockwise: each pair of tiles' two products once
  (no mask, not causal; ATTN's product count); with its Gram term, the β = 0 edge (DMTN) on m and n; the Gram
  alone, DMAP on m (5 + 1/T units a tile).
* `split_kept` — `split_kept_attention`, the same edge on two tiles with P kept from the forward (no recompute;
  n² floats a head), up to `KEPT_UP_TO` keys and `KEPT_ENTRIES` entries of P.
* `paired` — `paired_magnetic`, CMAP at β = 0 on its Hermitian pairing (each unordered token pair once).
* `_blocks` — what they share: the mask conventions (`NEG`, `apply_masks`, `attended_rows`; a fully
  masked row is 0 on every kernel), the blockwise tiling and the one online-softmax scan, the paired
  kernels' tiles (`tiling`, `pair_tasks`, `slab`).
* `dispatch` — `choose`, `KERNELS`, the default rule, the default block (`block_size_for`) and `runs_split`.

Layout of `jax.nn.dot_product_attention`: q `[b, t, h, d]`, k `[b, s, h, d]`, v `[b, s, h, e]`; a
per-key bias `[b, s, h]`; masks broadcastable to `[b, h, t, s]` (True = attend). Logits and softmax
accumulate in float32 whatever the input dtype.
"""
from attngeo.kernels._blocks import NEG, TRANSPOSED_COTANGENT_UP_TO, apply_masks, attended_rows, check_block_size
from attngeo.kernels.dispatch import (BLOCKWISE_FROM, IMPLEMENTATIONS, KEPT_ENTRIES, KEPT_UP_TO, KERNELS, PAIRED_BETA0_FROM_TILES, PAIRED_FROM_TILES,
                                      PAIRED_GRAM_FROM_TILES, MAX_BLOCK, PHASE_IMPLEMENTATIONS, STEP_ENTRIES, TILE,
                                      block_size_for,
                                      choose, default_implementation, runs_split)
from attngeo.kernels._blocks import levels, pair_tasks, tiling
from attngeo.kernels.paired import paired_magnetic
from attngeo.kernels.pallas import layout, pallas_sdpa
from attngeo.kernels.pallas_phase import pallas_phase_attention
from attngeo.kernels.phase import phase_attention, sincos
from attngeo.kernels.softmax import attention, log_normaliser
from attngeo.kernels.split import gram_attention, split_attention, split_weights
from attngeo.kernels.split_kept import split_kept_attention
from attngeo.kernels.split_paired import split_paired_attention

__all__ = ["BLOCKWISE_FROM", "IMPLEMENTATIONS", "KEPT_ENTRIES", "KEPT_UP_TO", "KERNELS", "NEG", "PAIRED_BETA0_FROM_TILES", "PAIRED_FROM_TILES",
           "PAIRED_GRAM_FROM_TILES", "MAX_BLOCK", "PHASE_IMPLEMENTATIONS", "STEP_ENTRIES", "TILE",
           "TRANSPOSED_COTANGENT_UP_TO",
           "apply_masks", "attended_rows", "block_size_for", "check_block_size", "attention", "choose", "default_implementation", "gram_attention",
           "layout", "levels",
           "log_normaliser", "pair_tasks", "pallas_phase_attention", "pallas_sdpa", "paired_magnetic",
           "phase_attention", "runs_split", "sincos", "split_attention", "split_kept_attention", "split_paired_attention", "split_weights", "tiling"]
