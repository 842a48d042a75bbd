"""What an attention kernel's time is made of on XLA:CPU, measured by the profiler, beside its product count.

    python -m attngeo.experiments.time_parts [--operators ATTN,DMAP,DMTN,ATAP,CMAP] [--seqs 256,2048]
                                             [--batches 8,4] [--implementation NAME] [--causal] [--calls 3]
                                             [--program grad|value|tanh]

For each length: a jitted forward + backward of every operator on the kernel the dispatcher picks
(`operators.transport`; CMAP `operators.magnetic_transport`) or on `--implementation`, 8 heads of 64, float32.
`--program` says which (`PROGRAMS`): "grad", the gradient of Σ w ⊙ y in q, k, v, a loss linear in y as `attngeo
bench`'s Σ y is — on the einsum kernel, whose backward forms its softmax term from P and P̄ = ȳ·vᵀ, y is then never
needed and XLA drops its product P·v (the blockwise kernel's backward reads y: Σ ȳ ⊙ y); "value", that loss and its
gradient (`jax.value_and_grad`: y is formed); "tanh", the gradient of Σ w ⊙ tanh(y), whose backward reads y as a
following layer's would. The calls are timed interleaved (`timing.interleaved_seconds`, fastest of `--calls`), then
each is run `--calls` times under `jax.profiler.trace`. XLA:CPU runs a program as thunks, one trace event each,
named for its HLO instruction; their times are summed by kind:

* products — dot fusions (YNNPACK's `ynn_fusion…`, Eigen's `dot…`);
* moves — fusions named for a slice, dynamic-update-slice, copy, transpose, concatenate or pad;
* elementwise — every other fusion: exp, the softmax's reductions, masks, the cotangents' passes.

XLA:CPU runs independent thunks side by side on its threads; a moment's time is split evenly among the ops running
then (`shared_seconds`), so the three parts add up to the time any op ran, and `between` is the rest of the wall
time (loop control, launching thunks; the fastest timed call less the profiled calls' mean, so it can dip below 0).
`elementwise MiB` is what the elementwise passes read and write per call (`elementwise_bytes`: each pass's operands
and output from the compiled HLO, × the times the profile saw it run): XLA:CPU fuses elementwise work into loops
with one output, each reading its operands from memory, so a member that needs more n × n arrays per block pays in
passes over memory more than in arithmetic. The last column, the products-only bound, is what the member would read
against ATTN if its elementwise passes and moves cost what ATTN's do (`bound`). XLA names a fusion for some of its
instructions: a transpose fused into an elementwise pass counts as elementwise. `units` counts the program's
products from its jaxpr (`product_flops`) in n × n × d units (2·b·h·n²·d FLOPs, d the head width; a length that is
not a whole number of blocks is padded to one, and the padded work is counted: 27.9 units for ATTN at 513 keys; P·v
is counted in every program, also where XLA drops it); "—" under `--causal`, whose kernels skip the dead blocks
inside a `lax.cond` that a count of the program cannot see through. Read each part against ATTN's (the `× ATTN`
columns). `WIDE` (not a default) is ATTN's kernel on q, k twice as wide, [q, k] and [k, q], with v as ATTN's: the
SDPA the augmented heads run (its 9 units against ATTN's 6), less their mixing of q and k, key bias and overflow
mend, and with its q̄, k̄ 2·d wide. Runs with glibc's huge pages, as `attngeo` does; CPU only (the names are
XLA:CPU's).
"""
from __future__ import annotations

import glob
import os
import re
import sys
import tempfile
from typing import NamedTuple

