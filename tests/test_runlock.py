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
    ["sit", "train", "--data", "digits", "--model.width", "16", "--model.depth", "1", "--model.heads", "2",
     "--model.patch", "2", "--train.steps", "1",
     "--metric", "false", "--out", "RUN"],
    ["swissroll", "--operators", "ATTN", "--orders", "ffn_first", "--train.steps", "1", "--out", "RUN"],
    ["bench", "--seqs", "16", "--batch", "1", "--heads", "1", "--head-dim", "8", "--repeats", "1", "--long", "0",
     "--operators", "ATTN", "--implementations", "einsum", "--out", "RUN"],
    ["bench", "--numerics", "--seqs", "16", "--batch", "1", "--heads", "1", "--head-dim", "8", "--out", "RUN"],
    ["bench-train", "--seq", "16", "--batch", "1", "--depth", "1", "--width", "16", "--head-dim", "8", "--repeats", "1",
     "--out", "RUN"],
    ["bench-geometry", "--sizes", "64", "--repeats", "1", "--block-size", "32", "--out", "RUN"],
    ["bench-regularisers", "--preset", "tiny", "--repeats", "1", "--terms", "skew", "--out", "RUN"],
])
def test_commands_that_write_outside_the_trainer_hold_their_whole_out_folder(holder, capsys, argv):
  """sit train and swissroll prepared data, sampled and wrote tables outside train.train's lock, and bench timed
  beside another bench and overwrote its tables: a second process on the same --out ran to the end beside the
  first. Now it is refused before any work."""
  from attngeo import cli
  wd, proc = holder
  before = sorted(os.listdir(wd))
  assert cli.main([wd if a == "RUN" else a for a in argv]) == 2
  assert f"is in use by pid {proc.pid}" in capsys.readouterr().err and sorted(os.listdir(wd)) == before


# ----------------------------------------------------------------------------- nothing left behind

def test_a_hold_leaves_no_lock_file_and_removes_the_folders_it_created(tmp_path):
  """The outermost hold left `.lock` (and the folders it made) in a folder the command never wrote."""
  wd = str(tmp_path / "a" / "b" / "run")
  with runlock.hold(wd):
    assert os.listdir(wd) == [".lock"]
  assert os.listdir(tmp_path) == []
  os.makedirs(os.path.join(wd, "kept"))
  with runlock.hold(wd):
    with runlock.hold(wd + "/"):
      pass
    assert os.path.exists(os.path.join(wd, ".lock"))                # the outer hold still owns it
  assert os.listdir(wd) == ["kept"]


def test_a_full_disk_while_writing_the_lock_leaves_neither_lock_nor_folder(tmp_path, monkeypatch):
  """The second fault-injection pass: a start at a full disk was refused but left `run/.lock` behind."""
  import errno

  def full(fd, data, offset):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(runlock.os, "pwrite", full)
  with pytest.raises(OSError, match="No space left"):
    with runlock.hold(str(tmp_path / "run")):
      pass
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("error", [ValueError("refused: disk full"), KeyboardInterrupt()])
def test_a_run_that_fails_before_its_first_checkpoint_leaves_the_folder_as_it_found_it(tmp_path, error):
  wd = tmp_path / "run"
  (wd / "notes").mkdir(parents=True)
  (wd / "notes" / "mine.txt").write_text("kept")
  with pytest.raises(type(error)):
    with runlock.hold(str(wd), started=runlock.has_checkpoint):
      (wd / "tokenizer").mkdir()
      (wd / "lm.json").write_text("{}")
      (wd / "ckpt" / "2.orbax-checkpoint-tmp-1").mkdir(parents=True)    # an unfinished step is no start
      raise error
  assert sorted(os.listdir(wd)) == ["notes"] and (wd / "notes" / "mine.txt").read_text() == "kept"
  with pytest.raises(ValueError):                                        # with a finished step, all stays
    with runlock.hold(str(wd), started=runlock.has_checkpoint):
      (wd / "ckpt" / "2").mkdir(parents=True)
      (wd / "metrics.jsonl").write_text("")
      raise ValueError("disk full at step 4")
  assert sorted(os.listdir(wd)) == ["ckpt", "metrics.jsonl", "notes"]


