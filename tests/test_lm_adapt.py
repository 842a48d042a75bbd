"""attngeo lm adapt: the chain end to end on a tiny GPT, what grafting and adapting change, reuse by key,
one-line errors for bad chains, the summary's mean ± sd, the --full plan and its launch lines."""
import dataclasses
import json
import math
import os
import subprocess

import numpy as np
import pytest
from flax import nnx

from attngeo import files, nn, runs
from attngeo.data import copying, text
from attngeo.experiments import lm as lm_cmd, lm_adapt
from attngeo.lm import adapt, recipe
from attngeo.lm.config import LMConfig, LMTrain, preset
from attngeo.train_config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = LMConfig(data="pydoc", depth=1, width=32, head_dim=16, seq_len=64,
                train=LMTrain(steps=2, batch_size=4, warmup=1, log_every=1, ckpt_every=0, progress=False))
ADAPT = ["--adapt.steps", "2", "--adapt.batch-size", "4", "--adapt.warmup", "1", "--adapt.log-every", "1",
         "--adapt.progress", "false", "--eval-rows", "4"]


def loss_jit():
  return nnx.jit(lambda m, tokens: recipe.loss_fn(m, {"tokens": tokens}, None)[0])


# ----------------------------------------------------------------------------- chain parsing


def test_the_adaptation_key_names_the_folders_it_named_before_lmtrain_was_a_trainconfig():
  """`train_key` names every adapted state's folder: LMTrain's `workdir` (where a run is written) must not
  enter it. The default protocol's key as recorded at 30c410d, before LMTrain subclassed TrainConfig."""
  assert files.fingerprint(adapt.train_key(adapt.AdaptConfig(), 0)) == "4f1b7e67893a5b7c"

def test_parse_chain_labels_and_one_line_errors():
  assert adapt.parse_chain("ATTN,dmtn,0.5:1,(0,1),1:0") == ["ATTN", "DMTN", (0.5, 1.0), "DMTN", "ATAP"]
  assert adapt.chain_text(adapt.parse_chain("ATTN,0.25:0.5")) == "ATTN,0.25:0.5"
  assert adapt.state_labels(["ATTN", "DMTN", "ATTN", "DMTN"]) == ["A0", "M1", "A1", "M2"]
  assert adapt.state_labels(["ATTN", "ATTN", "DMAP", (0.5, 1.0)]) == ["A0", "A0.1", "D1", "S2"]
  assert adapt.control_chain(["ATTN", "DMTN", "ATTN"]) == ["ATTN"] * 3
  bad = {"ATTN,DMTX": "chain state 1 'DMTX': unknown operator",
         "ATTN,1.5:1": "chain state 1 '1.5:1': beta must lie in [0, 1]; got 1.5",
         "ATTN,(1,-0.5)": "chain state 1 '(1,-0.5)': alpha must lie in [0, 1]; got -0.5",
         "ATTN,x:1": "chain state 1 'x:1': beta:alpha must be two numbers",
         "ATTN": "needs at least two states"}
  for chain, message in bad.items():
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as e:
      adapt.parse_chain(chain)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv, message", [
    (["--chain", "ATTN,DMTX"], "chain state 1 'DMTX': unknown operator"),
    (["--chain", "ATTN,0.5:2"], "alpha must lie in [0, 1]; got 2"),
    (["--source", "/nonexistent/run"], "source '/nonexistent/run': no such run folder"),
    (["--dry-run"], "--dry-run plans the --full (d32) protocol; add --full"),
    (["--adapt.steps", "-1"], "adapt.steps must be >= 0"),
    (["--adapt.lr", "-1"], "lr must be a positive finite rate; got -1.0"),
    (["--core-max-per-task", "0"], "max_per_task must be -1 (every example) or an integer ≥ 1; got 0"),
    (["--lm.seq-len", "32"], "lm.seq_len must be an integer ≥ 63"),
    (["--lm.width", "0"], "lm.width must be an integer ≥ 1 or none"),
    (["--preset", "inductin"], "--preset must be one of ['induction', 'induction-quick']; got 'inductin'"),
    (["--preset", "induction", "--full"], "--preset and --full are two protocols; give one"),
    (["--preset", "induction", "--lm.seq-len", "100"], "2L − 1 ≤ seq_len = 100"),
    (["--preset", "induction", "--source", "/nonexistent/run"], "give --preset or --source, not both"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, argv, message):
  out = tmp_path / "out"
  with pytest.raises(SystemExit) as e:
    lm_cmd.main(["adapt", *argv, "--out", str(out), "--table2-out", str(tmp_path / "t2")])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and message in err[-1]
  assert not out.exists() and not (tmp_path / "t2").exists()          # nothing trained, nothing written


