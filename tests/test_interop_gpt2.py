"""attngeo.interop.gpt2: a random state dict in the Hugging Face GPT-2 layout, imported, matches an
independent numpy forward pass written from transformers' modeling_gpt2.py; export round-trips."""
import json
import os

import export_audit
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from attngeo import connection, nn
from attngeo.interop import gpt2, layout, safetensors_io

forward = nnx.jit(lambda model, ids: model(ids))   # one compiled program per model shape

HF = {"vocab_size": 61, "n_positions": 24, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": None,
      "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "model_type": "gpt2"}


def random_state(hf=HF, seed=0):
  """A GPT-2 state dict with the hub's key names, Conv1D weights [in, out] and mask buffers."""
  r = np.random.default_rng(seed)
  d, f, v, p = hf["n_embd"], 4 * hf["n_embd"], hf["vocab_size"], hf["n_positions"]
  g = lambda *s, std=0.3: (r.standard_normal(s) * std).astype(np.float32)
  sd = {"wte.weight": g(v, d, std=0.5), "wpe.weight": g(p, d, std=0.2), "ln_f.weight": 1 + g(d, std=0.1),
        "ln_f.bias": g(d, std=0.1)}
  for i in range(hf["n_layer"]):
    q = f"h.{i}."
    sd.update({q + "ln_1.weight": 1 + g(d, std=0.1), q + "ln_1.bias": g(d, std=0.1),
               q + "ln_2.weight": 1 + g(d, std=0.1), q + "ln_2.bias": g(d, std=0.1),
               q + "attn.c_attn.weight": g(d, 3 * d), q + "attn.c_attn.bias": g(3 * d, std=0.1),
               q + "attn.c_proj.weight": g(d, d, std=0.1), q + "attn.c_proj.bias": g(d, std=0.1),
               q + "mlp.c_fc.weight": g(d, f, std=0.2), q + "mlp.c_fc.bias": g(f, std=0.1),
               q + "mlp.c_proj.weight": g(f, d, std=0.1), q + "mlp.c_proj.bias": g(d, std=0.1),
               q + "attn.bias": np.tril(np.ones((p, p), bool))[None, None], q + "attn.masked_bias": np.float32(-1e4)})
  return sd


def reference_logits(sd, hf, ids):
  """float64 numpy GPT2LMHeadModel forward, read off transformers' modeling_gpt2.py."""
  sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  d, h, eps = hf["n_embd"], hf["n_head"], hf["layer_norm_epsilon"]
  hd = d // h

  def ln(x, name):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * sd[name + ".weight"] + sd[name + ".bias"]

  def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

  b, n = ids.shape
  x = sd["wte.weight"][ids] + sd["wpe.weight"][:n]
  causal = np.tril(np.ones((n, n), bool))
  for i in range(hf["n_layer"]):
    p = f"h.{i}."
    a = ln(x, p + "ln_1") @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"]
    q, k, v = (t.reshape(b, n, h, hd).transpose(0, 2, 1, 3) for t in np.split(a, 3, axis=-1))
    w = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd)
    w = np.where(causal, w, np.finfo(np.float64).min)
    w = np.exp(w - w.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = (w @ v).transpose(0, 2, 1, 3).reshape(b, n, d)
    x = x + y @ sd[p + "attn.c_proj.weight"] + sd[p + "attn.c_proj.bias"]
    m = gelu_new(ln(x, p + "ln_2") @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"])
    x = x + m @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
  return ln(x, "ln_f") @ sd["wte.weight"].T


def write_model(folder, sd, hf=HF):
  os.makedirs(folder, exist_ok=True)
  safetensors_io.write(os.path.join(folder, "model.safetensors"), sd, {"format": "pt"})
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf, f)
  return str(folder)


IDS = np.random.default_rng(1).integers(0, HF["vocab_size"], (2, 20))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
  sd = random_state()
  folder = write_model(tmp_path_factory.mktemp("gpt2"), sd)
  model, _ = gpt2.load(folder)
  return sd, folder, model


def test_imported_gpt2_matches_numpy_reference(hub):
  sd, _, model = hub
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS)), reference_logits(sd, HF, IDS), atol=1e-4, rtol=0)


def test_prefixed_keys_and_tied_lm_head_are_accepted(tmp_path):
  sd = random_state(seed=2)
  pref = {"transformer." + k: v for k, v in sd.items()}
  pref["lm_head.weight"] = sd["wte.weight"].copy()
  model, _ = gpt2.load(write_model(tmp_path, pref))
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS)), reference_logits(sd, HF, IDS), atol=1e-4, rtol=0)
  pref["lm_head.weight"] = sd["wte.weight"] + 1
  with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
    gpt2.load(write_model(tmp_path, pref))