CONTENDER = """
import os, sys
from attngeo import runlock
wd, inside, tries = sys.argv[1], os.path.join(sys.argv[1], "..", "inside"), 0
for _ in range(int(sys.argv[2])):
  try:
    with runlock.hold(wd):
      fd = os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY)      # fails if another process is inside too
      os.close(fd)
      os.remove(inside)
  except runlock.RunFolderBusy:
    tries += 1
print(tries)
"""


def test_removing_the_lock_file_still_lets_one_process_in_at_a_time(tmp_path):
  """Holders unlink `.lock` as they leave: a process that locked the unlinked file must start again."""
  wd = str(tmp_path / "run")
  procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, wd, "300"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(3)]
  outs = [p.communicate(timeout=120) for p in procs]
  assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
  assert not os.path.exists(wd) or os.listdir(wd) == []          # no .lock left by any of them


def test_lm_train_refused_at_a_full_disk_before_its_first_step_writes_nothing(tmp_path, monkeypatch, capsys):
  """A full disk when the checkpoints are opened left tokenizer/, lm.json, corpus.json and .lock in a run
  folder that never held a step (`lm eval` then failed on it). Now the folder is not left at all."""
  from attngeo import checkpoint
  from attngeo.experiments import lm as lm_cmd
  out = str(tmp_path / "runs" / "lm")

  def full(workdir, *args, **kwargs):
    raise checkpoint.disk_full(workdir, 10**9, "the checkpoint folder")
  monkeypatch.setattr(checkpoint, "manager", full)
  argv = ["train", "--data", "pydoc", "--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "64",
          "--train.batch-size", "2", "--train.steps", "1", "--train.progress", "false", "--no-eval",
          "--data-dir", str(tmp_path / "data"), "--out", out]
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(argv)
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "no space left on the device" in err[0], err
  assert not os.path.exists(tmp_path / "runs")


def test_train_refused_at_its_first_checkpoint_leaves_the_folder_as_it_found_it(tmp_path, monkeypatch):
  """sit train, swissroll and every other train.train caller left config.json, ckpt/, metrics.jsonl and tb/
  in a folder with no step when the first checkpoint hit a full disk; a folder's own files stay."""
  from flax import nnx
  from helpers import Batches

  from attngeo import checkpoint, flow, nn, train
  wd = tmp_path / "run"
  (wd / "notes.txt").parent.mkdir()
  (wd / "notes.txt").write_text("kept")

  def full(mngr, step, *args):
    raise checkpoint.disk_full(str(wd / "ckpt"), 10**9, f"checkpoint step {step}")
  monkeypatch.setattr(checkpoint, "save", full)
  pf = nn.PointFlow(nn.PointFlowConfig.create(width=16, depth=1, num_heads=2), rngs=nnx.Rngs(0))
  pts = {"points": np.zeros((2, 4, 3), np.float32)}
  with pytest.raises(checkpoint.DiskFull):
    train.train(pf, lambda m, b, r: (flow.loss(m, b["points"], r), {}), Batches(pts),
                train.TrainConfig(steps=1, batch_size=2, workdir=str(wd), log_every=1, progress=False))
  assert os.listdir(wd) == ["notes.txt"]


@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
def test_an_out_that_cannot_be_a_folder_is_one_line_naming_out(tmp_path, capsys, where):
  """A file at --out (FileExistsError), a file as its parent (NotADirectoryError) or a folder the process may not
  write (/sys: EPERM, as a read-only file system's EROFS) were tracebacks from runlock._acquire's os.makedirs."""
  (tmp_path / "F").write_text("mine")
  out = {"a file": tmp_path / "F", "under a file": tmp_path / "F" / "run", "read-only": "/sys/attngeo-run"}[where]
  with pytest.raises(runlock.RunFolderUnusable, match=f"^--out {out} cannot be used as a run folder: ") as e:
    with runlock.hold(str(out)):
      pytest.fail("held")
  assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
  from attngeo import cli
  argv = ["swissroll", "--operators", "ATTN", "--orders", "ffn_first", "--train.steps", "1", "--out", str(out)]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"attngeo swissroll: error: --out {out} cannot be used"), err
  assert (tmp_path / "F").read_text() == "mine" and os.listdir(tmp_path) == ["F"]