OPERATORS = ("ATTN", "DMAP", "DMTN", "ATAP", "CMAP")
WIDE = "WIDE"          # plain attention on 2·d-wide q, k: the SDPA the augmented heads run (`_program`)
PROGRAMS = ("grad", "value", "tanh")
KINDS = ("products", "elementwise", "moves")
_PRODUCT = ("ynn", "dot", "convolution")
_MOVE = ("slice", "dynamic-slice", "dynamic-update-slice", "copy", "transpose", "concatenate", "pad", "reverse")
_CONTROL = ("while", "cond", "conditional", "call", "case")   # span their bodies' thunks: not ops of their own
_HLO_NAME = re.compile(r"^[a-z][\w\-]*(\.[\w\-]+)*$")      # "ynn_fusion.7", "cond.1.clone"; not "end: copy.2"


def product_flops(jaxpr) -> int:
  """2·(output size)·(contracted size) over every dot_general of a jaxpr and its sub-jaxprs, a scan's (or
  `lax.map`'s) body counted `length` times; `cond` branches skipped (the overflow mend's rerun,
  `operators._mend_overflow`, runs only on overflow). The product count of a kernel's program."""
  import numpy as np
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "cond":
      continue
    if eqn.primitive.name == "dot_general":
      (lc, _), _ = eqn.params["dimension_numbers"]
      out, lhs = eqn.outvars[0].aval.shape, eqn.invars[0].aval.shape
      total += 2 * int(np.prod(out)) * int(np.prod([lhs[i] for i in lc]))
    times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (tuple, list)) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          total += times * product_flops(sub)
  return total


def kind(name: str) -> str | None:
  """The kind (`KINDS`) of a thunk named `name` ("ynn_fusion.7", "subtract_exponential_fusion.2",
  "dynamic-slice_bitcast_fusion"), or None for an event that is not one op: a loop or a `lax.cond` ("while.16",
  "cond.38", whose events span their bodies' thunks), the executor's own ("ThunkExecutor::Execute")."""
  if not _HLO_NAME.match(name):
    return None
  parts = name.split(".")[0].split("_")
  if parts[0] in _CONTROL:
    return None
  if any(p in _PRODUCT for p in parts):
    return "products"
  if any(p in _MOVE for p in parts):
    return "moves"
  return "elementwise"


def shared_seconds(intervals) -> dict[str, float]:
  """{kind: seconds} of (start, end, kind) intervals, each moment's time split evenly among the intervals running
  then: two ops side by side take half of it each, so the kinds add up to the time any op ran."""
  totals = dict.fromkeys(KINDS, 0.0)
  edges = sorted([(s, 1, k) for s, _, k in intervals] + [(e, -1, k) for _, e, k in intervals],
                 key=lambda edge: (edge[0], edge[1]))
  running, count, before = dict.fromkeys(KINDS, 0), 0, None
  for at, step, k in edges:
    if count:
      for kk, c in running.items():
        totals[kk] += (at - before) * c / count
    running[k] += step
    count += step
    before = at
  return totals


def op_events(trace_dir: str) -> list[tuple[float, float, str]]:
  """(start, end seconds, name) of the op events (`kind` not None) of every profile under `trace_dir`
  (`jax.profiler.trace`)."""
  from jax.profiler import ProfileData
  events = []
  for path in glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True):
    for plane in ProfileData.from_file(path).planes:
      for line in plane.lines:
        if line.name == "python":          # the Python tracer's calls (shard_args, …): not the program's thunks
          continue
        events += [(e.start_ns * 1e-9, e.end_ns * 1e-9, e.name) for e in line.events if kind(e.name) is not None]
  return events


def op_seconds(trace_dir: str) -> dict[str, float]:
  """{kind: seconds} of the op events under `trace_dir` (`op_events`), the time of ops that ran side by side shared
  among them (`shared_seconds`)."""
  return shared_seconds([(start, end, kind(name)) for start, end, name in op_events(trace_dir)])


class Profile(NamedTuple):
  """A program's profile, per call: `seconds` {kind: seconds} (`op_seconds`) and `runs` {op name: times run}."""
  seconds: dict
  runs: dict


