"""The SiT experiment: the distance-form fold is exact, the transfer protocol runs end to end (smoke),
official checkpoints import as runs, and bad input fails in one line before any training."""
import dataclasses
import glob
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import config as config_lib, files, nn, runs
from attngeo.experiments import sit, sit_config, sit_run

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
  idx = sit_run.grid_order(10, 3, 10)
  assert (labels[idx].reshape(10, 3) == np.arange(10)[:, None]).all()


TINY = ["--data", "digits", "--model.width", "16", "--model.depth", "1", "--model.heads", "2", "--model.patch", "2",
        "--train.steps", "4",
        "--adapt-steps", "0", "--fold-steps", "2", "--eval-samples", "20", "--grid-per-class", "1",
        "--classifier-steps", "20", "--sample-steps", "2", "--seeds", "0", "--progress", "false",
        "--train.log-every", "3",
        "--probe-images", "2", "--train.batch-size", "16", "--train.warmup", "0"]
TRANSFER_ONLY = ("--adapt-steps", "--fold-steps")
TRAIN_TINY = [a for i, a in enumerate(TINY) if a not in TRANSFER_ONLY and TINY[i - 1] not in TRANSFER_ONLY]


def test_transfer_smoke_without_metric(tmp_path):
  """Smoke test of the protocol (one ATTN step, no adaptation, no classifier): stages, tables, figures."""
  out = str(tmp_path / "quick")
  sit.main(["transfer", *TINY, "--train.steps", "1", "--fold-steps", "0", "--sampler", "euler", "--metric", "false",
            "--out", out])
  rows = read_json(os.path.join(out, "transfer.json"))["rows"]
  assert [r["stage"] for r in rows] == list(sit_config.STAGES) and "fd" not in rows[0]
  assert rows[3]["fold_max_abs_diff"] <= 1e-5 * max(1.0, rows[3]["fold_scale"])
  assert os.path.getsize(os.path.join(out, "figures_seed0.png")) > 0
  assert len(read_json(os.path.join(out, "geometry.json"))) == 5      # one layer per stage
  assert read_json(os.path.join(out, "seed0", "attn", "config.json"))["train"]["ema"] == 0.999   # --ema
  # Memorisation: the held-out digits' distance to the training set is one number, whatever the stage.
  assert len({r["nn_heldout"] for r in rows}) == 1 and rows[0]["nn_heldout"] > 0
  for r in rows:
    assert r["nn_ratio"] > 0
    assert os.path.getsize(os.path.join(out, "seed0", r["stage"], "neighbours.png")) > 0
  # Every stage is a run folder (`sit sample`, `probe`, --init): the graft and the fold held weights but no config.
  for stage, operator in (("dmtn_graft", "DMTN"), ("dmap_fold", "DMAP")):
    model, _, mcfg = runs.load_run(os.path.join(out, "seed0", stage))
    assert mcfg.block.operator == operator and mcfg.block.distance_form == (stage == "dmap_fold")
  # --bench on a stage of a --metric false run says so (it named imports and latents)
  sit.main(["sample", os.path.join(out, "seed0", "attn"), "--bench", "euler:1", "--eval-samples", "4",
            "--out", str(tmp_path / "bench")])
  assert "no metric: the run was made with --metric false" in (tmp_path / "bench" / "sample_bench.md").read_text()
  # A damaged stage record is one line naming it on the rerun (was json's "Expecting value: line 1 column 1").
  with open(os.path.join(out, "seed0", "dmtn_graft", "stage.json"), "w"):
    pass
  with pytest.raises(ValueError, match=r"dmtn_graft/stage\.json is not valid JSON"):
    sit.main(["transfer", *TINY, "--train.steps", "1", "--fold-steps", "0", "--sampler", "euler", "--metric",
              "false", "--out", out])


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
  assert [r["stage"] for r in rows][:5] == list(sit_config.STAGES)
  assert [r["operator"] for r in rows][:5] == ["ATTN", "DMTN", "DMTN", "DMAP", "DMAP"]
  fold = rows[3]
  assert fold["fold_max_abs_diff"] <= 1e-5 * max(1.0, fold["fold_scale"])
  assert read_json(os.path.join(out, "seed0", "dmap_adapted", "config.json"))["train"]["ema"] == 0.995  # adapt_ema
  assert rows[3]["eps_rev"] < 1e-4 and rows[2]["eps_rev"] > 1e-3          # DMAP reversible, DMTN not
  assert {r["stage"] for r in rows[5:]} == {"reference: held-out real", "reference: uniform noise"}
  for stage in sit_config.STAGES:
    assert os.path.getsize(os.path.join(out, "seed0", stage, "samples.png")) > 0
  assert os.path.getsize(os.path.join(out, "figures_seed0.png")) > 0
  bench = sit.main(["sample", os.path.join(out, "seed0", "dmap_adapted"), "--bench", "heun:2"])   # a stage folder
  assert bench[0]["fd"] == pytest.approx(rows[4]["fd"], rel=1e-6)        # its own row, with the transfer's metric
  folded = runs.load_run(os.path.join(out, "seed0", "dmap_adapted"))[0]      # a training stage is a run folder
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
  row = sit.main(["train", *TRAIN_TINY, "--operator", "DMTN", "--out", out])
  assert row["operator"] == "DMTN" and np.isfinite(row["val_loss"])
  assert runs.load_run(out)[0].cfg.block.operator == "DMTN"
  # --bench at the run's own sampler settings reproduces its metric row: the same labels, noise, guidance, classifier.
  bench = sit.main(["sample", out, "--bench", "heun:2"])
  own = read_json(os.path.join(out, "metric.json"))[0]
  for key in ("fd", "precision", "recall", "accuracy", "nn_ratio"):
    assert bench[0][key] == pytest.approx(own[key], rel=1e-6), key


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
    (["--guidance", "-2"], r"guidance scale must be >= 1 \(1 = no guidance\); got -2\.0"),
    (["--sampler", "rk4"], "sampler must be one of"),
    (["--sample-steps", "0"], "sample_steps must be positive; got 0"),
    (["--model.width", "0"], "model.width must be positive; got 0"),    # was a ZeroDivisionError after data and
                                                                       # classifier
    (["--model.heads", "-1"], "model.heads must be positive; got -1"),
    (["--model.patch", "3"], "patch=3 does not divide the image size 8"),
    (["--data", "NPY_SQUARE"], "H = W"),
    (["--data", "NPY_RANGE"], r"float images of .* must lie in \[0, 1\]"),
    (["--data", "MIXED"], r"one size and channel count; .*a/0\.png is 8x8 grey but .*b/0\.png is 6x6 grey"),
    (["--data", "imagenet"], "data must be one of"),
    (["--train.lr", "-1"], r"^.*: train\.lr must be a positive finite rate; got -1\.0"),   # were TrainConfig's,
    (["--train.ema", "1"], r"train\.ema must be a decay in \[0, 1\)"),       # after data and classifier (issue 25)
    (["--train.log-every", "0"], "train.log_every must be an integer ≥ 1"),
    (["--guidance", "inf"], r"guidance scale must be finite .*; got inf"),     # every sample was NaN, FD printed
    (["--seeds", "0,-1"], r"seeds must be integers in \[0, 2³²\) .*; got -1"),  # failed after seed 0's whole run
    (["--train.mesh", "1,1,2"], r"train\.mesh \(1, 1, 2\) needs 2 devices; 1 are available"),   # after data written
    (["--steps", "3"], r"--steps is now --train\.steps"),                      # the flat layout's flags
    (["--ema=0.9"], r"--ema is now --train\.ema"),
    (["--mlp-ratio", "2"], r"--mlp-ratio is now --model\.mlp-ratio"),
    (["--eval-samples", "3"], r"eval_samples must be >= 4 with the metric"),  # `sit sample` refused it already
])
def test_bad_input_fails_before_training(tmp_path, capsys, args, message):
  from PIL import Image
  np.save(tmp_path / "square.npy", np.zeros((4, 8, 6), np.float32))
  np.save(tmp_path / "range.npy", np.full((4, 8, 8), 2.0, np.float32))
  for name, size in (("a", 8), ("b", 6)):
    os.makedirs(tmp_path / "mixed" / name)
    Image.fromarray(np.zeros((size, size), np.uint8)).save(tmp_path / "mixed" / name / "0.png")
  names = {"NPY_SQUARE": "square.npy", "NPY_RANGE": "range.npy", "MIXED": "mixed"}
  args = [str(tmp_path / names[a]) if a in names else a for a in args]
  base = ["--data", "digits"] if "--data" not in args else []
  for command in ("train", "transfer"):
    with pytest.raises(SystemExit) as e:
      sit.main([command, *base, *args, "--out", str(tmp_path / "out")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"attngeo sit {command}: error:"), err   # one line, no usage block
    assert err[0].endswith(f"(see attngeo sit {command} --help)")
    assert re.search(message, err[0]), err[0]
  assert not os.path.exists(tmp_path / "out")


# `sit train`'s default config as run folders recorded it before `model` and `train` were nested (issue 25).
FLAT_RECORD = {
    "data": "mnist", "test_fraction": 0.1, "preset": None, "width": 96, "depth": 4, "heads": 4, "patch": 4,
    "mlp_ratio": 4.0, "operator": "ATTN", "class_dropout": 0.1, "steps": 12000, "adapt_steps": 1000,
    "fold_steps": 1000, "batch_size": 64, "lr": 0.001, "adapt_lr": 0.0003, "warmup": 100, "schedule": "cosine",
    "ema": 0.999, "adapt_ema": 0.995, "mesh": [1, 1, 1], "sampler": "heun", "sample_steps": 16, "guidance": 1.5,
    "eval_samples": 300, "grid_per_class": 6, "probe_images": 4, "classifier_steps": 1500, "metric": True,
    "seeds": [0, 1], "init": None, "num_heads": None, "out": "runs/sit_train", "log_every": 50, "ckpt_every": 200,
    "progress": True, "reg": json.loads(json.dumps(dataclasses.asdict(sit_config.TRAIN_BASE.reg)))}


def test_a_flat_record_reads_as_the_nested_config():
  """A config.json written before the nesting reads as the same settings: every old field lands in its group."""
  nested = json.loads(json.dumps(dataclasses.asdict(sit_config.TRAIN_BASE)))
  assert sit_config.nested_record(FLAT_RECORD) == nested
  assert sit_config.nested_record(nested) == nested
  assert sit_config.from_record(FLAT_RECORD) == sit_config.TRAIN_BASE
  assert sit_config.from_record({**FLAT_RECORD, "retired_field": 1}) == sit_config.TRAIN_BASE   # an older version's


def test_a_flat_run_folder_resumes_under_the_same_settings_only(tmp_path):
  """`check_run_folder` compares a flat record with the nested config field by field: the same settings pass,
  another rate is refused naming the nested field, a control field may change."""
  out = str(tmp_path / "old")
  os.makedirs(out)
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"sit": {**FLAT_RECORD, "out": out}}, f)
  base = dataclasses.replace(sit_config.TRAIN_BASE, out=out)
  sit_config.check_run_folder(base, "train")
  sit_config.check_run_folder(config_lib.replaced(base, {"train.log_every": 7, "sampler": "euler"}), "train")
  with pytest.raises(ValueError, match=r"sit\.train\.lr 0\.001 → 0\.002"):
    sit_config.check_run_folder(config_lib.replaced(base, {"train.lr": 0.002}), "train")
  with pytest.raises(ValueError, match=r"sit\.model\.width 96 → 32"):
    sit_config.check_run_folder(config_lib.replaced(base, {"model.width": 32}), "transfer")


