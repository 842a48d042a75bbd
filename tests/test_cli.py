"""The `attngeo` command line: fast help for every command, one-line errors with exit status 2."""
import os
import subprocess
import sys

import pytest

from attngeo import cli

HELP_SCRIPT = """
import sys, time
t0 = time.perf_counter()
from attngeo import cli
try:
  cli.main(sys.argv[1:] + ["--help"])
except SystemExit as e:
  assert e.code in (0, None), e.code
print("JAX_IMPORTED" if "jax" in sys.modules else "NO_JAX", f"{time.perf_counter() - t0:.3f}")
"""


SUBCOMMANDS = ["study connection", "lm train", "lm eval", "lm sample", "lm table2", "lm adapt", "sit train",
               "sit sample", "sit transfer", "sit import"]


@pytest.mark.parametrize("command", sorted(cli.COMMANDS) + SUBCOMMANDS)
def test_help_documents_every_option_without_importing_jax(command):
  out = subprocess.run([sys.executable, "-c", HELP_SCRIPT, *command.split()], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, COLUMNS="200"))
  assert out.returncode == 0, out.stderr[-2000:]
  assert f"usage: attngeo {command}" in out.stdout
  assert "NO_JAX" in out.stdout, f"`attngeo {command} --help` imported JAX"
  if command in ("study", "lm", "sit"):                  # dispatchers: their sub-commands are checked below
    return
  for line in out.stdout.split("options:")[1].split("\n  -")[1:]:
    if not line.startswith("h, --help"):
      assert "default" in line.lower() or "required" in line.lower(), f"option without its default: -{line[:60]}"


def test_unknown_command_and_top_level_help(capsys):
  assert cli.main(["--help"]) == 0
  out = capsys.readouterr().out
  assert all(name in out for name in cli.COMMANDS)
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

  monkeypatch.setattr(cli.os, "execve", execve)
  monkeypatch.setattr(cli.sys, "argv", ["attngeo", "bench", "--seqs", "0"])
  orig = [sys.executable, "-X", "utf8", "/venv/bin/attngeo", "bench", "--seqs", "0"]
  monkeypatch.setattr(cli.sys, "orig_argv", orig)
  for name in ("GLIBC_TUNABLES", "ATTNGEO_HUGEPAGES", "ATTNGEO_REEXEC"):
    monkeypatch.delenv(name, raising=False)
  env = cli.huge_pages_env(os.environ)
  if env is None:
    pytest.skip("not glibc >= 2.35")
  with pytest.raises(SystemExit):
    cli.main()
  (path, args, got), = calls
  assert path == sys.executable and args == orig                                # flags and script kept
  assert got["GLIBC_TUNABLES"] == cli.HUGE_PAGES
  assert cli.huge_pages_env(got) is None                                        # the new process goes on
  assert cli.huge_pages_env(dict(got, GLIBC_TUNABLES="")) is None               # stripped tunables: no loop
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
  assert cli.huge_pages_env(os.environ)["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + cli.HUGE_PAGES
  monkeypatch.setattr(cli.sys, "argv", ["attngeo", "bench", "--help"])
  with pytest.raises(SystemExit):                                               # argparse's help exit, no exec
    cli.main()
  with pytest.raises(SystemExit) as exit_:                                       # in-process: no exec
    cli.main(["bench", "--seqs", "0"])
  assert exit_.value.code == 2 and len(calls) == 1
  monkeypatch.setenv("ATTNGEO_HUGEPAGES", "0")
  assert cli.huge_pages_env(os.environ) is None
  monkeypatch.delenv("ATTNGEO_HUGEPAGES")

  def failing(path, args, env):
    raise OSError("exec failed")
  monkeypatch.setattr(cli.os, "execve", failing)                               # a failed exec: run here
  monkeypatch.setattr(cli.sys, "argv", ["attngeo", "bench", "--seqs", "0"])
  with pytest.raises(SystemExit) as exit_:
    cli.main()
  assert exit_.value.code == 2
