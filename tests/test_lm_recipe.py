"""attngeo lm: the optimizer split, the FLOP count, the training recipe and the commands end to end."""
import json
import math
import os
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from attngeo import nn, optim
from attngeo.experiments import lm as lm_cmd
from attngeo.lm import recipe
from attngeo.lm.config import LMConfig, LMTrain
from attngeo.nn import gpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------- optimizer

def test_split_labels_and_muon_matrix_views():
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=20, head_dim=8, width=16), rngs=nnx.Rngs(0))
  labels = {jax.tree_util.keystr(p): optim.split_label(p, x) for p, x in
            jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}
  group = lambda name: {v for k, v in labels.items() if f"'{name}'" in k}
  assert group("embed") == {"embedding"} and group("unembed") == {"unembedding"}
  assert all(group(n) == {"muon"} for n in ("wq", "wk", "wv", "wo", "w1", "w2"))
  assert all(group(n) == {"scalar"} for n in ("b1", "b2", "scale"))
  dims = {jax.tree_util.keystr(p): optim.muon_dims(p, x) for p, x in
          jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))}
  pick = lambda name: next(v for k, v in dims.items() if f"'{name}'" in k)
  assert pick("wq") == optax.contrib.MuonDimensionNumbers((0,), (1, 2))
  assert pick("wo") == optax.contrib.MuonDimensionNumbers((0, 1), (2,))
  assert pick("embed") is None


def test_muon_orthogonalises_the_projection_as_a_d_by_hk_matrix():
  """A gradient of rank 16 as a [d, h·k] = [32, 32] matrix: Muon's update, viewed the same way, has
  16 singular values near 1 (Newton–Schulz band) and 16 at 0; orthogonalising another view would not."""
  cfg = LMTrain(lr=1.0, warmup=0, schedule="constant")
  a, b = jax.random.normal(jax.random.PRNGKey(0), (2, 32, 16))
  grads = {"blocks": {"attn": {"wq": (a @ b.T).reshape(32, 4, 8)}}}
  tx = optim.muon_adamw(cfg)
  upd, _ = tx.update(grads, tx.init(grads), grads)
  sv = np.linalg.svd(np.asarray(upd["blocks"]["attn"]["wq"]).reshape(32, 32), compute_uv=False)
  assert np.all((sv[:16] > 0.5) & (sv[:16] < 1.6)) and np.all(sv[16:] < 1e-3), sv


def test_warmdown_schedule_closed_form():
  cfg = LMTrain(steps=100, warmup=10, warmdown_ratio=0.5, final_lr_frac=0.1)
  s = optim.schedule(cfg, 2.0)
  for t, want in [(5, 1.0), (10, 2.0), (30, 2.0), (50, 2.0), (75, 2.0 * (0.5 + 0.5 * 0.1)), (100, 0.2)]:
    assert float(s(t)) == pytest.approx(want, rel=1e-6), t


# ----------------------------------------------------------------------------- model and FLOPs

def test_flops_per_token_by_hand():
  cfg = nn.GPTConfig.from_depth(2, vocab_size=50, seq_len=64, head_dim=16, width=32)
  matmul = 2 * (4 * 32 * 32 + 2 * 32 * 128) + 32 * 50          # q, k, v, o; MLP in and out; unembedding
  assert gpt.matmul_params(cfg) == matmul
  assert gpt.flops_per_token(cfg) == 6 * matmul + 12 * 2 * 2 * 16 * 64


def test_model_config_shape_rule_operator_and_overrides():
  mcfg = recipe.model_config(LMConfig(depth=3, head_dim=64, operator="0.3,0.7", learnable_operator=True,
                                      model=("mlp_ratio=2", "qk_norm=false")), 265)
  assert mcfg.width == 192 and mcfg.block.num_heads == 3 and mcfg.vocab_size == 265
  assert mcfg.block.operator == (0.3, 0.7) and mcfg.block.learnable_operator
  assert mcfg.block.mlp_ratio == 2.0 and mcfg.block.qk_norm is False
  with pytest.raises(ValueError, match="model override 'colour=red' must be name=value"):
    recipe.model_config(LMConfig(model=("colour=red",)), 265)
  tcfg = recipe.train_config(LMConfig(), 768, None)
  assert tcfg.embedding_lr == pytest.approx(0.3) and tcfg.unembedding_lr == pytest.approx(0.008)
  assert set(LMTrain.__dataclass_fields__) <= set(recipe.LMTrainConfig.__dataclass_fields__)


