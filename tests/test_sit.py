"""The SiT experiment: the distance-form fold is exact, the transfer protocol runs end to end (smoke),
official checkpoints import as runs, and bad input fails in one line before any training."""
import json
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from attngeo.experiments import sit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_json(path):
  with open(path) as f:
    return json.load(f)


def random_dit(seed=0, **fields):
  """A tiny DiT whose every parameter (adaLN-Zero and read-out included) is random, so nothing is masked by zeros."""
  cfg = nn.DiTConfig.create(image_size=8, patch=2, channels=1, depth=2, width=32, num_heads=2, num_classes=3, **fields)
  model = nn.DiT(cfg, rngs=nnx.Rngs(seed))
  rng = np.random.default_rng(seed + 1)
  for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    v.set_value(jnp.asarray(0.3 * rng.standard_normal(v.get_value().shape), jnp.float32))
  return model


def inputs(n=3):
  x = np.random.default_rng(5).standard_normal((n, 8, 8, 1)).astype(np.float32)
  return jnp.asarray(x), jnp.linspace(0.1, 0.9, n), jnp.arange(n) % 3


def qk_parameters(model):
  return sum(v.get_value().size for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
             if path[-1] in ("wq", "wk", "wp", "bq", "bk", "bp"))


forward = nnx.jit(lambda m, x, t, y: m(x, t, y))


def test_fold_is_exact_and_halves_the_query_key_parameters():
  model = nn.graft(random_dit(), "DMTN")
  x, t, y = inputs()
  h = jnp.asarray(np.random.default_rng(6).standard_normal((2, 16, 32)), jnp.float32)
  before = qk_parameters(model)
  nn.graft(model, "DMAP")
  grafted = np.asarray(forward(model, x, t, y))
  qk_grafted = [m.qkv(h)[:2] for m in nn.attention_modules(model)]
  nn.fold_distance(model)
  np.testing.assert_allclose(np.asarray(forward(model, x, t, y)), grafted, rtol=1e-5, atol=1e-5)
  assert qk_parameters(model) * 2 == before
  assert model.cfg.block.distance_form and model.cfg.block.operator == "DMAP"
  qk_folded = [m.qkv(h)[:2] for m in nn.attention_modules(model)]
  for (q0, k0), (q1, k1) in zip(qk_grafted, qk_folded):          # the probes see the same m = (q + k)/√2
    np.testing.assert_allclose(q1 + k1, q0 + k0, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="runs DMAP only"):
    nn.graft(model, "DMTN")
  rebuilt = nn.build(nn.config_dict(model))                        # run folders rebuild the folded shape
  assert jax.tree.map(jnp.shape, nnx.state(rebuilt, nnx.Param)) == jax.tree.map(jnp.shape, nnx.state(model, nnx.Param))


def test_fold_is_not_the_original_operator():
  """The fold reproduces DMAP, not the DMTN it came from (a fold that kept W_Q, W_K apart would not differ)."""
  model = nn.graft(random_dit(), "DMTN")
  x, t, y = inputs()
  dmtn = np.asarray(forward(model, x, t, y))
  nn.fold_distance(model)
  assert np.max(np.abs(np.asarray(forward(model, x, t, y)) - dmtn)) > 1e-2


def test_distance_form_arguments():
  with pytest.raises(ValueError, match="operator is a fixed DMAP"):
    nn.BlockConfig(distance_form=True, operator="ATTN").validate()
  with pytest.raises(ValueError, match="cannot carry qk_norm"):
    nn.BlockConfig(distance_form=True, operator="DMAP", qk_norm=True).validate()
  model = nnx.eval_shape(lambda: nn.GPT(nn.GPTConfig.create(depth=1, width=16, num_heads=2, vocab_size=11, seq_len=8,
                                                             qk_norm=True), rngs=nnx.Rngs(0)))
  with pytest.raises(ValueError, match="QK-norm"):
    nn.fold_distance(model)


def test_grid_rows_hold_one_class():
  labels = np.arange(40) % 10
  idx = sit.grid_order(10, 3, 10)
  assert (labels[idx].reshape(10, 3) == np.arange(10)[:, None]).all()
  tiles = np.stack([np.full((2, 2, 1), v) for v in np.linspace(-1, 1, 6)])
  grid = sit.image_grid(tiles, rows=2)
  assert grid.shape == (2 * 3 - 1, 3 * 3 - 1)
  np.testing.assert_allclose(grid[0, 0], 0.0)
  np.testing.assert_allclose(grid[3, 6], 1.0)            # last tile, bottom right


TINY = ["--data", "digits", "--width", "16", "--depth", "1", "--heads", "2", "--patch", "2", "--steps", "4",
        "--adapt-steps", "0", "--fold-steps", "2", "--eval-samples", "20", "--grid-per-class", "1",
        "--classifier-steps", "20", "--sample-steps", "2", "--seeds", "0", "--progress", "false", "--log-every", "3",
        "--probe-images", "2", "--batch-size", "16", "--warmup", "0"]


def test_transfer_smoke_without_metric(tmp_path):
  """Smoke test of the protocol (one ATTN step, no adaptation, no classifier): stages, tables, figures."""
  out = str(tmp_path / "quick")
  sit.main(["transfer", *TINY, "--steps", "1", "--fold-steps", "0", "--sampler", "euler", "--metric", "false",
            "--out", out])
  rows = read_json(os.path.join(out, "transfer.json"))["rows"]
  assert [r["stage"] for r in rows] == list(sit.STAGES) and "fd" not in rows[0]
  assert rows[3]["fold_max_abs_diff"] <= 1e-5 * max(1.0, rows[3]["fold_scale"])
  assert os.path.getsize(os.path.join(out, "figures_seed0.png")) > 0
  assert len(read_json(os.path.join(out, "geometry.json"))) == 5      # one layer per stage


