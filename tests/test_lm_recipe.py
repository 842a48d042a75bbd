"""attngeo lm: the optimizer split, the FLOP count, the training recipe and the commands end to end."""
import dataclasses
import json
import math
import os
import subprocess

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from attngeo import nn, optim
from attngeo.experiments import lm as lm_cmd
from attngeo.lm import recipe
from attngeo.lm.config import LMConfig, LMTrain
from attngeo.nn import gpt
from attngeo.train_config import TrainConfig

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
  assert recipe.model_config(LMConfig(operator="0.3:0.7"), 265).block.operator == (0.3, 0.7)   # lm adapt's spelling
  with pytest.raises(ValueError, match="model override 'colour=red' must be name=value"):
    recipe.model_config(LMConfig(model=("colour=red",)), 265)
  # a field of lm train's own flags had raised TypeError ("multiple values") or silently beaten the flag
  for item, flag in (("num_heads=1", "--width and --head-dim"), ("depth=2", "--depth"), ("operator=DMTN", "--operator"),
                     ("seq_len=128", "--seq-len"), ("width=64", "--width")):
    with pytest.raises(ValueError, match=f"^model override '{item}': .* is set by {flag}"):
      recipe.model_config(LMConfig(model=(item,)), 265)
  for item, said in (("qk_norm=maybe", "expected true/false; got 'maybe'"), ("mlp_ratio=abc", "abc")):
    with pytest.raises(ValueError, match=f"^model override '{item}': .*{said}") as e:
      recipe.model_config(LMConfig(model=(item,)), 265)
    assert "\n" not in str(e.value) and not str(e.value).split(": ", 1)[1].startswith('"')
  tcfg = recipe.train_config(LMConfig(), 768, None)
  assert tcfg.embedding_lr == pytest.approx(0.3) and tcfg.unembedding_lr == pytest.approx(0.008)
  assert type(tcfg) is TrainConfig and tcfg.workdir is None
  assert dataclasses.asdict(recipe.train_config(LMConfig(train=LMTrain(embedding_lr=0.1)), 768, "w")) == {
      **dataclasses.asdict(LMTrain()), "embedding_lr": 0.1, "unembedding_lr": pytest.approx(0.008), "workdir": "w"}


# ----------------------------------------------------------------------------- commands end to end

TINY = ["--data", "pydoc", "--depth", "1", "--width", "32", "--head-dim", "16", "--seq-len", "64",
        "--train.batch-size", "4", "--train.log-every", "1", "--train.ckpt-every", "2", "--train.progress", "false",
        "--train.schedule", "constant", "--train.warmup", "1"]


def snapshot(folder) -> dict:
  """{relative path: bytes} of every file under `folder`."""
  out = {}
  for d, _, names in os.walk(folder):
    for name in names:
      with open(os.path.join(d, name), "rb") as f:
        out[os.path.relpath(os.path.join(d, name), folder)] = f.read()
  return out


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
  assert math.isfinite(ev["bpb"]) and ev["core"] is None and ev["step"] == 4      # which checkpoint it measured
  assert os.path.exists(tmp_path / "part" / "tokenizer" / "tokenizer.json")
  texts = lm_cmd.main(["sample", part, "--prompt", "The ", "--max-tokens", "5", "--seed", "3"])
  assert len(texts) == 1 and texts[0].startswith("The ")
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["sample", part, "--prompt", "x" * 80])
  assert e.value.code == 2 and "prompt is 81 tokens; the model's context is 64 tokens" in capsys.readouterr().err
  lm_cmd.main(["sample", part, "--prompt", "The ", "--max-tokens", "500", "--temperature", "0"])
  assert "note: --max-tokens 500 capped at 59: the prompt (BOS included) takes 5 of the model's 64-token context" \
      in capsys.readouterr().err
  for flags, message in ((["--max-tokens", "-5"], "--max-tokens must be an integer ≥ 1; got -5"),
                         (["--num-samples", "0"], "--num-samples must be an integer ≥ 1; got 0"),
                         (["--top-k", "-1"], "--top-k must be ≥ 0"), (["--temperature", "-1"], "--temperature must be ≥ 0")):
    with pytest.raises(SystemExit) as e:
      lm_cmd.main(["sample", part, *flags])
    assert e.value.code == 2 and message in capsys.readouterr().err
  # A refused resume (another context) changes nothing on disk, and lm eval still reads the run's own context.
  before = snapshot(part)
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["train", *TINY, "--seq-len", "128", "--data-dir", data_dir, "--train.steps", "4", "--out", part])
  assert e.value.code == 2 and "model.seq_len 64 → 128" in capsys.readouterr().err
  assert snapshot(part) == before
  assert recipe.read_config(part).seq_len == 64
  # lm eval of a run whose corpus changed refuses, or evaluates the new text with a warning when asked.
  corpus_json = tmp_path / "part" / "corpus.json"
  corpus_json.write_text(json.dumps({**json.loads(corpus_json.read_text()), "key": "c0000000000000000"}))
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["eval", part, "--max-rows", "2", "--no-dac"])
  assert e.value.code == 2 and "is not the corpus the run trained on (corpus.json key c0000000000000000" in \
      capsys.readouterr().err
  ev = lm_cmd.main(["eval", part, "--max-rows", "2", "--no-dac", "--allow-changed-corpus"])
  assert ev["corpus_changed"] and "evaluating on the new text" in capsys.readouterr().err
  assert lm_cmd.main(["eval", part, "--max-rows", "2", "--no-dac", "--allow-changed-corpus", "--step", "2"])["step"] == 2
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