@pytest.mark.parametrize("args,message", [
    (["--init", "RUN", "--train.steps", "5"], r"train\.steps must be 0 with --init .*; got 5"),   # recorded 5, ran 0
    (["--init", "RUN", "--train.steps", "0", "--model.width", "32"],
     r"--model\.\* settings do not apply with --init .*; got model\.width=32"),      # recorded 32, ran the checkpoint's
])
def test_init_refuses_settings_it_would_ignore(tmp_path, capsys, args, message):
  args = [str(tmp_path / "run") if a == "RUN" else a for a in args]
  err = one_error_line(capsys, ["transfer", "--data", "digits", *args, "--out", str(tmp_path / "t")], "transfer")
  assert re.search(message, err), err
  assert not os.path.exists(tmp_path / "t")


def test_num_heads_without_init_is_refused(tmp_path, capsys):
  err = one_error_line(capsys, ["transfer", "--num-heads", "3", "--out", str(tmp_path / "t")], "transfer")
  assert "num_heads applies only with --init" in err and not os.path.exists(tmp_path / "t")


def test_init_from_a_model_that_is_not_attn_is_refused(tmp_path, capsys):
  """The transfer's first stage is ATTN: a DMTN model was labelled `attn | ATTN` (or failed after its stage)."""
  from test_interop_dit import official_state_dict

  from attngeo.interop import safetensors_io
  ckpt = str(tmp_path / "tiny_sit.safetensors")
  safetensors_io.write(ckpt, official_state_dict(np.random.default_rng(0), channels=1))
  run = str(tmp_path / "imported")
  sit.main(["import", ckpt, "--out", run, "--num-heads", "4"])
  model, _, _ = runs.load_run(run)
  nn.graft(model, "DMTN")
  model.cfg = model.cfg.with_operator("DMTN")
  dmtn = str(tmp_path / "dmtn")
  runs.write_weights_run(dmtn, model)
  capsys.readouterr()
  err = one_error_line(capsys, ["transfer", "--data", "digits", "--init", dmtn, "--train.steps", "0",
                                "--out", str(tmp_path / "t")], "transfer")
  assert "runs operator 'DMTN'; the transfer starts from an ATTN model" in err and not os.path.exists(tmp_path / "t")