# ----------------------------------------------------------------------------- commands end to end

TINY = ["--data", "pydoc", "--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "64",
        "--train.batch-size", "4", "--train.log-every", "1", "--train.ckpt-every", "2", "--train.progress", "false",
        "--train.schedule", "constant", "--train.warmup", "1"]


def losses(run_dir):
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows}                 # a resumed run overwrites the earlier tail


def test_train_resume_eval_sample_and_bad_input(tmp_path, capsys):
  data_dir = str(tmp_path / "data")
  ref, part = str(tmp_path / "ref"), str(tmp_path / "part")
  lm_cmd.main(["train", *TINY, "--data-dir", data_dir, "--train.steps", "4", "--out", ref, "--no-eval"])
  lm_cmd.main(["train", *TINY, "--data-dir", data_dir, "--train.steps", "2", "--out", part, "--no-eval"])
  lm_cmd.main(["train", *TINY, "--data-dir", data_dir, "--train.steps", "4", "--out", part, "--eval-max-rows", "4"])
  a, b = losses(ref), losses(part)
  assert sorted(a) == sorted(b) == [1, 2, 3, 4]
  np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=1e-6)   # resumed = uninterrupted
  out = capsys.readouterr().out
  assert "val bpb" in out and "induction acc" in out and "CORE skipped" in out
  ev = json.loads((tmp_path / "part" / "eval.json").read_text())
  assert math.isfinite(ev["bpb"]) and ev["core"] is None
  assert os.path.exists(tmp_path / "part" / "tokenizer" / "tokenizer.json")
  texts = lm_cmd.main(["sample", part, "--prompt", "The ", "--max-tokens", "5", "--seed", "3"])
  assert len(texts) == 1 and texts[0].startswith("The ")
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["sample", part, "--prompt", "x" * 80])
  assert e.value.code == 2 and "prompt is 81 tokens; the model's context is 64 tokens" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    lm_cmd.main(["eval", str(tmp_path / "nowhere")])
  assert "lm.json: missing" in capsys.readouterr().err
  os.remove(tmp_path / "part" / "tokenizer" / "tokenizer.json")
  with pytest.raises(SystemExit):
    lm_cmd.main(["eval", part])
  assert "tokenizer/tokenizer.json: no tokenizer file" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    lm_cmd.main(["train", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "x")])
  assert "no such file or directory" in capsys.readouterr().err


def test_a_run_resumes_only_on_its_own_corpus(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  (out / "corpus.json").write_text(json.dumps({"key": "c0000000000000000"}))
  cfg = LMConfig(data="pydoc", data_dir=str(tmp_path / "data"))
  with pytest.raises(ValueError, match="its corpus changed since the run started"):
    recipe.train(cfg, str(out))


def fake_run(calls):
  """recipe.train / evals.evaluate stand-ins: Table 2's bookkeeping without training."""
  def train(lm, run_dir, desc=""):
    calls.append((lm.operator, lm.train.seed))
    os.makedirs(run_dir, exist_ok=True)
    model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=8, head_dim=4, width=8, operator=recipe.parse_operator(lm.operator),
                                           learnable_operator=lm.learnable_operator), rngs=nnx.Rngs(0))
    corpus = type("Corpus", (), {"rows": lambda self, split, n: None})()
    return {"model": model, "tokenizer": None, "corpus": corpus,
            "history": [{"step": s, "loss": 3.0 - 0.1 * s - 0.01 * lm.train.seed} for s in (1, 2, 3)]}

  def evaluate(model, tok, rows, max_rows=None):
    seed = calls[-1][1]
    return {"bpb": 2.0 + 0.1 * seed, "val_loss": 1.0, "induction": 0.1 * seed, "induction_per_length": {},
            "dac": {"max_contrast": 0.0}}
  return train, evaluate


