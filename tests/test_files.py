"""attngeo.files: a run's config.json is read as a JSON object of configs, or refused in one line naming it; staged
writes land together."""
import os

import pytest

from attngeo import files


@pytest.mark.parametrize("content, kind", [("null", "NoneType"), ("[1, 2]", "list"), ('"text"', "str")])
def test_a_config_json_that_is_not_an_object_is_one_line_naming_it(tmp_path, content, kind):
  """Every command indexes the record by config name: null or a list crashed four sit commands with a traceback."""
  (tmp_path / "config.json").write_text(content)
  with pytest.raises(ValueError, match=rf"config\.json is not a run's config \(a JSON object of configs; it holds "
                                       rf"{kind}\)"):
    files.read_config(str(tmp_path))


def test_a_written_config_reads_back_and_a_missing_one_is_not_a_run(tmp_path):
  files.write_config(str(tmp_path / "run"), sit={"seeds": [0]}, sit_command="train")
  assert files.read_config(str(tmp_path / "run")) == {"sit": {"seeds": [0]}, "sit_command": "train"}
  with pytest.raises(FileNotFoundError, match="is not a run folder: no config.json"):
    files.read_config(str(tmp_path / "none"))


def write(path, text):
  with open(path, "w") as f:
    f.write(text)


def test_staged_writes_land_together_or_not_at_all(tmp_path):
  """Inside `staged`, `atomic_write` renames nothing until the block ends: a failure on a later file (a full disk)
  leaves every earlier one as it was and no temporary; a clean block renames all; a nested block joins the outer."""
  a, b = tmp_path / "t.md", tmp_path / "t.png"
  a.write_text("old")
  with pytest.raises(OSError, match="No space"):
    with files.staged():
      files.atomic_write(str(a), "new")
      assert a.read_text() == "old"                          # not yet renamed

      def full(tmp):
        write(tmp, "half")
        raise OSError(28, "No space left on device")
      files.atomic_write(str(b), full)
  assert sorted(os.listdir(tmp_path)) == ["t.md"] and a.read_text() == "old"
  with files.staged():
    files.atomic_write(str(a), "first")
    with files.staged():
      files.atomic_write(str(b), lambda tmp: write(tmp, "png"))
    assert not b.exists()                                    # the inner block waits for the outer one
    files.atomic_write(str(a), "second")                     # one path written twice: the last write lands
  assert sorted(os.listdir(tmp_path)) == ["t.md", "t.png"]
  assert (a.read_text(), b.read_text()) == ("second", "png")
  files.atomic_write(str(a), "plain")                        # outside a block: renamed at once
  assert a.read_text() == "plain"