@pytest.mark.parametrize("made_by, other", [("train", "transfer"), ("transfer", "train")])
@pytest.mark.parametrize("legacy", [False, True])
def test_a_sit_folder_serves_only_the_command_that_made_it(tmp_path, capsys, made_by, other, legacy):
  """`sit train` into a transfer folder took it over (and the transfer into a train folder dropped its model
  record): refused in one line, nothing written. A folder from before `sit_command` was recorded is told by what
  it holds (a train folder's trainer and model records; a transfer's transfer.json)."""
  out = tmp_path / "run"
  out.mkdir()
  record = {"sit": {**json.loads(json.dumps(dataclasses.asdict(sit_config.TRAIN_BASE))), "out": str(out)}}
  if legacy and made_by == "train":
    record.update(train={"steps": 1}, model={"class": "DiTConfig"})
  elif legacy:
    (out / "transfer.json").write_text("{}")
  else:
    record["sit_command"] = made_by
  (out / "config.json").write_text(json.dumps(record))
  before = snapshot(out)
  err = one_error_line(capsys, [other, "--data", "digits", "--out", str(out)], other)
  assert f"holds a `sit {made_by}` run; `sit {other}` needs a folder of its own" in err, err
  assert snapshot(out) == before


def test_sit_train_resumes_only_its_own_seed(tmp_path):
  """`sit train` trains `seeds[0]`: another first seed was refused by the trainer only after the classifier and
  a rewritten record (which then misled `sit sample --bench`); now before anything, naming it."""
  out = str(tmp_path / "run")
  os.makedirs(out)
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"sit": {**FLAT_RECORD, "out": out}, "sit_command": "train"}, f)
  base = dataclasses.replace(sit_config.TRAIN_BASE, out=out)
  sit_config.check_run_folder(dataclasses.replace(base, seeds=(0, 7)), "train")          # the first seed counts
  with pytest.raises(ValueError, match=r"sit\.seeds\[0\] 0 → 5"):
    sit_config.check_run_folder(dataclasses.replace(base, seeds=(5,)), "train")


