"""The one place that chooses an attention kernel: by name when asked, else by backend and length.

Three kinds of attention run on these kernels, each with its own set of names (`KERNELS`):

* `"softmax"` — `softmax(s·q·kᵀ + bias_j, masked)·v` (`attention`; every member of the (β, α) family):
  einsum, XLA's and cuDNN's fused SDPA, blockwise, and the Pallas flash kernel `"pallas"`
  (`attngeo.kernels.pallas`: Triton on GPU, Mosaic on TPU, interpret mode on CPU).
* `"phase"` — the same with a U(1) phase on the values (`phase_attention`): einsum, blockwise, Pallas (`pallas_phase`).
* `"magnetic"` — the magnetic operator CMAP (`operators.magnetic_transport`): the phase kernels, and the
  Hermitian pairing `"paired"` (β = 0, no mask, not causal; `attngeo.kernels.paired`), which is never a
  default — it is run only when named.

Default rule (see `attngeo bench`, docs/benchmarks.md): softmax attention runs cuDNN's flash kernel on
GPU and XLA's fused SDPA on TPU; on CPU, and for the phase kernels on every backend, the einsum path
below `BLOCKWISE_FROM` keys (or an unknown length) and the blockwise path from there on — O(n) memory
(393 MiB against einsum's 1,153 at 1024 keys, batch 8 × 8 heads) and, since its backward sums the key side
feature-major (`_blocks.column_sum`), the faster of the two: einsum ÷ blockwise 1.26–1.31 at 1024 keys and
1.46–1.55 at 2048 (`attngeo bench --operators ATTN,CMAP --seqs 1024,2048`, two runs, huge pages).
On the einsum kernel below `BLOCKWISE_FROM` keys the family's β = 1 edge (ATAP; `runs_split`) runs
`attngeo.kernels.split` instead of the augmented heads: one d-wide product and its transpose instead of
one 2·d wide (ATAP ÷ ATTN at 256 keys, two runs each: 1.66, 1.67 before it; 1.41, 1.55 with it; 1.23,
1.28 with the input-side overflow check too; 1.28, 1.34 since ATAP's backward is one product on the
symmetrised cotangent, `split.symmetric_logits`, against an ATTN 10 % faster, `_blocks.logits_product` —
docs/benchmarks.md; from 1024 keys the transposes cost more).
On the blockwise kernel the same edge, unmasked and not causal, runs up to `KEPT_UP_TO` keys on
`attngeo.kernels.split_kept`, two tiles whose P the forward keeps for the backward (6.5 product units, no recompute;
n² floats a head), and from `PAIRED_FROM_TILES` tiles on `attngeo.kernels.split_paired`: the two products of each pair of tiles (a, b), (b, a) at once, 7 product units
per tile like ATTN's instead of 11; the β = 0 edge (DMTN) runs there too from `PAIRED_BETA0_FROM_TILES` tiles
(a pair's Gram d wide and its X − Y one product 2·d wide: 9 + 1/T units), and DMAP, its Gram alone, from
`PAIRED_GRAM_FROM_TILES` tiles (5 + 1/T units against the 7 of its heads (m, m/2)).
The blockwise kernels' block, where none is named, is 512 keys from 17 heads a step (b·h; the phase kernel from 9)
and larger below (`block_size_for`: at batch 1 × 8 heads 1024, on which ATTN ran 14 % faster than on 512 at 16 384
keys); the pairs' tiles stay at 512.
`"pallas"` runs only when named: never a default on CPU (interpret mode is a test harness, not a kernel),
and not yet on GPU/TPU either — it has passed its interpret-mode tests, lowers to Triton and to Mosaic here,
and compiles for sm_90 with pip's Triton (`attngeo bench-triton`), but has never run on a device; the
GPU/TPU default moves to it (from `BLOCKWISE_FROM` keys) once `experiments/gpu_check.sh` has measured it there.
"""
from __future__ import annotations

import jax

from attngeo.kernels._blocks import check_block_size, tiles_in_pairs, tiling

IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "blockwise", "pallas")
PHASE_IMPLEMENTATIONS = ("einsum", "blockwise", "pallas")
KERNELS = {"softmax": IMPLEMENTATIONS, "phase": PHASE_IMPLEMENTATIONS, "magnetic": PHASE_IMPLEMENTATIONS + ("paired",)}
_WHAT = {"softmax": "", "phase": " for phase attention", "magnetic": " for the magnetic operator"}

