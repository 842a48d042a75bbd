"""`--reg.<term> λ` on `attngeo swissroll`, `attngeo lm train` and `attngeo sit train` (issue 30).

Each command makes a one-step tiny run with one term on: metrics.jsonl logs the term (`reg/<term>`,
finite) and the plain loss (`reg/base_loss`), the first step's plain loss is that of the same run with
every weight 0 (same initialisation, batch and rng) and the logged loss is it plus λ·R — so it differs
from the weight-0 run's. With every weight 0 a run's key is the one the code computed before the flags
existed (hard-coded keys of HEAD 036c4e0, and the key computed without the `reg` field). Bad input is
one line, exit 2, before any work.
"""
import dataclasses
import json
import os

import numpy as np
import pytest

from attngeo import config as config_lib, files
from attngeo.experiments import lm as lm_cmd, sit, sit_config, sit_run, swissroll, swissroll_config, swissroll_run
from attngeo.lm import table2
from attngeo.lm.config import LMConfig
from attngeo.regularisers_config import Regularisers


def rows(folder):
  with open(os.path.join(folder, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if line.strip()]


def check_term(reg_rows, plain_rows, term, weight):
  """The term's column is finite, the plain loss is the weight-0 run's, the loss is it + λ·R (≠ plain)."""
  r, p = reg_rows[0], plain_rows[0]
  assert r["step"] == p["step"] == 1
  value = r[f"reg/{term}"]
  assert np.isfinite(value) and value > 0 and all(np.isfinite(x[f"reg/{term}"]) for x in reg_rows)
  assert f"reg/{term}" not in p and "reg/base_loss" not in p
  np.testing.assert_allclose(r["reg/base_loss"], p["loss"], rtol=1e-5)
  np.testing.assert_allclose(r["loss"], p["loss"] + weight * value, rtol=1e-5)
  assert abs(r["loss"] - p["loss"]) > 1e-4 * abs(p["loss"])


def one_line_exit_2(capsys, call, needle, prog):
  with pytest.raises(SystemExit) as e:
    call()
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1, err
  assert err[0].startswith(f"{prog}: error:") and needle in err[0], err[0]


# ----------------------------------------------------------------------------- attngeo swissroll

SWISS = ["--operators", "ATTN", "--orders", "ffn_first", "--train.steps", "1", "--num-sets", "8", "--set-size", "32",
         "--model.width", "16", "--model.depth", "1", "--model.heads", "2", "--sample-sets", "1", "--sample-steps", "2",
         "--figure-times", "0.5,1", "--probe-sets", "1", "--probe-sizes", "32", "--heat-points", "40",
         "--train.ckpt-every", "0", "--progress", "false", "--coupling", "independent"]


def swissroll_train(cfg, op="ATTN"):
  """One condition's training as `run_condition` does it (no sampling or probing); its workdir."""
  from attngeo import data, train
  source, _ = data.point_sets(cloud="swiss_roll", num_points=cfg.num_points, seed=cfg.seed, set_size=cfg.set_size,
                              num_sets=cfg.num_sets)
  workdir = swissroll_config.condition_dir(cfg, op, "ffn_first", cfg.seed)
  train.train(swissroll_run.build_model(cfg, op, "ffn_first", cfg.seed), swissroll_run.training_loss(cfg),
              data.loader(source, cfg.train.batch_size, cfg.seed), swissroll_run.train_config(cfg, workdir, cfg.seed))
  return workdir


def test_swissroll_flag_adds_the_term_and_keeps_the_default_key(tmp_path):
  cfg = swissroll.config_from_argv([*SWISS, "--reg.skew", "0.5", "--out", str(tmp_path / "reg")])
  assert cfg.reg == Regularisers(skew=0.5)
  plain = swissroll.config_from_argv([*SWISS, "--out", str(tmp_path / "plain")])
  assert plain.reg == Regularisers()
  check_term(rows(swissroll_train(cfg)), rows(swissroll_train(plain)), "skew", 0.5)
  # keys: the default is HEAD's key and the key without the field; a term on keys another folder
  assert swissroll_config.training_key(swissroll_config.SwissRollConfig(), "DMAP", "ffn_first", 123) == "637726c60c9f42af"
  fields = {k: v for k, v in swissroll_config.flat_settings(plain).items()
            if k not in swissroll_config.NOT_TRAINING + swissroll_config.EVALUATION + ("seed", "reg")}
  from attngeo.data.points import PointSets
  without = files.fingerprint(fields, dict(operator="ATTN", order="ffn_first", data_seed=plain.seed,
                                           train_seed=plain.seed, point_sets=PointSets.VERSION))
  assert swissroll_config.training_key(plain, "ATTN", "ffn_first", plain.seed) == without
  assert swissroll_config.training_key(cfg, "ATTN", "ffn_first", cfg.seed) != without


@pytest.mark.slow
def test_swissroll_command_with_a_term(tmp_path):
  """The whole scan (train, sample, probe, figures) with one term on: its condition logs the term."""
  out = str(tmp_path / "reg")
  swissroll.main([*SWISS, "--reg.reversibility", "0.5", "--out", out])
  cfg = swissroll.config_from_argv([*SWISS, "--reg.reversibility", "0.5", "--out", out])
  (row,) = rows(swissroll_config.condition_dir(cfg, "ATTN", "ffn_first", cfg.seed))
  assert np.isfinite(row["reg/reversibility"]) and row["reg/reversibility"] > 0
  np.testing.assert_allclose(row["loss"], row["reg/base_loss"] + 0.5 * row["reg/reversibility"], rtol=1e-5)


@pytest.mark.parametrize("flags,needle", [
  (["--reg.curvature", "-0.1"], "reg.curvature must be a weight ≥ 0"),
  (["--reg.curvature", "1", "--reg.test-functions", "0"], "reg.test_functions must be an integer ≥ 1 when reg.curvature > 0"),
  (["--reg.skew", "1", "--reg.heads", "3"], "reg.heads must be ≤ the 2 heads of every attention layer; got 3"),
])
def test_swissroll_bad_reg_is_one_line(tmp_path, capsys, flags, needle):
  out = str(tmp_path / "out")
  one_line_exit_2(capsys, lambda: swissroll.main([*SWISS, *flags, "--out", out]), needle, "attngeo swissroll")
  assert not os.path.exists(out)


# ----------------------------------------------------------------------------- attngeo lm train

LM = ["--data", "pydoc", "--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "64",
      "--train.batch-size", "4", "--train.log-every", "1", "--train.ckpt-every", "1", "--train.progress", "false",
      "--train.schedule", "constant", "--train.warmup", "0", "--train.steps", "1", "--no-eval"]


def test_lm_train_logs_the_term_refuses_another_reg_and_keeps_the_default_key(tmp_path, capsys):
  data_dir = str(tmp_path / "data")
  reg_out, plain_out = str(tmp_path / "reg"), str(tmp_path / "plain")
  lm_cmd.main(["train", *LM, "--data-dir", data_dir, "--reg.isometry", "2", "--out", reg_out])
  lm_cmd.main(["train", *LM, "--data-dir", data_dir, "--out", plain_out])
  check_term(rows(reg_out), rows(plain_out), "isometry", 2.0)
  tb = [name for name in os.listdir(os.path.join(reg_out, "tb"))]
  assert tb, "TensorBoard events written"
  capsys.readouterr()
  # a run resumes only under its own reg (lm.json); the refusal leaves the folder as it was
  before = sorted(os.listdir(reg_out))
  one_line_exit_2(capsys, lambda: lm_cmd.main(["train", *LM, "--data-dir", data_dir, "--train.steps", "2",
                                               "--out", reg_out]),
                  "the run trained with reg.isometry = 2.0, not 0.0", "attngeo lm train")
  assert sorted(os.listdir(reg_out)) == before
  # keys: LMConfig()'s run key is HEAD's, and the key without the field; a term on keys another run
  assert table2.run_key(LMConfig()) == "83b5331a2ebe9d28"
  from attngeo.data import text
  lm = LMConfig(data="pydoc", depth=1, width=32, head_dim=16, seq_len=64)
  same = dataclasses.asdict(dataclasses.replace(lm, data="", data_dir=""))
  for name in ("copy_mix", "induction_lengths", "reg", "compat"):            # fields added at their old value
    del same[name]
  del same["train"]["workdir"]                  # LMTrain's run folder (a TrainConfig field since dcee05a)
  assert table2.run_key(lm) == files.fingerprint(same, text.content_key(lm.text_spec()))
  assert table2.run_key(dataclasses.replace(lm, reg=Regularisers(isometry=2.0))) != table2.run_key(lm)


@pytest.mark.parametrize("flags,needle", [
  (["--reg.reversibility", "-1"], "reg.reversibility must be a weight ≥ 0"),
  (["--reg.curvature", "0.5", "--reg.test-functions", "0"], "reg.test_functions must be an integer ≥ 1"),
  (["--reg.mixing", "1", "--reg.heads", "3"], "reg.heads must be ≤ the 2 heads of every attention layer; got 3"),
])
def test_lm_train_bad_reg_is_one_line(tmp_path, capsys, flags, needle):
  out = str(tmp_path / "out")
  one_line_exit_2(capsys, lambda: lm_cmd.main(["train", *LM, "--data-dir", str(tmp_path / "d"), *flags, "--out", out]),
                  needle, "attngeo lm train")
  assert not os.path.exists(out)


# ----------------------------------------------------------------------------- attngeo sit train

SIT = ["--data", "digits", "--model.width", "16", "--model.depth", "1", "--model.heads", "2", "--model.patch", "2",
       "--train.steps", "1", "--eval-samples", "4", "--grid-per-class", "1", "--sample-steps", "1", "--sampler", "euler",
       "--seeds", "0", "--progress", "false", "--train.log-every", "1", "--probe-images", "2", "--train.batch-size", "8",
       "--train.warmup", "0", "--metric", "false", "--train.ckpt-every", "0"]


def sit_train_config(flags, out):
  """`sit train`'s config from its flags, as `sit.main` parses them."""
  return config_lib.from_arguments(sit.train_parser().parse_args([*SIT, *flags, "--out", out]), sit_config.SiTConfig,
                                       sit_config.TRAIN_BASE)


def sit_train(cfg, prepared):
  """`sit train`'s training (`train_stage` of `train_one`, no sampling or probing) on `prepared` (`sit_run.prepare`)."""
  from flax import nnx

  from attngeo import nn
  train_src, ev = prepared
  mcfg = cfg.model.dit_config(cfg.operator, image_size=ev["image_shape"][1], channels=ev["image_shape"][3],
                              num_classes=ev["num_classes"])
  sit_run.train_stage(nn.DiT(mcfg, rngs=nnx.Rngs(cfg.seeds[0])), cfg, train_src, cfg.out, cfg.seeds[0], "sit")
  return cfg.out


CURV = ["--reg.curvature", "0.5", "--reg.test-functions", "2", "--reg.curvature-target", "2"]


@pytest.mark.slow            # 126 s on this shared machine (2 cores, load 9): data, a DiT and the term's compile
def test_sit_train_flag_adds_the_term(tmp_path):
  cfg, plain = sit_train_config(["--reg.skew", "3"], str(tmp_path / "reg")), sit_train_config([], str(tmp_path / "plain"))
  assert cfg.reg == Regularisers(skew=3.0) and plain.reg == Regularisers()
  prepared = sit_run.prepare(cfg)
  check_term(rows(sit_train(cfg, prepared)), rows(sit_train(plain, prepared)), "skew", 3.0)


@pytest.mark.slow
def test_sit_train_command_with_a_term(tmp_path):
  """The whole `sit train` (train, sample, probe) with one term on: metrics.jsonl and config.json hold it."""
  out = str(tmp_path / "reg")
  sit.main(["train", *SIT, *CURV, "--out", out])
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["sit"]["reg"]["curvature"] == 0.5
  (row,) = rows(out)
  assert np.isfinite(row["reg/curvature"]) and row["reg/curvature"] > 0
  np.testing.assert_allclose(row["loss"], row["reg/base_loss"] + 0.5 * row["reg/curvature"], rtol=1e-5)


def test_sit_reg_flags_are_train_only_and_bad_reg_is_one_line(tmp_path, capsys):
  out = str(tmp_path / "out")
  for flags, needle in ((["--reg.skew", "-2"], "reg.skew must be a weight ≥ 0"),
                        (["--reg.curvature", "1", "--reg.test-functions", "0"], "reg.test_functions must be an integer ≥ 1"),
                        (["--reg.skew", "1", "--reg.heads", "3"], "reg.heads must be ≤ the 2 heads")):
    one_line_exit_2(capsys, lambda: sit.main(["train", *SIT, *flags, "--out", out]), needle, "attngeo sit train")
  one_line_exit_2(capsys, lambda: sit.main(["transfer", "--reg.skew", "1", "--out", out]), "unrecognized arguments",
                  "attngeo sit transfer")
  assert not os.path.exists(out)


def test_a_model_without_attention_is_refused_before_any_work():
  """The check every command runs first (`regularisers.check_build`, on the model built abstractly)."""
  from flax import nnx

  from attngeo import regularisers
  build = lambda: nnx.Linear(4, 4, rngs=nnx.Rngs(0))     # noqa: E731
  with pytest.raises(ValueError) as e:
    regularisers.check_build(Regularisers(reversibility=0.3), build)
  assert str(e.value) == ("reg.reversibility = 0.3 asks for the attention walk, but the model has no attention "
                          "layers")
  regularisers.check_build(Regularisers(), build)           # every term off: nothing asked of the model
