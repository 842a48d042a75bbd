"""The `attngeo` command line: fast help for every command, one-line errors with exit status 2."""
import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings

import pytest

from attngeo import cli, files, hugepages, interrupts
from helpers import assert_errors_before_jax

# `python -c HELP_SCRIPT JSON`: `attngeo COMMAND --help` for each command of the JSON list, one after another in
# this one interpreter (a process each cost 0.15 s of start-up a command); prints, for each, its exit status,
# the help, the (option strings, help) of the parser it printed and whether JAX is imported by then.
HELP_SCRIPT = """
import argparse, contextlib, io, json, sys
printed = []                                  # (option strings, help) of each parser whose help is printed
format_help = argparse.ArgumentParser.format_help
def recording(self):
  printed.append([(a.option_strings or [a.dest], a.help) for a in self._actions
                  if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))])
  return format_help(self)
argparse.ArgumentParser.format_help = recording
from attngeo import cli
out = {}
for command in json.loads(sys.argv[1]):
  printed.clear()
  text = io.StringIO()
  with contextlib.redirect_stdout(text):
    try:
      code = cli.main(command.split() + ["--help"])
    except SystemExit as e:
      code = e.code
  out[command] = [code, text.getvalue(), printed[-1] if printed else [], "jax" in sys.modules]
print(json.dumps(out))
"""
COMMANDS = sorted(cli.COMMANDS) + sorted(cli.GROUPS)


@pytest.fixture(scope="module")
def helps():
  """{command: [exit status, help, actions, JAX imported]} of every command, from one fresh interpreter."""
  out = subprocess.run([sys.executable, "-c", HELP_SCRIPT, json.dumps(COMMANDS)], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, COLUMNS="200"))
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.splitlines()[-1])


def description(text: str | None) -> str:
  """An option's help without its default ("(default: 4)", "; default off", "default 10")."""
  return re.sub(r"[\s(;,]*\bdefault\b.*$", "", text or "", flags=re.I | re.S).strip()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_documents_every_option_without_importing_jax(command, helps):
  code, text, actions, jax_imported = helps[command]
  assert code in (0, None), code
  assert f"usage: attngeo {command}" in text
  assert not jax_imported, f"`attngeo {command} --help` imported JAX (or a command's help before it did)"
  undescribed = [opts[0] for opts, option_help in actions if not description(option_help)]
  assert not undescribed, f"`attngeo {command} --help`: options without a description: {undescribed}"
  if command in cli.GROUPS:                             # a group lists its sub-commands (checked below)
    return
  for line in text.split("options:")[1].split("\n  -")[1:]:
    if not line.startswith("h, --help"):
      assert "default" in line.lower() or "required" in line.lower(), f"option without its default: -{line[:60]}"


def test_description_of_an_option_is_its_help_without_the_default():
  assert description("points per set (default: 256)") == "points per set"
  assert description("(default: 256)") == description("default off") == description(None) == ""


def test_one_table_names_every_command_and_each_builds_its_own_parser(capsys):
  """cli.COMMANDS is the one table: every entry, sub-commands included, is a function of an experiments
  module; its parser's prog is `attngeo NAME`; the top-level help lists each group as `lm train|eval|…`
  and `attngeo GROUP` lists the group's sub-commands; no dispatcher builds argparse sub-parsers."""
  import inspect
  for name in cli.COMMANDS:
    group = name.split()[0]
    assert " " not in name or group in cli.GROUPS, name
    assert callable(cli.entry(name)), name
  for group in cli.GROUPS:
    assert cli.subcommands(group)
    assert cli.main([group]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: attngeo {group} {{{','.join(cli.subcommands(group))}}}")
    assert all(f"  {group} {sub} " in out for sub in cli.subcommands(group))
  assert cli.main(["--help"]) == 0
  out = capsys.readouterr().out
  for group in cli.GROUPS:
    assert f"  {group} {'|'.join(cli.subcommands(group))} " in out
  assert cli.main(["lm", "bogus"]) == 2
  assert "attngeo lm: unknown sub-command 'bogus'" in capsys.readouterr().err
  from attngeo.experiments import lm, lm_adapt, mlm, sit
  for module in (lm, lm_adapt, mlm, sit):
    assert "add_subparsers" not in inspect.getsource(module) and "_actions" not in inspect.getsource(module)
  parsers = {"lm train": lm.train_parser, "lm eval": lm.eval_parser, "lm sample": lm.sample_parser,
             "lm table2": lm.table2_parser, "lm ladder": lm.ladder_parser, "lm adapt": lm_adapt.parser, "sit train": sit.train_parser,
             "sit sample": sit.sample_parser, "sit transfer": sit.transfer_parser, "sit import": sit.import_parser,
             "mlm eval": mlm.eval_parser}
  for name, make in parsers.items():
    assert make().prog == f"attngeo {name}"
  import glob
  from pathlib import Path
  sources = glob.glob(os.path.join(os.path.dirname(cli.__file__), "**", "*.py"), recursive=True) + \
      glob.glob(os.path.join(os.path.dirname(lm.__file__), "*.py"))
  built = [f"{os.path.basename(path)}:{n}" for path in sources if path != os.path.join(os.path.dirname(cli.__file__), "config.py")
           for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1)
           if "Parser(" in line or "ArgumentParser(" in line]
  assert not built, f"parsers built by hand instead of config.parser: {built}"


