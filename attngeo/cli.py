"""`attngeo` command line: one command per job; each has its own `--help`.

    attngeo COMMAND [--help] [options]          attngeo GROUP SUB [--help] [options]   (lm, sit, study, mlm)

`COMMANDS` is the one table of every command, sub-commands included ("lm train"): each names a function
of `attngeo.experiments` (`main`, or the one after a colon) that takes the arguments after the command's
name and builds its own parser (`attngeo.config.Parser`, options generated from the config dataclass by
`config.add_arguments`). A group is only a prefix of that table. Parsing and
`--help` never import JAX (the command modules import it inside their functions), so help and
argument errors answer at once. A user's mistake (a bad option, a missing file, an invalid
configuration found before work starts) prints one line `attngeo COMMAND: error: …` and exits
with status 2; set `ATTNGEO_DEBUG=1` to see the traceback instead.

Ctrl-C (SIGINT) and SIGTERM (a TPU preemption, `kill PID`) stop a command the same way: `Terminated`, a
`KeyboardInterrupt`, is raised where the signal lands, everything on the way out closes as for Ctrl-C (a
training run waits for its pending checkpoint; a step it had not finished is never a step: orbax commits
a step by renaming its folder), then one line and exit status 130 (128 + SIGINT) or 143 (128 + SIGTERM).
Running the same command again resumes from the last checkpoint. A signal that lands inside an import, or in a
finaliser or JAX's gc callback (where its exception would be swallowed), is sent again until it lands where it
propagates (`interrupts.as_interrupts`).
"""
from __future__ import annotations

import contextlib
import errno
import importlib
import os
import signal
import sys
import warnings

from attngeo import errors, files, hugepages, interrupts
from attngeo.interrupts import Terminated

# One table of every command: "name" or "group sub" -> ("module" (runs its main) or "module:function", what it
# does). Each function takes the argument list after the command's name and builds its own parser (prog
# "attngeo NAME"); a group ("lm", "sit", "study", "mlm") is only a prefix: `attngeo lm` lists its sub-commands.
COMMANDS = {
    "swissroll": ("attngeo.experiments.swissroll", "the Swiss-roll scan: Table 1, Figures 1-2"),
    "swissroll-order": ("attngeo.experiments.swissroll_order", "the order effect: e^H̄ vs set size, depth and budget"),
    "bench": ("attngeo.experiments.bench_operators", "forward+backward time and memory of every operator and kernel"),
    "bench-geometry": ("attngeo.experiments.bench_geometry", "dense vs matrix-free Gamma_2 time and memory"),
    "bench-train": ("attngeo.experiments.bench_train", "GPT training step time per operator"),
    "heat": ("attngeo.experiments.heat_swissroll", "heat flow of a Gaussian Markov walk on a Swiss roll (Figure 1)"),
    "curvature": ("attngeo.experiments.curvature", "Bakry-Emery estimators against the sphere and torus"),
    "diffmap": ("attngeo.experiments.diffmap", "exact matrix-free diffusion map of a point cloud, with residuals"),
    "bench-diffmap": ("attngeo.experiments.bench_diffmap", "diffusion maps vs dense float64 eigsh and datafold by N"),
    "probe": ("attngeo.experiments.probe", "per-layer Markov/Bakry-Emery/connection diagnostics of a checkpoint"),
    "import": ("attngeo.experiments.import_export:import_main", "a nanochat, GPT-2, BERT or ALBERT checkpoint as a run folder"),
    "export": ("attngeo.experiments.import_export:export_main", "a run's model back to its public layout"),
    "sit train": ("attngeo.experiments.sit:train_main", "train a class-conditional SiT"),
    "sit sample": ("attngeo.experiments.sit:sample_main", "sample a grid from a run folder"),
    "sit transfer": ("attngeo.experiments.sit:transfer_main", "the ATTN -> DMTN -> DMAP transfer (Figures 3-5)"),
    "sit import": ("attngeo.experiments.sit:import_main", "an official SiT/DiT checkpoint as a run folder"),
    "lm train": ("attngeo.experiments.lm:train_main", "train a GPT on text (resumes a killed run)"),
    "lm eval": ("attngeo.experiments.lm:eval_main", "bpb, induction, DAC probe and CORE of a run"),
    "lm sample": ("attngeo.experiments.lm:sample_main", "sample text from a run (KV-cached)"),
    "lm table2": ("attngeo.experiments.lm:table2_main", "the seed's Table 2 at this machine's scale"),
    "lm ladder": ("attngeo.experiments.lm:ladder_main", "Table 2's protocol at several depths (the scale ladder)"),
    "lm adapt": ("attngeo.experiments.lm_adapt:main", "the seed's Table 3: sequential adaptation along a chain"),
    "bench-probe": ("attngeo.experiments.bench_probe", "probe time and memory at the d12 shape; training-hook overhead"),
    "bench-regularisers": ("attngeo.experiments.bench_regularisers",
                           "train-step cost of each geometry regulariser as a ratio to the plain step"),
    "bench-pallas": ("attngeo.experiments.pallas_blocks",
                     "the Pallas kernel's blocks x warps x stages timed on a GPU, each checked against blockwise"),
    "bench-triton": ("attngeo.experiments.triton_resources",
                     "the Pallas kernels compiled for a GPU here: shared memory, registers, spills per layout"),
    "study connection": ("attngeo.experiments.study_connection",
                         "connection-walk stability and isometry defects across sizes, trained vs random init"),
    "study curvature": ("attngeo.experiments.study_curvature",
                        "Swiss-roll models trained with a curvature or reversibility term vs without"),
    "mlm eval": ("attngeo.experiments.mlm:eval_main", "masked-LM loss and accuracy of BERT/ALBERT runs on SMILES"),
    "mlm transfer": ("attngeo.experiments.mlm_transfer", "the seed's transfer protocol on a pretrained BERT: graft, "
                     "adapt on MOSES, fold, adapt"),
}
GROUPS = {"sit": "SiT on images, the ATTN->DMTN->DMAP transfer (Figures 3-5), SiT/DiT import",
          "lm": "language models: bpb, induction, DAC, CORE; Table 2; adaptation (Table 3)",
          "study": "studies that train, probe and compare models across sizes",
          "mlm": "masked-LM evaluation of BERT/ALBERT runs and the transfer protocol on them"}


