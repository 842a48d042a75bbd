"""Tuning sweep of the Pallas flash kernel (`attngeo.kernels.pallas`): block size × Triton warps × stages.

    attngeo bench-pallas [--seq 4096] [--batch 8] [--heads 8] [--widths 64,256]
        [--value-dim 64] [--blocks 32,64,128] [--warps 4,8] [--stages 2,3] [--dtype bfloat16] [--causal]
        [--repeats 5] [--interpret] [--out DIR]

For each augmented head width D (64: ATTN and DMAP at head dim 64; 128: DMTN/ATAP in float32; 256: DMTN/ATAP
in 16-bit, `operators.augment`'s hi/lo pair) it times the jitted forward + backward of `pallas_sdpa` (the
gradient of Σ w ⊙ y, w fixed Gaussian, with respect to q, k, v and the key bias) at every block size (bq = bk)
and every Triton `num_warps` × `num_stages`, and checks each configuration against the blockwise kernel on
the same inputs: `err` is max |x − x_blockwise| / max |x_blockwise| over y and the four gradients, so a
configuration that is fast but wrong shows it. A configuration Triton rejects (shared memory, registers) gets
its one-line reason instead of a time. Rows print as they are measured (a run cut short keeps them); the last
lines name each width's fastest correct configuration. Writes pallas_blocks.{md,csv,json}.

On CPU it runs only with `--interpret` (Pallas' interpret mode ignores the Triton parameters: a dry run of
the sweep, not a timing). The kernel's default is `pallas.TRITON` and `pallas.layout("gpu", ...)`.
"""
from __future__ import annotations

import itertools
import math
import sys

from attngeo import config, runlock
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col

R = "right"
COLS = [Col("width", "D", align=R), Col("block", align=R), Col("warps", align=R), Col("stages", align=R),
        Col("seconds", "fwd+bwd ms", lambda s: f"{1e3 * s:.2f}" if math.isfinite(s) else "—", align=R),
        Col("tflops", "TFLOP/s", ".1f", align=R), Col("err", "err vs blockwise", ".1e", align=R), Col("status")]


def flops(b: int, h: int, t: int, s: int, d: int, e: int, causal: bool) -> float:
  """The kernel's own FLOPs (module docstring of `kernels.pallas`): forward 2ts(D + E), dk/dv kernel
  2ts(2D + 2E), dq kernel 2ts(2D + E), per batch × head; causal does about half."""
  per = 2 * t * s * ((d + e) + (2 * d + 2 * e) + (2 * d + e))
  return b * h * per * (0.5 if causal else 1.0)


def problem(b, n, h, d, e, dtype, causal):
  """(inputs, loss(impl, block) → jitted gradient program): q, k [b, n, h, d], v [b, n, h, e], bias [b, n, h]."""
  import jax
  import jax.numpy as jnp

  from attngeo import kernels
  ks = jax.random.split(jax.random.PRNGKey(0), 5)
  dt = jnp.dtype(dtype)
  q, k = (jax.random.normal(kk, (b, n, h, d), dt) for kk in ks[:2])
  v = jax.random.normal(ks[2], (b, n, h, e), dt)
  bias = jax.random.normal(ks[3], (b, n, h), jnp.float32)
  w = jax.random.normal(ks[4], (b, n, h, e), jnp.float32)
  scale = 1 / math.sqrt(d)

  def program(impl, block):
    def loss(q, k, v, bias):
      kw = {} if block is None else {"block_size": block}
      y = kernels.attention(q, k, v, bias=bias, causal=causal, scale=scale, implementation=impl, **kw)
      return jnp.sum(w * y.astype(jnp.float32)), y
    def outputs(*a):
      (_, y), grads = jax.value_and_grad(loss, range(4), has_aux=True)(*a)
      return (y, *grads)
    return jax.jit(outputs).lower(q, k, v, bias).compile()
  return (q, k, v, bias), program


def relative_error(got, want) -> float:
  """max over arrays of max |got − want| / max |want| (float32)."""
  import numpy as np
  worst = 0.0
  for g, r in zip(got, want):
    g, r = np.asarray(g, np.float32), np.asarray(r, np.float32)
    if not np.all(np.isfinite(g)):
      return math.inf
    worst = max(worst, float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), 1e-30)))
  return worst


def check_grid(widths, blocks, warps, stages, width_max: int = 1024, value_dim: int = 1) -> None:
  """One ValueError naming the first option value of a sweep's grid that Triton cannot take (`pallas.check_triton`)
  or a head or value width past `width_max`, before any work."""
  from attngeo.kernels import pallas
  for name, values, key in (("--blocks", blocks, "block"), ("--warps", warps, "num_warps"),
                            ("--stages", stages, "num_stages")):
    for v in values:
      try:
        pallas.check_triton(**{key: v})
      except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
  if max(widths) > width_max:
    raise ValueError(f"--widths must be at most {width_max}; got {max(widths)}")
  if value_dim > width_max:
    raise ValueError(f"--value-dim must be at most {width_max}; got {value_dim}")


def partial_note(done: int, total: int, what: str) -> str:
  """The line a table carries until its run has measured everything."""
  return "" if done >= total else f"incomplete: {done} of {total} {what} (the run was cut short or is running)"


