"""Forward+backward time and peak memory of every operator under every attention kernel.

    attngeo bench [--seqs 256,1024,4096] [--batch 8] [--heads 8] [--head-dim 64] [--repeats 3]
                  [--operators ATTN,DMAP,DMTN,ATAP,CMAP] [--implementations einsum,xla,cudnn,blockwise,pallas,paired]
                  [--long 16384] [--dtype float32|bfloat16] [--causal] [--interpret] [--numerics] [--out DIR]

For each (seq, operator, implementation) it prints the fastest wall time of a jitted
`grad(sum(transport(q, k, v)))` over `--repeats` runs, the compiled program's peak memory
(XLA's memory analysis: arguments + outputs + temporaries), and the ratio to the fastest
standard-attention (ATTN) path at that sequence length. The runs of one sequence length are
interleaved (run r of every cell before run r + 1 of any), so load from other jobs on a shared
machine falls on all of them alike: timed one cell after another, ratios moved by up to 2×. "× ATTN,
paired" is the median of the run-by-run ratios to ATTN on the same kernel (run r of each, timed in one
round), with a distribution-free 95 % interval from 6 repeats on (`timing.paired_ratio`; "paired" in the JSON
and CSV: [median, low, high], the bounds null below 6 repeats): the fastest runs' ratio takes each cell's best
moment, which at 1024 keys moved a 1.00 ratio to 1.04 between two runs. Cells are
grouped by kernel (ATTN first) and a group holds programs whose summed peak memory is at most half
the machine's (the host's RAM on CPU, the device's memory on an accelerator; `interleaved_with` in the JSON says how many cells shared a group): at 4096 keys the
dense kernels' programs (13–17 GiB each) are timed one at a time, and a program whose peak exceeds
three quarters of the machine's memory (dense CMAP at 4096 keys, 21 GiB) is not run: its row says
so, with the memory it would need. The process is bounded too: every cell of a length times one set of
inputs, and a program is not run when the process's resident memory plus its peak would pass that
limit (its row says so). XLA's analysis is a floor, not a bound (XLA's SDPA at 4096 keys: 13 GiB by the
analysis, 22 GiB held), so on the CPU the process's data segment is capped too while the cells run
(RLIMIT_DATA: it may grow by the room left under that limit): a program that allocates past it fails with a
runtime error and its row says so; "RSS growth" is how far the process's resident memory rose during the
cell's first run. "Runs on" names the kernel that ran: the implementation, or a split kernel where
`transport` takes it instead of the augmented heads (`operators.split_kernel`: ATAP "split" on the einsum path
below 512 keys, DMAP "gram" on it up to 384; blockwise, unmasked, not causal, ATAP "split_kept" up to 1024 keys
and "split_paired" for ATAP and DMAP from 4 tiles and DMTN from 16 where b·h ≥ 17). `--implementations` restricts the kernels (the ratios are then
to the fastest ATTN among them). CMAP, the magnetic operator
(`operators.magnetic_transport`, coupling 1, β = 0), runs on its own kernels (einsum, blockwise and
the Hermitian pairing "paired", which computes each unordered token pair once: `attngeo.kernels.paired`);
the note under the table gives its ratio to ATTN per sequence length. `--long N` adds the blockwise
path at batch 1, seq N, where a materialised P alone would need b·h·N²·4 bytes. Writes
bench_operators.{md,csv,json}; the Markdown's note names the backend, dtype, order and repeats, and every row carries
its dtype and repeats. One process per `--out` (`attngeo.runlock`): a second run there is refused before any work
(two runs side by side would also time each other's load). Repeated `--seqs`, `--operators` or `--implementations`
are timed once.

"pallas" (`attngeo.kernels.pallas`) is timed by default for the family on GPU (Triton) and TPU (Mosaic), for
CMAP (`attngeo.kernels.pallas_phase`) only when named;
on CPU it runs only when named with `--interpret` (interpret mode: a dry run of the script, not a timing).
When it is timed, the note gives each operator's Pallas time ÷ its xla / cudnn / blockwise time.

`--numerics` times nothing: for every family member and kernel it writes bench_numerics.{md,csv,json},
the error of the kernel's output y and gradients (dq, dk, dv of Σ w ⊙ y, w fixed Gaussian) on bfloat16
inputs and on float32 inputs against the einsum kernel in float32 at `highest` matmul precision on the
same (bf16-representable) values: `max |x − x_ref| / max |x_ref|` per array, the gradients' maximum over
dq, dk, dv (bf16 rounding of y alone is 2⁻⁸ ≈ 3.9e-3; TF32 products on GPU show in the float32 column).
"""
from __future__ import annotations