def subcommands(group: str) -> tuple[str, ...]:
  """The sub-commands of `group`, in table order."""
  return tuple(name.split()[1] for name in COMMANDS if name.split()[0] == group and " " in name)


def group_usage(group: str) -> str:
  subs = [name for name in COMMANDS if name.startswith(group + " ")]
  width = max(len(n) for n in subs) + 2
  return "\n".join([f"usage: attngeo {group} {{{','.join(subcommands(group))}}} [--help] [options]", "",
                    GROUPS[group] + ".", "", f"sub-commands (attngeo {group} SUB --help lists its options):"] +
                   [f"  {n:<{width}}{COMMANDS[n][1]}" for n in subs])


def find_command(argv: list[str]):
  """(command name, its arguments) for `argv`, or (None, exit status) after printing the usage a group
  or an unknown name calls for."""
  if argv and argv[0] in GROUPS:
    if len(argv) > 1 and f"{argv[0]} {argv[1]}" in COMMANDS:
      return f"{argv[0]} {argv[1]}", argv[2:]
    if len(argv) == 1 or argv[1] in ("-h", "--help"):
      print(group_usage(argv[0]))
      return None, 0
    print(f"attngeo {argv[0]}: unknown sub-command {argv[1]!r}\n\n{group_usage(argv[0])}", file=sys.stderr)
    return None, 2
  if not argv or argv[0] in ("-h", "--help"):
    print(usage())
    return None, 0
  if argv[0] not in COMMANDS:
    print(f"attngeo: unknown command {argv[0]!r}\n\n{usage()}", file=sys.stderr)
    return None, 2
  return argv[0], argv[1:]


def entry(name: str):
  """The function `COMMANDS[name]` names (imported on first use; command modules import JAX lazily)."""
  module_name, _, function = COMMANDS[name][0].partition(":")
  return getattr(importlib.import_module(module_name), function or "main")


def call_group(group: str, argv: list[str]):
  """`group SUB args…` from Python (`lm.main(["train", …])`, `python -m attngeo.experiments.lm train …`):
  the sub-command's return value; a group usage or an unknown sub-command exits as `attngeo` does."""
  name, rest = find_command([group, *argv])
  if name is None:
    raise SystemExit(rest)
  return entry(name)(rest)


