"""What the Pallas kernels cost a GPU, compiled here without one: shared memory, registers and spills per layout.

    attngeo bench-triton [--kernel softmax|phase] [--widths 64,128,256] [--value-dim 64]
        [--blocks 32,64,128] [--warps 4,8] [--stages 2,3] [--dtype bfloat16|float32] [--arch 90]
        [--triton-python PATH] [--out DIR]

For each augmented head width D (the phase kernel: D and phase heads F = 2·D, as CMAP at d = 64: 64, 128), block (bq = bk),
Triton `num_warps` and `num_stages`, the gradient program of the kernel (`pallas.pallas_sdpa` or
`pallas_phase.pallas_phase_attention`, bf16 or float32, 4096 tokens) is lowered for CUDA on this CPU, and the Triton IR of
each of its three kernels (forward, dk/dv, dq) is taken from the lowered custom call (MLIR bytecode, turned into
text through jaxlib's MLIR with the Triton dialect). That text is compiled by the `triton` package (pip; it
bundles ptxas) for `sm_<arch>` in a subprocess (`--triton-python`, default this interpreter), and ptxas' report
gives registers per thread and spill stores; Triton's metadata gives the shared memory a program asks for. A
program asking for more shared memory than the architecture gives one block (sm_90: 227 KiB) cannot launch:
its row says "too big". Rows with spills run, slower by the local-memory traffic.

These are the compiler's static figures, not times; `attngeo bench-pallas` times the
same grid on a GPU. The Triton here is pip's, not the one XLA links into jaxlib: the passes may differ by a
version, so the figures are close, not exact. Rows marked * are the kernel's default (`pallas.layout`,
`pallas.TRITON`). Writes triton_resources.{md,csv,json}.
"""
from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

from attngeo import config, runlock
from attngeo.experiments import pallas_blocks, report
from attngeo.experiments.report import Col

# The shared memory one thread block may ask for (opt-in maximum), by compute capability: CUDA's tables.
SHARED_BYTES = {80: 166912, 86: 101376, 89: 101376, 90: 232448}
TOKENS = 4096
R = "right"
COLS = [Col("kernel"), Col("D", align=R), Col("E", align=R), Col("block", align=R), Col("warps", align=R),
        Col("stages", align=R), Col("program"), Col("shared", "shared KiB", lambda b: f"{b / 1024:.0f}", align=R),
        Col("registers", align=R), Col("spill", "spill stores B", align=R), Col("verdict")]


def decode(attr: str) -> bytes:
  """The bytes of an MLIR string attribute as printed (`\\XX` hex escapes, `\\\\`, `\\"`, `\\n`, `\\t`)."""
  out, i = bytearray(), 0
  while i < len(attr):
    if attr[i] != "\\":
      out += attr[i].encode()
      i += 1
    elif attr[i + 1] in '\\"':
      out.append(ord(attr[i + 1]))
      i += 2
    elif attr[i + 1] in "nt":
      out.append({"n": 10, "t": 9}[attr[i + 1]])
      i += 2
    else:
      out.append(int(attr[i + 1:i + 3], 16))
      i += 3
  return bytes(out)


def triton_calls(stablehlo: str) -> list[dict]:
  """Each `__gpu$xla.gpu.triton` custom call of a lowered program: {name, warps, stages, ir (bytes)}."""
  import re
  calls = []
  for m in re.finditer(r"custom_call @__gpu\$xla\.gpu\.triton", stablehlo):
    i = stablehlo.index('ir = "', m.end()) + len('ir = "')
    j = i
    while stablehlo[j] != '"':
      j += 2 if stablehlo[j] == "\\" else 1
    tail = stablehlo[j:j + 500]
    calls.append(dict(name=re.search(r'name = "([^"]*)"', tail).group(1),
                      warps=int(re.search(r"num_warps = (\d+)", tail).group(1)),
                      stages=int(re.search(r"num_stages = (\d+)", tail).group(1)), ir=decode(stablehlo[i:j])))
  return calls


def as_text(bytecode: bytes) -> str:
  """Triton IR bytecode as MLIR text, read by jaxlib's MLIR with its Triton dialect."""
  from jax._src.lib.mlir import ir
  from jax._src.lib.triton import dialect
  ctx = ir.Context()
  dialect.register_dialect(ctx)
  with ctx:
    return str(ir.Module.parse(bytecode))


