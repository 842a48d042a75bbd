"""attngeo.runlock: one process per run folder, re-entrant within one, taken over from a dead owner."""
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from attngeo import runlock

HOLDER = """
import sys
from attngeo import runlock
with runlock.hold(sys.argv[1]):
  print("held", flush=True)
  sys.stdin.readline()
"""


@pytest.fixture
def holder(tmp_path):
  """Another process holding `tmp_path/run` until its stdin closes (or it is killed)."""
  wd = str(tmp_path / "run")
  proc = subprocess.Popen([sys.executable, "-c", HOLDER, wd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline() == "held\n"
  yield wd, proc
  if proc.poll() is None:
    proc.kill()
  proc.wait()
  proc.stdin.close()
  proc.stdout.close()


def test_a_second_process_is_refused_in_one_line_naming_the_owner(holder):
  wd, proc = holder
  expected = (f"run folder {wd} is in use by pid {proc.pid} on {socket.gethostname()} ({wd}/.lock); "
              f"wait for it or use another --out")
  with pytest.raises(runlock.RunFolderBusy) as err:
    with runlock.hold(wd):
      pass
  assert str(err.value) == expected and isinstance(err.value, ValueError)


def test_the_lock_of_a_killed_owner_is_taken_over(holder):
  wd, proc = holder
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  with runlock.hold(wd):
    with open(os.path.join(wd, ".lock")) as f:
      assert f.read().split() == [str(os.getpid()), socket.gethostname()]


def test_nested_holds_in_one_process_share_the_lock_until_the_outermost_exits(tmp_path):
  wd = str(tmp_path / "run")
  probe = [sys.executable, "-c", HOLDER, wd]

  def other_process_gets_it():
    out = subprocess.run(probe, input="\n", capture_output=True, text=True)
    assert out.returncode == 0 or "RunFolderBusy" in out.stderr, out.stderr[-2000:]
    return out.returncode == 0

  with runlock.hold(wd):
    with runlock.hold(os.path.join(wd, ".", "")):           # another spelling of the same folder
      assert not other_process_gets_it()
    assert not other_process_gets_it()                       # the outer hold still owns it
  assert other_process_gets_it()


def test_train_refuses_a_busy_run_folder_before_writing_anything(holder):
  from helpers import Batches

  from attngeo import train
  wd, _ = holder
  cfg = train.TrainConfig(steps=2, batch_size=2, workdir=wd, progress=False)
  build = lambda: pytest.fail("the model was built before the run folder was locked")
  with pytest.raises(runlock.RunFolderBusy, match="is in use by pid"):
    train.train(build, lambda m, b, r: (0.0, {}), Batches({"x": np.zeros(2)}), cfg)
  assert os.listdir(wd) == [".lock"]


@pytest.mark.parametrize("argv", [
    ["sit", "train", "--data", "digits", "--width", "16", "--depth", "1", "--heads", "2", "--patch", "2", "--steps", "1",
     "--metric", "false", "--out", "RUN"],
    ["swissroll", "--operators", "ATTN", "--orders", "ffn_first", "--steps", "1", "--out", "RUN"],
])
def test_commands_that_write_outside_the_trainer_hold_their_whole_out_folder(holder, capsys, argv):
  """sit train and swissroll prepared data, sampled and wrote tables outside train.train's lock: a second
  process on the same --out ran to the end beside the first. Now it is refused before any work."""
  from attngeo import cli
  wd, proc = holder
  before = sorted(os.listdir(wd))
  assert cli.main([wd if a == "RUN" else a for a in argv]) == 2
  assert f"is in use by pid {proc.pid}" in capsys.readouterr().err and sorted(os.listdir(wd)) == before