# The variables `sharding.initialize_distributed` reads (a coordinator, or a TPU pod slice's workers): only when
# one is set is JAX imported before the command parses its options, so argument errors answer at once.
DISTRIBUTED_ENV = ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES")

# Errors that mean "the input is wrong", reported in one line (anything else is a bug: traceback). A
# TypeError is one only when attngeo raised it on purpose (`errors.InputTypeError`): a bare one is a bug.
USER_ERRORS = (ValueError, errors.InputTypeError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FloatingPointError)


@contextlib.contextmanager
def _one_line_warnings(name: str):
  """attngeo's own warnings (a corrupt checkpoint skipped, a non-UTF-8 file) as one line,
  `attngeo NAME: warning: …`, without the source line Python's format adds; others as before. Its own: raised
  from the package or from its experiments (`attngeo.experiments`, a folder of its own on disk: a library warning
  with `stacklevel=2` names the experiment that called it)."""
  previous, home = warnings.showwarning, os.path.dirname(os.path.abspath(__file__))

  def ours(filename: str) -> bool:
    experiments = sys.modules.get("attngeo.experiments")
    homes = [home] + [os.path.dirname(os.path.abspath(experiments.__file__))] if experiments else [home]
    return any(os.path.abspath(filename).startswith(h + os.sep) for h in homes)

  def show(message, category, filename, lineno, file=None, line=None):
    if ours(filename):
      print(f"attngeo {name}: warning: {str(message).strip().splitlines()[0]}", file=file or sys.stderr)
    else:
      previous(message, category, filename, lineno, file, line)
  warnings.showwarning = show
  try:
    yield
  finally:
    warnings.showwarning = previous


def usage() -> str:
  lines = ["usage: attngeo COMMAND [--help] [options]", "", "commands:"]
  rows = [(name, desc) for name, (_, desc) in COMMANDS.items() if " " not in name]
  rows += [(f"{g} {'|'.join(subcommands(g))}", desc) for g, desc in GROUPS.items()]
  width = max(len(n) for n, _ in rows) + 2
  return "\n".join(lines + [f"  {n:<{width}}{desc}" for n, desc in rows])


def main(argv=None):
  from_shell = argv is None
  argv = sys.argv[1:] if argv is None else list(argv)
  name, rest = find_command(argv)
  if name is None:
    return rest
  wants_help = any(a in ("-h", "--help") for a in rest)
  if from_shell and not wants_help:
    hugepages.reexec()
  try:
    with interrupts.as_interrupts(), _one_line_warnings(name):   # from here on a signal is one line, 130 or 143
      command = entry(name)                     # importing it (numpy, …) takes 0.1 s: a signal there is held
      if not wants_help and any(os.environ.get(v) for v in DISTRIBUTED_ENV):
        from attngeo import sharding                              # imports JAX: only where there is a cluster
        sharding.initialize_distributed()
      command(rest)
  except (FileExistsError, NotADirectoryError, IsADirectoryError) as e:   # a file where a folder goes, or the reverse
    if os.environ.get("ATTNGEO_DEBUG"):
      raise
    print(f"attngeo {name}: error: {misplaced(e, name)}", file=sys.stderr)
    return 2
  except USER_ERRORS as e:
    if os.environ.get("ATTNGEO_DEBUG"):
      raise
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"attngeo {name}: error: {msg}", file=sys.stderr)
    return 2
  except KeyboardInterrupt as e:                   # Ctrl-C, or SIGTERM (`Terminated`)
    if os.environ.get("ATTNGEO_DEBUG"):
      raise
    how, code = ("terminated (SIGTERM)", 128 + signal.SIGTERM) if isinstance(e, Terminated) else ("interrupted", 130)
    kept = ("its tables are written at the end, so nothing new was: run the same command again" if
            name in WRITES_AT_THE_END else
            "what it finished is kept (checkpoints, cached results): run the same command again to go on")
    print(f"attngeo {name}: {how}; {kept}", file=sys.stderr)
    if from_shell:
      interrupts.exit_at_once(code)
    return code
  except Exception as e:                           # a full disk where no writer names it (a library's own write)
    reason, unwritable, memory = storage_full(e), not_writable(e), out_of_memory(e)
    if os.environ.get("ATTNGEO_DEBUG") or (reason is None and unwritable is None and memory is None):
      raise
    if memory is not None and reason is None:     # TensorStore's RESOURCE_EXHAUSTED of a full disk is the disk's
      print(f"attngeo {name}: error: {memory}; ask for less at once (batch, samples, sequence length, model size) "
            "and run the same command again (finished steps and cached results are kept)", file=sys.stderr)
      if from_shell:                 # JAX's exit handlers, after a failed allocation, printed 18 lines of tracebacks
        interrupts.exit_at_once(2)
      return 2
    where = f" writing {files.target(e.filename)}" if getattr(e, "filename", None) else ""
    advice = ("choose a folder this user can write (--out, --data-dir)" if reason is None else
              "free space (or raise the limit) and run the same command again (finished steps and cached results "
              "are kept)")
    print(f"attngeo {name}: error: {reason or unwritable}{where}; {advice}", file=sys.stderr)
    return 2
  return 0