HOLDER = """
import sys
from attngeo import runlock
with runlock.hold(sys.argv[1]):
  print("held", flush=True)
  sys.stdin.readline()
"""


def test_a_second_adapt_on_one_out_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
  """Issue 24: a second `lm adapt` on a busy --out loaded (or trained) its source first and was refused only
  after ~34 s. The folder is now held before any work: one line naming the owner, exit 2, nothing written."""
  out = str(tmp_path / "out")
  proc = subprocess.Popen([os.sys.executable, "-c", HOLDER, out], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True)
  try:
    assert proc.stdout.readline() == "held\n"
    work = []
    monkeypatch.setattr(lm_adapt, "default_source", lambda *a: work.append("train the source"))
    monkeypatch.setattr(adapt, "load_source", lambda *a: work.append("load the source"))
    with pytest.raises(SystemExit) as e:
      lm_cmd.main(["adapt", *ADAPT, "--out", out, "--table2-out", str(tmp_path / "t2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f"is in use by pid {proc.pid}" in err[0], err
    assert work == [] and os.listdir(out) == [".lock"] and not (tmp_path / "t2").exists()
  finally:
    proc.kill()
    proc.wait()
    proc.stdin.close()
    proc.stdout.close()


def test_preset_makes_the_source_that_presets_table2_attn_model(tmp_path, monkeypatch):
  """`--preset induction`: the source is the induction preset's Table 2 ATTN run (its lm config, --lm.*
  flags on top), found under --table2-out by its content key like the default source."""
  seen = []

  def source(cfg, table2_out):
    seen.append((cfg.lm, table2_out))
    raise ValueError("stop here")

  monkeypatch.setattr(lm_adapt, "default_source", source)
  with pytest.raises(SystemExit):
    lm_cmd.main(["adapt", "--preset", "induction", "--lm.train.steps", "7", *ADAPT, "--out", str(tmp_path / "o"),
                 "--table2-out", str(tmp_path / "t2")])
  want = preset("induction")
  want = dataclasses.replace(want, train=dataclasses.replace(want.train, steps=7))
  assert seen == [(want, str(tmp_path / "t2"))]
  assert want.tokenizer == "bpe" and want.copy_mix == 0.9 and want != lm_adapt.protocol().lm


def test_an_imported_source_needs_data_and_a_tokenizer(tmp_path):
  run = tmp_path / "imported"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"model": {"class": "GPTConfig"}, "imported": {"kind": "nanochat"}}))
  with pytest.raises(ValueError, match="imported checkpoint without a corpus: give --data"):
    adapt.validate(adapt.AdaptConfig(source=str(run)))
  with pytest.raises(FileNotFoundError, match="an imported checkpoint carries none: pass --tokenizer DIR"):
    adapt.validate(adapt.AdaptConfig(source=str(run), data="pydoc"))


@pytest.mark.parametrize("model,what", [({"class": "EncoderConfig"}, r"holds an encoder \(BERT/ALBERT\) model"),
                                        ({}, "holds no model config")])