def test_imported_gpt2_is_probe_ready_and_grafts(hub):
  sd, _, model = hub
  d, h = HF["n_embd"], HF["n_head"]
  mods = nn.attention_modules(model)
  assert len(mods) == HF["n_layer"] and all(isinstance(m, nn.Attention) for m in mods)
  assert mods[0].wv[...].shape == (d, h, d // h) and mods[0].wo[...].shape == (h, d // h, d)
  t = connection.head_transports(mods[0].wv[...], mods[0].wo[...])   # the probe's connection read-out
  c_attn, c_proj = sd["h.0.attn.c_attn.weight"], sd["h.0.attn.c_proj.weight"]
  np.testing.assert_allclose(t[1], (c_attn[:, 2 * d:][:, 8:16] @ c_proj[8:16]).T, atol=1e-5)  # head 1: W_O W_V
  before = layout.params(model)
  ref = reference_logits(sd, HF, IDS)
  nn.graft(model, "DMTN")
  dmtn = np.asarray(forward(model, jnp.asarray(IDS)))
  assert np.isfinite(dmtn).all() and np.abs(dmtn - ref).max() > 1e-2
  after = layout.params(model)
  assert all(np.array_equal(before[k], after[k]) for k in before)
  nn.graft(model, "ATTN")
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS)), ref, atol=1e-4, rtol=0)


def test_gpt2_export_round_trip(hub, tmp_path):
  sd, _, model = hub
  out = tmp_path / "export" / "model.safetensors"
  written = gpt2.save(model, str(out))
  back = safetensors_io.read(str(out))
  params = {k: v for k, v in sd.items() if k.split(".")[-2:] not in (["attn", "bias"], ["attn", "masked_bias"])}
  assert set(back) == set(params)
  for k in params:
    np.testing.assert_array_equal(back[k], params[k], err_msg=k)
  assert written["n_layer"] == HF["n_layer"] and written["tie_word_embeddings"] is True
  assert written["bos_token_id"] is None and written["eos_token_id"] is None    # 61 tokens: not GPT-2's ids
  again, _ = gpt2.load(str(out.parent))
  a, b = layout.params(model), layout.params(again)
  assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
  np.testing.assert_array_equal(forward(again, jnp.asarray(IDS)), forward(model, jnp.asarray(IDS)))


@pytest.mark.parametrize("edit,match", [
    (lambda sd, hf: sd.pop("h.1.mlp.c_fc.bias"), r"missing keys: h\.1\.mlp\.c_fc\.bias"),
    (lambda sd, hf: sd.__setitem__("h.0.attn.extra", np.zeros(3, np.float32)), r"unexpected keys: h\.0\.attn\.extra"),
    (lambda sd, hf: sd.__setitem__("h.0.ln_1.weight", np.ones(31, np.float32)),
     r"wrong shapes: h\.0\.ln_1\.weight \(31,\) \(expected \(32,\)\)"),
    (lambda sd, hf: hf.__setitem__("n_layer", 3), r"2 layers, config.json n_layer=3.*missing keys: h\.2\.attn"),
    (lambda sd, hf: hf.__setitem__("vocab_size", 64), r"61 vocabulary rows, config.json 64.*wte\.weight \(61, 32\)"),
    (lambda sd, hf: hf.__setitem__("activation_function", "relu"), r"activation_function='relu'"),
])
def test_gpt2_layout_errors_are_one_line(tmp_path, edit, match):
  sd, hf = random_state(), dict(HF)
  edit(sd, hf)
  with pytest.raises(ValueError, match=match) as e:
    gpt2.load(write_model(tmp_path, sd, hf))
  assert "\n" not in str(e.value)


def test_missing_config_json_is_one_line(tmp_path):
  safetensors_io.write(str(tmp_path / "model.safetensors"), random_state())
  with pytest.raises(FileNotFoundError, match="no GPT-2 config.json"):
    gpt2.load(str(tmp_path / "model.safetensors"))


# ----------------------------------------------------------------------------- export: lossless or refuses