def test_table2_tables_reuse_and_figure(tmp_path, monkeypatch, capsys):
  from attngeo.lm import evals
  calls = []
  train, evaluate = fake_run(calls)
  monkeypatch.setattr(recipe, "train", train)
  monkeypatch.setattr(evals, "evaluate", evaluate)
  args = ["table2", "--conditions", "ATTN,learnable", "--seeds", "0,1,2", "--out", str(tmp_path), "--lm.data", "pydoc"]
  out = lm_cmd.main(args)
  assert len(calls) == 6 and ("0.5,0.5", 0) in calls
  row = next(r for r in out["table"] if r["condition"] == "ATTN")
  assert row["bpb_mean"] == pytest.approx(2.1) and row["bpb_sd"] == pytest.approx(0.1)          # 2.0, 2.1, 2.2
  assert row["induction_sd"] == pytest.approx(np.std([0.0, 0.1, 0.2], ddof=1)) and row["seed_bpb"] == 0.8471
  assert "2.1000 ± 0.1000" in (tmp_path / "table2.md").read_text()
  for name in ("table2.csv", "results.json", "loss_curves.png"):
    assert (tmp_path / name).stat().st_size > 0
  learned = json.loads((tmp_path / "results.json").read_text())["runs"]
  assert any("learned_operator" in r for r in learned)
  lm_cmd.main(args)                                   # same configs: finished runs are reused
  assert len(calls) == 6
  lm_cmd.main(args + ["--lm.train.steps", "7"])       # another config: trained again
  assert len(calls) == 12


def test_table2_full_dry_run_plan_and_launch_line(capsys):
  out = lm_cmd.main(["table2", "--full", "--dry-run"])["plan"]
  assert out["width"] == 768 and out["heads"] == 6 and out["seq_len"] == 2048 and out["vocab_size"] == 65536
  assert out["flops_per_token"] == 6 * out["matmul_params"] + 12 * 12 * 6 * 128 * 2048
  h100 = out["step_seconds"]["H100 (bf16 dense)"]
  assert h100 == pytest.approx(out["flops_per_token"] * 524_288 / (989e12 * 0.4))
  printed = capsys.readouterr().out
  assert "1.038 G" in printed and "tpu/launch_tpu.sh" in printed
  launch = out["launch"].split(" -- ")
  cmd = ["bash", os.path.join(ROOT, launch[0]).split()[0], *launch[0].split()[1:], "--dry-run", "--", *launch[1].split()]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert res.returncode == 0 and "attngeo\\ lm\\ table2\\ --full" in res.stdout


def test_help_imports_no_jax():
  code = "import sys; from attngeo.experiments import lm; lm.parser(); assert 'jax' not in sys.modules"
  assert subprocess.run([os.sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


@pytest.mark.slow
def test_training_on_a_two_device_mesh_matches_one_device(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  runs = {}
  for mesh in ("1,1,1", "2,1,1"):
    out = str(tmp_path / mesh.replace(",", ""))
    code = ("import sys; from attngeo.experiments import lm; "
            f"lm.main(['train', *sys.argv[1:], '--train.steps', '3', '--train.mesh', '{mesh}', '--out', '{out}', "
            f"'--data-dir', '{tmp_path / 'data'}', '--no-eval'])")
    res = subprocess.run([os.sys.executable, "-c", code, *TINY], env=env if mesh == "2,1,1" else dict(env, XLA_FLAGS=""),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    runs[mesh] = losses(out)
  np.testing.assert_allclose([runs["2,1,1"][s] for s in (1, 2, 3)], [runs["1,1,1"][s] for s in (1, 2, 3)], rtol=2e-5)


def test_the_magnetic_operator_trains_and_evaluates_and_sampling_says_why_not(tmp_path, capsys):
  run = str(tmp_path / "cmap")
  lm_cmd.main(["train", *TINY, "--data-dir", str(tmp_path / "data"), "--train.steps", "2", "--operator", "CMAP",
               "--out", run, "--eval-max-rows", "4"])
  ev = json.loads((tmp_path / "cmap" / "eval.json").read_text())
  assert math.isfinite(ev["bpb"])
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["sample", run, "--prompt", "The ", "--max-tokens", "2"])
  assert e.value.code == 2 and "not CMAP" in capsys.readouterr().err
