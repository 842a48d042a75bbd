"""Issue 27's induction protocol: CopyMix rows in training, the corpus-token probe, its bad input, the preset."""
import dataclasses
import json
import os

import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from helpers import assert_errors_before_jax
from attngeo.data import copying, text
from attngeo.experiments import lm as lm_cmd
from attngeo.lm import evals, induction, recipe, table2
from attngeo.lm import tokenizer as tok_lib
from attngeo.lm.config import LMConfig, LMTrain, preset


def tiny_gpt():
  return nn.GPT(nn.GPTConfig.from_depth(1, vocab_size=265, seq_len=64, head_dim=8, width=16), rngs=nnx.Rngs(0))


def recording(monkeypatch):
  """Every batch of [s; s] rows `induction.induction` scores, recorded (the scoring itself unchanged)."""
  seen, score = [], induction._batch_jit

  def record(model, tokens):
    seen.append(np.asarray(tokens))
    return score(model, tokens)
  monkeypatch.setattr(induction, "_batch_jit", record)
  return seen


# ----------------------------------------------------------------------------- the probe's token sets

def test_uniform_mode_is_the_seeds_draw_and_corpus_mode_draws_only_corpus_tokens():
  ref = np.random.default_rng(1234).integers(0, 265, (64, 32))         # the protocol: uniform over [0, V)
  np.testing.assert_array_equal(induction.sequences(32, 265), np.concatenate([ref, ref], 1))
  pool = np.array([3, 40, 41, 200], np.int32)
  s = induction.sequences(32, 265, pool=pool)
  assert set(np.unique(s)) == set(pool.tolist())                       # only pool ids, and all of them
  picks = pool[np.random.default_rng(1234).integers(0, 4, (64, 32))]   # s_t = pool[u_t], u_t uniform
  np.testing.assert_array_equal(s, np.concatenate([picks, picks], 1))


def test_induction_feeds_the_model_only_corpus_tokens_and_uniform_is_unchanged(tmp_path, monkeypatch):
  docs = ["abcabc dd\n", "xyz", "abc", "q"]                           # train: documents 0, 1, 3 (val_every 3)
  root = tmp_path / "c"
  root.mkdir()
  for i, d in enumerate(docs):
    (root / f"d{i}.txt").write_text(d)
  corpus = text.open_corpus(text.TextSpec(str(root), val_every=3), tok_lib.ByteTokenizer(), str(tmp_path / "cache"))
  pool = corpus.token_ids()
  np.testing.assert_array_equal(pool, sorted(set(b"abcabc dd\nxyzq")))   # BOS (256) is not a corpus token
  model = tiny_gpt()
  ref = np.random.default_rng(1234).integers(0, 265, (64, 32))        # the seed's draw, made here
  rows = np.concatenate([ref, ref], 1)
  hits = np.argmax(np.asarray(model(rows[:, :-1])), -1) == rows[:, 1:]
  seen = recording(monkeypatch)
  out = induction.induction(model, 265, 64, pool=pool)
  assert set(np.unique(np.concatenate(seen))) <= set(pool.tolist()) and out["per_length"].keys() == {32}
  seen.clear()
  uniform = induction.induction(model, 265, 64)
  np.testing.assert_array_equal(np.concatenate(seen), rows)            # uniform: today's rows, exactly
  assert uniform["induction"] == pytest.approx(hits[:, 32:63].mean(), abs=1e-7)


def test_evaluate_reports_both_token_sets():
  tok = tok_lib.ByteTokenizer()
  model = tiny_gpt()
  rows = np.array([tok.encode("to be or not to be, that is the question" * 2, prepend=tok.bos_id)[:65]] * 2)
  pool = np.arange(97, 123, dtype=np.int32)
  out = evals.evaluate(model, tok, rows, with_dac=False, corpus_tokens=pool)
  ref = induction.induction(model, 265, 64, pool=pool)
  assert out["induction_corpus"] == ref["induction"] and out["induction_corpus_per_length"] == ref["per_length"]
  assert out["induction"] == induction.induction(model, 265, 64)["induction"]
  assert "induction_corpus" not in evals.evaluate(model, tok, rows, with_dac=False)