REFUSED = {   # field: (a change config.json cannot carry, what the one-line refusal names)
    "learned_positions": ({"learned_positions": False}, "learned_positions=False"),
    "embed_norm": ({"embed_norm": True}, "embed_norm=True"),
    "padded_vocab": ({"padded_vocab": 64}, "padded_vocab=64"),
    "logit_softcap": ({"logit_softcap": 15.0}, "logit_softcap=15.0"),
    "attn_windows": ({"attn_windows": (4, 4)}, r"attn_windows=\(4, 4\)"),
    "resid_mix": ({"resid_mix": True}, "resid_mix=True"),
    "smear_channels": ({"smear_channels": 8}, "smear_channels=8"),
    "backout_layer": ({"backout_layer": 0}, "backout_layer=0"),
    "value_embeds": ({"value_embeds": (1,)}, r"value_embeds=\(1,\)"),
    "head_dim": ({"head_dim": 4}, "head_dim=4"),
    "mlp_act": ({"mlp_act": "relu2"}, "mlp_act='relu2'"),
    "order": ({"order": "ffn_first"}, "order='ffn_first'"),
    "operator": ({"operator": "DMAP"}, "operator='DMAP'"),
    "learnable_operator": ({"learnable_operator": True}, "learnable_operator=True"),
    "use_rope": ({"use_rope": True}, "use_rope=True"),
    "qk_norm": ({"qk_norm": True}, "qk_norm=True"),
    "qkv_bias": ({"qkv_bias": False}, "qkv_bias=False"),
    "num_kv_heads": ({"num_kv_heads": 2}, "num_kv_heads=2"),
    "out_bias": ({"out_bias": False}, "out_bias=False"),
    "mlp_bias": ({"mlp_bias": False}, "mlp_bias=False"),
    "norm": ({"norm": "rms", "norm_bias": False}, "norm='rms'"),
    "norm_scale": ({"norm_scale": False}, "norm_scale=False"),
    "norm_bias": ({"norm_bias": False}, "norm_bias=False"),
    "qk_gain": ({"qk_gain": 1.2}, "qk_gain=1.2"),
    "distance_form": ({"distance_form": True, "operator": "DMAP"}, "distance_form=True"),
}
INERT = {"rope_base": 1e5, "rope_sign": -1, "rope_style": "interleaved", "rope_dtype": "bfloat16",   # no rotary
         "qk_norm_scale": False, "coupling": 2.0, "value_gate_channels": 6}   # no QK-norm, not CMAP, no VE
CARRIED = [{"norm_eps": 1e-3, "tie_embeddings": False, "implementation": "einsum", **INERT},   # config.json's own
           {"mlp_ratio": 2.0, "dtype": "bfloat16"}]                                           # keys; compute-only


def save_gpt2(model, folder):
  gpt2.save(model, os.path.join(folder, "model.safetensors"))


def test_export_covers_every_field():
  export_audit.check_covered(REFUSED, CARRIED)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_export_refuses_what_config_json_cannot_carry(field, tmp_path):
  changes, match = REFUSED[field]
  export_audit.check_refused(gpt2.config(HF), changes, match, save_gpt2, tmp_path / "out")


@pytest.mark.parametrize("changes", CARRIED, ids=str)
def test_export_carries_the_rest(changes, tmp_path):
  export_audit.check_carried(gpt2.config(HF), changes, save_gpt2, lambda folder: gpt2.load(folder)[0],
                             tmp_path / "out", IDS)


@pytest.mark.parametrize("field,value", [("n_head", 0), ("n_layer", -1), ("n_positions", 0), ("n_embd", "32"),
                                         ("n_inner", 0), ("vocab_size", 2.5), ("layer_norm_epsilon", -1e-5)])
def test_impossible_config_json_is_one_line(tmp_path, field, value):
  with pytest.raises(ValueError, match=rf"{field}(={value!r}| must be a finite number >= 0)") as e:
    gpt2.load(write_model(tmp_path, random_state(), dict(HF, **{field: value})))
  assert "\n" not in str(e.value)


def test_param_count_is_gpt2s_closed_form(hub):
  """`nn.param_count` of an imported GPT-2 is the public layout's count, V·d + P·d + L·(12d² + 13d) + 2d (the
  tensors of `random_state` minus the attention-mask buffers); its blocks alone are the L·(12d² + 13d)."""
  sd, _, model = hub
  d, v, p, n_layer = HF["n_embd"], HF["vocab_size"], HF["n_positions"], HF["n_layer"]
  blocks = n_layer * (12 * d * d + 13 * d)
  assert nn.param_count(model) == v * d + p * d + blocks + 2 * d
  assert nn.param_count(model, blocks_only=True) == blocks
  assert nn.param_count(model) == sum(np.size(a) for k, a in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias")))


def test_exported_bos_and_eos_are_gpt2s_only_on_its_vocabulary():
  """GPT-2's <|endoftext|> (50 256) on its own 50 257 tokens; null on any other vocabulary, where it named a
  token that does not exist (Hugging Face warned on loading a 265-token export) or one that means another thing."""
  for vocab, expected in ((gpt2.GPT2_VOCAB, 50256), (265, None), (65536, None)):
    hf = gpt2.hf_config(nn.GPTConfig.create(**gpt2.family_fields(), vocab_size=vocab, depth=1, width=32, num_heads=2,
                                         head_dim=16, seq_len=8))
    assert hf["bos_token_id"] == hf["eos_token_id"] == expected