def test_unknown_command_and_top_level_help(capsys):
  assert cli.main(["--help"]) == 0
  out = capsys.readouterr().out
  assert all(name in out for name in cli.COMMANDS if " " not in name) and all(group in out for group in cli.GROUPS)
  assert cli.main(["nonsense"]) == 2


def test_user_errors_are_one_line_with_exit_status_2(tmp_path):
  out = subprocess.run([sys.executable, "-m", "attngeo.cli", "probe", str(tmp_path / "missing")], capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 2
  assert len(out.stderr.strip().splitlines()) == 1 and out.stderr.startswith("attngeo probe: error:"), out.stderr
  assert "not a run folder" in out.stderr
  out = subprocess.run([sys.executable, "-m", "attngeo.cli", "bench", "--seqs", "0"], capture_output=True,
                       text=True, timeout=60)
  assert out.returncode == 2 and "expected a positive integer" in out.stderr


def test_a_command_from_the_shell_reexecutes_once_with_huge_pages(monkeypatch):
  """From the shell (argv None) a command re-executes itself with glibc's huge-page tunable added to the
  environment; the new process finds it and goes on; --help, in-process calls and ATTNGEO_HUGEPAGES=0 never do."""
  calls = []

  def execve(path, args, env):
    calls.append((path, args, env))
    raise SystemExit(0)

  monkeypatch.setattr(hugepages.os, "execve", execve)
  monkeypatch.setattr(cli.sys, "argv", ["attngeo", "bench", "--seqs", "0"])
  orig = [sys.executable, "-X", "utf8", "/venv/bin/attngeo", "bench", "--seqs", "0"]
  monkeypatch.setattr(cli.sys, "orig_argv", orig)
  for name in ("GLIBC_TUNABLES", "ATTNGEO_HUGEPAGES", "ATTNGEO_REEXEC"):
    monkeypatch.delenv(name, raising=False)
  env = hugepages.huge_pages_env(os.environ)
  if env is None:
    pytest.skip("not glibc >= 2.35")
  with pytest.raises(SystemExit):
    cli.main()
  (path, args, got), = calls
  assert path == sys.executable and args == orig                                # flags and script kept
  assert got["GLIBC_TUNABLES"] == hugepages.HUGE_PAGES
  assert hugepages.huge_pages_env(got) is None                                        # the new process goes on
  assert hugepages.huge_pages_env(dict(got, GLIBC_TUNABLES="")) is None               # stripped tunables: no loop
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
  assert hugepages.huge_pages_env(os.environ)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + hugepages.HUGE_PAGES
  monkeypatch.setattr(cli.sys, "argv", ["attngeo", "bench", "--help"])
  with pytest.raises(SystemExit):                                               # argparse's help exit, no exec
    cli.main()
  with pytest.raises(SystemExit) as exit_:                                       # in-process: no exec
    cli.main(["bench", "--seqs", "0"])
  assert exit_.value.code == 2 and len(calls) == 1
  monkeypatch.setenv("ATTNGEO_HUGEPAGES", "0")
  assert hugepages.huge_pages_env(os.environ) is None
  monkeypatch.delenv("ATTNGEO_HUGEPAGES")

  def failing(path, args, env):
    raise OSError("exec failed")
  monkeypatch.setattr(hugepages.os, "execve", failing)                               # a failed exec: run here
  monkeypatch.setattr(cli.sys, "argv", ["attngeo", "bench", "--seqs", "0"])
  with pytest.raises(SystemExit) as exit_:
    cli.main()
  assert exit_.value.code == 2


def test_argument_errors_answer_before_jax_is_imported(tmp_path):
  """A bad option, a missing file or a --data the run's model cannot read: exit 2, one line, JAX never imported
  (lm train/table2/eval/adapt and sit train/sample imported it first, 1.4–10 s, before issue 25's JAX-free configs)."""
  (tmp_path / "gpt").mkdir()
  (tmp_path / "gpt" / "config.json").write_text('{"model": {"class": "GPTConfig"}}')       # the class is all it reads
  (tmp_path / "pf").mkdir()
  (tmp_path / "pf" / "config.json").write_text('{"model": {"class": "PointFlowConfig"}}')
  cases = [(["swissroll", "--train.steps", "0"], "--train.steps must be a positive integer"),
           (["swissroll-order", "--protocols", "nope"], "--protocols must be"),
           (["heat", "--n", "5"], "--n must be at least 10"),
           (["diffmap", str(tmp_path / "missing.npy")], "FILE must be an existing"),
           (["curvature", "--sizes", "10"], "--sizes must be"),
           (["probe", str(tmp_path / "missing")], "not a run folder"),
           (["probe", str(tmp_path / "gpt"), "--data", "swiss_roll"], "--data must be an existing text file"),
           (["study", "connection", "--probe-samples", "1"], "probe_samples must be at least 2"),
           (["bench", "--seqs", "0"], "expected a positive integer"),
           # a walk-through: an empty list timed nothing and replaced the last tables; an unwritable --out was
           # found after the whole bench had run
           (["bench", "--seqs", ","], "expected comma-separated positive integers"),
           (["bench", "--seqs", "256,,512"], "expected comma-separated positive integers"),
           (["bench", "--out", "/proc/attngeo-out"], "cannot be written"),
           (["bench", "--out", ""], "expected a folder's path; got an empty one"),   # was the cwd, then a traceback
           (["bench-train", "--out", str(tmp_path / "gpt" / "config.json" / "x")], "is a file, not a folder"),
           (["bench-diffmap", "--sizes", "0"], "every size ≥ k + 2"),
           # the newcomer walk: the file named where --n was at fault, a Python tuple, "got 'a,b', None"
           (["diffmap", "swiss_roll", "--n", "5"], "--n must be at least --k + 2 = 12 (the points drawn from swiss_roll)"),
           (["swissroll", "--operators", "FOO,ATTN"], "comma-separated list of DMAP,DMTN,ATAP,ATTN,CMAP; got 'FOO,ATTN'"),
           (["probe", str(tmp_path / "gpt"), "--layers", "a,b"], "--layers takes comma-separated integers; got 'a,b'"),
           (["probe", str(tmp_path / "gpt"), "--heads", "1,c"], "--heads takes comma-separated integers; got '1,c'"),
           (["import", "gpt2", str(tmp_path / "missing.safetensors"), "--out", str(tmp_path / "o")], "does not exist"),
           (["swissroll", "--train.lr", "-1"], "--train.lr must be a positive finite number"),
           (["lm", "train", "--train.lr", "-1", "--out", "o"], "train.lr must be a positive finite rate; got -1.0"),
           (["lm", "train", "--seq-len", "32", "--out", "o"], "seq_len must be an integer ≥ 63"),
           # the second fault-injection pass: OverflowError from jit after 6.6 s; numpy's message after 4.6 s
           (["lm", "train", "--train.steps", "99999999999999999999", "--out", "o"], "train.steps must be an integer in"),
           (["lm", "train", "--train.seed", "-1", "--out", "o"], "train.seed must be an integer in [0, 2³²)"),
           (["lm", "train", "--model", "qk_norm", "--out", "o"], "model override 'qk_norm' must be name=value"),
           (["lm", "table2", "--lm.train.keep", "0", "--out", "o"], "lm.train.keep must be an integer ≥ 1"),
           (["lm", "eval", str(tmp_path / "missing")], "is not a language-model run folder"),
           (["lm", "adapt", "--adapt.lr", "-1", "--out", "o"], "adapt.lr must be a positive finite rate"),
           (["lm", "adapt", "--source", str(tmp_path / "missing"), "--out", "o"], "no such run folder"),
           (["sit", "train", "--train.ema", "1", "--out", "o"], "ema must be a decay in [0, 1)"),
           (["sit", "train", "--train.steps", "0", "--out", "o"], "steps must be >= 1 for sit train"),
           (["sit", "sample", str(tmp_path / "missing")], "is not a run folder"),
           # issue 24: these imported grain/JAX (8–10 s) before their one line
           (["mlm", "eval", str(tmp_path / "missing")], "RUN must be a run folder with a config.json"),
           (["mlm", "eval", str(tmp_path / "gpt"), "--data", "nope"], "--data must be one of moses, moses-train"),
           (["mlm", "eval", str(tmp_path / "gpt")], "holds a GPT model, not an encoder"),
           (["lm", "adapt", "--chain", "ATTN,XYZ", "--out", "o"], "chain state 1 'XYZ': unknown operator"),
           (["lm", "adapt", "--chain", "ATTN,0.5:2", "--out", "o"], "'0.5:2': alpha must lie in [0, 1]; got 2"),
           (["sit", "train", "--operator", "FOO", "--out", "o"],
            "operator must be one of ['ATAP', 'ATTN', 'DMAP', 'DMTN', 'CMAP'] or a (beta, alpha) pair; got 'FOO'"),
           (["sit", "train", "--operator", "0.5:1", "--out", "o"], "operator must be one of"),
           (["lm", "train", "--operator", "foo", "--out", "o"], "or a (beta, alpha) pair; got 'foo'"),   # as typed
           # issue 25: JAX-free model configs (attngeo.nn.config) and sampler names (attngeo.sampler_names)
           (["sit", "train", "--sampler", "rk4", "--out", "o"], "sampler must be one of ('euler', 'heun', 'dopri5'"),
           (["sit", "sample", str(tmp_path / "gpt"), "--sampler", "rk4"], "sampler must be one of"),
           (["sit", "transfer", "--guidance", "0.5", "--out", "o"], "guidance scale must be >= 1"),
           (["sit", "transfer", "--model.preset", "M/3", "--out", "o"],
            "DiT preset must be one of ['B/2', 'L/2', 'S/2'"),
           (["sit", "train", "--model.width", "100", "--model.heads", "3", "--out", "o"],
            "num_heads=3 does not divide width=100"),
           (["study", "connection", "--decoder-aspect", "0"], "decoder_aspect must be positive; got 0"),
           (["probe", str(tmp_path / "pf"), "--seed", "-1"], "--seed must be an integer in [0, 2³²)"),
           (["lm", "train", "--train.final-lr-frac", "2", "--out", "o"], "train.final_lr_frac must be a fraction in [0, 1]"),
           (["study", "connection", "--seeds", "-1"], "seeds must be distinct integers in [0, 2³²)"),
           (["study", "connection", "--seeds", "0,0"], "seeds must be distinct integers"),
           (["probe", str(tmp_path / "pf"), "--data", "swissrol"], "--data must be swiss_roll, sphere, torus or")]
  assert_errors_before_jax(cases, tmp_path)
  assert sorted(os.listdir(tmp_path)) == ["gpt", "pf"]                           # nothing written


def test_operator_names_are_the_models_table_without_jax():
  """`attngeo.operator_names` (JAX-free: the CLI checks with it) is the one table `operators` and
  `nn.resolve_operator` read; its readings against the square's corners written out here."""
  from attngeo import nn, operator_names as names, operators
  from attngeo.data import molecules
  from attngeo.experiments import mlm
  assert operators.CORNERS is names.CORNERS and operators.MAGNETIC is names.MAGNETIC
  square = {"ATTN": (1.0, 1.0), "DMTN": (0.0, 1.0), "ATAP": (1.0, 0.0), "DMAP": (0.0, 0.0), "CMAP": (0.0, 0.0)}
  for name, pair in square.items():
    assert nn.resolve_operator(name) == nn.resolve_operator(name.lower()) == names.resolve(name) == pair
  assert nn.resolve_operator((0.25, 1)) == (0.25, 1.0)
  assert [names.parse(s) for s in ("dmtn", "0.5:1", "(0.5, 1)", (0.5, 1), "1:1", "(0,0)")] == \
      ["DMTN", (0.5, 1.0), (0.5, 1.0), (0.5, 1.0), "ATTN", "DMAP"]
  for bad, message in (("FOO", "operator must be one of"), ((1.5, 0), "operator beta must lie in [0, 1]; got 1.5"),
                       ((0, -1), "operator alpha must lie in [0, 1]; got -1"), (3, "a (beta, alpha) pair of numbers")):
    for resolve in (names.resolve, nn.resolve_operator):
      with pytest.raises(ValueError) as e:
        resolve(bad)
      assert message in str(e.value) and "\n" not in str(e.value)
  for bad, message in (("CMAP", "unknown operator"), ("x:1", "two numbers"), ("0.5:2", "alpha must lie in [0, 1]")):
    with pytest.raises(ValueError, match=re.escape(message)):
      names.parse(bad)
  assert mlm.DATA_SOURCES == molecules.SOURCES                  # mlm's JAX-free copy of the data names


def test_debug_shows_the_traceback_of_errors_a_command_reports_itself(tmp_path, monkeypatch):
  """Under ATTNGEO_DEBUG, `ap.error(str(e))` inside an except block re-raises `e` (its traceback); plain
  validation messages and argparse's own parse errors stay one line."""
  out = subprocess.run([sys.executable, "-m", "attngeo.cli", "probe", str(tmp_path / "missing")], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, ATTNGEO_DEBUG="1"))
  assert out.returncode != 0 and "Traceback" in out.stderr and "in read_config" in out.stderr, out.stderr
  assert out.stderr.strip().splitlines()[-1].startswith("FileNotFoundError:")
  from attngeo import config
  ap = config.parser("attngeo x", None)
  ap.add_argument("--n", type=config.positive_int)
  monkeypatch.setenv("ATTNGEO_DEBUG", "1")
  with pytest.raises(ValueError, match="the cause"):
    try:
      raise ValueError("the cause")
    except ValueError as e:
      ap.error(str(e))
  for call in (lambda: ap.error("plain"), lambda: ap.parse_args(["--n", "0"])):
    with pytest.raises(SystemExit) as exit_:
      call()
    assert exit_.value.code == 2