def profile(call, calls: int) -> Profile:
  """The `Profile` of `call()` (a compiled program's call; its result blocked on) run `calls` times under
  `jax.profiler.trace`."""
  import collections

  import jax
  with tempfile.TemporaryDirectory(prefix="attngeo-time-parts-") as trace_dir:
    with jax.profiler.trace(trace_dir):
      for _ in range(calls):
        jax.block_until_ready(call())
    events = op_events(trace_dir)
  seconds = shared_seconds([(start, end, kind(name)) for start, end, name in events])
  runs = collections.Counter(name for _, _, name in events)
  return Profile({k: s / calls for k, s in seconds.items()}, {name: r / calls for name, r in runs.items()})


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
                "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = ")


def _array_bytes(shape: str) -> int:
  """Bytes of an HLO shape ("f32[8,512]{1,0}", or a tuple of them: summed)."""
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    size = _DTYPE_BYTES[dtype]
    for d in filter(None, dims.split(",")):
      size *= int(d)
    total += size
  return total


def _closing(text: str, start: int) -> int:
  """The index of the parenthesis that closes the one at `start`."""
  depth = 0
  for i in range(start, len(text)):
    depth += {"(": 1, ")": -1}.get(text[i], 0)
    if depth == 0:
      return i
  return len(text)


def pass_bytes(hlo_text: str) -> dict[str, int]:
  """{instruction: bytes it reads and writes} over an HLO module's text (`compiled.as_text()`): its output's size plus
  each distinct operand's, whole. An elementwise pass reads every operand once and writes its output once, so this
  is its memory traffic; a pass that reads only part of an operand (a fused slice) is over-counted."""
  lines = hlo_text.splitlines()
  sizes, operands = {}, {}
  for line in lines:
    m = _INSTRUCTION.match(line)
    if not m:
      continue
    rest = line[m.end():]
    end = _closing(rest, 0) + 1 if rest.startswith("(") else rest.find(" ")
    sizes[m.group(1)] = _array_bytes(rest[:end])
    call = rest.find("(", end)
    if call >= 0:
      args = re.sub(r"/\*.*?\*/", "", rest[call + 1:_closing(rest, call)])
      operands[m.group(1)] = set(re.findall(r"%([\w.\-]+)", args))
  return {name: sizes[name] + sum(sizes.get(o, 0) for o in operands.get(name, ())) for name in sizes}


class Row(NamedTuple):
  """One operator at one length: wall seconds (fastest call), product units, and op seconds per call by kind."""
  keys: int
  batch: int
  operator: str
  kernel: str
  wall: float
  units: float | None            # None under the causal order: its kernels skip dead blocks inside `lax.cond`
  parts: dict
  traffic: float = 0.0           # bytes per call the elementwise passes read and write (`elementwise_bytes`)


def elementwise_bytes(runs: dict, hlo_text: str) -> float:
  """Bytes the elementwise passes of a program read and write per call: Σ over its elementwise ops (`kind`) of the
  times each ran (`Profile.runs`) × its traffic (`pass_bytes` of the program's HLO). XLA:CPU fuses elementwise work
  into one-output loops that read their operands from memory and write their output to it, and an n × n block
  holds 4 MiB per [b, h] = [1, 1] at 1024 keys: this is what such passes cost, more than their arithmetic."""
  traffic = pass_bytes(hlo_text)
  return float(sum(times * traffic.get(name, 0) for name, times in runs.items() if kind(name) == "elementwise"))