@pytest.mark.parametrize("content", ["null", "[1]", '{"sit": [1]}'])
def test_a_config_json_that_is_not_a_record_is_one_line(tmp_path, capsys, content):
  out = tmp_path / "run"
  out.mkdir()
  (out / "config.json").write_text(content)
  err = one_error_line(capsys, ["train", "--data", "digits", "--out", str(out)], "train")
  assert "config.json is not a run's config" in err or "the recorded sit settings are damaged" in err, err
  assert sorted(os.listdir(out)) == ["config.json"]


def test_bench_on_a_transfer_stage_uses_that_stage_s_seed(tmp_path):
  """`sit sample OUT/seed1/<stage> --bench` drew seed 0's noise (the transfer's first seed), so it did not
  reproduce the stage's own metric row; a stage's seed is its folder's, the flag still wins."""
  import argparse
  import types
  out = tmp_path / "transfer"
  (out / "seed1" / "dmap_adapted").mkdir(parents=True)
  record = {**json.loads(json.dumps(dataclasses.asdict(sit_config.SiTConfig()))), "metric": False, "seeds": [0, 1]}
  (out / "config.json").write_text(json.dumps({"sit": record, "sit_command": "transfer"}))
  model = types.SimpleNamespace(cfg=types.SimpleNamespace(num_classes=10, channels=1))
  args = argparse.Namespace(guidance=None, seeds=None, eval_samples=None)
  stage = str(out / "seed1" / "dmap_adapted")
  assert sit_run.bench_inputs(model, stage, args)[0].seeds == (1,)
  assert sit_run.bench_inputs(model, stage, argparse.Namespace(guidance=None, seeds=(3,), eval_samples=None))[0].seeds \
      == (3,)