@pytest.mark.parametrize("flags, message", [
    (["--seq-len", "32"], "seq_len must be an integer ≥ 63 (the shortest induction sequence"),
    (["--seq-len", "0"], "seq_len must be an integer ≥ 63"),
    (["--width", "0"], "width must be an integer ≥ 1 or none"),
    (["--depth", "0"], "depth must be an integer ≥ 1"),
    (["--head-dim", "-4"], "head_dim must be an integer ≥ 1"),
    (["--aspect", "0", "--width", "none"], "aspect must be an integer ≥ 1"),
    (["--width", "40"], "head_dim=16 does not divide width=40"),
    (["--train.steps", "0"], "steps must be an integer in [1, 2³¹)"),
    (["--eval-rows", "0"], "eval_rows must be an integer ≥ 1"),
    (["--operator", "CMAP", "--head-dim", "15", "--width", "30"], "CMAP needs an even head_dim"),
    (["--copy-mix", "1"], "copy_mix must be a share in [0, 1) of training rows that repeat a random span; got 1.0"),
    (["--copy-mix", "-0.1"], "copy_mix must be a share in [0, 1)"),
    (["--induction-lengths", "32,64"], "induction_lengths must be distinct half-lengths L ≥ 1 with 2L − 1 ≤ seq_len = 64"),
    (["--tokenizer", "bpe", "--vocab-size", "100"], "vocab_size must be an integer ≥ 265 (256 bytes + 9 special"),
    (["--preset", "nope"], "--preset must be one of ['induction', 'induction-quick']; got 'nope'"),
])
def test_bad_train_settings_are_one_line_before_anything_is_written(tmp_path, capsys, flags, message):
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["train", *TINY, *flags, "--data-dir", str(tmp_path / "data"), "--out", str(out)])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and message in err[-1] and len(err) == 1, err
  assert not out.exists() and not (tmp_path / "data").exists()


def test_a_refused_new_run_leaves_no_folder(tmp_path, capsys):
  """A corpus too small for a validation document was refused after tokenizer/ was written into the new folder."""
  data = tmp_path / "one.txt"
  data.write_text("a single document " * 10)
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["train", *TINY, "--data", str(data), "--data-dir", str(tmp_path / "cache"), "--out", str(out)])
  assert e.value.code == 2 and "the val split has no documents" in capsys.readouterr().err
  assert not out.exists()