import gc
import math
import os

from attngeo import config, runlock
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col

CORNERS = ("ATTN", "DMAP", "DMTN", "ATAP")
OPERATORS = CORNERS + ("CMAP",)
IMPLEMENTATIONS = ("einsum", "xla", "cudnn", "blockwise", "pallas", "paired")    # paired: CMAP only
PALLAS_BACKENDS = ("gpu", "tpu")                # compiled there; "cpu" only in interpret mode (--interpret)


def inputs(b, n, h, d, dtype="float32"):
  """q, k, v [b, n, h, d] of one sequence length, standard normal (seeded): every cell of that length times
  the same arrays, so the process holds one set (at 4096 keys, 15 cells × 192 MiB of copies held 2.8 GiB)."""
  import jax
  import jax.numpy as jnp
  ks = jax.random.split(jax.random.PRNGKey(0), 3)
  return tuple(jax.random.normal(kk, (b, n, h, d), jnp.dtype(dtype)) for kk in ks)


def compiled_call(name, impl, b, n, h, d, block_size=None, dtype="float32", qkv=None, causal=False):
  """(call, peak bytes): the compiled fwd+bwd program of one cell, bound to its inputs (`qkv`, default
  `inputs(b, n, h, d, dtype)`; block_size None: each kernel's default; `causal`: the lower-triangular order)."""
  import jax
  import jax.numpy as jnp

  from attngeo import operators as op
  q, k, v = qkv if qkv is not None else inputs(b, n, h, d, dtype)
  kw = dict(implementation=impl, causal=causal)
  if block_size is not None:
    kw["block_size"] = block_size
  if op.is_magnetic(name):
    def loss(q, k, v):
      return jnp.sum(op.magnetic_transport(q, k, v, coupling=1.0, **kw))
  else:
    beta, alpha = op.corner(name)

    def loss(q, k, v):
      return jnp.sum(op.transport(q, k, v, beta=beta, alpha=alpha, **kw))

  compiled = jax.jit(jax.grad(loss, (0, 1, 2))).lower(q, k, v).compile()
  return (lambda: compiled(q, k, v)), timing.peak_bytes(compiled)


def runs_on(name, impl, n, dtype="float32", causal=False, batch_heads=64) -> str:
  """The kernel a cell runs on: `impl`, or a split kernel where `operators.split_kernel` takes it instead of the
  augmented heads (ATAP on einsum below 512 keys: "split"; DMAP on einsum up to 384 keys: "gram"; ATAP blockwise
  on two tiles up to 1024 keys: "split_kept"; blockwise pairs of tiles, ATAP and DMAP from 4 tiles and DMTN from
  16 where `batch_heads`, b·h, is 17 or more: "split_paired")."""
  from attngeo import operators as op
  if op.is_magnetic(name):
    return impl
  split = op.split_kernel(*op.corner(name), impl, n, dtype=dtype, causal=causal, batch_heads=batch_heads,
                          heads=batch_heads)
  return op.SPLIT_KERNELS.get(split, impl)


def measure(name, impl, b, n, h, d, repeats, block_size=None, dtype="float32", causal=False):
  """(fastest seconds, peak bytes) of one cell timed alone."""
  call, mem = compiled_call(name, impl, b, n, h, d, block_size, dtype, causal=causal)
  return min(timing.interleaved_seconds({name: call}, repeats)[name]), mem


def available_impls(name="ATTN", chosen=None, causal=False):
  """The kernels that run `name` on this backend (restricted to `chosen` when given), in timing order; under
  `causal`, not CMAP's Hermitian pairing (it needs the symmetric, unmasked order)."""
  import jax

  from attngeo import operators
  if name in OPERATORS[len(CORNERS):]:
    impls = [i for i in operators.MAGNETIC_IMPLEMENTATIONS if i != "pallas" or chosen is not None]   # only named
  else:
    impls = ["einsum", "xla", "blockwise"]
    if jax.default_backend() == "gpu":
      impls.insert(2, "cudnn")
    if jax.default_backend() in PALLAS_BACKENDS or (chosen is not None and "pallas" in chosen):
      impls.append("pallas")                      # on CPU only when named (main checks --interpret)
  return [i for i in impls if (chosen is None or i in chosen) and not (causal and i == "paired")]


