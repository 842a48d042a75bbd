"""The research loop on every kind of run, through the `attngeo` command as a user types it:

    make the run (tiny) → attngeo probe RUN → attngeo study connection --runs RUN (GPT, PointFlow)
    → attngeo export RUN (GPT) → attngeo import (the exported file) → the same logits.

One test per run kind: `lm train`, an `lm table2` condition, an `lm adapt` state, `sit train`, a
`sit transfer` stage, a Swiss-roll condition, a `study connection` model, and imported GPT-2, nanochat
and SiT/DiT checkpoints. A layout that cannot carry a model refuses in one line (exit 2) and writes
nothing; one that can re-imports to logits equal within float32 rounding.
"""
import dataclasses
import glob
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_interop_dit import official_state_dict
from test_interop_gpt2 import random_state as gpt2_state, write_model as write_gpt2
from test_interop_nanochat import VINTAGE, random_state as nanochat_state, write as write_nanochat
from test_lm_adapt import ADAPT, TINY as LM_TINY
from test_sit import TINY as SIT_TINY, TRAIN_TINY as SIT_TRAIN_TINY
from test_study_connection import smoke_argv
from test_swissroll import made_scan, scan_config

from attngeo import cli, nn, runs

forward = nnx.jit(lambda model, ids: model(ids))


def attngeo(capsys, *argv) -> tuple[int, str]:
  """`attngeo ARGV` as the shell runs it (one-line errors, exit codes): (status, stderr)."""
  capsys.readouterr()
  try:
    code = cli.main(list(argv))
  except SystemExit as e:          # argparse's own usage errors
    code = e.code
  return code, capsys.readouterr().err


def read_json(path):
  with open(path) as f:
    return json.load(f)


def probe(capsys, run, tmp, *data):
  out = os.path.join(tmp, "probe")
  code, err = attngeo(capsys, "probe", run, *data, "--batch", "1", "--samples", "8", "--triangles", "16",
                      "--no-progress", "--out", out)
  assert code == 0, err
  rows = read_json(os.path.join(out, "probe.json"))["layers"]
  assert rows and all(np.isfinite(r["entropy_rate"]).all() if "entropy_rate" in r else True for r in rows)
  return rows


def study(capsys, run, tmp, family, tokens=()):
  out = os.path.join(tmp, "study")
  code, err = attngeo(capsys, "study", "connection", *smoke_argv(out, family), "--runs", run, *tokens)
  assert code == 0, err
  (model,) = read_json(os.path.join(out, "study.json"))["models"]
  assert model["family"] == family and all(0 <= x["effective_isometry_defect"] <= 1 for x in model["trained"])


def logits(run, ids):
  model, _, _ = runs.load_run(run)
  return np.asarray(forward(model, jnp.asarray(ids)))


def export_round_trip(capsys, run, tmp, fmt, ids):
  """Export RUN in `fmt`, import the file back, compare logits; or a one-line refusal that writes nothing."""
  out = os.path.join(tmp, f"export_{fmt}", "model_000000.safetensors")
  code, err = attngeo(capsys, "export", run, "--format", fmt, "--out", out)
  if code != 0:
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(os.path.dirname(out)) or not os.listdir(os.path.dirname(out))
    return err
  back = os.path.join(tmp, f"back_{fmt}")
  code, err = attngeo(capsys, "import", fmt, out, "--out", back)
  assert code == 0, err
  ref = logits(run, ids)
  np.testing.assert_allclose(logits(back, ids), ref, atol=2e-5 * max(1.0, np.abs(ref).max()), rtol=0)
  return None


def gpt_loop(capsys, run, tmp, *, data=("--data", "random"), formats=("nanochat", "gpt2")):
  """The loop of a GPT run; returns {format: None (round trip exact) | the refusal line}."""
  model, _, _ = runs.load_run(run)
  rows = probe(capsys, run, tmp, *data, "--seq-len", str(min(16, model.cfg.seq_len)))
  assert len(rows) == len(nn.attention_modules(model))
  ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (2, 12))
  np.save(os.path.join(tmp, "ids.npy"), ids)          # the study's probe tokens: ids of this model's vocabulary
  study(capsys, run, tmp, "decoder", ("--probe-tokens", os.path.join(tmp, "ids.npy")))
  return {fmt: export_round_trip(capsys, run, tmp, fmt, ids) for fmt in formats}


