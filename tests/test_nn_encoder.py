"""nn.Encoder (BERT / ALBERT): padding, shared layers, HF init, operators, graft/fold, registry, errors.

Parity with transformers' own classes on the real checkpoints is in tests/test_interop_bert.py.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import special

from attngeo import operators
from attngeo.nn import Encoder, EncoderConfig, Mlp, attention_modules, fold_distance, graft, registry
from attngeo.nn.encoder import hf_init

TINY = dict(depth=2, vocab_size=31, seq_len=16, width=16, num_heads=2, head_dim=8)


def tiny(**fields):
  return Encoder(EncoderConfig.create(**{**TINY, **fields}), rngs=nnx.Rngs(0))


def tiny_albert(**fields):
  return Encoder(EncoderConfig.albert(**{**TINY, "embed_dim": 8, **fields}), rngs=nnx.Rngs(0))


IDS = jnp.array([[2, 5, 7, 9, 3, 0, 0], [2, 11, 4, 3, 0, 0, 0]], jnp.int32)
MASK = IDS != 0


def test_gelu_erf_is_the_exact_gelu():
  mlp = Mlp(3, 4, "gelu_erf", rngs=nnx.Rngs(0))
  z = np.linspace(-6, 6, 101)
  want = z * 0.5 * (1 + special.erf(z / math.sqrt(2)))          # float64 closed form
  assert np.abs(np.asarray(mlp.fn(jnp.asarray(z, jnp.float32))) - want).max() < 1e-6
  assert np.abs(np.asarray(jax.nn.gelu(jnp.asarray(z, jnp.float32))) - want).max() > 1e-4   # tanh form is not it


@pytest.mark.parametrize("make", [tiny, tiny_albert])
def test_padding_changes_nothing_on_the_real_tokens(make):
  """A padded sequence's real positions equal the same sequence run alone without padding, at every layer."""
  model = make()
  hs = model.hidden_states(IDS, MASK)
  assert len(hs) == model.cfg.depth + 1 and all(h.shape == (2, 7, 16) for h in hs)
  for row in range(2):
    n = int(MASK[row].sum())
    alone = model.hidden_states(IDS[row:row + 1, :n])
    for a, b in zip(hs, alone):
      np.testing.assert_allclose(np.asarray(a[row, :n]), np.asarray(b[0]), atol=2e-5)
  assert model.mlm_logits(IDS, MASK).shape == (2, 7, 31)


def test_albert_shares_one_layer_and_projects_the_embedding():
  model = tiny_albert(depth=5)
  assert len(model.layers) == 1 and len(attention_modules(model)) == 1
  x0 = model.embeddings(IDS)
  e = model.embed_norm(model.embed[...][IDS] + model.wpe[...][:7] + model.wtt[...][0])
  np.testing.assert_allclose(np.asarray(x0), np.asarray(e @ model.embed_proj[...] + model.embed_proj_bias[...]),
                             atol=1e-6)
  hs = model.hidden_states(IDS, MASK)
  np.testing.assert_allclose(np.asarray(hs[3]), np.asarray(model.layers[0](hs[2], MASK[:, None, None, :])), atol=1e-6)
  assert model.embed.shape == (31, 8) and model.mlm_dense.shape == (16, 8)


def test_post_ln_block_is_bert_s_formula():
  """x' = LN₂(y + W₂ gelu(W₁ y + b₁) + b₂), y = LN₁(x + attn(x)), written from the parameters in float64."""
  model = tiny(initializer_range=0.3)
  blk = model.layers[0]
  x = np.asarray(model.embeddings(IDS[:1]), np.float64)
  p = {k: np.asarray(v, np.float64) for k, v in (
    ("wq", blk.attn.wq[...]), ("wk", blk.attn.wk[...]), ("wv", blk.attn.wv[...]), ("wo", blk.attn.wo[...]),
    ("bq", blk.attn.bq[...]), ("bk", blk.attn.bk[...]), ("bv", blk.attn.bv[...]), ("bo", blk.attn.bo[...]),
    ("w1", blk.mlp.w1[...]), ("b1", blk.mlp.b1[...]), ("w2", blk.mlp.w2[...]), ("b2", blk.mlp.b2[...]))}

  def ln(z, norm):
    mu, var = z.mean(-1, keepdims=True), z.var(-1, keepdims=True)
    return (z - mu) / np.sqrt(var + 1e-12) * np.asarray(norm.scale[...]) + np.asarray(norm.bias[...])
  q, k, v = (np.einsum("bnd,dhk->bhnk", x, p["w" + c]) + p["b" + c][None, :, None] for c in "qkv")
  s = np.einsum("bhik,bhjk->bhij", q, k) / math.sqrt(8)
  a = np.exp(s - s.max(-1, keepdims=True))
  a /= a.sum(-1, keepdims=True)
  y = ln(x + np.einsum("bhij,bhjk,hkd->bid", a, v, p["wo"]) + p["bo"], blk.norm_attn)
  h = y @ p["w1"] + p["b1"]
  want = ln(y + (h * 0.5 * (1 + special.erf(h / math.sqrt(2)))) @ p["w2"] + p["b2"], blk.norm_mlp)
  np.testing.assert_allclose(np.asarray(blk(jnp.asarray(x, jnp.float32))), want, atol=2e-5)