# ----------------------------------------------------------------------------- CopyMix in the run

def small_text(root) -> str:
  """12 short documents (the 10th is validation): a corpus that tokenises in well under a second."""
  root.mkdir()
  for i in range(12):
    (root / f"d{i:02d}.txt").write_text(f"document {i}: " + "to be or not to be, that is the question. " * 5)
  return str(root)


def test_copy_mix_share_is_exact():
  for f in (0.1, 0.25, 1 / 3, 0.5, 0.9):
    mix = copying.CopyMix(f, 265, 65)
    assert sum(mix.synthetic(k) is not None for k in range(997)) == np.floor(997 * f)
    assert all(sum(mix.synthetic(k) is not None for k in range(a, a + 40)) in (np.floor(40 * f), np.ceil(40 * f))
               for a in (0, 13, 500))                                  # evenly spread, not clustered


def test_copy_mix_draws_fresh_spans_every_epoch_and_the_same_on_resumption(tmp_path):
  """The loader's stream row k = epoch·N + position gets its own span: a second epoch repeats no synthetic
  row of the first (the rows were fixed by the row index before), and a resumed iterator serves the same."""
  corpus = text.open_corpus(LMConfig(data=small_text(tmp_path / "c"), data_dir=str(tmp_path / "d")).text_spec(),
                            tok_lib.ByteTokenizer(), str(tmp_path / "d"))
  n = len(corpus.rows("train", 32))
  it = text.loader(corpus, "train", 32, 2, seed=0, copy_mix=0.5)
  rows = [r for _ in range(n) for r in next(it)["tokens"]]            # n steps of 2: two epochs
  text_rows = {bytes(np.asarray(r["tokens"])) for r in corpus.rows("train", 32)}
  synthetic = [bytes(r) for r in rows if bytes(r) not in text_rows]
  assert len(synthetic) == n and len(set(synthetic)) == n              # half the stream, none repeated
  state = it.get_state()
  ahead = [next(it)["tokens"] for _ in range(3)]
  again = text.loader(corpus, "train", 32, 2, seed=0, copy_mix=0.5)
  again.set_state(state)
  assert all(np.array_equal(next(again)["tokens"], a) for a in ahead)


def test_run_keys_of_earlier_runs_are_unchanged_and_a_share_keys_a_new_run(tmp_path):
  data = tmp_path / "a.txt"
  data.write_text("to be or not to be\n")
  lm = dataclasses.replace(table2.Table2Config().lm, data=str(data))
  # `table2.run_key` of these configs at commit ee91e79, before copy_mix and induction_lengths existed:
  assert table2.run_key(lm) == "aca2468441db7292"
  assert table2.run_key(table2.condition_config(lm, "DMTN", 1)) == "32aecb8500270db3"
  keys = {table2.run_key(dataclasses.replace(lm, copy_mix=f)) for f in (0.0, 0.1, 0.25)}
  keys.add(table2.run_key(dataclasses.replace(lm, induction_lengths=(32,))))
  assert len(keys) == 4


def test_a_run_resumes_only_under_its_own_copy_mix(tmp_path):
  out = tmp_path / "run"
  out.mkdir()
  (out / "lm.json").write_text(json.dumps(dataclasses.asdict(LMConfig(copy_mix=0.25))))
  with pytest.raises(ValueError, match="the run trained with copy_mix 0.25, not 0.0"):
    recipe.train(LMConfig(data=small_text(tmp_path / "c"), data_dir=str(tmp_path / "data"), seq_len=64), str(out))
  assert sorted(os.listdir(out)) == ["lm.json"]