def test_a_source_that_is_no_gpt_is_refused_first(tmp_path, model, what):
  """Newcomer walk: an ALBERT source was asked for --data, then --tokenizer, then a checkpoint it has not."""
  run = tmp_path / "albert"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"model": model, "imported": {"kind": "albert"}}))
  with pytest.raises(ValueError, match=f"{what}; lm adapt takes GPT runs"):
    adapt.check_files(adapt.AdaptConfig(source=str(run)))


# ----------------------------------------------------------------------------- graft

def test_graft_swaps_the_operator_and_touches_no_weight():
  model = nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=20, head_dim=8, width=16, seq_len=12), rngs=nnx.Rngs(0))
  tokens = np.random.default_rng(0).integers(0, 20, (2, 12))
  forward = nnx.jit(lambda m, x: m(x))
  before = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  key, logits = adapt.weights_key(model), np.asarray(forward(model, tokens))
  adapt.graft(model, "DMTN")
  after = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
  assert model.cfg.block.operator == "DMTN" and [m.coefficients() for m in nn.attention_modules(model)] == [(0.0, 1.0)]
  assert np.abs(np.asarray(forward(model, tokens)) - logits).max() > 1e-3          # another operator, other logits
  assert adapt.weights_key(model) != key                                           # the key records the operator
  adapt.graft(model, "ATTN")
  np.testing.assert_array_equal(np.asarray(forward(model, tokens)), logits)       # back: the same model exactly
  assert adapt.weights_key(model) == key
  clone = nnx.clone(model)
  wq = nn.attention_modules(clone)[0].wq
  wq[...] = wq[...].at[0, 0, 0].add(1e-3)
  assert adapt.weights_key(clone) != key


# ----------------------------------------------------------------------------- the chain end to end

@pytest.fixture(scope="module")
def chain(tmp_path_factory):
  """A tiny source run and the chain ATTN → DMTN → ATTN (2 steps per state, seeds 0 and 1) through the CLI."""
  tmp = tmp_path_factory.mktemp("adapt")
  data_dir = str(tmp / "data")
  src = str(tmp / "source")
  recipe.train(dataclasses.replace(TINY, data_dir=data_dir), src)
  before = adapt.weights_key(recipe.load(src)[0])
  out = str(tmp / "out")
  argv = ["adapt", "--source", src, "--chain", "ATTN,DMTN,ATTN", "--seeds", "0,1", "--control", "false", "--out", out,
          *ADAPT]
  result = lm_cmd.main(argv)
  return dict(tmp=tmp, src=src, out=out, argv=argv, result=result, before=before, data_dir=data_dir)


def test_chain_runs_end_to_end_and_writes_table3(chain):
  result, out = chain["result"], chain["out"]
  assert result["labels"] == ["A0", "M1", "A1"] and result["trained"] == 4
  recs = result["records"]
  assert [(r["seed"], r["label"]) for r in recs] == [(s, lab) for s in (0, 1) for lab in ("A0", "M1", "A1")]
  for name in ("table3.md", "table3.csv", "results.json", "chain.png"):
    assert os.path.getsize(os.path.join(out, name)) > 0
  with open(os.path.join(out, "table3.md")) as f:
    md = f.read()
  assert "| M1 | DMTN | graft |" in md and "| A1 | ATTN | adapted | 2 |" in md and "CORE" in md
  assert all(math.isfinite(r[p]["bpb"]) and 0 <= r[p]["induction"] <= 1 for r in recs for p in ("graft", "adapted"))
  assert all(0 <= r[p]["induction_corpus"] <= 1 for r in recs for p in ("graft", "adapted"))
  assert "induction, corpus tokens" in md
  assert recs[1]["graft"] == recs[4]["graft"]                       # the first graft is the same model for every seed
  assert recs[1]["adapted"]["bpb"] != recs[4]["adapted"]["bpb"]     # the seeds' data orders differ