BLOCKWISE_FROM = 512   # keys: the portable kernels' switch from the dense einsum path to the blockwise one
# Tiles from which the β = 1 edge runs on pairs of tiles (`runs_split`): with T tiles the diagonal ones, which
# need a transpose each way, are 1/T of the area. ATAP ÷ ATTN blockwise, fwd + bwd, 8 heads of 64, huge pages
# (`python -m attngeo.experiments.bench_pairs --operator ATAP --seqs 1024,2048,4096 --batches 8,8,4`, after the
# key side went feature-major): augmented heads 1.46 / 1.39 / 1.32, pairs 1.51 / 1.38 / 1.17 at 1024 / 2048 / 4096
# keys (2 / 4 / 8 tiles of 512); since the diagonal tiles' sums stay feature-major (e312bd2) augmented 1.38 / 1.39 /
# 1.31, pairs 1.44 / 1.37 / 1.13; since a pair's X + Y is one product (b590994), pairs 1.51 / 1.24 / 1.09 against
# augmented 1.38 / 1.36 / 1.33, and at 1024 keys (`--repeats 8`, two runs) pairs 1.42, 1.40 against 1.43, 1.38: a tie.
PAIRED_FROM_TILES = 4
# Tiles from which the β = 0 edge (DMTN) runs on pairs of tiles: 9 + 1/T units per tile (a pair's Gram d wide, its
# X − Y 2·d wide, the diagonal tiles d wide) against the augmented heads' 11, all 2·d wide, which run faster per unit.
# DMTN ÷ ATTN blockwise (`bench_pairs`, batch 8 / 4 / 1 / 1): augmented 1.44 / 1.33 / 1.35 / 1.33, pairs 1.97 / 1.62
# / 1.36 / 1.33 at 2048 / 4096 / 8192 / 16 384 keys — a tie from 16 tiles since the augmented heads' key side went
# feature-major (before it the pairs won there, 1.18 / 1.13 against 1.28 / 1.27). Since a pair's X − Y is one
# product (0d61ee1), two runs: augmented 1.40, 1.42 / 1.32, 1.34 / 1.36, 1.33 / 1.32, 1.33, pairs 1.78, 1.79 / 1.50,
# 1.48 / 1.31, 1.29 / 1.24, 1.26: the pairs win from 16 tiles again.
PAIRED_BETA0_FROM_TILES = 16
# Tiles from which DMAP runs on pairs of tiles: its Gram (s/2)·m_a·m_bᵀ alone, once per pair, 5 + 1/T units per
# tile against the heads (m, m/2)'s 7 (ATTN's count). DMAP ÷ ATTN blockwise, fwd + bwd, 8 heads of 64, heads → pairs,
# interleaved (`python -m attngeo.experiments.bench_pairs --operator DMAP`, 2026-12-06, docs/benchmarks.md): 1.01 →
# 0.99, 0.99 → 1.03, 0.97 → 1.01 at 1024 keys (batch 8, 2 tiles); 1.00 → 1.08, 1.01 → 0.97, 1.02 → 0.97 at 2048
# (batch 8); 1.01 → 0.88 at 4096 (batch 4); 1.04 → 0.81 at 16 384 (batch 1).
PAIRED_GRAM_FROM_TILES = 4

# The blockwise kernels' block when none is named (`block_size=None`): the largest power of two from `TILE` to
# `MAX_BLOCK` with b·h·block² ≤ `STEP_ENTRIES[kind]` (`block_size_for`). Each step of their loops runs a dozen ops over
# one block of every head; a step over a small block (batch 1, few heads) costs more than its work. The phase kernel
# holds more arrays a step (P, θ, P cos θ, P sin θ) and runs best on half the entries. Fwd + bwd, 64 wide, float32,
# paired medians ÷ the 512-key block (`python -m attngeo.experiments.bench_blocks`, 2026-12-07, docs/benchmarks.md,
# "The blockwise kernels' block"), 1024 / 2048:
#   softmax, 8192 keys: 1 head 0.860 / 0.813 (4096: 0.862); 1 × 2 0.873 / 0.858; 1 × 4 0.888 / 0.909; 1 × 8 0.880 /
#   0.962; 2 × 8 0.870; 4 × 8 0.970; 2048 keys, 8 × 8: 1.118 (256: 1.463). 16 384 keys, 1 × 8: 0.863 / 0.960.
#   phase, 8192 keys: 1 head 0.854 / 0.812; 1 × 2 0.892 / 0.899; 1 × 4 0.929 / 1.127; 1 × 8 0.929 / 1.176; 2 × 8 1.061.
STEP_ENTRIES = {"softmax": 2 ** 24, "phase": 2 ** 23}
MAX_BLOCK = 2048
TILE = 512   # the least default block, and the paired kernels' tile bound when none is named
# Keys up to which the β = 1 edge runs on two tiles with P kept (`runs_split`, "kept"; `attngeo.kernels.split_kept`):
# n² floats of P a head, at most four 512 × 512 tiles, and 6.5 product units where ATTN's blockwise kernel runs 7.
# ATAP ÷ ATTN blockwise, fwd + bwd, batch 8, 8 heads of 64, the routes interleaved (`python -m
# attngeo.experiments.bench_pairs --operator ATAP --seqs 512,1024 --batches 8,8 --repeats 8`, two runs, 2026-12-07):
# augmented heads 1.27, 1.41 / 1.41, 1.38, kept 1.19, 1.24 / 1.23, 1.20, pairs — / 1.48, 1.37 at 512 / 1024 keys.
# DMTN and DMAP stay on their heads (`--operator DMTN|DMAP --seqs 1024 --batches 8`, docs/benchmarks.md: no gain).
# Below `BLOCKWISE_FROM` the einsum path runs the dense split kernel instead.
KEPT_UP_TO = 2 * TILE
# Entries of P (b·h·n², float32) up to which the kept kernel is taken: four times a blockwise step's (`STEP_ENTRIES`),
# 256 MiB — batch 8 × 8 heads at 1024 keys. P lives from a layer's forward to its backward, so a model holds one such
# P per layer until its backward; over the cap ATAP keeps its O(n)-memory routes.
KEPT_ENTRIES = 4 * STEP_ENTRIES["softmax"]


