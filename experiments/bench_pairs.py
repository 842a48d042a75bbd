"""The blockwise routes of DMTN, ATAP or DMAP timed on one set of inputs: the crossovers behind
`kernels.PAIRED_BETA0_FROM_TILES` (DMTN), `kernels.PAIRED_FROM_TILES` (ATAP) and `kernels.PAIRED_GRAM_FROM_TILES`
(DMAP), and `kernels.KEPT_UP_TO`.

    python -m attngeo.experiments.bench_pairs [--operator DMTN|ATAP|DMAP] [--seqs 2048,4096,8192,16384]
                                              [--batches 8,4,1,1] [--repeats 2]

For each length: forward + backward (a jitted grad of Σ y²) of ATTN on the blockwise kernel, of the member on
the augmented heads (`operators.augment`, then the blockwise softmax kernel: the route below the crossover), on
two tiles with P kept (`kernels.split_kept_attention`, up to `kernels.KEPT_UP_TO` keys) and on pairs of tiles
(`kernels.split_paired_attention`, two or more tiles of 512); the last two DMTN through `operators.beta0_paired`'s
m and n with its Gram term, ATAP on q and k with its key bias, DMAP its Gram alone on m = (q + k)/√2 with its key
bias; none with `operators.transport`'s guards. 8 heads of 64, float32: ATTN and the augmented heads on the blockwise
kernel's default block (`kernels.block_size_for(b·h)`: 512 from batch 3 on, 1024 at batches 1–2), the pairs on tiles
of 512 (each length whole blocks: a multiple of the block), the routes timed in alternation
(`timing.interleaved_seconds`), fastest run. Prints a Markdown table of each route ÷ ATTN ("—" where a route does
not run at that length). Runs with glibc's huge pages, as `attngeo` does.
"""
from __future__ import annotations

import sys


BLOCK = 512                     # the pairs' tile bound here (`kernels.TILE`)


def routes(n: int, batch: int, heads: int = 8, head_dim: int = 64, operator: str = "DMTN"):
  """{route: a no-argument call} for ATTN blockwise and the two routes of `operator` (DMTN, ATAP, DMAP) at `n`
  keys."""
  import jax
  import jax.numpy as jnp

  from attngeo import kernels, operators as op
  from attngeo.kernels._blocks import tiles_in_pairs
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = (0.3 * jax.random.normal(key, (batch, n, heads, head_dim)) for key in ks)
  scale = head_dim ** -0.5

  beta, alpha = op.corner(operator)

  def augmented(q, k, v):
    aug = op.augment(q, k, beta=beta, alpha=alpha, scale=scale)
    return kernels.attention(aug.q, aug.k, v, bias=aug.bias, implementation="blockwise", scale=scale)

  def split(kernel, **kw):
    def run(q, k, v):
      if (beta, alpha) == (0.0, 0.0):                                # DMAP: the Gram (s/2)·m·mᵀ and its key bias
        aug = op.augment(q, k, beta=beta, alpha=alpha, scale=scale)
        return kernel(aug.q, aug.q, v, weights=(0.0, 0.0), gram=0.5, bias=aug.bias, scale=scale, **kw)
      if beta == 0.0:                                                # (q, k) := (m, n), `operators.beta0_paired`
        return kernel(*op.beta0_heads(q, k), v, weights=(-alpha / 2, alpha / 2), gram=0.5, scale=scale, **kw)
      bias = op.key_bias(q, k, beta=beta, alpha=alpha, scale=scale)
      return kernel(q, k, v, weights=kernels.split_weights(alpha), bias=bias, scale=scale, **kw)
    return run

  attn = lambda q, k, v: op.transport(q, k, v, implementation="blockwise")
  step = lambda f: jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) ** 2), (0, 1, 2)))
  names = [("ATTN", attn), ("augmented", augmented)]
  if n % 2 == 0 and n <= kernels.KEPT_UP_TO:
    names.append(("kept", split(kernels.split_kept_attention)))
  if tiles_in_pairs(n, BLOCK) and n % BLOCK == 0:
    names.append(("pairs", split(kernels.split_paired_attention, block_size=BLOCK)))
  return {name: (lambda g=step(f): g(q, k, v)) for name, f in names}


def main(argv=None):
  from attngeo import config
  from attngeo.experiments import timing
  ap = config.parser("python -m attngeo.experiments.bench_pairs", __doc__)
  ap.add_argument("--operator", type=str.upper, choices=("DMTN", "ATAP", "DMAP"), default="DMTN",
                  help="the member whose routes are timed, any case (default DMTN)")
  timing.add_lengths(ap, [2048, 4096, 8192, 16384], [8, 4, 1, 1])
  ap.add_argument("--repeats", type=config.positive_int, default=2,
                  help="timed runs of each call, interleaved (default 2)")
  a = ap.parse_args(argv)
  timing.check_lengths(ap, a, arrays=7, width=8 * 64)           # q, k, v and their gradients, 8 heads of 64

  def rows():
    from attngeo.kernels import block_size_for
    for n, batch in zip(a.seqs, a.batches):
      block = min(block_size_for(batch * 8), n)
      if n % BLOCK or n % block:
        ap.error(f"--seqs: each length must be a multiple of {BLOCK} keys and of the kernel's block at its batch "
                 f"({block} at batch {batch}): whole blocks for every route and ATTN alike; got {n}")
    print(f"| keys | batch | ATTN blockwise (ms) | {a.operator} augmented ÷ ATTN | {a.operator} kept ÷ ATTN | "
          f"{a.operator} pairs ÷ ATTN |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, batch in zip(a.seqs, a.batches):
      calls = routes(n, batch, operator=a.operator)
      best = {name: min(t) for name, t in timing.interleaved_seconds(calls, a.repeats).items()}
      ratio = lambda name: f"{best[name] / best['ATTN']:.2f}" if name in best else "—"
      print(f"| {n} | {batch} | {best['ATTN'] * 1e3:.1f} | {ratio('augmented')} | {ratio('kept')} | {ratio('pairs')} |",
            flush=True)
      yield n
  return timing.print_rows(ap, argv, rows)


if __name__ == "__main__":
  sys.exit(main())