def test_both_induction_token_sets_are_scored_on_every_state(chain):
  """Table 3 reports induction under the seed's uniform tokens and under the corpus's own tokens: the
  source state's values are `attngeo.lm.induction` recomputed in each mode on the source model."""
  from attngeo.lm import induction
  source, tok, lm = recipe.load(chain["src"])
  corpus = text.open_corpus(lm.text_spec(), tok, chain["data_dir"])
  state0 = chain["result"]["records"][0]["adapted"]
  uniform = induction.induction(source, tok.vocab_size, lm.seq_len)
  pooled = induction.induction(source, tok.vocab_size, lm.seq_len, pool=corpus.token_ids())
  assert state0["induction"] == pytest.approx(uniform["induction"], abs=1e-6)
  assert state0["induction_corpus"] == pytest.approx(pooled["induction"], abs=1e-6)
  # a near-chance model may score both modes alike: the stored losses per length tell the pools apart
  loss = lambda per: [round(v["induction_loss"], 5) for _, v in sorted(per.items(), key=lambda kv: int(kv[0]))]
  assert loss(uniform["per_length"]) != loss(pooled["per_length"])
  stored = [files.read_json(os.path.join(chain["out"], "evals", f)) for f in os.listdir(os.path.join(chain["out"], "evals"))]
  assert any(loss(ev["induction_per_length"]) == loss(uniform["per_length"])
             and loss(ev["induction_corpus_per_length"]) == loss(pooled["per_length"]) for ev in stored)


def test_each_state_starts_from_the_graft_of_the_previous_and_changes_only_its_weights(chain):
  """State k's first logged loss is the loss of graft(θ_{k−1}, o_k) on its seed's first batch; the
  source's weights are untouched; each state's config differs from the source's only in the operator."""
  src, recs = chain["src"], chain["result"]["records"]
  source, tok, lm = recipe.load(src)
  assert adapt.weights_key(source) == chain["before"]
  corpus = text.open_corpus(lm.text_spec(), tok, chain["data_dir"])
  loss = loss_jit()
  src_model = files.read_config(src)["model"]
  for seed in (0, 1):
    prev = nnx.clone(source)
    for rec in [r for r in recs if r["seed"] == seed and r["state"] > 0]:
      adapt.graft(prev, rec["operator"])
      batch = next(text.loader(corpus, "train", 64, 4, seed))
      with open(os.path.join(rec["workdir"], "metrics.jsonl")) as f:
        first = json.loads(f.readline())
      assert first["step"] == 1 and first["loss"] == pytest.approx(float(loss(prev, batch["tokens"])), rel=1e-5)
      saved = files.read_config(rec["workdir"])["model"]
      assert saved["block"].pop("operator") == rec["operator"]
      assert saved == {**src_model, "block": {k: v for k, v in src_model["block"].items() if k != "operator"}}
      adapted = nnx.clone(prev)
      runs.load_model(adapted, rec["workdir"])
      moved = [not np.array_equal(a, b) for (_, a), (_, b) in zip(nnx.to_flat_state(nnx.state(prev, nnx.Param)),
                                                                  nnx.to_flat_state(nnx.state(adapted, nnx.Param)))]
      assert all(moved)                                             # every parameter adapted
      prev = adapted