# Commands that write their tables once, at the end (bench-pallas and bench-triton save theirs after every row).
WRITES_AT_THE_END = frozenset({"bench", "bench-geometry", "bench-train", "bench-diffmap", "bench-probe",
                               "bench-regularisers"})

# errno -> what the one line says; the texts are how libraries that wrap the error spell them.
STORAGE_FULL = {errno.ENOSPC: ("no space left on device", "No space left on device"),
                errno.EDQUOT: ("disk quota exceeded", "Disk quota exceeded"),
                errno.EFBIG: ("file too large for the file-size limit (ulimit -f)", "File too large"),
                -1: ("no space left on device", "Not enough disk space")}      # tfds' own check before it writes
# errno -> the one line of a folder the command cannot write (a mount the user chose). EACCES stays a
# traceback: a wrong path inside the code raises it as readily as a user's folder does.
NOT_WRITABLE = {errno.EROFS: "read-only file system"}


def misplaced(e: OSError, command: str = "") -> str:
  """The one line of a file where a folder goes (`--out FILE`, `--out FILE/sub`) or a folder where a file goes, named
  as the user knows it (`files.target`: not the hidden temporary), with the options of `command` that name folders
  (`--data-dir` only for `lm`'s); an error raised with a message of its own keeps it."""
  if not e.filename or e.errno not in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  if e.errno == errno.EISDIR:
    return f"{files.target(e.filename)} is a folder where the command writes a file; move it or choose another --out"
  flags = "--out, --data-dir" if command.split(" ")[0] == "lm" else "--out"
  return (f"{files.target(e.filename)} is, or lies under, a file where a folder was expected ({flags}); "
          "choose a folder's path")


def not_writable(e: BaseException) -> str | None:
  """The one line's reason when `e` is an OSError of a read-only file system; None otherwise."""
  return NOT_WRITABLE.get(e.errno) if isinstance(e, OSError) else None


def storage_full(e: BaseException) -> str | None:
  """What a full disk, quota or file-size limit says in the one line (None for any other error): the errno of
  an OSError, or its text in an error without one (tfds' RuntimeError and errno-less IOError, safetensors'
  SafetensorError)."""
  for code, (reason, text) in STORAGE_FULL.items():
    if (isinstance(e, OSError) and e.errno == code) or (getattr(e, "errno", None) is None and text in str(e)):
      return reason
  return None


def out_of_memory(e: BaseException) -> str | None:
  """What the one line says when the memory ran out (None for any other error): numpy's MemoryError, or XLA's
  RESOURCE_EXHAUSTED or "INTERNAL: Error dispatching computation: Out of memory allocating N bytes" (an allocation
  a program could not get; the error's first line names its size)."""
  if isinstance(e, MemoryError):
    return f"out of memory ({str(e).strip().splitlines()[0] if str(e).strip() else 'MemoryError'})"
  first = str(e).strip().splitlines()[0] if str(e).strip() else ""
  if "RESOURCE_EXHAUSTED" in first or "Out of memory allocating" in first:    # XLA also says INTERNAL: … Out of memory
    return f"out of memory ({first[:200]})"
  return None


if __name__ == "__main__":
  sys.exit(main())