@pytest.mark.parametrize("layout", ["nanochat", "gpt2"])
def test_compat_builds_a_gpt_that_export_takes(layout, tmp_path):
  """A default `lm train` GPT exports to neither layout (8 --model overrides each, the break-it pass found); with
  --compat it is built in the layout, and the export writes it; --model still changes it (and export refuses)."""
  from attngeo import interop
  options = {"meta": {}} if layout == "nanochat" else {}
  out = lambda name: str(tmp_path / name / ("model_000001.safetensors" if layout == "nanochat" else "model.safetensors"))
  default = nn.GPT(recipe.model_config(LMConfig(depth=2, head_dim=16), 265), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=f"not a {'nanochat' if layout == 'nanochat' else 'GPT-2'}-family GPT|cannot export"):
    interop.save(default, layout, out("default"), **options)
  model = nn.GPT(recipe.model_config(LMConfig(depth=2, head_dim=16, compat=layout), 265), rngs=nnx.Rngs(0))
  interop.save(model, layout, out("compat"), **options)
  assert os.path.getsize(out("compat")) > 0
  flip = "mlp_bias=true" if layout == "nanochat" else "mlp_bias=false"
  changed = nn.GPT(recipe.model_config(LMConfig(depth=2, head_dim=16, compat=layout, model=(flip,)), 265),
                   rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="mlp_bias"):
    interop.save(changed, layout, out("changed"), **options)
  with pytest.raises(ValueError, match=r"compat must be one of \('', 'nanochat', 'gpt2'\)"):
    LMConfig(compat="bert").validate()


def test_a_run_resumes_only_on_its_own_corpus(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  (out / "corpus.json").write_text(json.dumps({"key": "c0000000000000000"}))
  cfg = LMConfig(data="pydoc", data_dir=str(tmp_path / "data"))
  with pytest.raises(ValueError, match="its corpus changed since the run started"):
    recipe.train(cfg, str(out))
  (out / "corpus.json").unlink()                       # deleted beside checkpoints: nothing left to check against
  (out / "ckpt" / "2").mkdir(parents=True)
  (out / "lm.json").write_text(json.dumps({}))
  with pytest.raises(ValueError, match=r"holds checkpoints but no corpus\.json, which records what the run trained on"):
    recipe.train(cfg, str(out))
  (out / "lm.json").unlink()
  with pytest.raises(ValueError, match=r"holds checkpoints but no lm\.json"):
    recipe.train(cfg, str(out))
  assert sorted(os.listdir(out)) == ["ckpt"]


OFFSET = {"ATTN": 0.0, "0.5,0.5": 0.03}


def fake_run(calls, evaluated=None):
  """recipe.train / evals.evaluate stand-ins: Table 2's bookkeeping without training. bpb of seed s:
  2 + 0.1·s + o·(1 + s²), o = OFFSET[operator] (so the conditions' spreads differ)."""
  def train(lm, run_dir, desc=""):
    calls.append((lm.operator, lm.train.seed))
    os.makedirs(run_dir, exist_ok=True)
    model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=8, head_dim=4, width=8, operator=recipe.parse_operator(lm.operator),
                                           learnable_operator=lm.learnable_operator), rngs=nnx.Rngs(0))
    corpus = type("Corpus", (), {"rows": lambda self, split, n: None, "key": "c0",
                                 "token_ids": lambda self: np.arange(3, 7)})()
    return {"model": model, "tokenizer": None, "corpus": corpus,
            "history": [{"step": s, "loss": 3.0 - 0.1 * s - 0.01 * lm.train.seed,
                         **({"induction_corpus": 0.1 * s, "induction": 0.05 * s} if s > 1 else {})} for s in (1, 2, 3)]}

  def evaluate(model, tok, rows, max_rows=None, corpus_tokens=None):
    op, seed = calls[-1]
    if evaluated is not None:
      evaluated.append((op, seed, max_rows))
    assert np.array_equal(corpus_tokens, np.arange(3, 7))                   # the corpus's ids reach the probe
    return {"bpb": 2.0 + 0.1 * seed + OFFSET[op] * (1 + seed ** 2), "val_loss": 1.0, "induction": 0.1 * seed,
            "induction_corpus": 0.5 + 0.1 * seed, "induction_per_length": {}, "induction_corpus_per_length": {},
            "dac": {"max_contrast": 0.0}}
  return train, evaluate