def test_hf_init_statistics_and_seed():
  model = tiny(depth=3, width=64, num_heads=4, head_dim=16, vocab_size=200, initializer_range=0.05)
  flat = {".".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  for name, a in flat.items():
    if name.endswith("scale"):
      assert np.all(a == 1), name
    elif name.split(".")[-1] in ("bq", "bk", "bv", "bo", "b1", "b2", "bias") or name.endswith("_bias"):
      assert np.all(a == 0), name
    elif name == "embed":
      assert np.all(a[0] == 0) and abs(a[1:].std() - 0.05) < 0.002             # pad row zero, as HF's init
    else:
      assert abs(a.std() - 0.05) < 0.1 * 0.05 and abs(a.mean()) < 0.01, name
  again = tiny(depth=3, width=64, num_heads=4, head_dim=16, vocab_size=200, initializer_range=0.05)
  np.testing.assert_array_equal(np.asarray(again.layers[2].attn.wq[...]), flat["layers.2.attn.wq"])
  other = registry.build(registry.config_dict(model), seed=1)
  assert not np.array_equal(np.asarray(other.layers[2].attn.wq[...]), flat["layers.2.attn.wq"])
  hf_init(other, nnx.Rngs(0), 0.05, 0)
  assert np.asarray(other.embed[...])[0].max() == 0


def test_registry_rebuilds_the_encoder_and_its_fold():
  model = tiny_albert(pooler=True, classifier="labels", num_labels=3, tie_decoder=False)
  cfg = registry.config_from_dict(registry.config_dict(model))
  assert cfg == model.cfg and type(registry.build(cfg)) is Encoder
  fold_distance(model)
  assert model.cfg.block.distance_form and registry.build(registry.config_dict(model)).layers[0].attn.distance_form
  assert model.class_logits(IDS, MASK).shape == (2, 3)


@pytest.mark.parametrize("make", [tiny, tiny_albert])
def test_graft_and_fold_act_on_every_layer(make):
  """graft DMAP == fold_distance (same outputs), and each layer's attention is the operator's Markov matrix."""
  model = make(initializer_range=0.2)
  base = np.asarray(model.mlm_logits(IDS, MASK))
  graft(model, "DMAP")
  dmap = np.asarray(model.mlm_logits(IDS, MASK))
  assert np.abs(dmap - base).max() > 1e-3
  hs = model.hidden_states(IDS, MASK)
  attn = model.layers[0].attn
  q, k, v = attn.qkv(hs[0])
  p = operators.markov_matrix(q, k, beta=0.0, alpha=0.0, mask=MASK[:, None, None, :])
  want = jnp.einsum("bhij,bjhk,hkd->bid", p, v, attn.wo[...]) + attn.bo[...]
  np.testing.assert_allclose(np.asarray(attn(hs[0], MASK[:, None, None, :])), np.asarray(want), atol=2e-5)
  fold_distance(model)
  np.testing.assert_allclose(np.asarray(model.mlm_logits(IDS, MASK)), dmap, atol=2e-4)


def test_presets():
  bert, albert = EncoderConfig(), EncoderConfig.albert()
  assert (bert.depth, bert.width, bert.block.num_heads, int(bert.width * bert.block.mlp_ratio)) == (12, 256, 4, 512)
  assert (albert.edim, albert.block.num_heads, albert.shared_layers) == (128, 8, True)
  assert bert.block.mlp_act == "gelu_erf" and bert.block.norm_eps == 1e-12 and bert.block.qkv_bias


@pytest.mark.parametrize("call, match", [
  (lambda m: m.hidden_states(IDS.astype(jnp.float32)), "integer array"),
  (lambda m: m.hidden_states(IDS + 40), r"ids must lie in \[0, 31\)"),
  (lambda m: m.hidden_states(jnp.zeros((1, 17), jnp.int32)), "seq_len=16"),
  (lambda m: m.hidden_states(IDS, MASK.astype(jnp.int32)), "mask must be a bool"),
  (lambda m: m.hidden_states(IDS, MASK[:, :3]), "mask must have ids' shape"),
  (lambda m: m.pooled(IDS), "no pooler"),
  (lambda m: m.class_logits(IDS), "no classifier"),
])
def test_bad_calls_are_one_line(call, match):
  with pytest.raises(ValueError, match=match) as e:
    call(tiny())
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("fields, match", [
  (dict(depth=0), "depth must be an integer"),
  (dict(order="ffn_first"), "post-LN"),
  (dict(classifier="nsp"), "needs pooler=True"),
  (dict(classifier="seq"), "classifier must be one of"),
  (dict(pad_token_id=99), "pad_token_id"),
  (dict(embed_dim=0), "embed_dim must be"),
  (dict(initializer_range=0.0), "initializer_range"),
])
def test_bad_configs_are_one_line(fields, match):
  with pytest.raises(ValueError, match=match):
    EncoderConfig.create(**{**TINY, **fields})


def test_with_operator_keeps_the_encoder():
  cfg = EncoderConfig.create(**TINY).with_operator("DMTN")
  assert cfg.block.operator == "DMTN" and dataclasses.replace(cfg).depth == 2