def test_a_full_disk_no_writer_names_is_one_line(monkeypatch, capsys):
  """ENOSPC from a library's own write (an OSError, or tfds' RuntimeError around it) was a 21–45-line
  traceback; the command now says it in one line and exits 2."""
  import errno

  from attngeo.experiments import heat_swissroll
  lines = []
  for exc in (OSError(errno.ENOSPC, "No space left on device", "/full/run/tokenizer.json"),
              RuntimeError('Failed to finalize writing of split "train": write() failed: No space left on device')):
    def full(argv, exc=exc):
      raise exc
    monkeypatch.setattr(heat_swissroll, "main", full)
    assert cli.main(["heat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attngeo heat: error: no space left on device"), err
    lines += err
  assert "writing /full/run/tokenizer.json" in lines[0]
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: (_ for _ in ()).throw(OSError(errno.EACCES, "denied")))
  with pytest.raises(OSError):                    # any other OSError is a bug to see, not a user line
    cli.main(["heat"])


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
  """`sit sample --bench --eval-samples 100000` ended in XLA's RESOURCE_EXHAUSTED traceback: a real one (an
  allocation no machine holds) and numpy's MemoryError are one line, exit 2; any other RuntimeError is raised."""
  import jax.numpy as jnp

  from attngeo.experiments import heat_swissroll
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: jnp.zeros((1 << 45,), jnp.float32).block_until_ready())
  assert cli.main(["heat"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("attngeo heat: error: out of memory (RESOURCE_EXHAUSTED: Out of memory "
                                             "allocating 140737488355328 bytes"), err
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: (_ for _ in ()).throw(MemoryError("Unable to allocate")))
  assert cli.main(["heat"]) == 2
  assert capsys.readouterr().err.startswith("attngeo heat: error: out of memory (Unable to allocate); ask for less")
  dispatch = RuntimeError("INTERNAL: Error dispatching computation: Out of memory allocating 11075922208 bytes.")
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: (_ for _ in ()).throw(dispatch))   # a probe, found by review
  assert cli.main(["heat"]) == 2
  assert capsys.readouterr().err.startswith("attngeo heat: error: out of memory (INTERNAL: Error dispatching "
                                            "computation: Out of memory allocating 11075922208 bytes.); ask for less")
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: (_ for _ in ()).throw(RuntimeError("INTERNAL: a bug")))
  with pytest.raises(RuntimeError, match="INTERNAL"):
    cli.main(["heat"])