def test_save_figure_writes_the_format_of_its_name_and_never_half_a_file(tmp_path):
  """`save_figure` goes through a temporary whose name has no image extension: the format comes from the path,
  and a savefig that fails leaves the earlier figure."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib.figure import Figure
  fig = Figure()
  fig.add_subplot().plot([0, 1], [1, 0])
  files.save_figure(fig, str(tmp_path / "a.png"))
  files.save_figure(fig, str(tmp_path / "a.svg"))
  assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert b"<svg" in (tmp_path / "a.svg").read_bytes()[:400]
  before = (tmp_path / "a.png").read_bytes()
  with pytest.raises(TypeError):                          # fails mid-savefig, after the temporary was opened
    files.save_figure(fig, str(tmp_path / "a.png"), dpi="not a number")
  assert (tmp_path / "a.png").read_bytes() == before and sorted(os.listdir(tmp_path)) == ["a.png", "a.svg"]


def test_staged_survives_a_caught_failed_rewrite_a_failed_rename_and_a_late_writer(tmp_path):
  """Found by review: a rewrite of a staged path that failed (caught inside the block) deleted the shared temporary,
  and the block's end then raised FileNotFoundError and left the others' temporaries; two spellings of one path
  did the same; a failed rename left the remaining temporaries; a write from a context copied inside the block
  and run after it vanished."""
  import contextvars
  a, b = tmp_path / "a.md", tmp_path / "b.md"

  def failing(tmp):
    write(tmp, "half")
    raise OSError(28, "No space left on device")
  with files.staged():
    files.atomic_write(str(a), "first")
    files.atomic_write(str(b), "new")
    with pytest.raises(OSError):
      files.atomic_write(str(a), failing)                    # caught: the first write of a still lands
    files.atomic_write(str(tmp_path / "." / "b.md"), "newer")   # another spelling of b: the last write lands
  assert (a.read_text(), b.read_text()) == ("first", "newer") and sorted(os.listdir(tmp_path)) == ["a.md", "b.md"]

  (tmp_path / "dir.md").mkdir()
  with pytest.raises(IsADirectoryError, match="a folder is where this file goes"):
    with files.staged():
      files.atomic_write(str(a), "second")
      files.atomic_write(str(tmp_path / "dir.md"), "a folder is in the way")
      files.atomic_write(str(b), "never")
  assert (a.read_text(), b.read_text()) == ("first", "newer")         # found before the first rename: nothing lands
  assert sorted(os.listdir(tmp_path)) == ["a.md", "b.md", "dir.md"]   # no temporary left

  with files.staged():
    late = contextvars.copy_context()
  late.run(files.atomic_write, str(a), "late")
  assert a.read_text() == "late" and sorted(os.listdir(tmp_path)) == ["a.md", "b.md", "dir.md"]


def test_a_sigterm_during_the_renames_waits_for_the_last_one(tmp_path, monkeypatch):
  """Found by a break-it pass: SIGTERM raised between two renames (the CLI turns it into an exception) left
  probe.json new beside probe.md/csv/png old. The renames now run with SIGINT/SIGTERM held."""
  import signal

  class Stop(Exception):
    pass

  def handler(signum, frame):
    raise Stop
  names = ["a.md", "a.csv", "a.json", "a.png"]
  for n in names:
    (tmp_path / n).write_text("old")
  replace, calls = os.replace, []

  def replace_and_signal(src, dst):
    calls.append(dst)
    if len(calls) == 1:
      os.kill(os.getpid(), signal.SIGTERM)                  # arrives between the first and the second rename
    replace(src, dst)
  old = signal.signal(signal.SIGTERM, handler)
  try:
    monkeypatch.setattr(files.os, "replace", replace_and_signal)
    with pytest.raises(Stop):
      with files.staged():
        for n in names:
          files.atomic_write(str(tmp_path / n), "new")
  finally:
    signal.signal(signal.SIGTERM, old)
  assert [(tmp_path / n).read_text() for n in names] == ["new"] * 4 and sorted(os.listdir(tmp_path)) == sorted(names)


def test_a_killed_writer_s_temporary_is_removed_by_the_next_write_of_its_file(tmp_path):
  """A kill -9 mid-write left `.name.tmp-PID-N`; each kill added one, and on a nearly full disk they failed the next
  run. The next write of the same file removes those of processes that are gone, and keeps a live process's."""
  import subprocess
  import sys
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  dead = tmp_path / f".a.md.tmp-{int(gone.stdout)}-3"
  alive = tmp_path / f".a.md.tmp-{os.getppid()}-0"
  other = tmp_path / f".b.md.tmp-{int(gone.stdout)}-1"
  for p in (dead, alive, other):
    p.write_text("half")
  files.atomic_write(str(tmp_path / "a.md"), "new")
  assert sorted(os.listdir(tmp_path)) == sorted(["a.md", alive.name, other.name])
  assert files.target(str(alive)) == str(tmp_path / "a.md") and files.target("x/a.md") == "x/a.md"


def test_a_write_that_runs_out_of_space_names_the_file(tmp_path):
  """Fault pass: a full disk during the tokenizer's save was one line without the file (a failed write() carries no
  filename, only a failed open() does); atomic_write names the file it was writing, and leaves no temporary."""
  import errno

  def full(tmp):
    with open(tmp, "w"):
      raise OSError(errno.ENOSPC, "No space left on device")
  with pytest.raises(OSError) as e:
    files.atomic_write(str(tmp_path / "tokenizer.json"), full)
  assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "tokenizer.json")
  assert os.listdir(tmp_path) == []