def test_adaptation_reads_the_sources_copy_mix_rows_and_keys_the_share(chain, tmp_path):
  """A source trained with CopyMix share c adapts on the same mixture: the first logged loss is the loss on
  the first CopyMix batch (not the plain-text one), and the share enters the state key only when c > 0."""
  source, tok, lm = recipe.load(chain["src"])
  mixed = dataclasses.replace(lm, copy_mix=0.5)
  corpus = text.open_corpus(lm.text_spec(), tok, chain["data_dir"])
  train = LMTrain(steps=1, batch_size=4, warmup=1, log_every=1, ckpt_every=0, progress=False)
  model = nnx.clone(source)
  loss = loss_jit()
  want = float(loss(source, next(text.loader(corpus, "train", 64, 4, 0, copy_mix=0.5))["tokens"]))
  plain = float(loss(source, next(text.loader(corpus, "train", 64, 4, 0))["tokens"]))
  history = adapt.adapt(model, mixed, corpus, train, 0, str(tmp_path / "state"))
  assert history[0]["loss"] == pytest.approx(want, rel=1e-5) and abs(want - plain) > 1e-3
  assert adapt.data_mix(lm) == () and adapt.data_mix(mixed) == ({"copy_mix": 0.5, "stream": 2},)


def test_finished_states_are_reused_only_on_an_exact_match(chain, capsys, monkeypatch):
  reads, token_ids = [], text.Corpus.token_ids
  monkeypatch.setattr(text.Corpus, "token_ids", lambda self, *a: reads.append(1) or token_ids(self, *a))
  again = lm_cmd.main(chain["argv"])
  assert again["trained"] == 0 and again["evaluated"] == 0
  assert reads == []                    # every evaluation stored: the corpus's ids are not read
  assert [r["adapted"] for r in again["records"]] == [r["adapted"] for r in chain["result"]["records"]]
  other = lm_cmd.main([*chain["argv"], "--eval-rows", "2"])        # another evaluation: re-evaluated, not retrained
  assert other["trained"] == 0 and other["evaluated"] == 1 + 1 + 2 * 3
  # another adaptation config (and the control chain, new too): only those states train
  lr = lm_cmd.main([*chain["argv"], "--adapt.lr", "0.01", "--seeds", "0", "--chain", "ATTN,DMTN", "--control", "true"])
  assert lr["trained"] == 1 and lr["records"][1]["key"] != chain["result"]["records"][1]["key"]
  assert lr["control"]["trained"] == 1 and lr["control"]["chain"] == ["ATTN", "ATTN"] and "control bpb" in lr["markdown"]
  # another source (a run folder without lm.json: M1 of seed 0, given a tokenizer and a corpus): every state is new
  m1 = chain["result"]["records"][1]["workdir"]
  moved = lm_cmd.main([*chain["argv"], "--source", m1, "--tokenizer", os.path.join(chain["src"], "tokenizer"),
                       "--data", "pydoc", "--lm.data-dir", chain["data_dir"], "--seeds", "0", "--chain", "ATTN,DMTN"])
  assert moved["source"]["kind"] == "run" and moved["source"]["key"] != chain["result"]["source"]["key"]
  assert moved["trained"] == 1 and moved["records"][0]["adapted"]["bpb"] == pytest.approx(
      chain["result"]["records"][2]["graft"]["bpb"], rel=1e-6)       # M1 under ATTN is A1's graft


def test_load_run_reads_every_lm_run_folder(chain, tmp_path):
  """`runs.load_run` (probe, export, study connection) on an `lm train` run, an `lm adapt` state and an `lm table2`
  condition: the trainer config comes back as the class that wrote it (it has the Muon/AdamW split's fields), the
  model with the checkpoint's weights; a run written before config.json named its classes loads too."""
  t2 = lm_cmd.Table2Config(conditions=("ATTN",), seeds=(0,), eval_rows=2, out=str(tmp_path / "t2"),
                           lm=dataclasses.replace(TINY, data_dir=chain["data_dir"], train=dataclasses.replace(
                               TINY.train, steps=1)))
  row = lm_cmd.run_condition(t2, "ATTN", 0)
  folders = [chain["src"], chain["result"]["records"][1]["workdir"],
             os.path.join(t2.out, "runs", f"ATTN_s0_{row['key']}")]
  for path in folders:
    model, tcfg, mcfg = runs.load_run(path)
    assert type(tcfg) is TrainConfig and tcfg.embedding_lr == pytest.approx(0.3 * (32 / 768) ** -0.5)
    assert mcfg == model.cfg and adapt.weights_key(model) == adapt.weights_key(runs.load_model(
        nn.GPT(mcfg, rngs=nnx.Rngs(1)), path))
  assert adapt.weights_key(runs.load_run(chain["src"])[0]) == chain["before"]
  legacy = tmp_path / "legacy"
  legacy.mkdir()
  saved = files.read_config(chain["src"])
  del saved["classes"]
  (legacy / "config.json").write_text(json.dumps(saved))
  assert type(runs.train_config(str(legacy))) is TrainConfig
  saved["classes"] = {"train": "attngeo.lm.recipe.LMTrainConfig"}        # the class LM runs recorded before
  (legacy / "config.json").write_text(json.dumps(saved))
  assert runs.train_config(str(legacy)) == dataclasses.replace(runs.train_config(chain["src"]), workdir=str(legacy))