def sweep(seq, batch, heads, widths, value_dim, blocks, warps, stages, dtype, causal, repeats, emit=print,
          save=None):
  """The rows of the sweep (see the module docstring); `emit` gets each row's Markdown line as it is measured and
  `save` (if given) the rows so far, so that a run cut short keeps them."""
  from attngeo.kernels import pallas
  rows = []
  for d in widths:
    args, program = problem(batch, seq, heads, d, value_dim, dtype, causal)
    want = program("blockwise", None)(*args)
    for block, nw, ns in itertools.product(blocks, warps, stages):
      row = dict(width=d, block=block, warps=nw, stages=ns, seconds=math.nan, tflops=None, err=None, status="ok")
      try:
        with pallas.triton_params(num_warps=nw, num_stages=ns), pallas.unbounded_tiles():
          call = program("pallas", block)
        got = call(*args)
        row["err"] = relative_error(got, want)
        row["seconds"] = timing.median_seconds(lambda: call(*args), repeats)
        row["tflops"] = flops(batch, heads, seq, seq, d, value_dim, causal) / row["seconds"] / 1e12
      except Exception as e:  # noqa: BLE001 — a configuration Triton rejects is reported in its row
        row["status"] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
      rows.append(row)
      emit(report.markdown([row], COLS).splitlines()[-1])
      if save is not None:
        save(rows)
  return rows


def best(rows, tolerance: float) -> list[str]:
  """'D=…: fastest correct …' per width (err ≤ tolerance)."""
  out = []
  for d in dict.fromkeys(r["width"] for r in rows):
    ok = [r for r in rows if r["width"] == d and r["err"] is not None and r["err"] <= tolerance
          and math.isfinite(r["seconds"])]
    if ok:
      r = min(ok, key=lambda r: r["seconds"])
      out.append(f"D={d}: fastest correct block {r['block']}, warps {r['warps']}, stages {r['stages']}: "
                 f"{1e3 * r['seconds']:.2f} ms ({r['tflops']:.1f} TFLOP/s)")
    else:
      out.append(f"D={d}: no configuration ran within err ≤ {tolerance:g}")
  return out


def add_grid_arguments(p, widths: str) -> None:
  """The layout grid both Pallas sweeps take (this one and `triton_resources`), checked by `check_grid`: head
  widths (default `widths`), value width, blocks, warps, stages and the operands' dtype."""
  p.add_argument("--widths", type=config.int_list, default=widths, help="augmented head widths D, comma-separated")
  p.add_argument("--value-dim", type=config.positive_int, default=64, help="value width E")
  p.add_argument("--blocks", type=config.int_list, default="32,64,128",
                 help="block sizes (bq = bk), powers of two 16…128")
  p.add_argument("--warps", type=config.int_list, default="4,8", help="Triton num_warps values")
  p.add_argument("--stages", type=config.int_list, default="2,3", help="Triton num_stages values")
  p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                 help="q, k, v dtype (float32 runs as TF32 on the tensor cores, with twice the operand bytes)")


def parser():
  p = config.parser("attngeo bench-pallas", __doc__, show_defaults=True)
  p.add_argument("--seq", type=config.positive_int, default=4096, help="queries = keys")
  p.add_argument("--batch", type=config.positive_int, default=8, help="sequences per call")
  p.add_argument("--heads", type=config.positive_int, default=8, help="attention heads")
  add_grid_arguments(p, widths="64,256")
  p.add_argument("--causal", action="store_true", help="the lower-triangular order")
  p.add_argument("--repeats", type=config.positive_int, default=5, help="timed runs per configuration (median)")
  p.add_argument("--interpret", action="store_true", help="allow CPU (interpret mode: a dry run, not a timing)")
  p.add_argument("--out", type=config.out_folder, default="runs/pallas_blocks", help="output folder")
  return p


def main(argv=None):
  a = parser().parse_args(argv)
  widths, blocks, warps, stages = a.widths, a.blocks, a.warps, a.stages
  check_grid(widths, blocks, warps, stages, width_max=512, value_dim=a.value_dim)
  with runlock.hold(a.out):                     # one process per --out, refused before any work
    return run(a, widths, blocks, warps, stages)


def run(a, widths, blocks, warps, stages) -> int:
  """The sweep of `main`'s checked arguments `a`, its tables in `a.out` after every row."""
  import jax
  backend = jax.default_backend()
  if backend == "cpu" and not a.interpret:
    raise ValueError("the sweep times Triton on a GPU; on CPU pass --interpret for a dry run")
  print(f"backend={backend} device={jax.devices()[0].device_kind} seq={a.seq} batch={a.batch} heads={a.heads} "
        f"E={a.value_dim} dtype={a.dtype} causal={a.causal}", flush=True)
  print("\n".join(report.markdown([], COLS).splitlines()[:2]), flush=True)
  tolerance = 2e-2 if a.dtype == "bfloat16" else 2e-3       # bf16 operands ~2⁻⁸; TF32 products ~1e-3

  total = len(widths) * len(blocks) * len(warps) * len(stages)

  def save(rows):
    note = "\n".join([partial_note(len(rows), total, "configurations")] * (len(rows) < total) + best(rows, tolerance))
    report.write(a.out, "pallas_blocks", rows, COLS, note=note, quiet=True,
                 payload={"config": vars(a), "backend": backend, "complete": len(rows) == total, "rows": rows})
  rows = sweep(a.seq, a.batch, a.heads, widths, a.value_dim, blocks, warps, stages, a.dtype, a.causal, a.repeats,
               emit=lambda line: print(line, flush=True), save=save)
  print("\n".join(best(rows, tolerance)))
  report.wrote(a.out, "pallas_blocks.md", "pallas_blocks.csv", "pallas_blocks.json")
  return 0


if __name__ == "__main__":                      # `python -m`: the same command, through the CLI's error handling
  from attngeo import cli
  sys.exit(cli.main(["bench-pallas", *sys.argv[1:]]))
