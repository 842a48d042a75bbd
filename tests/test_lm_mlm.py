"""MLM masking and scores against float64 numpy references; `evaluate` against a direct computation."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo.data import molecules
from attngeo.lm import mlm
from attngeo.lm.smiles import SmilesTokenizer


def _log_softmax64(z):
  z = np.asarray(z, np.float64)
  m = z.max(-1, keepdims=True)
  return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


def _reference(logits, targets, selected):
  """(loss, accuracy) in float64 numpy over the selected positions."""
  lp = _log_softmax64(logits)
  nll = -np.take_along_axis(lp, np.asarray(targets)[..., None], -1)[..., 0]
  sel = np.asarray(selected)
  return nll[sel].mean(), (np.asarray(logits).argmax(-1) == targets)[sel].mean()


def test_mlm_sums_match_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 7, 11)).astype(np.float32) * 4
  targets = rng.integers(0, 11, (3, 7))
  targets[0, :3] = logits[0, :3].argmax(-1)          # some correct predictions
  selected = rng.random((3, 7)) < 0.5
  out = mlm.mlm_sums(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(selected))
  loss, acc = _reference(logits, targets, selected)
  assert int(out.count) == selected.sum()
  np.testing.assert_allclose(float(out.nll) / int(out.count), loss, rtol=1e-6)
  assert int(out.correct) / int(out.count) == acc


def test_masking_follows_the_stated_rule():
  rng = np.random.default_rng(1)
  b, n, v = 600, 48, 40
  special = np.zeros(v, bool)
  special[:5] = True
  mask_id = 4
  ids = rng.integers(0, v, (b, n)).astype(np.int32)
  lengths = rng.integers(1, n + 1, b)
  mask = np.arange(n)[None] < lengths[:, None]
  out = jax.device_get(mlm.mask_tokens(jax.random.PRNGKey(3), jnp.asarray(ids), jnp.asarray(mask),
                                       jnp.asarray(special), mask_id))
  eligible = mask & ~special[ids]
  m = eligible.sum(1)
  k = np.where(m > 0, np.maximum(1, np.round(0.15 * m)), 0)
  np.testing.assert_array_equal(out.selected.sum(1), k)
  assert not (out.selected & ~eligible).any()
  np.testing.assert_array_equal(out.inputs[~out.selected], ids[~out.selected])
  np.testing.assert_array_equal(out.targets, ids)
  sel_in, sel_ids = out.inputs[out.selected], ids[out.selected]
  total, ordinary = len(sel_in), v - special.sum()
  shares = {"mask": np.mean(sel_in == mask_id), "kept": np.mean(sel_in == sel_ids),
            "random": np.mean((sel_in != mask_id) & (sel_in != sel_ids))}
  expect = {"mask": 0.8, "kept": 0.1 + 0.1 / ordinary, "random": 0.1 * (1 - 1 / ordinary)}
  for name, p in expect.items():          # within 4 binomial standard deviations (~2,400 selected tokens)
    assert abs(shares[name] - p) < 4 * np.sqrt(p * (1 - p) / total), (name, shares[name], p)
  assert not special[sel_in[sel_in != mask_id]].any()          # random replacements are ordinary tokens
  again = mlm.mask_tokens(jax.random.PRNGKey(3), jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(special), mask_id)
  np.testing.assert_array_equal(np.asarray(again.inputs), out.inputs)
  other = mlm.mask_tokens(jax.random.PRNGKey(4), jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(special), mask_id)
  assert (np.asarray(other.selected) != out.selected).any()


@dataclasses.dataclass(frozen=True)
class TinyCfg:
  vocab_size: int
  mlm_head: bool = True


class TinyEncoder(nnx.Module):
  """A bidirectional toy honouring the padding mask: x_j = E[t_j] + mean_{mask} E[t]; logits = x·W."""

  def __init__(self, vocab, d=8, head=True, seed=0):
    rng = np.random.default_rng(seed)
    self.cfg = TinyCfg(vocab, head)
    self.E = nnx.Param(jnp.asarray(rng.normal(size=(vocab, d)), jnp.float32))
    self.W = nnx.Param(jnp.asarray(rng.normal(size=(d, vocab)), jnp.float32))

  def __call__(self, ids, mask):
    e = self.E[...][ids]
    w = mask[..., None].astype(e.dtype)
    return e + (e * w).sum(1, keepdims=True) / w.sum(1, keepdims=True)

  def head_logits(self, x):
    return x @ self.W[...]

  def mlm_logits(self, ids, mask):
    return self.head_logits(self(ids, mask))


def _numpy_logits(model, ids, mask, head=None):
  e = np.asarray(model.E[...], np.float64)[ids]
  w = mask[..., None].astype(np.float64)
  x = e + (e * w).sum(1, keepdims=True) / w.sum(1, keepdims=True)
  return x @ np.asarray((head or model).W[...], np.float64)


@pytest.fixture(scope="module")
def tok():
  try:
    return SmilesTokenizer.from_vocab(molecules.wheel_file("rxnfp", "models", "transformers", "bert_pretrained"))
  except FileNotFoundError:
    pytest.skip("rxnfp not installed")


SMILES = molecules.reactions(n=4, seed=2) + ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C"]


def test_evaluate_matches_a_direct_numpy_computation(tok):
  model = TinyEncoder(tok.vocab_size)
  ids, mask = tok.batch(SMILES)
  m = jax.device_get(mlm.mask_tokens(jax.random.PRNGKey(5), jnp.asarray(ids), jnp.asarray(mask),
                                     jnp.asarray(tok.special_ids), tok.mask_id))
  loss, acc = _reference(_numpy_logits(model, m.inputs, mask), m.targets, m.selected)
  for batch_size in (3, 64):          # length-sorted, trimmed, padded batches change nothing
    res = mlm.evaluate(model, tok, SMILES, seed=5, batch_size=batch_size, progress=False)
    np.testing.assert_allclose(res.loss, loss, rtol=2e-6)
    assert res.accuracy == acc and res.masked == m.selected.sum() and res.sequences == len(SMILES)
  assert res.tokens == (mask & ~tok.special_ids[ids]).sum()
  np.testing.assert_allclose(res.perplexity, np.exp(loss), rtol=1e-5)


def test_a_headless_model_is_scored_through_another_head(tok):
  body, head = TinyEncoder(tok.vocab_size, head=False, seed=1), TinyEncoder(tok.vocab_size, seed=2)
  ids, mask = tok.batch(SMILES)
  m = jax.device_get(mlm.mask_tokens(jax.random.PRNGKey(0), jnp.asarray(ids), jnp.asarray(mask),
                                     jnp.asarray(tok.special_ids), tok.mask_id))
  loss, _ = _reference(_numpy_logits(body, m.inputs, mask, head=head), m.targets, m.selected)
  res = mlm.evaluate(body, tok, SMILES, head=head, batch_size=4, progress=False)
  np.testing.assert_allclose(res.loss, loss, rtol=2e-6)
  with pytest.raises(ValueError, match="no MLM head; pass head="):
    mlm.evaluate(body, tok, SMILES, progress=False)


@pytest.mark.parametrize("kwargs,smiles,msg", [
  (dict(rate=0.0), SMILES, r"rate must lie in \(0, 1\)"),
  (dict(batch_size=0), SMILES, "batch_size must be"),
  (dict(seed=-1), SMILES, "seed must be"),
  ({}, ["[UNK]", "[MASK]"], "no token to mask"),
  ({}, ["CCX"], r"smiles\[0\]: SMILES 'CCX' cannot be split at position 2"),
])
def test_bad_input_is_one_line(tok, kwargs, smiles, msg):
  with pytest.raises(ValueError, match=msg):
    mlm.evaluate(TinyEncoder(tok.vocab_size), tok, smiles, progress=False, **kwargs)
  with pytest.raises(ValueError, match="vocab has 591 tokens but the model's 100"):
    mlm.evaluate(TinyEncoder(100), tok, SMILES, progress=False)


def test_mlm_eval_command_errors_are_one_line(tmp_path, capsys):
  from attngeo import cli
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text('{"model": {"class": "GPTConfig"}}')
  enc = tmp_path / "enc"
  enc.mkdir()
  (enc / "config.json").write_text('{"model": {"class": "EncoderConfig"}}')
  cases = [([str(tmp_path / "missing")], "no " + str(tmp_path / "missing" / "config.json")),
           ([str(run)], "holds a GPT model, not an encoder"),
           ([str(enc)], "no vocab file"),
           ([str(enc), "--vocab", str(tmp_path / "v.txt")], "--vocab must be an existing vocab.txt"),
           ([str(enc), "--data", "chembl"], "--data must be one of moses, moses-train, reactions"),
           ([str(enc), "--rate", "1.5"], r"--rate must lie in \(0, 1\)"),
           ([str(enc), "--n", "0"], "--n must be >= 1")]
  for argv, msg in cases:
    try:
      code = cli.main(["mlm", "eval", *argv])
    except SystemExit as e:                       # argparse's error: usage line, then the message
      code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith(("attngeo mlm: error:", "attngeo mlm eval: error:")), (argv, err)
    assert re.search(msg, err[-1]), (argv, err)