def choose(kind: str, implementation: str | None = None, n_keys: int | None = None, *, strict: bool = True) -> str:
  """The kernel that runs attention of `kind` ("softmax", "phase", "magnetic") over `n_keys` keys.

  implementation: a name of `KERNELS[kind]` (returned as it is), or None for the default rule of the
  module docstring. strict=False (a layer's kernel setting, kept across a graft between the family and
  CMAP): a name that only another kind has falls back to the default instead of being an error. A name
  no kind has is an error either way, in one line.
  """
  names = KERNELS[kind]
  if implementation in names:
    return implementation
  known = any(implementation in other for other in KERNELS.values())
  if implementation is not None and (strict or not known):
    raise ValueError(f"implementation must be one of {names} or None{_WHAT[kind]}; got {implementation!r}")
  if kind == "softmax":
    backend = jax.default_backend()
    if backend in ("gpu", "cuda"):
      return "cudnn"
    if backend == "tpu":
      return "xla"
  return "blockwise" if n_keys is not None and n_keys >= BLOCKWISE_FROM else "einsum"


def block_size_for(batch_heads: int, kind: str = "softmax") -> int:
  """The blockwise kernels' default block for `batch_heads` = b·h heads a step: the largest power of two from
  `TILE` to `MAX_BLOCK` with b·h·block² ≤ `STEP_ENTRIES[kind]` — for "softmax" 2048 up to 4 heads a step, 1024 for
  5–16, 512 from 17 on; for "phase" 2048 up to 2, 1024 for 3–8, 512 from 9 on."""
  if kind not in STEP_ENTRIES:
    raise ValueError(f"kind must be one of {tuple(STEP_ENTRIES)}; got {kind!r}")
  block = TILE
  while 2 * block <= MAX_BLOCK and batch_heads * (2 * block) ** 2 <= STEP_ENTRIES[kind]:
    block *= 2
  return block


def chosen_block(block_size, batch_heads: int, kind: str = "softmax") -> int:
  """`block_size` checked (`_blocks.check_block_size`), or `block_size_for(batch_heads, kind)` where it is None."""
  return block_size_for(batch_heads, kind) if block_size is None else check_block_size(block_size)


def default_implementation(seq_len: int | None = None) -> str:
  """The default softmax kernel on this backend for `seq_len` keys: `choose("softmax", None, seq_len)`."""
  return choose("softmax", None, seq_len)


def runs_split(implementation: str | None, n_keys: int, *, masked: bool = False, causal: bool = False,
               static: bool = False, block_size: int = 512, from_tiles: int = PAIRED_FROM_TILES,
               kept: bool = False, heads: int | None = None) -> str | None:
  """The kernel a β = 1 member of the family (not ATTN) runs on over `n_keys` keys, instead of the augmented
  heads: `"dense"` (`attngeo.kernels.split`) where the softmax kernel is einsum and `n_keys < BLOCKWISE_FROM`;
  where it is blockwise, with no mask, no causal order and `static` weights (a Python-float α), `"kept"`
  (`attngeo.kernels.split_kept`, if `kept`) on two tiles of n/2 ≤ `block_size` keys up to `KEPT_UP_TO` keys and,
  where `heads` (b·h) is given, up to `KEPT_ENTRIES` entries of P in all (b·h·n²), else `"paired"`
  (`attngeo.kernels.split_paired`) where the keys cut into `from_tiles` (default `PAIRED_FROM_TILES`) or more tiles
  (`_blocks.tiling`); else None. The caller checks the member and the dtype (`operators.transport`: a static β = 1.0,
  inputs of ≥ 32 bits)."""
  kernel = choose("softmax", implementation, n_keys)
  if kernel == "einsum" and n_keys < BLOCKWISE_FROM:
    return "dense"
  if kernel != "blockwise" or not static or masked or causal:
    return None
  fits = heads is None or heads * n_keys * n_keys <= KEPT_ENTRIES
  if kept and fits and n_keys % 2 == 0 and n_keys <= KEPT_UP_TO and n_keys // 2 <= block_size:
    return "kept"
  if tiles_in_pairs(n_keys, block_size) and tiling(n_keys, block_size)[0] >= from_tiles:
    return "paired"
  return None