@pytest.fixture(scope="module")
def transfer_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("transfer") / "run")
  sit.main(["transfer", *TINY, "--out", out])
  return out


@pytest.mark.slow
def test_transfer_with_metric(transfer_run):
  """Five stages in order, the fold exact, DMAP reversible, the reference rows, figures, the folded run readable."""
  out = transfer_run
  rows = read_json(os.path.join(out, "transfer.json"))["rows"]
  assert [r["stage"] for r in rows][:5] == list(sit.STAGES)
  assert [r["operator"] for r in rows][:5] == ["ATTN", "DMTN", "DMTN", "DMAP", "DMAP"]
  fold = rows[3]
  assert fold["fold_max_abs_diff"] <= 1e-5 * max(1.0, fold["fold_scale"])
  assert rows[3]["eps_rev"] < 1e-4 and rows[2]["eps_rev"] > 1e-3          # DMAP reversible, DMTN not
  assert {r["stage"] for r in rows[5:]} == {"reference: held-out real", "reference: uniform noise"}
  for stage in sit.STAGES:
    assert os.path.getsize(os.path.join(out, "seed0", stage, "samples.png")) > 0
  assert os.path.getsize(os.path.join(out, "figures_seed0.png")) > 0
  folded = sit.read_run(os.path.join(out, "seed0", "dmap_adapted"))      # a training stage is a run folder
  assert folded.cfg.block.distance_form and not hasattr(folded.blocks[0].attn, "wq")


@pytest.mark.slow
def test_transfer_resumes_finished_stages(transfer_run, capsys):
  rows = read_json(os.path.join(transfer_run, "transfer.json"))["rows"]
  capsys.readouterr()
  sit.main(["transfer", *TINY, "--out", transfer_run])
  assert capsys.readouterr().out.count("done earlier") == 5
  again = read_json(os.path.join(transfer_run, "transfer.json"))["rows"]
  assert [r["fd"] for r in again] == [r["fd"] for r in rows]


@pytest.mark.slow
def test_train_command(tmp_path):
  out = str(tmp_path / "train")
  row = sit.main(["train", *TINY, "--operator", "DMTN", "--out", out])
  assert row["operator"] == "DMTN" and np.isfinite(row["val_loss"])
  assert sit.read_run(out).cfg.block.operator == "DMTN"


def test_import_then_sample_then_transfer_refuses_mismatched_data(tmp_path, capsys):
  from test_interop_dit import official_state_dict
  from attngeo.interop import safetensors_io
  ckpt = str(tmp_path / "tiny_sit.safetensors")
  safetensors_io.write(ckpt, official_state_dict(np.random.default_rng(0), channels=1))   # 8x8x1, 5 classes
  run = str(tmp_path / "imported")
  sit.main(["import", ckpt, "--out", run, "--num-heads", "4"])
  assert "5 classes + null label, learned sigma True" in capsys.readouterr().out
  path = sit.main(["sample", run, "--per-class", "1", "--sampler", "euler", "--sample-steps", "2"])
  assert os.path.getsize(path) > 0 and np.load(path[:-4] + ".npy").shape == (5, 8, 8, 1)
  with pytest.raises(SystemExit) as e:               # digits has 10 classes; the imported model 5
    sit.main(["transfer", "--data", "digits", "--init", run, "--out", str(tmp_path / "t")])
  assert e.value.code == 2
  assert "labels must lie in [0, 5) (the model's class count)" in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "t")


@pytest.mark.parametrize("args,message", [
    (["--guidance", "0.5"], "guidance scale must be >= 1"),
    (["--sampler", "rk4"], "sampler must be one of"),
    (["--patch", "3"], "patch=3 does not divide the image size 8"),
    (["--data", "NPY_SQUARE"], "H = W"),
    (["--data", "NPY_RANGE"], r"float images of .* must lie in \[0, 1\]"),
    (["--data", "imagenet"], "data must be one of"),
])
def test_bad_input_fails_before_training(tmp_path, capsys, args, message):
  np.save(tmp_path / "square.npy", np.zeros((4, 8, 6), np.float32))
  np.save(tmp_path / "range.npy", np.full((4, 8, 8), 2.0, np.float32))
  args = [str(tmp_path / "square.npy") if a == "NPY_SQUARE" else str(tmp_path / "range.npy") if a == "NPY_RANGE" else a
          for a in args]
  base = ["--data", "digits"] if "--data" not in args else []
  for command in ("train", "transfer"):
    with pytest.raises(SystemExit) as e:
      sit.main([command, *base, *args, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("attngeo sit: error:")       # one line, no usage block
    import re
    assert re.search(message, err[0]), err[0]
  assert not os.path.exists(tmp_path / "out")


def test_full_protocol_dry_run_and_launch_line(capsys):
  cfg = sit.main(["transfer", "--full", "--dry-run"])
  out = capsys.readouterr().out
  assert (cfg.preset, cfg.adapt_steps, cfg.fold_steps, cfg.batch_size, cfg.ema) == ("XL/2", 40_000, 80_000, 256, 0.9999)
  assert "stabilityai/sd-vae-ft-ema" in out and "launch: tpu/launch_tpu.sh" in out
  launch = out.split("launch: ")[1].strip().replace(" -- ", " --dry-run -- ").split()
  res = subprocess.run(["bash", os.path.join(ROOT, launch[0]), *launch[1:]], capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  lines = [line for line in res.stdout.splitlines() if line.startswith("+ ")]
  assert lines[3].endswith("attngeo\\ sit\\ transfer\\ --full\\ --init\\ CKPT.safetensors\\ --data\\ LATENTS.npz"
                           "\\ --out\\ OUT")