def test_adapt_ema_outside_0_1_is_one_line(tmp_path, capsys):
  err = one_error_line(capsys, ["transfer", "--data", "digits", "--adapt-ema", "1.5", "--out", str(tmp_path / "t")],
                       "transfer")
  assert "adapt_ema must lie in [0, 1) (0: no EMA); got 1.5" in err and not os.path.exists(tmp_path / "t")


def test_full_protocol_dry_run_and_launch_line(capsys):
  cfg = sit.main(["transfer", "--full", "--dry-run"])
  out = capsys.readouterr().out
  assert (cfg.model.preset, cfg.adapt_steps, cfg.fold_steps, cfg.train.batch_size, cfg.train.ema) == ("XL/2", 40_000, 80_000,
                                                                                               256, 0.9999)
  assert "stabilityai/sd-vae-ft-ema" in out and "launch: tpu/launch_tpu.sh" in out
  launch = out.split("launch: ")[1].strip().replace(" -- ", " --dry-run -- ").split()
  res = subprocess.run(["bash", os.path.join(ROOT, launch[0]), *launch[1:]], capture_output=True, text=True, timeout=60)
  assert res.returncode == 0, res.stderr
  lines = [line for line in res.stdout.splitlines() if line.startswith("+ ")]
  assert lines[3].endswith("attngeo\\ sit\\ transfer\\ --full\\ --init\\ CKPT.safetensors\\ --data\\ LATENTS.npz"
                           "\\ --out\\ OUT")


@pytest.fixture
def imported_run(tmp_path):
  from test_interop_dit import official_state_dict
  from attngeo.interop import safetensors_io
  ckpt = str(tmp_path / "tiny_sit.safetensors")
  safetensors_io.write(ckpt, official_state_dict(np.random.default_rng(0), channels=1))   # 8x8x1, 5 classes, width 32
  run = str(tmp_path / "imported")
  sit.main(["import", ckpt, "--out", run, "--num-heads", "4"])
  return ckpt, run


def one_error_line(capsys, argv, command):
  with pytest.raises(SystemExit) as e:
    sit.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"attngeo sit {command}: error:"), err
  return err[0]


def snapshot(folder):
  out = {}
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), "rb") as f:
      out[name] = f.read()
  return out


@pytest.mark.parametrize("heads,message", [("0", "expected a positive integer; got 0"),
                                           ("-4", "expected a positive integer; got -4"),
                                           ("3", "num_heads=3 must divide the checkpoint's width 32")])
def test_import_heads_must_be_a_positive_divisor(imported_run, tmp_path, capsys, heads, message):
  ckpt, _ = imported_run
  capsys.readouterr()
  err = one_error_line(capsys, ["import", ckpt, "--out", str(tmp_path / "new"), "--num-heads", heads], "import")
  assert message in err and not os.path.exists(tmp_path / "new")