def pallas_ratios(rows) -> list[str]:
  """'OP pallas ÷ xla/cudnn/blockwise a/b/c at seq n' for every operator the Pallas kernel was timed on."""
  out = []
  for n in dict.fromkeys(r["seq"] for r in rows):
    for name in OPERATORS:
      t = {r["implementation"]: r["seconds"] for r in rows if r["seq"] == n and r["operator"] == name}
      if "pallas" in t and math.isfinite(t["pallas"]):
        other = [i for i in ("xla", "cudnn", "blockwise") if i in t]
        ratios = "/".join(f"{t['pallas'] / t[i]:.2f}" for i in other)
        out.append(f"{name} pallas ÷ {'/'.join(other)} {ratios} at seq {n}")
  return out


def numerics(seqs, batch, heads, head_dim, operators=CORNERS, implementations=None, seed=0):
  """Rows of bf16 and float32 errors per (seq, operator, kernel) against float32 einsum at highest precision
  (see the module docstring)."""
  import jax
  import jax.numpy as jnp

  from attngeo import operators as op
  rows = []
  for n in seqs:
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v, w = [jax.random.normal(kk, (batch, n, heads, head_dim)).astype(jnp.bfloat16).astype(jnp.float32)
                  for kk in ks]
    for name in (x for x in operators if x in CORNERS):
      beta, alpha = op.corner(name)

      def outs(impl, dtype, q=q, k=k, v=v, beta=beta, alpha=alpha):
        def loss(q, k, v):
          y = op.transport(q, k, v, beta=beta, alpha=alpha, implementation=impl)
          return jnp.sum(w * y.astype(jnp.float32)), y
        (_, y), g = jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(*(x.astype(dtype) for x in (q, k, v)))
        return [x.astype(jnp.float32) for x in (y, *g)]
      with jax.default_matmul_precision("highest"):
        ref = outs("einsum", jnp.float32)
      rel = lambda got: [float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(got, ref)]
      for impl in available_impls(name, implementations):
        row = dict(seq=n, batch=batch, operator=name, implementation=impl)
        for dtype, tag in ((jnp.bfloat16, "bf16"), (jnp.float32, "f32")):
          try:
            err = rel(outs(impl, dtype))
            row[f"{tag}_y"], row[f"{tag}_grad"] = err[0], max(err[1:])
          except Exception as e:  # noqa: BLE001 — a kernel that rejects the dtype/shape is reported in its row
            row[f"{tag}_y"] = row[f"{tag}_grad"] = float("nan")
            print(f"{name}/{impl}/{n}/{tag}: {type(e).__name__}: {str(e)[:120]}")
        rows.append(row)
  return rows


NUMERIC_COLUMNS = [Col("seq"), Col("batch"), Col("operator"), Col("implementation"),
                   Col("bf16_y", "bf16 y err", ".2e"), Col("bf16_grad", "bf16 grad err", ".2e"),
                   Col("f32_y", "f32 y err", ".2e"), Col("f32_grad", "f32 grad err", ".2e")]


def machine_bytes() -> int:
  """Memory the timed programs live in: the accelerator's allocator limit, else the host's physical memory."""
  import jax
  stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget() -> int:
  """Bytes of compiled programs' peaks that one interleaved group may hold: half the machine's memory."""
  return machine_bytes() // 2


def memory_limit() -> int:
  """Peak bytes above which a cell is not run: three quarters of the machine's memory (the process,
  the inputs and the other live programs need the rest; beyond it Linux kills the whole run)."""
  return machine_bytes() * 3 // 4


def resident_bytes() -> int | None:
  """Bytes held where the timed programs live: the accelerator's allocator (`bytes_in_use`) on a GPU or
  TPU, else this process's resident memory (Linux `/proc/self/statm`); None where it cannot be read."""
  import jax
  if jax.default_backend() != "cpu":
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_in_use")
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return None


def over_limit(peak: int | None) -> str | None:
  """Why a program of `peak` bytes may not run now, or None: what the process already holds (`resident_bytes`)
  plus the program's peak would pass `memory_limit` (each program is bounded by its own check at compile
  time; this bounds the process, which also holds the inputs, the runtime and what the allocator has kept)."""
  rss = resident_bytes()
  if rss is None or peak is None or rss + peak <= memory_limit():
    return None
  return (f"process at {rss / 2**30:.1f} GiB + program {peak / 2**30:.1f} GiB over the "
          f"{memory_limit() / 2**30:.1f} GiB limit")


