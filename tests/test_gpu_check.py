"""experiments/gpu_check.sh, the one prepared GPU script: syntax, shellcheck, its CPU dry run (tiny shapes, the
Pallas kernel in interpret mode) and `attngeo bench`'s Pallas guard."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from attngeo.experiments import bench_operators

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "gpu_check.sh")


def test_syntax_shellcheck_and_bad_argument():
  assert subprocess.run(["bash", "-n", SCRIPT]).returncode == 0
  shellcheck = shutil.which("shellcheck") or os.path.join(os.path.dirname(sys.executable), "shellcheck")
  if os.path.exists(shellcheck):
    out = subprocess.run([shellcheck, SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
  out = subprocess.run(["bash", SCRIPT, "--dry"], capture_output=True, text=True, timeout=30)
  assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "--dry-run" in out.stderr
  out = subprocess.run(["bash", SCRIPT, "--out"], capture_output=True, text=True, timeout=30)
  assert out.returncode == 2 and out.stderr.strip() == "gpu_check.sh: --out needs a folder"


@pytest.mark.parametrize("argv,env,word", [
    (["--dry-run", "{tmp}/afile"], {}, "cannot write the output folder"),
    (["--dry-run", "{tmp}/afile/sub"], {}, "cannot write the output folder"),
    (["--dry-run", "--out"], {}, "must not start with '-'"),
    (["--out", "{tmp}/o", "--dry-run"], {}, "too many arguments"),
    (["--dry-run", "{tmp}/o"], {"GPU_CHECK_SECONDS": "60s"}, "GPU_CHECK_SECONDS must be a whole number"),
    (["--dry-run", "{tmp}/o"], {"GPU_CHECK_SECONDS": "0"}, "GPU_CHECK_SECONDS must be a whole number")])
def test_mistakes_are_one_line_before_any_stage(tmp_path, argv, env, word):
  """A bad output folder, a budget that is not a whole number of seconds ≥ 60 or a stray argument: exit 2, one
  line, no stage run (they used to run every stage into `tee` errors and exit 0)."""
  (tmp_path / "afile").write_text("x")
  argv = [a.format(tmp=tmp_path) for a in argv]
  path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])   # this venv's attngeo
  out = subprocess.run(["bash", SCRIPT, *argv], capture_output=True, text=True, timeout=30,
                       env=dict(os.environ, PATH=path, **env))
  assert out.returncode == 2 and word in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert "===" not in out.stdout and not (tmp_path / "o").exists()


def test_without_the_venv_or_a_gpu_it_says_so_and_writes_nothing(tmp_path):
  """No attngeo on PATH (a dry run outside the venv) or no nvidia-smi (the GPU run on a CPU machine): one line,
  exit 2, no folder made (the GPU run used to go on: pip on the system python, a symlink in the checkout)."""
  for argv, word in ((["--dry-run", str(tmp_path / "d")], "activate the project's venv"),
                     (["--out", str(tmp_path / "g")], "no NVIDIA GPU here")):
    out = subprocess.run(["bash", SCRIPT, *argv], capture_output=True, text=True, timeout=30,
                         env=dict(os.environ, PATH="/usr/bin:/bin"))
    assert out.returncode == 2 and word in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert not any(tmp_path.iterdir())


def test_help_prints_the_header():
  out = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=30)
  assert out.returncode == 0 and "bash experiments/gpu_check.sh --dry-run [DIR]" in out.stdout


def test_pallas_needs_a_gpu_or_tpu_unless_interpret_on_cpu(capsys):
  import jax
  if jax.default_backend() != "cpu":
    pytest.skip("the guard is for CPU")
  with pytest.raises(SystemExit) as e:
    bench_operators.main(["--seqs", "16", "--implementations", "xla,pallas"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "pallas needs a GPU or TPU" in err[0] and "--interpret" in err[0]
  assert bench_operators.available_impls("ATTN") == ["einsum", "xla", "blockwise"]   # never a CPU default
  assert "pallas" in bench_operators.available_impls("DMTN", ["pallas"])


@pytest.mark.slow
def test_dry_run_writes_the_pallas_rows(tmp_path):
  """The whole script on CPU: Pallas timed beside xla and blockwise (its ratios in the note), and its bf16 and
  float32 numerics against float32 einsum: float32 ≤ 1e-5 (the same sums), bf16 within 4 × 2⁻⁸."""
  env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
  out = subprocess.run(["bash", SCRIPT, "--dry-run", str(tmp_path)], capture_output=True, text=True, timeout=900,
                       cwd=ROOT, env=env)                 # the script's python3 and attngeo: this interpreter's
  assert out.returncode == 0, out.stderr[-2000:]
  rows = json.loads((tmp_path / "bench_operators.json").read_text())
  pallas = [r for r in rows if r["implementation"] == "pallas"]
  assert {r["operator"] for r in pallas} == {"ATTN", "DMTN"} and all(r["seconds"] > 0 for r in pallas)
  assert "DMTN pallas ÷ xla/blockwise" in (tmp_path / "bench_operators.md").read_text()
  num = [r for r in json.loads((tmp_path / "bench_numerics.json").read_text()) if r["implementation"] == "pallas"]
  assert {r["operator"] for r in num} == {"ATTN", "DMTN"}
  for r in num:
    assert r["f32_y"] <= 1e-5 and r["f32_grad"] <= 1e-5
    assert 1e-4 < r["bf16_y"] <= 4 * 2**-8 and 1e-4 < r["bf16_grad"] <= 4 * 2**-8
  cmap = json.loads((tmp_path / "cmap_pallas" / "bench_operators.json").read_text())
  assert {r["implementation"] for r in cmap} == {"blockwise", "pallas"} and all(r["seconds"] > 0 for r in cmap)
  assert "CMAP pallas ÷ blockwise" in (tmp_path / "cmap_pallas" / "bench_operators.md").read_text()
  assert (tmp_path / "train_lm" / "bench_train.json").exists()
  sweep = json.loads((tmp_path / "pallas_blocks" / "pallas_blocks.json").read_text())["rows"]
  assert sweep and all(r["status"] == "ok" and r["err"] < 2e-2 for r in sweep)
  summary = (tmp_path / "summary.txt").read_text().splitlines()
  assert [line.split(":")[0] for line in summary] == ["numerics", "bench_operators", "bench_cmap_pallas",
                                                        "bench_train_lm", "pallas_blocks"]
  assert all(": ok in" in line for line in summary)