def test_the_periodic_eval_reports_bpb_and_both_induction_modes_at_its_steps(tmp_path):
  cfg = LMConfig(data=small_text(tmp_path / "c"), data_dir=str(tmp_path / "data"), seq_len=64, eval_every=5,
                 eval_rows=2, induction_lengths=(32,))
  tok = tok_lib.ByteTokenizer()
  corpus = text.open_corpus(cfg.text_spec(), tok, cfg.data_dir)
  hook, model = recipe.eval_hook(cfg, corpus, tok, steps=12), tiny_gpt()
  assert hook(3, model) is None and set(hook(12, model)) == {"val_bpb", "induction", "induction_corpus"}
  got = hook(5, model)
  assert got["induction_corpus"] == induction.induction(model, 265, 64, (32,), pool=corpus.token_ids())["induction"]
  assert got["induction"] == induction.induction(model, 265, 64, (32,))["induction"]
  assert "induction" not in recipe.eval_hook(dataclasses.replace(cfg, induction_lengths=()), corpus, tok, 12)(5, model)


@pytest.mark.slow
def test_training_logs_induction_on_copy_mix_rows(tmp_path):
  cfg = LMConfig(data=small_text(tmp_path / "c"), data_dir=str(tmp_path / "data"), depth=1, width=32, head_dim=16, seq_len=64,
                 copy_mix=0.5, eval_every=2, eval_rows=2, induction_lengths=(32,),
                 train=LMTrain(steps=2, batch_size=4, log_every=1, ckpt_every=2, progress=False, warmup=1))
  hist = recipe.train(cfg, str(tmp_path / "run"))["history"]
  assert "induction" not in hist[0] and {"val_bpb", "induction", "induction_corpus"} <= set(hist[1])
  assert 0 <= hist[1]["induction_corpus"] <= 1
  logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert logged[-1]["induction_corpus"] == hist[1]["induction_corpus"]
  assert any(f.startswith("events.out.tfevents") for _, _, fs in os.walk(tmp_path / "run") for f in fs)


# ----------------------------------------------------------------------------- the preset and bad input

def test_the_induction_preset_is_a_bpe_depth_2_copy_mix_protocol_flags_override(monkeypatch):
  cfg = preset("induction").validate()
  assert cfg.tokenizer == "bpe" and cfg.depth >= 2 and 0 < cfg.copy_mix < 1 and cfg.eval_every > 0
  assert cfg.induction_lengths and max(cfg.induction_lengths) * 2 - 1 <= cfg.seq_len
  # The measured protocol (docs/lm.md: 0.995 / 0.955 at L = 32, 64, 128 after 1500 steps): L = 128 is probed,
  # most rows are copy rows, and the recipe's Muon/AdamW split drives it (AdamW needs twice the steps).
  assert 128 in cfg.induction_lengths and cfg.copy_mix >= 0.9 and cfg.vocab_size == 512
  assert cfg.train.optimizer == "muon_adamw" and cfg.train.steps == 1500 and cfg.train.warmdown_ratio == 0.3
  seen = []
  monkeypatch.setattr(recipe, "train", lambda c, out, desc="": seen.append(c) or {"history": []})
  lm_cmd.main(["train", "--preset", "induction", "--copy-mix", "0.1", "--train.steps", "7", "--no-eval", "--out", "o"])
  assert seen[0] == dataclasses.replace(cfg, copy_mix=0.1, train=dataclasses.replace(cfg.train, steps=7))


def test_protocol_errors_are_one_line_before_jax(tmp_path):
  cases = [(["lm", "train", "--copy-mix", "1", "--out", "o"], "copy_mix must be a share in [0, 1)"),
           (["lm", "train", "--induction-lengths", "128", "--seq-len", "128", "--out", "o"],
            "induction_lengths must be distinct half-lengths L ≥ 1 with 2L − 1 ≤ seq_len = 128"),
           (["lm", "train", "--induction-lengths", "32,32", "--out", "o"], "induction_lengths must be distinct"),
           (["lm", "train", "--tokenizer", "bpe", "--vocab-size", "264", "--out", "o"], "vocab_size must be an integer ≥ 265"),
           (["lm", "table2", "--lm.copy-mix", "-0.5", "--out", "o"], "lm.copy_mix must be a share in [0, 1)"),
           (["lm", "table2", "--preset", "induction", "--lm.induction-lengths", "256", "--out", "o"],
            "lm.induction_lengths must be distinct half-lengths"),
           (["lm", "table2", "--preset", "nope", "--out", "o"], "--preset must be one of")]
  assert_errors_before_jax(cases, tmp_path)
  assert os.listdir(tmp_path) == []
