"""A blockwise kernel at several block sizes: the measurements behind `kernels.block_size_for`.

    python -m attngeo.experiments.bench_blocks [--seqs 4096,16384] [--batches 1,1] [--heads 8]
                                               [--blocks 512,1024,2048] [--kernel softmax|phase] [--repeats 4]

For each length: forward + backward (a jitted grad of Σ y, as `attngeo bench` times) of `kernels.attention` (or,
with `--kernel phase`, `kernels.phase_attention`, CMAP's one-sided kernel) on the blockwise kernel with each block
of `--blocks`, 64 wide, float32, on one set of inputs, the blocks timed in alternation (`timing.interleaved_seconds`,
rounds in alternating order). Prints a Markdown table: each block's fastest run in ms, its paired median ÷ the first
block (the median of the run-by-run ratios; with a 95 % interval from 6 repeats on, `timing.paired_ratio`), and the
block `block_size_for(b·h, kernel)` takes when none is named (at most the length), and each program's peak memory by
XLA's analysis. Runs with glibc's huge pages, as `attngeo` does.
"""
from __future__ import annotations

import math
import sys


def calls(n: int, batch: int, heads: int, blocks, head_dim: int = 64, kernel: str = "softmax") -> dict:
  """{block: (a no-argument call of the compiled forward + backward, its peak bytes by XLA's analysis)} at `n` keys on
  one set of inputs: the softmax kernel (ATTN's), or the phase kernel (CMAP's one-sided kernel; phase heads q and k,
  coupling 1)."""
  import jax
  import jax.numpy as jnp

  from attngeo import kernels
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (0.3 * jax.random.normal(key, (batch, n, heads, head_dim)) for key in ks)
  if kernel == "phase":
    attend = lambda q, k, v, bs: kernels.phase_attention(q, k, v, q, k, 1.0, implementation="blockwise", block_size=bs)
  else:
    attend = lambda q, k, v, bs: kernels.attention(q, k, v, implementation="blockwise", block_size=bs)
  from attngeo.experiments import timing
  out = {}
  for bs in blocks:
    compiled = jax.jit(jax.grad(lambda q, k, v, bs=bs: jnp.sum(attend(q, k, v, bs)), (0, 1, 2))).lower(q, k, v).compile()
    out[bs] = (lambda c=compiled: c(q, k, v)), timing.peak_bytes(compiled)
  return out


def main(argv=None):
  from attngeo import config
  from attngeo.experiments import timing
  ap = config.parser("python -m attngeo.experiments.bench_blocks", __doc__)
  timing.add_lengths(ap, [4096, 16384], [1, 1])
  ap.add_argument("--heads", type=config.positive_int, default=8, help="attention heads (default 8)")
  ap.add_argument("--blocks", type=config.int_list, default=(512, 1024, 2048),
                  help="block sizes, the first the reference of the ratios (default 512,1024,2048)")
  ap.add_argument("--kernel", choices=("softmax", "phase"), default="softmax",
                  help="softmax (ATTN's, every family member's) or phase (CMAP's one-sided kernel) (default softmax)")
  ap.add_argument("--repeats", type=config.positive_int, default=4,
                  help="timed runs of each block, interleaved (default 4; 6 or more for an interval)")
  a = ap.parse_args(argv)
  timing.check_lengths(ap, a, arrays=6, width=a.heads * 64)          # q, k, v and their gradients
  blocks = list(dict.fromkeys(a.blocks))

  def rows():
    from attngeo import kernels
    print("| keys | batch × heads | default block | " + " | ".join(f"{bs} (ms)" for bs in blocks)
          + " | " + " | ".join(f"{bs} ÷ {blocks[0]}, paired" for bs in blocks[1:])
          + " | peak MiB (" + ", ".join(map(str, blocks)) + ") |")
    print("|---:|---:|---:|" + "---:|" * (2 * len(blocks) - 1) + "---|")
    for n, batch in zip(a.seqs, a.batches):
      runs = calls(n, batch, a.heads, blocks, kernel=a.kernel)
      times = timing.interleaved_seconds({bs: call for bs, (call, _) in runs.items()}, a.repeats)
      mib = lambda b: "—" if b is None else f"{b / 2 ** 20:.0f}"
      ratios = [timing.paired_ratio(times[bs], times[blocks[0]]) for bs in blocks[1:]]
      text = lambda r: f"{r.median:.3f}" + ("" if math.isnan(r.low) else f" [{r.low:.3f}, {r.high:.3f}]")
      print(f"| {n} | {batch} × {a.heads} | {min(kernels.block_size_for(batch * a.heads, a.kernel), n)} | "
            + " | ".join(f"{min(times[bs]) * 1e3:.1f}" for bs in blocks) + " | "
            + " | ".join(text(r) for r in ratios) + " | " + ", ".join(mib(runs[bs][1]) for bs in blocks) + " |",
            flush=True)
      yield n
  return timing.print_rows(ap, argv, rows)


if __name__ == "__main__":
  sys.exit(main())