def test_import_refuses_an_existing_run_unless_overwrite(imported_run, capsys):
  ckpt, run = imported_run
  before = snapshot(run)
  capsys.readouterr()
  err = one_error_line(capsys, ["import", ckpt, "--out", run, "--num-heads", "2"], "import")
  assert f"--out {run} already holds files (config.json, weights.npz)" in err and "--overwrite" in err
  assert snapshot(run) == before                                      # nothing changed on disk
  os.makedirs(os.path.join(run, "probe"), exist_ok=True)              # outputs of the old run (break-it pass:
  open(os.path.join(run, "samples_euler_2_g1.5.png"), "wb").close()    # they stayed beside the new weights)
  sit.main(["import", ckpt, "--out", run, "--num-heads", "2", "--overwrite"])
  assert runs.load_run(run)[0].cfg.block.num_heads == 2
  assert sorted(os.listdir(run)) == ["config.json", "weights.npz"]
  assert not glob.glob(run.rstrip(os.sep) + ".*")                     # no staging folder left beside it


@pytest.mark.parametrize("args,message", [(["--per-class", "0"], "argument --per-class: expected a positive integer"),
                                          (["--guidance", "-1"], "guidance scale must be >= 1"),
                                          (["--sample-steps", "0"], "sample_steps must be positive"),
                                          (["--bench", "heun:16,rk4:8"], "got 'rk4:8'"),
                                          (["--bench", "euler:0"], "STEPS a positive integer; got 'euler:0'"),
                                          (["--bench", "euler:4", "--eval-samples", "3"], "expected an integer >= 4")])
def test_sample_bad_input_is_one_line(imported_run, capsys, args, message):
  _, run = imported_run
  before = snapshot(run)
  capsys.readouterr()
  assert message in one_error_line(capsys, ["sample", run, *args], "sample")
  assert snapshot(run) == before


def test_sample_refuses_a_run_of_another_model_in_one_line(tmp_path, capsys):
  """A language model's run folder (newcomer walk: AttributeError 'GPTConfig' object has no attribute 'null_label')."""
  run = str(tmp_path / "lm")
  files.write_config(run, model=nn.config_dict(nn.GPTConfig()))        # as `lm train` records its model
  before = snapshot(run)
  err = one_error_line(capsys, ["sample", run], "sample")
  assert "holds a GPT model; sit sample takes SiT runs" in err
  assert snapshot(run) == before


def test_sample_bench_times_each_sampler(imported_run, tmp_path):
  """`sit sample --bench`: one row per sampler setting; an imported checkpoint records no data, so no metric."""
  _, run = imported_run
  out = str(tmp_path / "bench")
  rows = sit.main(["sample", run, "--bench", "euler:2,heun:2", "--eval-samples", "6", "--out", out])
  assert [(r["sampler"], r["steps"]) for r in rows] == [("euler", 2), ("heun", 2)]
  assert all(r["samples_per_s"] > 0 and "fd" not in r for r in rows)
  assert "no metric: the run records no sit data" in pathlib.Path(out, "sample_bench.md").read_text()
  assert read_json(os.path.join(out, "sample_bench.json"))["rows"][1]["sampler"] == "heun"


def test_labels_outside_the_classes_are_refused():
  model = random_dit(class_dropout_prob=0.1)                    # 3 classes + the null label 3
  x, t, _ = inputs(2)
  for y in ([0, 4], [-1, 0]):
    with pytest.raises(ValueError, match=r"labels y must lie in \[0, 4\) \(3 classes and the null label 3\)"):
      model(x, t, jnp.asarray(y))
  assert model(x, t, jnp.asarray([3, 3])).shape == x.shape       # the null label is a label