def lowered(kernel: str, d: int, e: int, block: int, warps: int, stages: int, n: int = TOKENS,
            dtype: str = "bfloat16") -> list[dict]:
  """The three Triton kernels of `kernel`'s gradient program (q, k, v in `dtype`, batch 1, one head, n tokens) at
  this layout, each {name, warps, stages, text}; one line if this jaxlib does not emit them as this reads them."""
  import jax
  import jax.numpy as jnp

  from attngeo.kernels import pallas, pallas_phase
  shape = lambda width: jax.ShapeDtypeStruct((1, n, 1, width), jnp.dtype(dtype))
  bias = jax.ShapeDtypeStruct((1, n, 1), jnp.float32)
  if kernel == "softmax":
    f = lambda q, k, v, b: pallas.pallas_sdpa(q, k, v, b, None, False, 0.125, block)
    args = (shape(d), shape(d), shape(e), bias)
  else:
    f = lambda q, k, v, b, qt, kt, c: pallas_phase.pallas_phase_attention(q, k, v, b, qt, kt, c, None, False, 0.125,
                                                                          block)
    args = (shape(d), shape(d), shape(e), bias, shape(2 * d), shape(2 * d), jax.ShapeDtypeStruct((1,), jnp.float32))
  grads = jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32)), range(len(args)))
  with pallas.lowering_target("gpu"), pallas.triton_params(num_warps=warps, num_stages=stages), \
       pallas.unbounded_tiles():
    text = jax.jit(grads).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  calls = triton_calls(text)
  if len(calls) != 3:
    import jaxlib
    raise ValueError(f"found {len(calls)} of the 3 Triton calls (__gpu$xla.gpu.triton) in the "
                     f"lowered program: jaxlib {jaxlib.__version__} emits them another way; this reads jaxlib ≤ 0.10's")
  return [dict(name=c["name"], warps=c["warps"], stages=c["stages"], text=as_text(c["ir"])) for c in calls]


# Runs under --triton-python: JSON [{name, warps, stages, text}] and the arch on stdin; JSON results on stdout.
COMPILE = r"""
import json, os, re, subprocess, sys, tempfile
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
job = json.load(sys.stdin)
arch = job["arch"]
out = []
def compiled(k, folder):
  path = os.path.join(folder, k["name"] + ".ttir")
  with open(path, "w") as f:
    f.write(k["text"])
  try:
    c = triton.compile(path, target=GPUTarget("cuda", arch, 32), options={"num_warps": k["warps"],
                                                                         "num_stages": k["stages"]})
    ptx = os.path.join(folder, "k.ptx")
    with open(ptx, "w") as f:
      f.write(c.asm["ptx"])
    gpu = "sm_%da" % arch if arch >= 90 else "sm_%d" % arch
    r = subprocess.run([get_ptxas(arch).path, "-v", "--gpu-name", gpu, ptx, "-o", ptx + ".o"],
                       capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    return dict(shared=int(c.metadata.shared), registers=int(regs.group(1)) if regs else None,
                spill=sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", r.stderr)), error=None)
  except Exception as e:
    return dict(shared=None, registers=None, spill=None, error=(str(e).splitlines() or [type(e).__name__])[0])
for i, k in enumerate(job["kernels"]):
  folder = os.path.join(job["folder"], str(i))       # the caller's temporary folder: it removes it, killed or not
  os.mkdir(folder)
  out.append(compiled(k, folder))
print(json.dumps(out))
"""


def compile_kernels(kernels: list[dict], arch: int, python: str) -> list[dict]:
  """{shared, registers, spill, error} of each kernel, compiled by `python`'s triton for sm_<arch> in a temporary
  folder of this process (removed here even when the compile is killed with it)."""
  import tempfile
  with tempfile.TemporaryDirectory(prefix="attngeo-triton-") as folder:
    job = json.dumps({"arch": arch, "kernels": kernels, "folder": folder})
    r = subprocess.run([python, "-c", COMPILE], input=job, capture_output=True, text=True)
  if r.returncode != 0:
    last = (r.stderr.strip().splitlines() or ["no output"])[-1]
    raise ValueError(f"--triton-python {python}: compiling failed: {last}")
  try:
    results = json.loads((r.stdout.strip().splitlines() or [""])[-1])
  except ValueError:
    results = None
  if not isinstance(results, list) or len(results) != len(kernels):
    raise ValueError(f"--triton-python {python} printed no compile results: is it a Python with pip's triton?")
  return results


def default_layout(kernel: str, d: int, e: int, dtype: str = "bfloat16") -> tuple[int, int, int]:
  """(block, warps, stages) the kernel uses by default on GPU at this width and operand dtype (`pallas.layout`,
  `pallas.TRITON`)."""
  import numpy as np

  from attngeo.kernels import pallas, pallas_phase
  size = np.dtype("float32" if dtype == "float32" else "float16").itemsize
  if kernel == "softmax":
    block = pallas.layout("gpu", TOKENS, TOKENS, d, e, 512, size)[0]
  else:
    block = pallas_phase.phase_layout("gpu", TOKENS, TOKENS, d, 2 * d, e, 512, size)[0]
  return block, pallas.TRITON["num_warps"], pallas.TRITON["num_stages"]


