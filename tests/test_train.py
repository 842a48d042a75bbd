"""attngeo.train: sharded runs match single-device ones, multi-process agrees, a killed run resumes exactly."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import tiny_run
from helpers import Batches

from attngeo import config as config_lib, data, nn, optim, sharding, train

SCRIPT = os.path.join(os.path.dirname(__file__), "tiny_run.py")


def run_script(*args, devices=1, timeout=300):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=timeout)
  assert out.returncode == 0, out.stderr[-3000:]
  return parse(out.stdout)


def parse(stdout):
  rows = [json.loads(l) for l in stdout.splitlines() if l.startswith("{")]
  return [r for r in rows if "loss" in r], rows[-1]


def run_single(*args):
  """`tiny_run` on one CPU device: in this process when it is such a process (no second JAX import and
  compile), in a subprocess otherwise (a GPU session's tests)."""
  if jax.default_backend() == "cpu" and jax.device_count() == 1:
    return tiny_run.run(args)
  return run_script(*args)


@pytest.fixture(scope="module")
def single_device():
  return run_single()


# Every geometry term of attngeo.regularisers, small enough to keep the run learning: the mesh run trains
# through their gradients too (curvature through the blockwise kernel, reversibility through the damped
# law's LU solves, the head transports of isometry sharded over the tensor axis).
REG = "--reg", "curvature=0.05,reversibility=0.05,skew=0.05,mixing=0.05,isometry=0.05"


def test_mesh_run_matches_single_device_with_parameters_born_sharded(single_device):
  losses, _ = run_single(*REG)
  sharded, meta = run_script("--mesh", "2,2,2", "--sharded-init", *REG, devices=8)
  assert meta["devices"] == 8
  np.testing.assert_allclose([r["loss"] for r in sharded], [r["loss"] for r in losses], rtol=2e-5)
  assert losses[-1]["loss"] < losses[0]["loss"]
  # The terms are in the loss: it is not the plain run's.
  assert min(abs(a["loss"] - b["loss"]) for a, b in zip(losses, single_device[0])) > 1e-4
  # wq [embed, heads, kv]: embed over fsdp, heads over tensor.
  assert meta["wq_spec"].endswith("('fsdp', 'tensor', None)")
  # Created under jit with output shardings: no device holds a whole copy of a sharded parameter.
  assert meta["sharded_params"] >= 8 and meta["full_copies"] == 0


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_process_distributed_run_agrees(single_device):
  port = free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, SCRIPT, "--mesh", "2,2,2", "--coordinator", f"127.0.0.1:{port}",
                             "--num-processes", "2", "--process-id", str(i)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  # both processes' stderr: when one dies the other aborts too ("another task died"), and only the first to fail says why
  assert [p.returncode for p in procs] == [0, 0], "\n\n".join(
      f"process {i} (exit {p.returncode}):\n{err[-3000:]}" for i, (p, (_, err)) in enumerate(zip(procs, outs)))
  metas = []
  for stdout, _ in outs:
    losses, meta = parse(stdout)
    assert meta["processes"] == 2 and meta["devices"] == 8
    np.testing.assert_allclose([r["loss"] for r in losses], [r["loss"] for r in single_device[0]], rtol=2e-5)
    metas.append(meta)
  # Per-host input: each process read only its 4 rows of each global batch of 8, and together
  # they fed exactly the single-process run's global batches.
  steps = len(single_device[1]["ids"])
  for meta in metas:
    assert meta["reads"] == 4 * steps and all(len(ids) == 4 for ids in meta["ids"])
  union = [metas[0]["ids"][s] + metas[1]["ids"][s] for s in range(steps)]
  assert union == single_device[1]["ids"]


def held(proc, wd, log, checkpoint_step):
  """Wait until the run in `wd` holds at its --hold-at step, with step `checkpoint_step` checkpointed."""
  ckpt, deadline = os.path.join(wd, "ckpt"), time.time() + 240
  while time.time() < deadline:
    if os.path.exists(wd + ".held") and os.path.isdir(os.path.join(ckpt, str(checkpoint_step))):
      return
    assert proc.poll() is None, log()[-3000:]
    time.sleep(0.05)
  proc.kill()                                          # or leaving the Popen block waits out its hold
  raise AssertionError("the run never reached its hold")


def test_killed_run_resumes_exactly(tmp_path, single_device):
  reference = [r["loss"] for r in single_device[0]]
  wd = str(tmp_path / "run")
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  log = tmp_path / "killed.log"
  with open(log, "wb") as sink, subprocess.Popen(
      [sys.executable, SCRIPT, "--workdir", wd, "--ckpt-every", "3", "--hold-at", "8"],
      stdout=subprocess.DEVNULL, stderr=sink, env=env) as proc:
    held(proc, wd, log.read_text, 6)                   # steps 7 and 8 run and 7 is logged, after checkpoint 6
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  steps = [int(d) for d in os.listdir(os.path.join(wd, "ckpt")) if d.isdigit()]
  assert max(steps) == 6, "the run must be killed mid-way"
  losses, meta = run_single("--workdir", wd, "--ckpt-every", "3")
  assert meta["start_step"] == 6, "the second run must resume, not restart"
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    logged = [json.loads(line) for line in f]
  assert [r["step"] for r in logged] == list(range(1, 13)), "each step logged once after the resume"
  np.testing.assert_allclose([r["loss"] for r in logged], reference, rtol=1e-6)
  np.testing.assert_allclose([r["loss"] for r in losses], reference, rtol=1e-6)   # history = whole run
  events = tb_scalars(os.path.join(wd, "tb"), "loss")
  assert [step for step, _ in events] == list(range(1, 13)), "each step once in the TensorBoard events"
  np.testing.assert_allclose([v for _, v in events], reference, rtol=1e-6)      # float32 in the events


# `python -c CLI_RUN WORKDIR`: tiny_run's training as an `attngeo` command (cli.main: its signal handling).
CLI_RUN = """
import sys
from attngeo import cli
cli.COMMANDS["tiny"] = ("tiny_run:run", "tests/tiny_run.py's GPT run")
sys.exit(cli.main(["tiny", "--workdir", sys.argv[1], "--ckpt-every", "3", "--hold-at", "4"]))
"""


def test_sigterm_is_one_line_exit_143_and_the_run_resumes(tmp_path, single_device):
  """SIGTERM (a preemption, `kill`) ended an `attngeo` command with no line and status -15; now it stops as Ctrl-C
  does: one line, exit 143 (128 + 15), the checkpoints it wrote kept and the next run resumes from the last one."""
  reference = [r["loss"] for r in single_device[0]]
  wd = str(tmp_path / "run")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(
      [os.path.dirname(__file__)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  env.pop("ATTNGEO_DEBUG", None)
  with subprocess.Popen([sys.executable, "-c", CLI_RUN, wd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        env=env) as proc:
    ckpt = os.path.join(wd, "ckpt")
    held(proc, wd, lambda: proc.stderr.read().decode(), 3)
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
  assert code == 143, (code, err[-3000:])
  assert err.startswith("attngeo tiny: terminated (SIGTERM); what it finished is kept"), err[-3000:]
  assert len(err.strip().splitlines()) == 1, err
  kept = sorted(int(d) for d in os.listdir(ckpt) if d.isdigit())
  assert kept and max(kept) < 12 and not [d for d in os.listdir(ckpt) if "tmp" in d], os.listdir(ckpt)
  losses, meta = run_single("--workdir", wd, "--ckpt-every", "3")
  assert meta["start_step"] == max(kept), "the second run resumes from the last checkpoint"
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    logged = [json.loads(line) for line in f]
  assert [r["step"] for r in logged] == list(range(1, 13)), "each step logged once after the resume"
  np.testing.assert_allclose([r["loss"] for r in logged], reference, rtol=1e-6)
  np.testing.assert_allclose([r["loss"] for r in losses], reference, rtol=1e-6)


def tb_scalars(folder, tag):
  """[(step, value)] of `tag` in every events file of `folder`, in file order: TFRecords (length u64,
  its masked CRC u32, an `Event` proto, its CRC u32) read with tensorboardX's proto; a cut record ends a file."""
  import struct

  from tensorboardX.proto import event_pb2
  out = []
  for name in sorted(f for f in os.listdir(folder) if f.startswith("events.out.tfevents.")):
    with open(os.path.join(folder, name), "rb") as f:
      data = f.read()
    at = 0
    while at + 12 <= len(data):
      (size,) = struct.unpack("<Q", data[at:at + 8])
      if at + 16 + size > len(data):
        break
      event = event_pb2.Event.FromString(data[at + 12:at + 12 + size])
      out += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
      at += 16 + size
  return out


def test_bad_mesh_and_optimizer():
  with pytest.raises(ValueError, match="needs 2 devices"):
    sharding.make_mesh((2, 1, 1))
  with pytest.raises(ValueError, match="three positive sizes"):
    sharding.make_mesh((1, 1))
  with pytest.raises(ValueError, match="optimizer must be"):
    optim.make_optimizer(train.TrainConfig(optimizer="sgd"))
  with pytest.raises(ValueError, match="schedule must be"):
    optim.make_optimizer(train.TrainConfig(schedule="step"))


IMPOSSIBLE = [("keep", 0), ("steps", -1), ("steps", 0), ("lr", -1.0), ("lr", float("nan")), ("warmup", -3),
              ("ckpt_every", -5), ("batch_size", 0), ("log_every", 0), ("ema", 1.0), ("ema", -0.1), ("clip", -1.0),
              ("weight_decay", float("inf")), ("schedule", "step"), ("optimizer", "sgd"), ("mesh", (1, 0, 1)),
              ("mesh", (1, 1)), ("steps", 2.5), ("progress", "yes"), ("workdir", "")]


@pytest.mark.parametrize("field,value", IMPOSSIBLE)
def test_impossible_config_values_are_one_line_errors_naming_the_field(field, value):
  with pytest.raises(ValueError, match=rf"^{field} must be [^\n]*; got {re.escape(repr(value))}$"):
    train.TrainConfig(**{field: value})
  cfg = train.TrainConfig()
  setattr(cfg, field, value)                                    # changed after construction: train refuses too
  with pytest.raises(ValueError, match=rf"^{field} must be"):
    train.train(lambda: pytest.fail("work started"), lambda m, b, r: (0.0, {}), Batches({}), cfg)


def test_impossible_values_from_the_command_line_fail_while_parsing():
  import argparse
  ap = argparse.ArgumentParser()
  config_lib.add_arguments(ap, train.TrainConfig)
  with pytest.raises(ValueError, match=r"^keep must be an integer ≥ 1"):
    config_lib.from_arguments(ap.parse_args(["--keep", "0"]), train.TrainConfig)


NO_JAX_CONFIG = """
import sys
from attngeo import train_config
from attngeo.lm import recipe
from attngeo.lm.config import LMConfig, LMTrain
assert recipe.train_config(LMConfig(train=LMTrain(steps=3)), 128, None).steps == 3
try:
  train_config.check(LMTrain(lr=-1), "train.")
except ValueError as e:
  print(e)
train_config.TrainConfig(keep=2)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "optax", "flax", "orbax")))
"""


def test_the_trainer_configs_and_their_rules_import_no_jax():
  """TrainConfig (attngeo.train_config) and the LM's LMTrain validate without JAX (the CLI
  checks a command line with them before importing it); attngeo.train and optim re-use the same ones."""
  out = subprocess.run([sys.executable, "-c", NO_JAX_CONFIG], capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines() == ["train.lr must be a positive finite rate; got -1", "[]"]
  from attngeo import train_config
  assert train.TrainConfig is train_config.TrainConfig and train.check_resumable is train_config.check_resumable
  assert optim.check is train_config.check_optimizer and optim.RULES is train_config.OPTIMIZER_RULES


def test_a_run_folder_that_names_the_old_train_class_still_loads(tmp_path):
  """Runs written before the move record "attngeo.train.TrainConfig" in config.json: it still resolves (the
  re-export), to the same class new runs record as attngeo.train_config.TrainConfig."""
  import dataclasses

  from attngeo import files, runs
  old, new = tmp_path / "old", tmp_path / "new"
  old.mkdir()
  (old / "config.json").write_text(json.dumps({"train": dataclasses.asdict(train.TrainConfig(steps=3)),
                                               "classes": {"train": "attngeo.train.TrainConfig"}}))
  assert runs.train_config(str(old)) == train.TrainConfig(steps=3, workdir=str(old))
  files.write_config(str(new), train=train.TrainConfig(steps=4))
  assert files.read_config(str(new))["classes"] == {"train": "attngeo.train_config.TrainConfig"}
  assert runs.train_config(str(new)) == train.TrainConfig(steps=4, workdir=str(new))


def test_logical_rules_skip_indivisible_dimensions():
  """embed→fsdp (2 divides 6), heads→tensor (2 does not divide 3), and no mesh axis used twice."""
  import types
  mesh = types.SimpleNamespace(shape={"data": 1, "fsdp": 2, "tensor": 2})
  spec = jax.sharding.PartitionSpec
  assert sharding.logical_to_spec(("embed", "heads"), (6, 3), mesh) == spec("fsdp", None)
  assert sharding.logical_to_spec(("embed", "mlp"), (6, 4), mesh) == spec("fsdp", "tensor")
  assert sharding.logical_to_spec(("embed", "embed"), (6, 6), mesh) == spec("fsdp", None)
  assert sharding.logical_to_spec(("kv", "cond"), (4, 4), mesh) == spec(None, None)


def test_ema_is_the_polyak_average_of_the_weights():
  """ema_t = d·ema_{t-1} + (1 − d)·θ_t from ema_0 = θ_0, checked against the weights seen at every step."""
  from attngeo import flow
  model = nn.PointFlow(nn.PointFlowConfig.create(width=16, num_heads=2, depth=1), rngs=nnx.Rngs(0))
  theta0 = np.asarray(model.in_w[...])
  seen = []
  pts = {"points": np.random.default_rng(0).standard_normal((4, 16, 3)).astype(np.float32)}
  loss = lambda m, b, r: (flow.loss(m, b["points"], jax.random.PRNGKey(0)), {})
  record = lambda step, m: seen.append(np.asarray(m.in_w[...])) or {}
  decay = 0.8
  cfg = train.TrainConfig(steps=6, batch_size=4, lr=3e-2, warmup=1, ema=decay, log_every=1, progress=False)
  res = train.train(model, loss, Batches(pts), cfg, hooks=(record,))
  ema = theta0
  for theta in seen:
    ema = decay * ema + (1 - decay) * theta
  assert not np.allclose(ema, seen[-1], atol=1e-3)              # the average really lags
  np.testing.assert_allclose(res.ema["in_w"].get_value(), ema, rtol=1e-5, atol=1e-7)


def test_muon_runs_and_decreases_the_loss():
  from attngeo import flow
  model = nn.PointFlow(nn.PointFlowConfig.create(width=16, num_heads=2, depth=1), rngs=nnx.Rngs(0))
  pts = {"points": np.random.default_rng(0).standard_normal((4, 16, 3)).astype(np.float32)}
  loss = lambda m, b, r: (flow.loss(m, b["points"], jax.random.PRNGKey(0)), {})
  cfg = train.TrainConfig(steps=30, batch_size=4, lr=2e-2, warmup=2, optimizer="muon", log_every=10, progress=False)
  res = train.train(model, loss, Batches(pts), cfg)
  assert res.history[-1]["loss"] < 0.9 * res.history[0]["loss"]


def test_config_overrides_from_command_line():
  import argparse
  ap = argparse.ArgumentParser()
  config_lib.add_arguments(ap, train.TrainConfig)
  cfg = config_lib.from_arguments(ap.parse_args(["--mesh", "2,2,2", "--lr", "0.1", "--workdir", "none",
                                                 "--progress", "false"]), train.TrainConfig)
  assert cfg.mesh == (2, 2, 2) and cfg.lr == 0.1 and cfg.workdir is None and cfg.progress is False
  assert cfg.steps == train.TrainConfig().steps


def test_grain_loader_state_roundtrip():
  records = [{"x": np.array([i], np.int32)} for i in range(10)]
  it = data.loader(records, 3, seed=0)
  next(it)
  state = json.loads(json.dumps(it.get_state()))
  a = [next(it)["x"].tolist() for _ in range(4)]
  it2 = data.loader(records, 3, seed=0)
  it2.set_state(state)
  assert [next(it2)["x"].tolist() for _ in range(4)] == a


def test_non_finite_loss_stops_the_run_with_a_clear_error():
  model = nn.PointFlow(nn.PointFlowConfig.create(width=16, num_heads=2, depth=1), rngs=nnx.Rngs(0))
  loss = lambda m, b, r: (jnp.sum(m(b["points"], jnp.ones((2,)))) * jnp.nan, {})
  pts = {"points": np.ones((2, 4, 3), np.float32)}
  with pytest.raises(FloatingPointError, match="loss is nan at step 1"):
    train.train(model, loss, Batches(pts), train.TrainConfig(steps=3, batch_size=2, log_every=1, progress=False))


class TurnsNaN:
  """Point sets that turn NaN from batch `bad` on (1-based), with the iterator-state protocol."""

  def __init__(self, bad):
    self.bad, self.i = bad, 0

  def __next__(self):
    self.i += 1
    return {"points": np.full((2, 4, 3), np.nan if self.i >= self.bad else 1.0, np.float32)}

  def get_state(self):
    return {"i": self.i}

  def set_state(self, state):
    self.i = state["i"]


@pytest.mark.parametrize("ckpt_every, kept", [
    (2, r"the last checkpoint in \S+ \(step 2\) holds the state before it; the last finite loss logged was "
        r"\S+ at step 2 \(lower"),
    (0, r"no checkpoint was written before it; the last finite loss logged was \S+ at step 2 \(lower"),
    (5, r"no checkpoint was written before it, the first was due at step 5; the last finite loss"),
])
def test_a_non_finite_loss_says_what_the_run_folder_keeps(tmp_path, ckpt_every, kept):
  model = nn.PointFlow(nn.PointFlowConfig.create(width=16, num_heads=2, depth=1), rngs=nnx.Rngs(0))
  loss = lambda m, b, r: (jnp.mean(m(b["points"], jnp.ones((2,))) ** 2), {})
  workdir = str(tmp_path / "run")
  cfg = train.TrainConfig(steps=6, batch_size=2, log_every=1, ckpt_every=ckpt_every, workdir=workdir, progress=False)
  with pytest.raises(FloatingPointError, match="loss is nan at step 3; " + kept):
    train.train(model, loss, TurnsNaN(bad=3), cfg)
  assert os.path.isdir(workdir) == (ckpt_every == 2)        # without a checkpoint the folder goes, as found


def test_training_loop_makes_no_implicit_transfers():
  """Host↔device traffic in the loop is explicit (per-host batches in, metrics out): JAX's transfer guard."""
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=16, head_dim=8, width=16), rngs=nnx.Rngs(0))
  import optax
  loss = lambda m, b, r: (optax.softmax_cross_entropy_with_integer_labels(m(b["tokens"][:, :-1]),
                                                                         b["tokens"][:, 1:]).mean(), {})
  tok = {"tokens": np.random.default_rng(0).integers(0, 16, (2, 9)).astype(np.int32)}
  with jax.transfer_guard("disallow"):
    res = train.train(model, loss, Batches(tok), train.TrainConfig(steps=3, batch_size=2, log_every=1, progress=False))
  assert res.step == 3