def process_bound():
  """`timing.bounded_data(memory_limit())` on the CPU, where the timed programs live in this process's memory
  (XLA's analysis of a program's peak is a floor, not a bound: see `time_group`); nothing elsewhere."""
  import contextlib

  import jax
  return timing.bounded_data(memory_limit()) if jax.default_backend() == "cpu" else contextlib.nullcontext()


def groups(cells: list[dict], budget: int) -> list[list[dict]]:
  """Cells (of one kernel) packed in order into groups whose summed peak bytes stay within `budget` (a cell over the
  budget alone is a group of one). The programs of a group stay alive while it is timed, so an
  unbounded group runs a 24 GiB machine out of memory at 4096 keys (12 dense programs of 13–17 GiB)."""
  out, used = [], budget + 1
  for cell in cells:
    need = cell["peak_bytes"] or 0
    if used + need > budget:
      out.append([])
      used = 0
    out[-1].append(cell)
    used += need
  return out


def time_group(group: list[dict], calls: dict, repeats: int, n: int, bound: int | None = None):
  """Warm up every cell of `group` (dropping one that fails, e.g. out of memory under the process bound `bound`,
  bytes of data segment) and time them interleaved. On the CPU each cell's warm-up also measures how far the
  process's resident memory rose above where it stood (`rss_growth_bytes`; XLA's analysis, `peak_bytes`,
  leaves out what its runtime allocates besides: 4 GiB more for the einsum programs at 4096 keys, 9 GiB
  more for XLA's SDPA)."""
  import jax
  from tqdm import tqdm
  ready = {}
  gc.collect()
  for row in group:
    key = (row["operator"], row["implementation"])
    why = over_limit(row["peak_bytes"])            # the group's programs run one at a time
    if why:
      row["skipped"] = why
      tqdm.write(f"{key[0]}/{key[1]}/{n}: not run, {why}")
      continue
    before = timing.status_bytes("VmRSS") if jax.default_backend() == "cpu" and timing.reset_peak() else None
    try:
      jax.block_until_ready(calls[key]())
      ready[key] = calls[key]
    except Exception as e:  # noqa: BLE001 — reported in its row, the others still timed
      row["skipped"] = failure(e, bound)
      tqdm.write(f"{key[0]}/{key[1]}/{n}: {row['skipped']}")
    if before is not None:
      row["rss_growth_bytes"] = max((timing.status_bytes("VmHWM") or before) - before, 0)
  try:
    times = timing.interleaved_seconds(ready, repeats, warmup=0)
  except Exception as e:  # noqa: BLE001 — the group's rows say why they have no time
    times = {}
    for row in group:
      row.setdefault("skipped", failure(e, bound))
  for row in group:
    key = (row["operator"], row["implementation"])
    row["seconds"] = min(times.get(key, [float("nan")]))
    row["interleaved_with"] = len(group)
    attn = times.get(("ATTN", row["implementation"]))
    if row["operator"] != "ATTN" and key in times and attn:         # its kernel's ATTN timed beside it
      ratio = timing.paired_ratio(times[key], attn)               # bounds None (JSON null) below 6 repeats
      row["paired"] = [ratio.median] + [None if math.isnan(x) else x for x in ratio[1:]]


def failure(e: Exception, bound: int | None) -> str:
  """One line for a cell whose program failed (while the data segment was capped, most likely an allocation
  past the cap: the line names the cap, not a cause)."""
  where = f" with the data segment capped at {bound / 2**30:.1f} GiB" if bound else ""
  return f"failed{where}: {type(e).__name__}: {' '.join(str(e).split())[:160]}"