def _program(operator: str, n: int, batch: int, heads: int, head_dim: int, implementation, causal: bool,
             program: str = "grad"):
  """(the jitted `program` (`PROGRAMS`), its arguments, the kernel's name) of `operator` at `n` keys."""
  import jax
  import jax.numpy as jnp

  from attngeo import kernels, operators as op
  ks = jax.random.split(jax.random.PRNGKey(0), 4)
  q, k, v, w = (0.3 * jax.random.normal(key, (batch, n, heads, head_dim)) for key in ks)
  if operator == WIDE:          # q, k as [q, k] and [k, q]: ATTN's kernel at the augmented heads' width, v as wide
    name = kernels.choose("softmax", implementation, n) + ", 2·d heads"
    f = lambda q2, k2, v: kernels.attention(q2, k2, v, causal=causal, scale=head_dim ** -0.5,
                                            implementation=implementation)
    q, k = jnp.concatenate([q, k], -1), jnp.concatenate([k, q], -1)
  elif operator == "CMAP":
    name = kernels.choose("magnetic", implementation, n)
    f = lambda q, k, v: op.magnetic_transport(q, k, v, causal=causal, implementation=implementation)
  else:
    beta, alpha = op.corner(operator)
    split = op.split_kernel(beta, alpha, implementation, n, causal=causal, batch_heads=batch * heads,
                            heads=batch * heads)
    name = op.SPLIT_KERNELS.get(split, kernels.choose("softmax", implementation, n))
    if split is None and operator in ("DMTN", "ATAP"):
      name += ", augmented"                          # the 2·d-wide heads (`operators.augment`)
    f = lambda q, k, v: op.transport(q, k, v, beta=beta, alpha=alpha, causal=causal, implementation=implementation)
  if program not in PROGRAMS:
    raise ValueError(f"program must be one of {', '.join(PROGRAMS)}; got {program!r}")
  if program == "tanh":
    loss = lambda q, k, v, w: jnp.sum(jnp.tanh(f(q, k, v)) * w)
  else:
    loss = lambda q, k, v, w: jnp.sum(f(q, k, v) * w)
  differentiate = jax.value_and_grad if program == "value" else jax.grad
  return jax.jit(differentiate(loss, (0, 1, 2))), (q, k, v, w), name


def measure(n: int, batch: int, operators=OPERATORS, *, implementation=None, causal: bool = False, calls: int = 3,
            heads: int = 8, head_dim: int = 64, program: str = "grad") -> list[Row]:
  """A `Row` per operator at `n` keys (module docstring): the calls timed interleaved, then each profiled."""
  import jax

  from attngeo.experiments import timing
  programs = {name: _program(name, n, batch, heads, head_dim, implementation, causal, program) for name in operators}
  compiled = {name: g.lower(*args).compile() for name, (g, args, _) in programs.items()}
  wall = timing.interleaved_seconds({name: (lambda c=c, a=programs[name][1]: c(*a)) for name, c in compiled.items()},
                                    calls)
  unit = 2 * batch * heads * n * n * head_dim
  rows = []
  for name, (grad, args, kernel) in programs.items():
    units = None if causal else product_flops(jax.make_jaxpr(grad)(*args).jaxpr) / unit
    prof = profile(lambda c=compiled[name], a=args: c(*a), calls)
    traffic = elementwise_bytes(prof.runs, compiled[name].as_text())
    rows.append(Row(n, batch, name, kernel, min(wall[name]), units, prof.seconds, traffic))
  return rows


def table(rows: list[Row], header: bool = True) -> str:
  """A Markdown table of `rows`: milliseconds, and each part ÷ ATTN's at the same length (when ATTN was run);
  `header=False` gives the rows alone, to follow a table already printed."""
  head = ("| keys | batch | operator | kernel | wall ms | × ATTN | units | products ms | elementwise ms | moves ms | "
          "between ms | elementwise MiB | products × ATTN | elementwise × ATTN | its bytes × ATTN | moves × ATTN | "
          "products-only bound |")
  lines = [head, "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"] if header else []
  base = {r.keys: r for r in rows if r.operator == "ATTN"}
  ratio = lambda x, y: f"{x / y:.2f}" if y > 0 else "—"
  ms = lambda seconds: f"{seconds * 1e3 + 0.0:.1f}".replace("-0.0", "0.0")
  for r in rows:
    b = base.get(r.keys)
    cells = [ms(r.parts[k]) for k in KINDS] + [ms(r.wall - sum(r.parts.values())), f"{r.traffic / 2**20:.0f}"]
    cells += [ratio(r.parts[k], b.parts[k]) if b else "—" for k in KINDS[:2]]
    cells += [ratio(r.traffic, b.traffic) if b else "—", ratio(r.parts["moves"], b.parts["moves"]) if b else "—"]
    cells.append(ratio(bound(r, b), b.wall) if b else "—")
    units = "—" if r.units is None else f"{r.units:.2f}"
    lines.append(f"| {r.keys} | {r.batch} | {r.operator} | {r.kernel} | {ms(r.wall)} | "
                 f"{ratio(r.wall, b.wall) if b else '—'} | {units} | {' | '.join(cells)} |")
  return "\n".join(lines)