def test_table2_tables_reuse_welch_column_and_figure(tmp_path, monkeypatch, capsys):
  from scipy import stats as sps

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
  assert row["induction_corpus_mean"] == pytest.approx(0.6) and row["welch_t"] is None
  learnable = next(r for r in out["table"] if r["condition"] == "learnable")
  attn_bpb, learn_bpb = [2.0, 2.1, 2.2], [2.0 + 0.1 * s + 0.03 * (1 + s * s) for s in range(3)]
  ref = sps.ttest_ind(learn_bpb, attn_bpb, equal_var=False)
  assert learnable["bpb_vs_attn"] == pytest.approx(np.mean(learn_bpb) - 2.1, rel=1e-9)
  assert learnable["welch_t"] == pytest.approx(ref.statistic, rel=1e-9)
  assert learnable["welch_p"] == pytest.approx(ref.pvalue, rel=1e-9)
  md = (tmp_path / "table2.md").read_text()
  assert "2.1000 ± 0.1000" in md and "here − ATTN (Welch t, p)" in md
  assert "induction, corpus tokens" in md and "0.600 ± 0.100" in md and "induction, uniform (seed's)" in md
  assert f"{np.mean(learn_bpb) - 2.1:+.4f} (t = {ref.statistic:.1f}, p = {ref.pvalue:.2g})" in md
  for name in ("table2.csv", "results.json", "loss_curves.png", "induction_curves.png"):
    assert (tmp_path / name).stat().st_size > 0
  results = json.loads((tmp_path / "results.json").read_text())
  assert results["runs"][0]["induction_curve"] == [[2, 0.2, 0.1], [3, pytest.approx(0.3), pytest.approx(0.15)]]
  assert any("learned_operator" in r for r in results["runs"])
  assert next(r for r in results["table"] if r["condition"] == "learnable")["welch_p"] == pytest.approx(ref.pvalue)
  lm_cmd.main(args)                                   # same configs: finished runs are reused
  assert len(calls) == 6
  lm_cmd.main(args + ["--lm.train.steps", "7"])       # another config: trained again
  assert len(calls) == 12


def test_table2_results_are_keyed_by_the_corpus_content_and_the_evaluation(tmp_path, monkeypatch):
  """New text at the same path trains again (it reused the old bpb: keyed by the path); another --eval-rows
  re-evaluates (it was left out of the key); the same text at another path is the same run."""
  from attngeo.lm import evals
  calls, evaluated = [], []
  train, evaluate = fake_run(calls, evaluated)
  monkeypatch.setattr(recipe, "train", train)
  monkeypatch.setattr(evals, "evaluate", evaluate)
  data = tmp_path / "text"
  data.mkdir()
  (data / "a.txt").write_text("first text " * 20)
  args = ["table2", "--conditions", "ATTN", "--seeds", "0", "--out", str(tmp_path / "out"), "--lm.data", str(data)]
  lm_cmd.main(args)
  assert len(calls) == len(evaluated) == 1
  lm_cmd.main(args + ["--eval-rows", "7"])
  assert len(evaluated) == 2 and evaluated[-1][2] == 7
  lm_cmd.main(args + ["--eval-rows", "7"])
  assert len(evaluated) == 2                                         # reused under its own key
  (data / "a.txt").write_text("other text " * 20)
  lm_cmd.main(args)
  assert len(evaluated) == 3
  folders = sorted(os.listdir(tmp_path / "out" / "runs"))
  assert len(folders) == 2                                           # another corpus: another run folder
  moved = tmp_path / "moved"
  os.rename(data, moved)
  lm_cmd.main([*args[:-1], str(moved)])
  assert len(evaluated) == 3 and sorted(os.listdir(tmp_path / "out" / "runs")) == folders


def test_table2_full_dry_run_plan_and_launch_line(capsys):
  out = lm_cmd.main(["table2", "--full", "--dry-run"])["plan"]
  assert out["width"] == 768 and out["heads"] == 6 and out["seq_len"] == 2048 and out["vocab_size"] == 65536
  assert out["flops_per_token"] == 6 * out["matmul_params"] + 12 * 12 * 6 * 128 * 2048
  h100 = out["step_seconds"]["H100 (bf16 dense)"]
  assert h100 == pytest.approx(out["flops_per_token"] * 524_288 / (989e12 * 0.4))
  printed = capsys.readouterr().out
  assert "1.038 G" in printed and "tpu/launch_tpu.sh" in printed
  with open(os.path.join(ROOT, "docs", "lm.md"), encoding="utf-8") as f:    # docs/lm.md shows it as "(real output)"
    assert printed in f.read(), "docs/lm.md's block of `attngeo lm table2 --full --dry-run` is not what it prints"
  launch = out["launch"].split(" -- ")
  cmd = ["bash", os.path.join(ROOT, launch[0]).split()[0], *launch[0].split()[1:], "--dry-run", "--", *launch[1].split()]
  res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert res.returncode == 0 and "attngeo\\ lm\\ table2\\ --full" in res.stdout