def test_dry_run_local_line_and_help(capsys):
  sit.main(["transfer", "--dry-run", "--train.steps", "3", "--seeds", "0"])
  assert capsys.readouterr().out.strip().splitlines()[-1] == "local: attngeo sit transfer --train.steps 3 --seeds 0"
  helps = {"train": sit.train_parser().format_help(), "transfer": sit.transfer_parser().format_help()}
  assert "(default: runs/sit_train)" in helps["train"] and "(default: runs/sit)" in helps["transfer"]
  for flag in ("--adapt-steps", "--fold-steps", "--adapt-lr", "--init", "--num-heads"):
    assert flag not in helps["train"] and flag in helps["transfer"]
  assert "--operator" in helps["train"] and "--operator" not in helps["transfer"]
  with pytest.raises(SystemExit) as exit_:
    sit.main(["--help"])
  top = capsys.readouterr().out
  assert exit_.value.code == 0
  assert "usage: attngeo sit {train,sample,transfer,import}" in top and "attngeo sit SUB --help lists its options" in top


def test_argument_errors_and_the_dry_run_answer_without_importing_jax():
  code = ("import sys\nfrom attngeo.experiments import sit\n"
          "sit.main(['transfer', '--dry-run', '--model.preset', 'S/2'])\n"
          "try:\n  sit.main(['train', '--sampler', 'bogus', '--out', '/nonexistent/x'])\nexcept SystemExit:\n  pass\n"
          "print('JAX', 'jax' in sys.modules)")
  run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert run.stdout.strip().endswith("JAX False") and "sampler" in run.stderr


def test_full_dry_run_says_when_flags_override_its_notes(capsys):
  """The notes describe SiT-XL/2 at batch 256 whatever the flags; with --model.preset S/2 they now say the JSON
  rules (break-it pass)."""
  sit.main(["transfer", "--full", "--dry-run"])
  assert "override these notes" not in capsys.readouterr().out
  cfg = sit.main(["transfer", "--full", "--dry-run", "--model.preset", "S/2"])
  assert cfg.model.preset == "S/2" and "override these notes: the JSON above is what would run" in \
      capsys.readouterr().out


def test_full_dry_run_prints_its_cost(capsys):
  """Training FLOPs from the official SiT-XL/2 layout's weight shapes (interop.dit), chip-hours at 40 % MFU."""
  from attngeo import train
  from attngeo.interop import dit as dit_import
  cfg = sit.main(["transfer", "--full", "--dry-run"])
  out = capsys.readouterr().out
  mcfg = nn.DiTConfig.preset("XL/2", **sit_config.FULL_DATA)
  shapes = dit_import.expected_shapes(mcfg)
  matrices = {k: math.prod(s) for k, s in shapes.items() if k.endswith(".weight") and "embedding_table" not in k}
  per_image = sum(v for k, v in matrices.items() if "adaLN" in k or k.startswith("t_embedder"))
  per_token = sum(matrices.values()) - per_image
  tokens, width = shapes["pos_embed"][1], shapes["pos_embed"][2]
  flops = 6 * (tokens * per_token + per_image) + 12 * mcfg.depth * tokens ** 2 * width
  images = (cfg.train.steps + cfg.adapt_steps + cfg.fold_steps) * cfg.train.batch_size * len(cfg.seeds)
  hours = images * flops / (train.PEAK_FLOPS["TPU v5e"] * 0.4) / 3600
  assert f"{flops / 1e9:.0f} GFLOPs per training image" in out and f"{images:,} images" in out
  assert f"TPU v5e: {hours:,.0f} chip-hours at 40% MFU ({hours / 8:.1f} h on 8 chips" in out


def test_sample_grid_rows_are_labelled_with_their_class(imported_run, monkeypatch):
  import matplotlib.figure
  _, run = imported_run
  shown = []

  def savefig(fig, path, **kw):                     # records the rows' labels; writes the (atomic) file, empty
    shown.append([t.get_text() for t in fig.axes[0].get_yticklabels()])
    open(path, "wb").close()
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
  sit.main(["sample", run, "--per-class", "2", "--sampler", "euler", "--sample-steps", "1"])
  assert shown == [[f"class {c}" for c in range(5)]]