# ----------------------------------------------------------------------------- summary, data, plan

def test_summary_mean_and_sd_by_hand():
  ev = lambda b, i: {"bpb": b, "val_loss": 0.0, "induction": i, "induction_corpus": i / 2, "dac_max_contrast": 0.1,
                     "dac_mean_contrast": 0.0, "core": None}
  records = []
  for seed, (b1, b2) in enumerate([(2.0, 1.5), (2.2, 1.1), (2.4, 1.3)]):
    records += [dict(seed=seed, state=0, steps=0, graft=ev(3.0, 0.5), adapted=ev(3.0, 0.5), key="k0", graft_key="k0"),
                dict(seed=seed, state=1, steps=5, graft=ev(3.5, 0.1), adapted=ev(b1, 0.2), key=f"a{seed}",
                     graft_key="g1"),
                dict(seed=seed, state=2, steps=5, graft=ev(b1 + 0.1, 0.3), adapted=ev(b2, 0.4), key=f"b{seed}",
                     graft_key=f"g2{seed}")]
  rows = adapt.summarise({"labels": ["A0", "M1", "A1"], "chain": ["ATTN", "DMTN", "ATTN"], "records": records})
  assert [(r["label"], r["phase"]) for r in rows] == [("A0", "source"), ("M1", "graft"), ("M1", "adapted"),
                                                      ("A1", "graft"), ("A1", "adapted")]
  assert rows[0]["bpb_mean"] == 3.0 and rows[0]["bpb_sd"] is None and rows[1]["bpb_sd"] is None   # one model
  assert rows[2]["bpb_mean"] == pytest.approx(2.2) and rows[2]["bpb_sd"] == pytest.approx(0.2)    # 2.0, 2.2, 2.4
  assert rows[4]["bpb_mean"] == pytest.approx(1.3) and rows[4]["bpb_sd"] == pytest.approx(0.2)    # 1.5, 1.1, 1.3
  assert rows[3]["bpb_mean"] == pytest.approx(2.3) and rows[4]["core_mean"] is None
  assert rows[4]["induction_corpus_mean"] == pytest.approx(0.2) and rows[1]["induction_corpus_sd"] is None
  assert adapt.pm(1.3, 0.2) == "1.3000 ± 0.2000" and adapt.pm(3.0, None) == "3.0000" and adapt.pm(None, None) == "—"
  table = lm_adapt.table_rows(rows, lm_adapt.SEED_TABLE3)
  assert table[2]["seed_bpb"] == 0.6657 and table[1]["seed_bpb"] is None and table[4]["seed_induction"] == 0.8334
  control = [dict(r, bpb_per_seed=[2.0, 2.1, 2.3]) for r in rows]           # the control's bpb per seed, by hand
  table = lm_adapt.table_rows(rows, {}, control)
  a, b = np.array([2.0, 2.2, 2.4]), np.array([2.0, 2.1, 2.3])                # M1 adapted vs the control's M1
  t = (a.mean() - b.mean()) / math.sqrt(a.var(ddof=1) / 3 + b.var(ddof=1) / 3)
  df = (a.var(ddof=1) / 3 + b.var(ddof=1) / 3) ** 2 / ((a.var(ddof=1) / 3) ** 2 / 2 + (b.var(ddof=1) / 3) ** 2 / 2)
  from scipy import stats as sps
  assert table[2]["d_bpb"] == f"{a.mean() - b.mean():+.4f} (p={2 * sps.t.sf(abs(t), df):.2g})"
  assert table[1]["d_bpb"] is None and table[0]["d_bpb"] is None            # graft and source rows: no test
  assert table[2]["d_induction"] == "+0.0000 (p=1)"                          # the same values on both sides
  above = [dict(r, induction_per_seed=[0.25, 0.3, 0.35]) for r in rows]      # the control above: a negative difference
  assert lm_adapt.table_rows(rows, {}, above)[2]["d_induction"].startswith("-0.1000 (p=")
  shared = [dict(r, shared=True, bpb_per_seed=[2.5] * 3) for r in rows]      # --adapt.steps 0: one model per side
  control = [dict(r, shared=True, bpb_per_seed=[2.4] * 3) for r in rows]
  assert lm_adapt.table_rows(shared, {}, control)[2]["d_bpb"] == "—"          # not "p=0"