def bound(row: Row, attn: Row) -> float:
  """Seconds `row` would take if its elementwise passes and moves cost what `attn`'s do: its wall less their excess
  (÷ ATTN's wall: the products-only bound, what the member's products alone allow against ATTN)."""
  return row.wall - sum(row.parts[k] - attn.parts[k] for k in ("elementwise", "moves"))


def _names(text: str) -> tuple[str, ...]:
  """argparse type: comma-separated operators of `OPERATORS` or `WIDE`, any case, each once."""
  from attngeo import config
  return tuple(dict.fromkeys(config.choice_list(OPERATORS + (WIDE,))(text.upper())))


def main(argv=None):
  from attngeo import config
  from attngeo.experiments import timing
  ap = config.parser("python -m attngeo.experiments.time_parts", __doc__)
  ap.add_argument("--operators", type=_names, default=OPERATORS,
                  help=f"comma-separated operators (default {','.join(OPERATORS)}); {WIDE}: ATTN's kernel on q, k "
                       "twice as wide (v as ATTN's), the SDPA that DMTN and ATAP's augmented heads run, without "
                       "their mixing of q and k, key bias or overflow mend")
  timing.add_lengths(ap, [256, 2048], [8, 4])
  ap.add_argument("--implementation", choices=("einsum", "blockwise"), default=None,
                  help="the kernel every operator runs on (default: the dispatcher's choice per operator and length); "
                       "not pallas, which runs in interpret mode on CPU and whose products a jaxpr count cannot see")
  ap.add_argument("--causal", action="store_true", help="causal order (default: none)")
  ap.add_argument("--calls", type=config.positive_int, default=3,
                  help="timed and profiled calls of each program (default 3)")
  ap.add_argument("--program", choices=PROGRAMS, default="grad",
                  help="grad: the gradient of Σ w ⊙ y, linear in y as `attngeo bench`'s loss is (on the einsum "
                       "kernel y itself is never formed); value: that loss and its gradient; tanh: the gradient of "
                       "Σ w ⊙ tanh(y), whose backward reads y (default grad)")
  a = ap.parse_args(argv)
  timing.check_lengths(ap, a, arrays=8, width=8 * 64)           # q, k, v, w and three gradients, 8 heads of 64
  from attngeo import hugepages
  hugepages.reexec()
  printed = False
  from attngeo import interrupts
  try:
    with interrupts.as_interrupts():          # SIGTERM as Ctrl-C; neither lost in an import or a gc callback
      timing.start_jax(ap, cpu_only=True)
      for n, batch in zip(a.seqs, a.batches):
        rows = measure(n, batch, a.operators, implementation=a.implementation, causal=a.causal, calls=a.calls,
                       program=a.program)
        print(table(rows, header=not printed), flush=True)
        printed = True
  except KeyboardInterrupt as stop:                 # Ctrl-C, or SIGTERM (`interrupts.Terminated`)
    return interrupts.rows_kept(ap.prog, from_shell=argv is None, printed=printed, stop=stop)
  except Exception as e:                            # a full TMPDIR under the profile: one line, the rows kept
    if "No space left" not in str(e):
      raise
    ap.exit(2, f"{ap.prog}: error: no space left for the profile in {tempfile.gettempdir()} (set TMPDIR to a folder "
               "with room); the rows printed above are complete\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