def verdict(row: dict, arch: int) -> str:
  if row["error"]:
    return f"fails: {row['error'][:100]}"
  if row["shared"] > SHARED_BYTES.get(arch, SHARED_BYTES[90]):
    return "too big: cannot launch"
  return "spills" if row["spill"] else "ok"


def table(kernel, widths, value_dim, blocks, warps, stages, arch, python, dtype="bfloat16", emit=print,
          save=None) -> list[dict]:
  """One row per (width, block, warps, stages, program), each layout's three programs compiled in one subprocess;
  `emit` gets each row's Markdown line and `save` (if given) the rows after each layout."""
  rows = []
  for d in widths:
    default = default_layout(kernel, d, value_dim, dtype)
    for block, nw, ns in itertools.product(blocks, warps, stages):
      programs = lowered(kernel, d, value_dim, block, nw, ns, dtype=dtype)
      for k, res in zip(programs, compile_kernels(programs, arch, python)):
        row = dict(kernel=kernel + ("*" if (block, nw, ns) == default else ""), D=d, E=value_dim, block=block,
                   warps=nw, stages=ns, program=k["name"].removeprefix("attngeo_"), **res)
        row["verdict"] = verdict(row, arch)
        rows.append(row)
        emit(report.markdown([row], COLS).splitlines()[-1])
      if save is not None:
        save(rows)
  return rows


def parser():
  p = config.parser("attngeo bench-triton", __doc__, show_defaults=True)
  p.add_argument("--kernel", choices=("softmax", "phase"), default="softmax",
                 help="softmax: the family's flash kernel (D = the augmented width); phase: CMAP's (F = 2·D)")
  pallas_blocks.add_grid_arguments(p, widths="64,128,256")
  p.add_argument("--arch", type=int, choices=sorted(SHARED_BYTES), default=90,
                 help="compute capability ×10 (90: H100/H200; 80: A100)")
  p.add_argument("--triton-python", default=sys.executable,
                 help="an interpreter with the triton package (pip install triton)")
  p.add_argument("--out", type=config.out_folder, default="runs/triton_resources", help="output folder")
  return p


def main(argv=None):
  a = parser().parse_args(argv)
  widths, blocks, warps, stages = a.widths, a.blocks, a.warps, a.stages
  pallas_blocks.check_grid(widths, blocks, warps, stages, value_dim=a.value_dim)
  try:
    probe = subprocess.run([a.triton_python, "-c", "import triton; print(triton.__version__)"],
                           capture_output=True, text=True)
  except OSError as e:
    raise ValueError(f"--triton-python {a.triton_python or repr('')} cannot run: {e.strerror}") from None
  if probe.returncode != 0 or not re.fullmatch(r"\d+\.\d+\S*", probe.stdout.strip()):
    raise ValueError(f"--triton-python {a.triton_python or repr('')} has no triton package: pip install triton (it bundles "
                     "ptxas; no GPU needed), or name another interpreter with --triton-python")
  header = (f"triton {probe.stdout.strip()}, sm_{a.arch} (shared memory per block ≤ {SHARED_BYTES[a.arch] // 1024} "
            f"KiB), kernel {a.kernel}, {a.dtype}, {TOKENS} tokens; * = the kernel's default layout")
  print(header, flush=True)
  print("\n".join(report.markdown([], COLS).splitlines()[:2]), flush=True)
  total = len(widths) * len(blocks) * len(warps) * len(stages)

  def save(rows):
    layouts = len(rows) // 3
    note = "\n".join([header] + [pallas_blocks.partial_note(layouts, total, "layouts")] * (layouts < total))
    report.write(a.out, "triton_resources", rows, COLS, note=note, quiet=True,
                 payload={"config": vars(a), "triton": probe.stdout.strip(), "complete": layouts == total,
                          "rows": rows})
  with runlock.hold(a.out):                     # one process per --out
    table(a.kernel, widths, a.value_dim, blocks, warps, stages, a.arch, a.triton_python, a.dtype,
          emit=lambda line: print(line, flush=True), save=save)
  report.wrote(a.out, "triton_resources.md", "triton_resources.csv", "triton_resources.json")
  return 0


if __name__ == "__main__":                      # `python -m`: the same command, through the CLI's error handling
  from attngeo import cli
  sys.exit(cli.main(["bench-triton", *sys.argv[1:]]))