def test_copy_mix_rows_are_repeated_random_sequences_fixed_by_stream_index():
  row = {"tokens": np.full(65, 7, np.int32)}
  mix = copying.CopyMix(0.25, 265, 65, min_len=8)
  synthetic = [k for k in range(2000) if mix.synthetic(k) is not None]
  assert len(synthetic) == 500                                          # exactly ⌊2000·0.25⌋
  for k in synthetic[:50]:
    t = mix(k, row)["tokens"]
    period = next(p for p in range(8, 33) if np.array_equal(t[p:], t[:-p]))   # s repeated with its length
    assert t.shape == (65,) and t.dtype == np.int32 and t.max() < 265 and period <= 32
  assert all(mix(k, row) is row for k in range(50) if k not in synthetic)
  again = copying.CopyMix(0.25, 265, 65, min_len=8)
  assert all(np.array_equal(again(k, row)["tokens"], mix(k, row)["tokens"]) for k in synthetic[:20])
  with pytest.raises(ValueError, match="copy fraction must lie in"):
    copying.CopyMix(1.5, 265, 65)


def test_full_dry_run_plan_and_launch_lines(capsys):
  plan = lm_cmd.main(["adapt", "--full", "--dry-run"])["plan"]
  assert (plan["depth"], plan["width"], plan["heads"], plan["seq_len"], plan["vocab_size"]) == (32, 2048, 16, 2048, 65536)
  assert plan["arch"] == "2025-10" and plan["flops_per_token"] == 6 * plan["matmul_params"] + 12 * 32 * 16 * 128 * 2048
  assert plan["total_steps"] == 500 * 3 * 3 and plan["tokens_per_step"] == 256 * 2048 and plan["evaluations"] == 17
  printed = capsys.readouterr().out
  assert "attngeo import nanochat" in printed and "--arch 2025-10" in printed
  for line, script, ok in ((plan["launch"], "tpu/launch_tpu.sh", "attngeo\\ lm\\ adapt\\ --full"),
                           (plan["launch_gpu"], "tpu/launch_gpu.sh", "attngeo lm adapt --full --out")):
    head, cmd = line.split(" -- ")
    res = subprocess.run(["bash", os.path.join(ROOT, script), *head.split()[1:], "--dry-run", "--", *cmd.split()],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0 and ok in res.stdout, res.stderr


def test_help_imports_no_jax():
  code = ("import sys; from attngeo.experiments import lm, lm_adapt; lm.train_parser(); lm_adapt.parser(); "
          "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if 'jax' in m)")
  assert subprocess.run([os.sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0