def test_transfer_refuses_a_folder_made_under_other_settings(tmp_path, capsys):
  """Finished stages are read back: a re-run under other settings would report them as its own."""
  out = str(tmp_path / "run")
  sit.main(["transfer", *TINY, "--train.steps", "1", "--fold-steps", "0", "--sampler", "euler", "--metric", "false",
            "--out", out])
  before = {p: os.path.getmtime(os.path.join(out, p)) for p in ("config.json", "transfer.json")}
  with pytest.raises(SystemExit):
    sit.main(["transfer", *TINY, "--train.steps", "2", "--fold-steps", "0", "--sampler", "euler", "--metric", "false",
              "--out", out])
  assert "sit.train.steps 1 → 2" in capsys.readouterr().err
  assert before == {p: os.path.getmtime(os.path.join(out, p)) for p in before}      # nothing rewritten
  capsys.readouterr()
  sit.main(["transfer", *TINY, "--train.steps", "1", "--fold-steps", "0", "--sampler", "euler", "--metric", "false",
            "--seeds", "0", "--train.log-every", "7", "--out", out])                          # control fields may change
  assert capsys.readouterr().out.count("done earlier") == 5


def test_classifier_is_reused_only_for_its_own_settings(tmp_path):
  """The metric's classifier is keyed by its config and images: other --classifier-steps train a new one."""
  out = str(tmp_path / "run")

  def prepare(steps):
    ev = sit_run.prepare(sit_config.SiTConfig(data="digits", classifier_steps=steps, out=out, progress=False))[1]
    [folder] = glob.glob(os.path.join(out, "classifier", "*"))
    return ev["classifier"].cfg.steps, os.stat(os.path.join(folder, "params.npz")).st_mtime_ns
  first, again, other = prepare(5), prepare(5), prepare(6)
  assert again == first                                   # read back, not retrained
  assert other[0] == 6 and other[1] != first[1]           # retrained (and rewritten) under the new setting


def test_train_resume_under_another_loss_or_model_is_refused(tmp_path, capsys):
  """A `sit train` folder resumes only the run its checkpoints hold: another --reg.skew or width is one line,
  nothing rewritten; what is only evaluated (sampler steps) may change."""
  out = str(tmp_path / "train")
  args = ["train", *TRAIN_TINY, "--train.steps", "2", "--metric", "false", "--sampler", "euler", "--out", out]
  sit.main(args)
  listing = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(out, "**"), recursive=True)}
  for extra, field in ((["--reg.skew", "0.1"], "sit.reg.skew 0.0 → 0.1"),
                       (["--model.width", "32"], "sit.model.width 16 → 32"),
                       (["--train.steps", "3"], "sit.train.steps 2 → 3")):       # cosine: another trajectory
    with pytest.raises(SystemExit):
      sit.main(args + extra)
    assert field in capsys.readouterr().err
    assert listing == {p: os.path.getmtime(p) for p in glob.glob(os.path.join(out, "**"), recursive=True)}
  capsys.readouterr()
  row = sit.main(args + ["--sample-steps", "3"])
  assert np.isfinite(row["val_loss"])
  assert "probe:" not in capsys.readouterr().err                    # --progress false: no bar (the probe drew one)


def test_train_into_another_kind_of_run_is_refused_before_any_data(tmp_path, capsys):
  """An lm run folder (or an import) is not resumed as a SiT: refused in one line, nothing added (it wrote the
  image data and trained the classifier first, then the trainer refused)."""
  out = tmp_path / "lm_run"
  out.mkdir()
  (out / "config.json").write_text(json.dumps({"train": {"steps": 5}, "model": {"class": "GPTConfig"}}))
  with pytest.raises(SystemExit):
    sit.main(["train", *TRAIN_TINY, "--out", str(out)])
  assert "holds another kind of run (its config.json records model, train)" in capsys.readouterr().err
  assert sorted(os.listdir(out)) == ["config.json"]


@pytest.mark.parametrize("args, message", [(["--classifier-steps", "0"], "classifier_steps must be ≥ 1"),
                                           (["--test-fraction", "1"], r"test_fraction must lie in \(0, 1\)")])
def test_metric_settings_are_checked_before_any_data(tmp_path, capsys, args, message):
  out = tmp_path / "never"
  with pytest.raises(SystemExit):
    sit.main(["train", *TRAIN_TINY, *args, "--out", str(out)])
  assert re.search(message, capsys.readouterr().err) and not out.exists()