def test_table2_dry_run_without_full_plans_the_protocol_that_would_run(capsys):
  """Without --full the plan printed vocab 4,096 (the BPE default, under the byte tokenizer), 0 chip-hours and
  launch lines with --full; now the byte vocabulary, the small protocol's hours and the command as given."""
  from attngeo.nn import gpt
  out = lm_cmd.main(["table2", "--dry-run", "--seeds", "0,1", "--lm.train.steps", "50"])["plan"]
  mcfg = nn.GPTConfig.from_depth(2, head_dim=64, width=128, vocab_size=265, seq_len=128)
  assert out["vocab_size"] == 265 and out["flops_per_token"] == gpt.flops_per_token(mcfg)
  assert out["runs"] == 5 * 2 and out["steps"] == 50
  hours = out["step_seconds"]["H100 (bf16 dense)"] * 50 * 10 / 3600
  printed = capsys.readouterr().out
  assert "vocab 265 (byte tokenizer)" in printed and f"({lm_cmd.amount(hours)} chip-hours" in printed
  assert hours > 0 and lm_cmd.amount(hours) != "0"
  assert "--full" not in out["launch"] and "--full" not in printed
  assert "attngeo lm table2 --lm.train.steps 50 --seeds 0,1 --lm.data shakespeare --out runs/table2" in out["launch"]
  assert lm_cmd.amount(0.0031) == "0.0031" and lm_cmd.amount(12345.6) == "12,346"


def test_help_imports_no_jax():
  code = "import sys; from attngeo.experiments import lm; lm.train_parser(); lm.table2_parser(); assert 'jax' not in sys.modules"
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


def test_table2_negative_seed_is_one_line_before_any_run(tmp_path, capsys):
  """--seeds -1 started the ATTN condition, wrote its folder, then failed inside numpy naming no flag."""
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["table2", "--seeds", "-1", "--out", str(tmp_path / "t2"), "--lm.data", "pydoc"])
  assert e.value.code == 2 and "--seeds must name distinct non-negative training seeds; got [-1]" in \
      capsys.readouterr().err
  assert not (tmp_path / "t2").exists()


def test_an_imported_gpt_is_told_why_lm_eval_cannot_read_it(tmp_path):
  """Newcomer walk: an exported then imported LM was refused by `lm eval` and `lm sample` with "lm.json: missing"
  alone; the refusal now says what an import lacks and what takes it."""
  (tmp_path / "config.json").write_text(json.dumps({"model": {"class": "GPTConfig"}, "imported": {"kind": "gpt2"}}))
  with pytest.raises(FileNotFoundError, match="is an imported checkpoint, without the corpus and tokenizer"):
    recipe.read_config(str(tmp_path))
  with pytest.raises(FileNotFoundError, match="is not a language-model run folder"):
    recipe.read_config(str(tmp_path / "missing"))
  (tmp_path / "config.json").write_text(json.dumps({"model": {"class": "EncoderConfig"}, "imported": {"kind": "bert"}}))
  with pytest.raises(FileNotFoundError, match=r"holds an encoder \(BERT/ALBERT\) model; .*attngeo mlm eval"):
    recipe.read_config(str(tmp_path))                  # not "adapt it with lm adapt", which refuses an encoder


def test_a_file_in_the_way_of_the_run_folder_is_refused_before_the_corpus_is_built(tmp_path, monkeypatch):
  """Fault pass: `lm train --out FILE/sub` was refused (a file is in the way) only after it had tokenised the corpus
  into runs/lm_data."""
  (tmp_path / "afile").write_text("x")
  monkeypatch.chdir(tmp_path)
  cfg = LMConfig(data="pydoc", data_dir=str(tmp_path / "data"))
  with pytest.raises(ValueError, match=r"--out .*afile/sub: .*afile is a file, where lm train writes a folder"):
    recipe.train(cfg, str(tmp_path / "afile" / "sub"))
  with pytest.raises(ValueError, match=r"--data-dir .*afile: .*afile is a file"):
    recipe.train(dataclasses.replace(cfg, data_dir=str(tmp_path / "afile")), str(tmp_path / "run"))
  assert sorted(os.listdir(tmp_path)) == ["afile"]                  # no data cache, no run folder