# ----------------------------------------------------------------------------- language-model runs

LM_ONE_STEP = dataclasses.replace(LM_TINY, train=dataclasses.replace(LM_TINY.train, steps=1))


@pytest.fixture(scope="session")
def lm_run(made_once):
  """One `lm train` run (one step) and its prepared corpus, made once for the session and every xdist
  worker: the loop of `lm train`, the corpus of the `lm table2` condition, the source of `lm adapt`."""
  from attngeo.lm import recipe

  def make(folder):
    recipe.train(dataclasses.replace(LM_ONE_STEP, data_dir=os.path.join(folder, "data")), os.path.join(folder, "run"))
  folder = made_once("loop_lm", make)[0]
  return os.path.join(folder, "run"), os.path.join(folder, "data")


def test_lm_train_run(capsys, tmp_path, lm_run):
  run, _ = lm_run
  text = tmp_path / "held_out.txt"
  text.write_text("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 8)
  outcome = gpt_loop(capsys, run, str(tmp_path), data=("--data", str(text)))
  assert "encoded by the run's tokenizer" in read_json(tmp_path / "probe" / "probe.json")["inputs"]
  # the recipe's GPT keeps attngeo's own settings (learned norm scales, MLP biases, rope sign +1, ...): no public
  # layout carries them, so each export names what it cannot carry instead of writing a different model
  assert all(line and "=" in line for line in outcome.values()), outcome     # "... rope_sign=1 (nanochat: -1) ..."
  assert all(f"attngeo lm train --compat {fmt} builds a GPT this layout takes" in line   # and what would take it
             for fmt, line in outcome.items()), outcome


def test_lm_table2_condition(capsys, tmp_path, lm_run):
  from attngeo.experiments import lm as lm_cmd
  t2 = lm_cmd.Table2Config(conditions=("DMTN",), seeds=(0,), eval_rows=2, out=str(tmp_path / "t2"),
                           lm=dataclasses.replace(LM_ONE_STEP, data_dir=lm_run[1]))
  row = lm_cmd.run_condition(t2, "DMTN", 0)
  run = os.path.join(t2.out, "runs", f"DMTN_s0_{row['key']}")
  outcome = gpt_loop(capsys, run, str(tmp_path))
  assert all(outcome.values()) and "operator" in outcome["nanochat"], outcome   # public layouts are ATTN only


def test_lm_ladder_reuses_table2_runs_and_writes_its_table(capsys, tmp_path, lm_run):
  from attngeo.experiments import lm as lm_cmd
  from attngeo.lm import table2
  flags = ["--lm.data", LM_ONE_STEP.data, "--lm.data-dir", lm_run[1], "--lm.width", "32", "--lm.head-dim", "16",
           "--lm.seq-len", "64", "--lm.train.steps", "1", "--lm.train.batch-size", "4", "--lm.train.warmup", "1",
           "--lm.train.ckpt-every", "0", "--lm.train.progress", "false", "--eval-rows", "2", "--conditions", "ATTN",
           "--seeds", "0", "--out", str(tmp_path / "t2")]
  t2 = lm_cmd.table2_main(flags)
  (first,) = t2["runs"]
  out = lm_cmd.ladder_main([*flags, "--depths", "1,2"])
  assert [(r["depth"], r["condition"]) for r in out["table"]] == [(1, "ATTN"), (2, "ATTN")]
  # the depth Table 2 trained (its protocol's 2) is its run, read back, not trained again; depth 1 is another run
  assert out["runs"][1]["key"] == first["key"] and out["runs"][1]["seconds"] == first["seconds"]
  assert out["runs"][0]["key"] != first["key"] and table2.Table2Config().lm.depth == 2
  assert out["table"][1]["params_m"] > out["table"][0]["params_m"]
  assert all(os.path.exists(tmp_path / "t2" / f"ladder.{ext}") for ext in ("md", "csv", "json", "png"))
  assert "| 2 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--depths", "2,2"], "--depths must name distinct depths ≥ 1; got [2, 2]"),
    (["--depths", "0"], "--depths must name distinct depths ≥ 1; got [0]"),
    (["--lm.depth", "3"], "unrecognized arguments: --lm.depth 3"),                  # the rungs' depths are --depths
    (["--conditions", "ATTN,XYZ"], "--conditions: unknown ['XYZ']"),
])
def test_lm_ladder_bad_input_is_one_line_before_any_work(capsys, tmp_path, argv, message):
  from attngeo.experiments import lm as lm_cmd
  with pytest.raises(SystemExit) as e:
    lm_cmd.ladder_main([*argv, "--out", str(tmp_path / "o")])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and message in err[-1] and not os.path.exists(tmp_path / "o")