def test_a_file_where_a_folder_is_made_is_one_line(monkeypatch, capsys, tmp_path):
  """`probe RUN --out FILE`, `import … --out FILE`, `lm train --data-dir FILE` ended in FileExistsError's traceback."""
  from attngeo.experiments import heat_swissroll
  (tmp_path / "afile").write_text("x")
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: os.makedirs(tmp_path / "afile", exist_ok=True))
  assert cli.main(["heat"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"attngeo heat: error: {tmp_path / 'afile'} is, or lies under, a file where a folder was expected "
                 "(--out); choose a folder's path"], err                  # `lm`'s commands also name --data-dir
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: os.makedirs(tmp_path / "afile" / "sub", exist_ok=True))
  assert cli.main(["heat"]) == 2                            # `--out afile/sub`: NotADirectoryError, was a traceback
  assert capsys.readouterr().err.startswith(f"attngeo heat: error: {tmp_path / 'afile' / 'sub'} is, or lies under, a")
  (tmp_path / "out" / "probe.md").mkdir(parents=True)

  def staged_write(argv):
    with files.staged():
      files.atomic_write(str(tmp_path / "out" / "probe.md"), "table")
  monkeypatch.setattr(heat_swissroll, "main", staged_write)
  assert cli.main(["heat"]) == 2                            # a folder where a file goes: named as the file
  assert capsys.readouterr().err.strip() == (f"attngeo heat: error: {tmp_path / 'out' / 'probe.md'} is a folder where "
                                             "the command writes a file; move it or choose another --out")
  assert os.listdir(tmp_path / "out") == ["probe.md"]