def run(seqs, batch, heads, head_dim, repeats, long_seq, dtype="float32", operators=OPERATORS, implementations=None,
        causal=False):
  from tqdm import tqdm
  rows = []
  names = ("ATTN",) + tuple(x for x in operators if x != "ATTN")     # ATTN always: the ratios' reference
  for n in tqdm(seqs, desc="bench_operators"):
    calls, cells, qkv = {}, [], None                         # the previous length's inputs are freed first
    qkv = inputs(batch, n, heads, head_dim, dtype)
    impls = dict.fromkeys(i for name in names for i in available_impls(name, implementations, causal))
    for impl in impls:                                                              # by kernel, ATTN first
      for name in (x for x in names if impl in available_impls(x, implementations, causal)):
        row = dict(seq=n, batch=batch, operator=name, implementation=impl, kernel=runs_on(name, impl, n, dtype, causal, batch * heads),
                   causal=causal, seconds=float("nan"), peak_bytes=None)
        try:
          calls[name, impl], row["peak_bytes"] = compiled_call(name, impl, batch, n, heads, head_dim, dtype=dtype,
                                                               qkv=qkv, causal=causal)
        except Exception as e:  # noqa: BLE001 — a kernel that rejects the shape (e.g. cuDNN limits) is reported
          tqdm.write(f"{name}/{impl}/{n}: {type(e).__name__}: {str(e)[:120]}")
        if (row["peak_bytes"] or 0) > memory_limit():
          row["skipped"] = f"needs {row['peak_bytes'] / 2**30:.1f} GiB of {memory_limit() / 2**30:.1f} GiB"
          tqdm.write(f"{name}/{impl}/{n}: not run, {row['skipped']}")
          calls.pop((name, impl), None)
        cells.append(row)
    kernels = dict.fromkeys(c["implementation"] for c in cells)
    with process_bound() as bound:
      for group in (g for impl in kernels for g in groups(
          [c for c in cells if c["implementation"] == impl and (c["operator"], c["implementation"]) in calls],
          memory_budget())):
        time_group(group, calls, repeats, n, bound)
        for row in group:                     # free each group's programs before the next one runs
          calls.pop((row["operator"], row["implementation"]), None)
        gc.collect()
    rows += cells
  for n in seqs:
    attn = [r["seconds"] for r in rows if r["seq"] == n and r["operator"] == "ATTN" and r["seconds"] == r["seconds"]]
    for r in rows:
      if r["seq"] == n:
        r["ratio_to_best_attn"] = r["seconds"] / min(attn) if attn else float("nan")
  calls = qkv = None                                         # the long row holds only its own inputs
  if long_seq:
    t, mem = measure("DMTN", "blockwise", 1, long_seq, heads, head_dim, 1, dtype=dtype, causal=causal)
    rows.append(dict(seq=long_seq, batch=1, operator="DMTN", implementation="blockwise",
                     kernel=runs_on("DMTN", "blockwise", long_seq, dtype, causal, heads),
                     causal=causal, seconds=t, repeats=1,
                     peak_bytes=mem,
                     ratio_to_best_attn=float("nan"), dense_p_bytes=heads * long_seq * long_seq * 4))
  return rows


COLUMNS = [Col("seq"), Col("batch"), Col("operator"), Col("implementation"), Col("kernel", "runs on"),
           Col("seconds", "fwd+bwd ms", lambda t: f"{1e3 * t:.1f}"), Col("ratio_to_best_attn", "× best ATTN", ".2f"),
           Col("paired", "× ATTN, paired [95 %]", lambda p: f"{p[0]:.3f}" + (
               f" [{p[1]:.3f}, {p[2]:.3f}]" if p[1] is not None else ""), align="right"),
           Col("peak_bytes", "peak MiB", lambda b: f"{b / 2**20:.0f}"),
           Col("rss_growth_bytes", "RSS growth MiB", lambda b: f"{b / 2**20:.0f}")]


def parser():
  ap = config.parser("attngeo bench", __doc__, show_defaults=True)
  ap.add_argument("--seqs", type=config.int_list, default="256,1024,4096", help="sequence lengths, comma-separated")
  ap.add_argument("--batch", type=config.positive_int, default=8, help="batch size")
  ap.add_argument("--heads", type=config.positive_int, default=8, help="attention heads")
  ap.add_argument("--head-dim", type=config.positive_int, default=64, help="head dimension")
  ap.add_argument("--repeats", type=config.positive_int, default=3, help="timed runs per cell, interleaved with the other cells of its sequence length "
                       "(fastest reported; the paired ratio's 95 %% interval needs 6 or more)")
  ap.add_argument("--operators", type=config.choice_list(OPERATORS), default=None,
                  help=f"operators to time, comma-separated subset of {','.join(OPERATORS)} (default: every one "
                       "with a kernel among --implementations; ATTN is always timed as the reference)")
  ap.add_argument("--implementations", type=config.choice_list(IMPLEMENTATIONS), default=None,
                  help=f"kernels to time, comma-separated subset of {','.join(IMPLEMENTATIONS)} (default: every "
                       "kernel this backend has; ratios are to the fastest ATTN among those timed)")
  ap.add_argument("--long", type=config.nonnegative_int, default=16384,
                  help="sequence length of the blockwise long-sequence row (0 skips it)")
  ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                  help="input dtype (accumulation is float32)")
  ap.add_argument("--causal", action="store_true",
                  help="time the causal (lower-triangular) operators, as GPTs run them: CMAP's Hermitian pairing "
                       "needs the symmetric order and is left out")
  ap.add_argument("--interpret", action="store_true",
                  help="allow --implementations pallas on CPU, in Pallas' interpret mode (a dry run; not a timing)")
  ap.add_argument("--numerics", action="store_true",
                  help="time nothing: bf16 and float32 errors of every family member and kernel against float32 "
                       "einsum at highest precision (bench_numerics.{md,csv,json})")
  ap.add_argument("--out", type=config.out_folder, default="runs/bench", help="output folder for bench_operators.{md,csv,json}")
  return ap