def test_lm_adapt_state(capsys, tmp_path, lm_run):
  from attngeo.experiments import lm as lm_cmd
  result = lm_cmd.main(["adapt", "--source", lm_run[0], "--chain", "ATTN,DMTN,ATTN", "--seeds", "0", "--control", "false",
                        "--out", str(tmp_path / "chain"), *ADAPT, "--adapt.steps", "1"])
  a1 = result["records"][2]["workdir"]                 # A1: ATTN again, after the DMTN state
  assert all(gpt_loop(capsys, a1, str(tmp_path)).values())          # refused in one line, as for lm train


# ----------------------------------------------------------------------------- imported GPTs

def test_imported_gpt2(capsys, tmp_path):
  src = write_gpt2(tmp_path / "hub", gpt2_state(seed=3))
  run = str(tmp_path / "run")
  assert attngeo(capsys, "import", "gpt2", src, "--out", run)[0] == 0
  outcome = gpt_loop(capsys, run, str(tmp_path))
  assert outcome["gpt2"] is None and outcome["nanochat"] is not None, outcome


def test_imported_nanochat(capsys, tmp_path):
  src = write_nanochat(tmp_path, nanochat_state(VINTAGE, current=False, seed=4), VINTAGE)
  run = str(tmp_path / "run")
  assert attngeo(capsys, "import", "nanochat", src, "--out", run)[0] == 0
  outcome = gpt_loop(capsys, run, str(tmp_path))
  assert outcome["nanochat"] is None and outcome["gpt2"] is not None, outcome


# ----------------------------------------------------------------------------- point sets and images

def test_swissroll_condition(capsys, tmp_path, made_once):
  from attngeo.experiments import swissroll_config
  cfg = scan_config(made_scan(made_once))                # the session's scan (tests/test_swissroll.py), read only
  run = swissroll_config.condition_dir(cfg, "DMTN", "ffn_first", cfg.seed)
  probe(capsys, run, str(tmp_path), "--data", "swiss_roll", "--set-size", "48")
  study(capsys, run, str(tmp_path), "encoder")
  code, err = attngeo(capsys, "export", run, "--format", "nanochat", "--out", str(tmp_path / "x.safetensors"))
  assert code == 2 and len(err.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "x.safetensors")


def test_study_connection_model(capsys, tmp_path):
  out = str(tmp_path / "study0")
  code, err = attngeo(capsys, "study", "connection", *smoke_argv(out, "decoder"), "--decoder-steps", "1")
  assert code == 0, err
  (folder,) = glob.glob(os.path.join(out, "models", "*"))
  gpt_loop(capsys, folder, str(tmp_path), formats=())


def test_sit_train_run_and_transfer_stage(capsys, tmp_path):
  from attngeo.experiments import sit
  run = str(tmp_path / "train")
  sit.main(["train", *SIT_TRAIN_TINY, "--train.steps", "1", "--metric", "false", "--out", run])
  probe(capsys, run, str(tmp_path / "p1"), "--data", "noise")
  out = str(tmp_path / "transfer")
  sit.main(["transfer", *SIT_TINY, "--train.steps", "1", "--fold-steps", "1", "--sampler", "euler", "--metric", "false",
            "--out", out])
  probe(capsys, os.path.join(out, "seed0", "dmap_adapted"), str(tmp_path / "p2"), "--data", "noise")


def test_imported_sit(capsys, tmp_path):
  from attngeo.interop import safetensors_io
  ckpt = str(tmp_path / "tiny_sit.safetensors")
  safetensors_io.write(ckpt, official_state_dict(np.random.default_rng(0), channels=1))
  run = str(tmp_path / "imported")
  assert attngeo(capsys, "sit", "import", ckpt, "--out", run, "--num-heads", "4")[0] == 0
  probe(capsys, run, str(tmp_path), "--data", "noise")
