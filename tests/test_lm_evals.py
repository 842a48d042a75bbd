"""Language-model evaluations against independent references: bpb, induction, the DAC probe, CORE."""
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from attngeo.lm import bpb, core, dac, evals, induction
from attngeo.lm import tokenizer as tok_lib


def tiny_gpt(vocab=265, seq_len=64, operator="ATTN", seed=0):
  cfg = nn.GPTConfig.from_depth(1, vocab_size=vocab, seq_len=seq_len, head_dim=8, width=16, operator=operator)
  return nn.GPT(cfg, rngs=nnx.Rngs(seed))


# ----------------------------------------------------------------------------- bpb

def test_bpb_matches_a_float64_reference_with_specials_masked():
  model = tiny_gpt(vocab=20)
  rng = np.random.default_rng(0)
  rows = rng.integers(0, 20, (7, 13)).astype(np.int32)
  rows[:, 0] = 19
  rows[2, 5] = 19                                        # special targets inside rows
  table = rng.integers(1, 5, 20).astype(np.int32)
  table[[17, 19]] = 0                                    # two "special" ids
  logits = np.asarray(nnx.jit(lambda m, x: m(x))(model, jnp.asarray(rows[:, :-1])), np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  y = rows[:, 1:]
  nats = -np.take_along_axis(logp, y[..., None], -1)[..., 0]
  want = (nats * (table[y] > 0)).sum() / (math.log(2) * table[y].sum())
  got = bpb.bits_per_byte(model, rows, table, batch_size=3)      # 7 rows: the last batch is padded
  assert got["bytes"] == table[y].sum() and got["tokens"] == y.size
  np.testing.assert_allclose(got["bpb"], want, rtol=1e-5)
  np.testing.assert_allclose(got["loss"], nats.mean(), rtol=1e-5)


def test_bpb_of_a_uniform_model_is_log2_vocab_per_byte():
  model = tiny_gpt(vocab=265)
  model.unembed[...] = jnp.zeros_like(model.unembed[...])          # uniform predictions: ln V nats per token
  tok = tok_lib.ByteTokenizer()
  rows = np.array([tok.encode("hello world, hello!", prepend=tok.bos_id)])
  got = bpb.bits_per_byte(model, rows, tok.token_bytes())
  np.testing.assert_allclose(got["bpb"], math.log2(265), rtol=1e-6)   # one byte per byte-level token


def test_bpb_bad_rows():
  with pytest.raises(ValueError, match=r"\[m, T \+ 1\]"):
    bpb.bits_per_byte(tiny_gpt(), np.zeros((0, 5), np.int32), np.ones(265, np.int32))
  with pytest.raises(ValueError, match="token_bytes covers 10 ids"):
    bpb.bits_per_byte(tiny_gpt(), np.full((1, 5), 12, np.int32), np.ones(10, np.int32))


# ----------------------------------------------------------------------------- induction

class CopyOracle(nnx.Module):
  """Logits: at i ≥ L (the second copy) a confident guess of x[i − L + 1]; elsewhere uniform."""

  def __init__(self, vocab):
    self.vocab = vocab

  def __call__(self, x):
    n = x.shape[1]
    L = (n + 1) // 2
    i = jnp.arange(n)
    src = jnp.clip(i - L + 1, 0, n - 1)
    guess = jax.nn.one_hot(x[:, src], self.vocab) * 10.0
    return jnp.where((i >= L)[None, :, None], guess, 0.0)


def test_induction_positions_on_an_oracle():
  v = 50
  out = induction.induction(CopyOracle(v), vocab_size=v, seq_len=130)
  assert set(out["per_length"]) == {32, 64}                        # 2L − 1 ≤ 130
  for r in out["per_length"].values():
    assert r["induction_acc"] == 1.0
    np.testing.assert_allclose(r["random_half_loss"], math.log(v), rtol=1e-5)
    np.testing.assert_allclose(r["induction_loss"], math.log(1 + (v - 1) * math.exp(-10.0)), rtol=1e-4)
  assert out["induction"] == 1.0


def test_induction_sequences_and_lengths():
  s = induction.sequences(32, 7)
  assert s.shape == (64, 64) and s.max() < 7
  np.testing.assert_array_equal(s[:, :32], s[:, 32:])
  np.testing.assert_array_equal(s, induction.sequences(32, 7))
  assert induction.lengths_for(256) == (32, 64, 128) and induction.lengths_for(2048) == (32, 64, 128, 256, 512)
  with pytest.raises(ValueError, match="no induction length"):
    induction.induction(CopyOracle(5), 5, seq_len=40)


# ----------------------------------------------------------------------------- DAC

def test_edge_logits_match_a_dense_float64_reference():
  rng = np.random.default_rng(1)
  L, b, h, d = 6, 2, 3, 4
  q, k = rng.standard_normal((2, b, 2 * L - 1, h, d))
  got, counts = dac.edge_logits(q, k, L)
  A = 0.5 * (np.einsum("bihd,bjhd->bhij", q, k) - np.einsum("bihd,bjhd->bhij", k, q)) / math.sqrt(d)
  for o, delta in enumerate(dac.OFFSETS):
    vals = [A[:, :, i, i - L + 1 + delta] for i in range(L, 2 * L - 1) if i - L + 1 + delta >= 0]
    np.testing.assert_allclose(np.asarray(got)[:, o], np.mean(vals, axis=(0, 1)), rtol=1e-5, atol=1e-6)
    assert counts[o] == len(vals)
  assert counts.tolist() == [L - 2, L - 1, L - 1, L - 1, L - 1]
  np.testing.assert_allclose(dac.local_contrast([[1.0, 2.0, 5.0, 0.0, -1.0]]), [5.0 - 0.5])


def test_dac_probe_shapes_on_a_gpt():
  model = tiny_gpt(seq_len=64, operator="DMTN")
  out = dac.dac_probe(model, 256, 64)
  assert out["L"] == 32 and np.asarray(out["logit"]).shape == (1, 2, 5) and np.asarray(out["contrast"]).shape == (1, 2)


# ----------------------------------------------------------------------------- CORE

class Successor(nnx.Module):
  """Predicts token x + 1 after token x, confidently: a model whose CORE answers are known by hand."""

  def __init__(self, vocab, seq_len=64):
    self.vocab = vocab
    self.cfg = type("C", (), {"seq_len": seq_len})()

  def __call__(self, x):
    return jax.nn.one_hot((x + 1) % self.vocab, self.vocab) * 8.0


def write_bundle(root, tasks):
  """tasks: {label: (type, shots, delimiter, baseline, [examples])}"""
  os.makedirs(os.path.join(root, "eval_data"), exist_ok=True)
  lines = ["icl_tasks:"]
  meta = ["Eval Task,Random baseline"]
  for label, (kind, shots, delim, base, examples) in tasks.items():
    lines += [f"- label: {label}", f"  dataset_uri: {label}.jsonl", f"  num_fewshot: [{shots}]",
              f"  icl_task_type: {kind}", f"  continuation_delimiter: {json.dumps(delim)}"]
    meta.append(f"{label},{base}")
    with open(os.path.join(root, "eval_data", f"{label}.jsonl"), "w") as f:
      f.write("\n".join(json.dumps(e) for e in examples) + "\n")
  with open(os.path.join(root, "core.yaml"), "w") as f:
    f.write("\n".join(lines) + "\n")
  with open(os.path.join(root, "eval_meta_data.csv"), "w") as f:
    f.write("\n".join(meta) + "\n")
  return str(root)


# Under the successor model a continuation scores well iff each of its characters follows the previous one.
# (Example 2 is decided by the first continuation token alone: scoring from the wrong start ties it.)
MC = [{"query": "ab", "choices": ["cde", "cxq"], "gold": 0}, {"query": "mn", "choices": ["zz", "op"], "gold": 0},
      {"query": "rs", "choices": ["xyz", "tuv"], "gold": 1}, {"query": "gh", "choices": ["ij", "ik"], "gold": 1}]
SCHEMA = [{"context_options": ["ab", "xq"], "continuation": "cd", "gold": 0},
          {"context_options": ["qq", "kl"], "continuation": "mn", "gold": 1},
          {"context_options": ["uv", "de"], "continuation": "wx", "gold": 1}]
LM = [{"context": " abc ", "continuation": "def"}, {"context": "pq", "continuation": "rst"},
      {"context": "xy", "continuation": "zz"}, {"context": "hi", "continuation": "jk"}, {"context": "mn", "continuation": "oq"}]


def test_core_centred_accuracies_by_hand(tmp_path):
  bundle = write_bundle(tmp_path / "bundle", {"mc": ("multiple_choice", 1, "", 25.0, MC),
                                             "schema": ("schema", 0, "", 50.0, SCHEMA),
                                             "lm": ("language_modeling", 2, "", 0.0, LM)})
  out = core.evaluate_core(Successor(265), tok_lib.ByteTokenizer(), bundle, seq_len=64)
  # mc: examples 1 and 3 have the non-successor choice as gold → 2/4; schema: example 3 → 2/3;
  # lm: 'abc'→'def', 'pq'→'rst', 'hi'→'jk' are successor chains → 3/5.
  assert out["results"] == {"mc": 0.5, "schema": pytest.approx(2 / 3), "lm": 0.6}
  want = {"mc": (0.5 - 0.25) / 0.75, "schema": (2 / 3 - 0.5) / 0.5, "lm": 0.6}
  assert out["centered"] == pytest.approx(want)
  assert out["core"] == pytest.approx(np.mean(list(want.values())))


def test_core_prompts_follow_the_dclm_templates():
  shot = [{"query": "Q1", "choices": ["a", "b"], "gold": 1}]
  assert core.render("multiple_choice", {"query": "Q2", "choices": ["x", "y"]}, " ", shot) == ["Q1 b\n\nQ2 x", "Q1 b\n\nQ2 y"]
  shot = [{"context_options": ["c0", "c1"], "continuation": "k", "gold": 0}]
  assert core.render("schema", {"context_options": ["d0", "d1"], "continuation": "m"}, ": ", shot) == \
      ["c0: k\n\nd0: m", "c0: k\n\nd1: m"]
  shot = [{"context": " ctx  ", "continuation": "cont"}]
  assert core.render("language_modeling", {"context": "  q ", "continuation": "ans"}, " ", shot) == \
      ["ctx cont\n\nq", "ctx cont\n\nq ans"]
  assert core.common_length([[1, 2, 3], [1, 2, 4]]) == 2 and core.common_length([[9, 2, 3], [1, 2, 3]], "right") == 2
  assert core.centered(0.25, 25.0) == 0.0 and core.centered(1.0, 25.0) == 1.0


def test_core_bad_bundles_name_the_file_and_line(tmp_path):
  bundle = write_bundle(tmp_path / "b", {"mc": ("multiple_choice", 0, " ", 25.0, MC)})
  path = os.path.join(bundle, "eval_data", "mc.jsonl")
  with open(path, "a") as f:
    f.write("{broken\n")
  with pytest.raises(ValueError, match=r"mc.jsonl:5: not valid JSON"):
    core.load_bundle(bundle)
  with open(path, "w") as f:
    f.write(json.dumps({"query": "q", "gold": 0}) + "\n")
  with pytest.raises(ValueError, match=r"mc.jsonl:1: a multiple_choice example needs .* missing \['choices'\]"):
    core.load_bundle(bundle)
  os.remove(os.path.join(bundle, "eval_meta_data.csv"))
  with pytest.raises(FileNotFoundError, match="eval_meta_data.csv: missing"):
    core.load_bundle(bundle)


def test_evaluate_reports_other_metrics_without_a_bundle(tmp_path):
  tok = tok_lib.ByteTokenizer()
  rows = np.array([tok.encode("to be or not to be, that is the question" * 2, prepend=tok.bos_id)[:65]] * 3)
  out = evals.evaluate(tiny_gpt(seq_len=64), tok, rows, core_bundle=str(tmp_path / "none"))
  assert out["core"] is None and "no eval bundle at" in out["core_note"]
  assert math.isfinite(out["bpb"]) and 0 <= out["induction"] <= 1 and out["dac"]["L"] == 32


def test_core_shuffles_with_1337_and_draws_demonstrations_with_1234_plus_index(tmp_path, monkeypatch):
  import random
  bundle = write_bundle(tmp_path / "b", {"lm": ("language_modeling", 2, "", 0.0, LM)})
  seen = []
  real = core.render
  monkeypatch.setattr(core, "render", lambda kind, item, d, shots: seen.append((item, shots)) or real(kind, item, d, shots))
  core.evaluate_core(Successor(265), tok_lib.ByteTokenizer(), bundle, seq_len=64)
  data = list(LM)
  random.Random(1337).shuffle(data)
  for idx, (item, shots) in enumerate(seen):
    assert item == data[idx]
    assert shots == [data[i] for i in random.Random(1234 + idx).sample([i for i in range(5) if i != idx], 2)]


@pytest.mark.parametrize("kind, example, message", [
    ("multiple_choice", {"query": "q", "choices": ["a", "b"], "gold": "0"}, "field 'gold' must be an integer index into 'choices' (0 to 1); got '0'"),
    ("multiple_choice", {"query": "q", "choices": ["a", "b"], "gold": -1}, "field 'gold' must be an integer index"),
    ("multiple_choice", {"query": "q", "choices": ["a", "b"], "gold": 2}, "(0 to 1); got 2"),
    ("multiple_choice", {"query": "q", "choices": ["a", "b"], "gold": True}, "got True"),
    ("multiple_choice", {"query": "q", "choices": "ab", "gold": 0}, "field 'choices' must be a non-empty list of strings; got 'ab'"),
    ("multiple_choice", {"query": 3, "choices": ["a"], "gold": 0}, "field 'query' must be a string; got 3"),
    ("schema", {"context_options": ["a", "b"], "continuation": "c", "gold": 5}, "index into 'context_options' (0 to 1); got 5"),
    ("language_modeling", {"context": "a", "continuation": ["b"]}, "field 'continuation' must be a string"),
])
def test_core_examples_with_a_bad_field_are_one_line_naming_file_line_and_field(tmp_path, kind, example, message):
  """A string, negative or out-of-range gold, or a string of choices, was scored (wrongly) or crashed: now refused."""
  good = {"multiple_choice": MC, "schema": SCHEMA, "language_modeling": LM}[kind]
  bundle = write_bundle(tmp_path / "b", {"t": (kind, 1, " ", 25.0, good[:2] + [example])})
  with pytest.raises(ValueError) as e:
    core.load_bundle(bundle)
  assert str(e.value).startswith(os.path.join(bundle, "eval_data", "t.jsonl") + ":3: ") and message in str(e.value)
  assert "\n" not in str(e.value)


def test_core_bundle_baselines_shots_and_max_per_task_are_checked_before_scoring(tmp_path):
  bundle = write_bundle(tmp_path / "b", {"mc": ("multiple_choice", 1, " ", 100.0, MC)})
  with pytest.raises(ValueError, match=r"eval_meta_data.csv:2: field 'Random baseline' of task 'mc' must be a "
                                       r"percentage in \[0, 100\); got '100.0'"):
    core.load_bundle(bundle)
  bundle = write_bundle(tmp_path / "c", {"mc": ("multiple_choice", 4, " ", 25.0, MC)})       # 4 examples, 4 shots
  with pytest.raises(ValueError, match=r"mc.jsonl: 4 examples; 4-shot prompts need at least 5"):
    core.load_bundle(bundle)
  bundle = write_bundle(tmp_path / "d", {"mc": ("multiple_choice", 2, " ", 25.0, MC)})
  model, tok = Successor(265), tok_lib.ByteTokenizer()
  with pytest.raises(ValueError, match=r"max_per_task 2 is too few for the few-shot prompts of \['mc'\]"):
    core.evaluate_core(model, tok, bundle, seq_len=64, max_per_task=2)
  for bad in (0, -2):
    with pytest.raises(ValueError, match="max_per_task must be -1 .every example. or an integer ≥ 1"):
      core.evaluate_core(model, tok, bundle, seq_len=64, max_per_task=bad)
  assert 0 <= core.evaluate_core(model, tok, bundle, seq_len=64, max_per_task=3)["results"]["mc"] <= 1