def main(argv=None):
  ap = parser()
  a = ap.parse_args(argv)
  import jax
  backend = jax.default_backend()
  if a.implementations and "pallas" in a.implementations and backend not in PALLAS_BACKENDS and not (
      backend == "cpu" and a.interpret):
    ap.error(f"--implementations pallas needs a GPU or TPU (Triton / Mosaic); this backend is {backend}"
             + (" (add --interpret for a dry run in interpret mode)" if backend == "cpu" else ""))
  if a.numerics and a.causal:
    ap.error("--causal times the causal order; --numerics compares the kernels' errors without it: give one")
  if a.interpret and backend != "cpu":
    ap.error(f"--interpret is for CPU (on {backend} the Pallas kernel is compiled); drop it")
  if a.operators is None:                             # the default: every operator with a kernel among those chosen
    left_out = [x for x in OPERATORS if not available_impls(x, a.implementations, a.causal)]
    a.operators = tuple(x for x in OPERATORS if x not in left_out)
    if left_out and "ATTN" not in left_out:
      print(f"left out: {', '.join(left_out)} (no kernel among --implementations {','.join(a.implementations)})")
  a.seqs, a.operators = list(dict.fromkeys(a.seqs)), tuple(dict.fromkeys(a.operators))   # each cell once
  if a.implementations:
    a.implementations = tuple(dict.fromkeys(a.implementations))
  if a.numerics:
    with runlock.hold(a.out):                       # one process per --out, refused before any work
      rows = numerics(list(a.seqs), a.batch, a.heads, a.head_dim, a.operators, a.implementations)
      report.write(a.out, "bench_numerics", rows, NUMERIC_COLUMNS,
                   note=f"backend={backend}; relative max error against float32 einsum at highest precision")
    return rows
  for name in dict.fromkeys(("ATTN",) + tuple(a.operators)):
    if not available_impls(name, a.implementations, a.causal):
      ap.error(f"--implementations {','.join(a.implementations)} leaves no kernel for {name} on {jax.default_backend()} "
               f"(its kernels here{' under --causal' if a.causal else ''}: {','.join(available_impls(name, causal=a.causal))})")
  with runlock.hold(a.out):                         # one process per --out: a second run would skew the times too
    return _timed(a, backend)


def _timed(a, backend):
  """The timing run of `main` (arguments checked, --out held): rows, the note, the three files."""
  import jax
  setting = f"backend={backend} devices={jax.device_count()} dtype={a.dtype} causal={a.causal} repeats={a.repeats}"
  print(setting)
  rows = run(list(a.seqs), a.batch, a.heads, a.head_dim, a.repeats, a.long, a.dtype, a.operators,
             a.implementations, a.causal)
  for r in rows:
    r["dtype"] = a.dtype
    r.setdefault("repeats", a.repeats)                                  # the --long row is timed once
  notes = [setting]
  if "CMAP" in a.operators:
    best = {n: min((r["ratio_to_best_attn"] for r in rows if r["seq"] == n and r["operator"] == "CMAP"
                    and math.isfinite(r["ratio_to_best_attn"] or float("nan"))), default=float("nan"))
            for n in a.seqs}                                   # skipped cells (memory) carry no ratio
    notes.append("CMAP (magnetic) fwd+bwd ÷ best ATTN: " + ", ".join(f"{v:.2f}× at seq {n}" for n, v in best.items()))
  notes += [f"{r['operator']}/{r['implementation']} at seq {r['seq']} not run: {r['skipped']}"
            for r in rows if "skipped" in r]
  if a.long:
    r = rows[-1]
    notes.append(f"blockwise seq={r['seq']}: peak {r['peak_bytes'] / 2**30:.2f} GiB "
                 f"(a materialised P alone: {r['dense_p_bytes'] / 2**30:.1f} GiB)")
  notes += pallas_ratios(rows)
  note = "; ".join(notes)
  report.write(a.out, "bench_operators", rows, COLUMNS, note=note)
  return rows


if __name__ == "__main__":
  main()