def test_a_full_disk_that_tensorstore_calls_resource_exhausted_is_not_out_of_memory(monkeypatch, capsys):
  from attngeo.experiments import heat_swissroll
  full = RuntimeError("RESOURCE_EXHAUSTED: Error writing \"x/0.0\" in OCDBT database: [OS error: No space left on device]")
  monkeypatch.setattr(heat_swissroll, "main", lambda argv: (_ for _ in ()).throw(full))
  assert cli.main(["heat"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("attngeo heat: error: no space left on device; free space"), err


def test_the_file_size_limit_and_a_wrapped_full_disk_are_one_line(monkeypatch, capsys):
  """EFBIG (`ulimit -f`) and safetensors' SafetensorError('… (os error 28)') escaped the disk-full handler, which
  took only an OSError/RuntimeError naming ENOSPC: tracebacks."""
  import errno

  from safetensors import SafetensorError

  from attngeo.experiments import heat_swissroll
  for exc, line in ((OSError(errno.EFBIG, "File too large", "/run/weights.npz"),
                     "file too large for the file-size limit (ulimit -f) writing /run/weights.npz"),
                    (SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
                     "no space left on device; ")):
    monkeypatch.setattr(heat_swissroll, "main", lambda argv, exc=exc: (_ for _ in ()).throw(exc))
    assert cli.main(["heat"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"attngeo heat: error: {line}"), err


def _interrupted(argv):
  raise KeyboardInterrupt


def _terminated(argv):
  raise cli.Terminated


def _sigterm_self(argv):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(10)                                      # the handler raises here, at once
  raise AssertionError("SIGTERM did not stop the command")


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
  """Ctrl-C during a command: one line saying what is kept, exit status 130 (128 + SIGINT), no traceback."""
  monkeypatch.setitem(cli.COMMANDS, "boom", (f"{__name__}:_interrupted", "raises KeyboardInterrupt"))
  monkeypatch.delenv("ATTNGEO_DEBUG", raising=False)
  assert cli.main(["boom"]) == 130
  err = capsys.readouterr().err
  assert err.startswith("attngeo boom: interrupted;") and len(err.strip().splitlines()) == 1, err
  assert "what it finished is kept" in err
  monkeypatch.setitem(cli.COMMANDS, "bench", (f"{__name__}:_interrupted", "raises KeyboardInterrupt"))
  assert cli.main(["bench"]) == 130               # the bench writes its tables at the end: it keeps nothing
  err = capsys.readouterr().err
  assert "nothing new was: run the same command again" in err and "kept" not in err, err
  assert cli.WRITES_AT_THE_END <= set(cli.COMMANDS) - {"bench-pallas", "bench-triton"}    # those save every row
  monkeypatch.setenv("ATTNGEO_DEBUG", "1")
  with pytest.raises(KeyboardInterrupt):
    cli.main(["boom"])


@pytest.fixture
def python_sigint():
  """Python's own SIGINT handler during the test (a library or the xdist worker may have set another: the tests
  that need it were skipped in one CI run of two), the previous one back after."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


class _SignalsInItsFinaliser:
  """Sends `signum` from `__del__` and runs bytecode there, so the handler's KeyboardInterrupt (`Terminated` for
  SIGTERM) is raised inside a finaliser, where Python swallows it (as inside JAX's gc callback)."""

  def __init__(self, signum):
    self.signum = signum

  def __del__(self):
    os.kill(os.getpid(), self.signum)
    sum(range(10_000))


def _signal_in_a_finaliser(signum):
  _SignalsInItsFinaliser(signum)
  for _ in range(20):
    time.sleep(0.05)
  raise AssertionError(f"{signal.Signals(signum).name} raised inside a finaliser did not stop the command")


def _sigterm_in_a_finaliser(argv):
  _signal_in_a_finaliser(signal.SIGTERM)


def _sigint_in_a_finaliser(argv):
  _signal_in_a_finaliser(signal.SIGINT)


@pytest.mark.parametrize("name,code,line", [("SIGTERM", 143, "terminated (SIGTERM)"), ("SIGINT", 130, "interrupted")])
def test_a_signal_swallowed_by_a_finaliser_is_delivered_again(monkeypatch, capsys, python_sigint, name, code, line):
  """Fault pass 3 (F1–F3): SIGTERM landing in a gc callback was swallowed ("Exception ignored") and the command ran
  on; so was a Ctrl-C 0.3–0.8 s into `attngeo bench` (JAX importing and compiling, its gc callback running), which
  then ran to the end with status 0. Either stops now: one line, exit 143 or 130, and no "Exception ignored" noise;
  the unraisable hook is restored afterwards."""
  monkeypatch.setitem(cli.COMMANDS, "fin", (f"{__name__}:_{name.lower()}_in_a_finaliser", f"{name} inside __del__"))
  monkeypatch.delenv("ATTNGEO_DEBUG", raising=False)
  caught, hook = [], sys.unraisablehook
  before = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))   # never pytest's death
  try:
    assert cli.main(["fin"]) == code and not caught
  finally:
    signal.signal(signal.SIGTERM, before)
  err = capsys.readouterr().err
  assert err.startswith(f"attngeo fin: {line};") and len(err.strip().splitlines()) == 1, err
  assert sys.unraisablehook is hook


# The body of a module that sends itself Ctrl-C while it is being imported, then runs on (a C extension's init, numpy's,
# was broken so half-way: "ImportError: Encountered an error while initializing the extension").
_SELF_INTERRUPTING_MODULE = """
import os, pathlib, signal, time
os.kill(os.getpid(), signal.SIGINT)
for _ in range(20):
  time.sleep(0.01)
pathlib.Path(__file__).with_suffix(".done").write_text("imported whole")


def main(argv):
  for _ in range(50):
    time.sleep(0.02)
  raise AssertionError("Ctrl-C during an import was not delivered after it")
"""


def test_ctrl_c_during_an_import_lands_after_it(monkeypatch, capsys, tmp_path, python_sigint):
  """A Ctrl-C landing inside an import — here the command's own module, imported by `cli.main` as `lm train`'s
  imports numpy for 0.1 s — is held until the import is done (the module whole, no ImportError, no traceback),
  then stops the command: one line, exit 130."""
  (tmp_path / "attngeo_self_interrupting.py").write_text(_SELF_INTERRUPTING_MODULE)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setitem(cli.COMMANDS, "imp", ("attngeo_self_interrupting:main", "Ctrl-C while it is imported"))
  monkeypatch.delenv("ATTNGEO_DEBUG", raising=False)
  try:
    assert cli.main(["imp"]) == 130
  finally:
    sys.modules.pop("attngeo_self_interrupting", None)
  err = capsys.readouterr().err
  assert err.startswith("attngeo imp: interrupted;") and len(err.strip().splitlines()) == 1, err
  assert (tmp_path / "attngeo_self_interrupting.done").exists()            # the module ran to its end
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler           # as_interrupts put it back


# (module, message): a warning attngeo raises, from the package itself or for one of its experiments
WARNINGS = {"checkpoint": ("attngeo.checkpoint", "checkpoint step 30 in D is corrupt or incomplete; trying step 20"),
            "experiment": ("attngeo.experiments.probe",
                           "the walk spectra of layers [4] did not meet the eigensolver's tolerance")}


def _warns(argv):
  import importlib
  module, message = WARNINGS[argv[0]]
  warnings.warn_explicit(message, UserWarning, importlib.import_module(module).__file__, 318)


@pytest.mark.parametrize("source", WARNINGS)
def test_attngeos_warnings_are_one_line(monkeypatch, capsys, source):
  """Fault pass 3 (F7): the corrupt-checkpoint warning printed three lines (path, message, source line). The newcomer
  walk: `probe`'s unconverged-spectrum warning (`attngeo.probe`, stacklevel 2) names experiments/probe.py, a folder
  outside the package's, and printed its path and source line too."""
  monkeypatch.setitem(cli.COMMANDS, "warn", (f"{__name__}:_warns", "warns"))
  with warnings.catch_warnings():
    warnings.simplefilter("always")
    assert cli.main(["warn", source]) == 0
  assert capsys.readouterr().err == f"attngeo warn: warning: {WARNINGS[source][1]}\n"


def test_sigterm_is_one_line_and_exit_143_and_the_handler_is_restored(monkeypatch, capsys):
  """SIGTERM during a command raises `cli.Terminated` (a KeyboardInterrupt: what Ctrl-C closes, it closes); one line,
  exit 143 (128 + SIGTERM); the process's own SIGTERM handler is back after the command."""
  monkeypatch.setitem(cli.COMMANDS, "boom", (f"{__name__}:_terminated", "raises Terminated"))
  monkeypatch.setitem(cli.COMMANDS, "term", (f"{__name__}:_sigterm_self", "sends itself SIGTERM"))
  monkeypatch.delenv("ATTNGEO_DEBUG", raising=False)
  caught = []
  before = signal.signal(signal.SIGTERM, lambda signum, frame: caught.append(signum))   # never pytest's death
  try:
    for name in ("boom", "term"):
      t0 = time.perf_counter()
      assert cli.main([name]) == 143
      assert time.perf_counter() - t0 < 5 and not caught
      err = capsys.readouterr().err
      assert err.startswith(f"attngeo {name}: terminated (SIGTERM);") and len(err.strip().splitlines()) == 1, err
      assert signal.getsignal(signal.SIGTERM) is not interrupts._interrupt
  finally:
    signal.signal(signal.SIGTERM, before)
  monkeypatch.setenv("ATTNGEO_DEBUG", "1")
  with pytest.raises(cli.Terminated):
    cli.main(["boom"])


def _wrong_type(argv):
  from attngeo import errors
  raise errors.InputTypeError("--thing must be a number; got a string")


def _a_bug(argv):
  len(3)                                              # a TypeError from a wrong call inside: a bug


def test_a_wrong_typed_input_is_one_line_but_a_bare_type_error_is_a_bug(monkeypatch, capsys):
  """Only attngeo's own type checks (`errors.InputTypeError`) are user errors; a TypeError from inside keeps
  its traceback, so a bug is never reported as the user's mistake."""
  monkeypatch.delenv("ATTNGEO_DEBUG", raising=False)
  monkeypatch.setitem(cli.COMMANDS, "typed", (f"{__name__}:_wrong_type", "a type check"))
  monkeypatch.setitem(cli.COMMANDS, "bug", (f"{__name__}:_a_bug", "a bug"))
  assert cli.main(["typed"]) == 2
  assert capsys.readouterr().err.strip() == "attngeo typed: error: --thing must be a number; got a string"
  with pytest.raises(TypeError, match="has no len"):
    cli.main(["bug"])


def test_an_interrupted_shell_command_flushes_and_exits_without_the_teardown(tmp_path):
  """From the shell, an interrupted command ends with `os._exit` after its one line (the interpreter's teardown
  segfaulted after a signal during XLA's compile-and-load); what it printed is flushed, atexit hooks do not run."""
  (tmp_path / "cmd.py").write_text("import atexit\n"
                                   "def run(argv):\n"
                                   "  atexit.register(print, 'TEARDOWN')\n"
                                   "  print('partial line', end='')\n"
                                   "  raise KeyboardInterrupt\n")
  code = ("import sys\nfrom attngeo import cli\ncli.COMMANDS['cmd'] = ('cmd:run', 'test')\n"
          "sys.argv = ['attngeo', 'cmd']\nsys.exit(cli.main())")
  env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", ATTNGEO_HUGEPAGES="0")
  env.pop("ATTNGEO_DEBUG", None)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
  assert out.returncode == 130 and out.stdout == "partial line"
  assert out.stderr.strip().startswith("attngeo cmd: interrupted;") and "TEARDOWN" not in out.stdout


def _read_only(argv):
  raise OSError(errno.EROFS, "Read-only file system", "/mnt/ro/data")


def _tfds_full(argv):
  raise OSError("Not enough disk space. Needed: 1.2 MiB (download: 0, generated: 1.2 MiB)")


def test_a_read_only_or_full_data_folder_is_one_line(monkeypatch, capsys):
  """The second fault-injection pass: a read-only --data-dir (EROFS from makedirs) and tfds' own errno-less
  'Not enough disk space' were tracebacks."""
  monkeypatch.delenv("ATTNGEO_DEBUG", raising=False)
  monkeypatch.setitem(cli.COMMANDS, "ro", (f"{__name__}:_read_only", "read-only"))
  monkeypatch.setitem(cli.COMMANDS, "full", (f"{__name__}:_tfds_full", "tfds full"))
  assert cli.main(["ro"]) == 2
  assert capsys.readouterr().err.strip() == ("attngeo ro: error: read-only file system writing /mnt/ro/data; choose a "
                                             "folder this user can write (--out, --data-dir)")
  assert cli.main(["full"]) == 2
  assert capsys.readouterr().err.strip().startswith("attngeo full: error: no space left on device; free space")


@pytest.mark.parametrize("argv,flag", [(["probe", "RUN", "--out", "F"], "--out F"),
                                       (["probe", "RUN", "--out", "F/sub"], "--out F/sub"),
                                       (["mlm", "eval", "RUN", "--out", "F/sub"], "--out F/sub"),
                                       (["export", "RUN", "--format", "gpt2", "--out", "F/m.safetensors"],
                                        "--out F/m.safetensors")])
def test_an_output_folder_that_is_a_file_is_refused_before_the_work(tmp_path, capsys, argv, flag):
  """Newcomer walk: `probe RUN --out FILE` printed the whole probe table, then refused --out (naming --data-dir,
  which probe has not); `mlm eval` and `export` the same. Now one line before any work, naming the file."""
  (tmp_path / "F").write_text("x")
  argv = [str(tmp_path / a) if a.startswith(("F", "RUN")) else a for a in argv]
  with pytest.raises(SystemExit) as e:
    cli.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert f"{flag.replace('F', str(tmp_path / 'F'), 1)}: {tmp_path / 'F'} is a file" in err[0], err
  assert (tmp_path / "F").read_text() == "x" and not (tmp_path / "RUN").exists()
