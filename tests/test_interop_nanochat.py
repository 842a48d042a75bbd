"""attngeo.interop.nanochat: random state dicts in nanochat's key layouts (the 2025-10 d32 release and
2026-07), imported, match an independent numpy forward pass written from nanochat's gpt.py at
those commits; export round-trips; the seed fork's neutral fill; .pt only through torch."""
import json
import os
import stat
import sys
import types

import export_audit
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

from attngeo import nn
from attngeo.interop import layout, nanochat, safetensors_io

forward = nnx.jit(lambda model, ids: model(ids))   # one compiled program per model shape

F32_EPS = float(np.finfo(np.float32).eps)   # torch F.rms_norm's default ε for float32 inputs
VINTAGE = {"sequence_len": 64, "vocab_size": 50, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "n_embd": 32}
# 2026: vocabulary padded 50 -> 64; windows S=128 on layer 0, L=512 on layers 1, 2; VE on layers 0, 2; back-out at 1.
CURRENT = {"sequence_len": 512, "vocab_size": 50, "n_layer": 3, "n_head": 4, "n_kv_head": 2, "n_embd": 32,
           "window_pattern": "SL"}


def random_state(mc, current: bool, seed=0):
  r = np.random.default_rng(seed)
  g = lambda *s, std=0.3: (r.standard_normal(s) * std).astype(np.float32)
  d, h, kv, L, V = mc["n_embd"], mc["n_head"], mc["n_kv_head"], mc["n_layer"], mc["vocab_size"]
  k = d // h
  rows = -(-V // 64) * 64 if current else V
  sd = {"transformer.wte.weight": g(rows, d, std=1.0), "lm_head.weight": g(rows, d, std=0.3)}
  for i in range(L):
    p = f"transformer.h.{i}."
    sd.update({p + "attn.c_q.weight": g(h * k, d), p + "attn.c_k.weight": g(kv * k, d),
               p + "attn.c_v.weight": g(kv * k, d), p + "attn.c_proj.weight": g(d, h * k, std=0.15),
               p + "mlp.c_fc.weight": g(4 * d, d, std=0.2), p + "mlp.c_proj.weight": g(d, 4 * d, std=0.1)})
    if current and i % 2 == (L - 1) % 2:
      sd[p + "attn.ve_gate.weight"] = g(kv, 12)
      sd[f"value_embeds.{i}.weight"] = g(rows, kv * k, std=0.5)
  if current:
    sd.update({"resid_lambdas": 1 + g(L, std=0.1), "x0_lambdas": 0.2 + g(L, std=0.05),
               "smear_gate.weight": g(1, 24), "smear_lambda": np.array([0.6], np.float32),
               "backout_lambda": np.array([0.3], np.float32)})
  return sd


def reference_logits(sd, mc, ids, current: bool, tables=None):
  """float64 numpy forward read off nanochat/gpt.py (ccfe791 for 2025-10, 92d63d4 for 2026-07).

  `tables`: the dtype the rotary cos/sin tables are computed in (float32) and kept in — 2025-10:
  bfloat16 always; 2026-07: its compute dtype, bfloat16 on an Ampere+ CUDA GPU, float32 on CPU."""
  tables = tables or ("float32" if current else "bfloat16")
  sd = {k: np.asarray(v, np.float64) for k, v in sd.items()}
  d, h, kv, L, V, T = (mc[k] for k in ("n_embd", "n_head", "n_kv_head", "n_layer", "vocab_size", "sequence_len"))
  hd = d // h
  b, n = ids.shape
  rms = lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + F32_EPS)
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  base = 100000 if current else 10000
  inv_freq = 1.0 / base ** (np.arange(0, hd, 2, dtype=np.float32) / hd)
  freqs = np.outer(np.arange(n, dtype=np.float32), inv_freq.astype(np.float32))
  keep = ml_dtypes.bfloat16 if tables == "bfloat16" else np.float32
  cos = np.cos(freqs).astype(keep).astype(np.float64)[None, :, None]
  sin = np.sin(freqs).astype(keep).astype(np.float64)[None, :, None]

  def rotary(x):
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return np.concatenate([x1 * cos + x2 * sin, -x1 * sin + x2 * cos], -1)

  if current:   # per-layer windows: pattern tiled, last layer long; short = ceil(T/4/128)*128
    pat = mc["window_pattern"]
    short = int(np.ceil(T / 4 / 128)) * 128
    win = [T if pat[i % len(pat)] == "L" else short for i in range(L)]
    win[-1] = T
  else:
    win = [T] * L
  qi, kj = np.arange(n)[:, None], np.arange(n)[None, :]

  x = rms(sd["transformer.wte.weight"][ids])
  if current:
    gate = sd["smear_lambda"] * sigmoid(x[:, 1:, :24] @ sd["smear_gate.weight"].T)
    x = np.concatenate([x[:, :1], x[:, 1:] + gate * x[:, :-1]], 1)
  x0, xb = x, None
  for i in range(L):
    p = f"transformer.h.{i}."
    if current:
      x = sd["resid_lambdas"][i] * x + sd["x0_lambdas"][i] * x0
    a = rms(x)
    q = (a @ sd[p + "attn.c_q.weight"].T).reshape(b, n, h, hd)
    k = (a @ sd[p + "attn.c_k.weight"].T).reshape(b, n, kv, hd)
    v = (a @ sd[p + "attn.c_v.weight"].T).reshape(b, n, kv, hd)
    if f"value_embeds.{i}" + ".weight" in sd:
      ve = sd[f"value_embeds.{i}.weight"][ids].reshape(b, n, kv, hd)
      v = v + (3 * sigmoid(a[..., :12] @ sd[p + "attn.ve_gate.weight"].T))[..., None] * ve
    q, k = rms(rotary(q)), rms(rotary(k))
    if current:
      q, k = q * 1.2, k * 1.2
    k, v = np.repeat(k, h // kv, axis=2), np.repeat(v, h // kv, axis=2)   # enable_gqa: head j uses kv head j // (h/kv)
    s = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(hd)
    s = np.where((kj <= qi) & (qi - kj <= win[i]), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = np.einsum("bhij,bjhd->bihd", w, v).reshape(b, n, d)
    x = x + y @ sd[p + "attn.c_proj.weight"].T
    x = x + np.maximum(rms(x) @ sd[p + "mlp.c_fc.weight"].T, 0) ** 2 @ sd[p + "mlp.c_proj.weight"].T
    if current and i == L // 2:
      xb = x
  if current:
    x = x - sd["backout_lambda"] * xb
  logits = (rms(x) @ sd["lm_head.weight"].T)[..., :V]
  return 15 * np.tanh(logits / 15)


def tables_of(model) -> str:
  """The rotary-table dtype an imported model computes with (the reference's `tables`)."""
  return model.cfg.block.rope_dtype or "float32"


def write(tmp_path, sd, mc, step=650):
  path = tmp_path / f"model_{step:06d}.safetensors"
  safetensors_io.write(str(path), sd)
  (tmp_path / f"meta_{step:06d}.json").write_text(json.dumps({"step": step, "model_config": mc}))
  return str(path)


IDS_VINTAGE = np.random.default_rng(1).integers(0, VINTAGE["vocab_size"], (2, 20))
IDS_CURRENT = np.random.default_rng(2).integers(0, CURRENT["vocab_size"], (1, 140))   # > S window of 128


@pytest.fixture(scope="module")
def vintage(tmp_path_factory):
  sd = random_state(VINTAGE, current=False)
  model, info = nanochat.load(write(tmp_path_factory.mktemp("v"), sd, VINTAGE))
  return sd, model, info


@pytest.fixture(scope="module")
def current(tmp_path_factory):
  sd = random_state(CURRENT, current=True, seed=3)
  model, info = nanochat.load(write(tmp_path_factory.mktemp("c"), sd, CURRENT))
  return sd, model, info


def test_d32_release_layout_matches_numpy_reference(vintage):
  sd, model, info = vintage
  assert info["arch"] == "2025-10" and info["commit"].startswith("ccfe791")
  ref = reference_logits(sd, VINTAGE, IDS_VINTAGE, False)
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS_VINTAGE)), ref, atol=1e-4, rtol=0)


def test_2026_layout_matches_numpy_reference(current):
  sd, model, info = current
  assert info["arch"] == "2026-07" and info["commit"].startswith("92d63d4")
  cfg = model.cfg
  assert cfg.padded_vocab == 64 and cfg.attn_windows == (128, 512, 512) and cfg.value_embeds == (0, 2)
  ref = reference_logits(sd, CURRENT, IDS_CURRENT, True, tables_of(model))
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS_CURRENT)), ref, atol=1e-4, rtol=0)
  # the short window bites: the same weights with every layer at full context differ
  full = dict(CURRENT, window_pattern="L")
  assert np.abs(reference_logits(sd, full, IDS_CURRENT, True, tables_of(model)) - ref).max() > 1e-3


def test_window_pattern_tiles_and_ends_long():
  # S = ceil(T/4/128)·128 (the code's value; its comment's "2048 -> 768" is stale: the expression gives 512)
  assert nanochat.windows("SSSL", 2048, 6) == (512, 512, 512, 2048, 512, 2048)
  assert nanochat.windows("SSSL", 1100, 5) == (384, 384, 384, 1100, 1100)
  assert nanochat.windows("L", 100, 2) == (100, 100)
  with pytest.raises(ValueError, match="window_pattern"):
    nanochat.windows("SXL", 2048, 3)


def test_seed_fork_fill_runs_the_d32_weights_under_the_2026_code(tmp_path):
  """The fork's modal/initialize.py: vintage weights + neutral 2026 extras, window L, 2026 forward."""
  sd = random_state(VINTAGE, current=False, seed=4)
  path = write(tmp_path, sd, VINTAGE)
  with pytest.raises(ValueError, match=r"missing keys: backout_lambda, resid_lambdas, smear_gate\.weight"):
    nanochat.load(path, arch="2026-07")
  model, _ = nanochat.load(path, arch="2026-07", fill_missing=True)
  filled = dict(sd, resid_lambdas=np.ones(2, np.float32), x0_lambdas=np.zeros(2, np.float32),
                smear_gate=None, smear_lambda=np.zeros(1, np.float32), backout_lambda=np.zeros(1, np.float32))
  filled.pop("smear_gate")
  filled["smear_gate.weight"] = np.zeros((1, 24), np.float32)
  filled["value_embeds.1.weight"] = np.zeros((64, 16), np.float32)
  filled["transformer.h.1.attn.ve_gate.weight"] = np.zeros((2, 12), np.float32)
  for key in ("transformer.wte.weight", "lm_head.weight"):   # vocab 50 padded to 64 rows
    filled[key] = np.concatenate([sd[key], np.zeros((14, 32), np.float32)])
  ref = reference_logits(filled, dict(VINTAGE, window_pattern="L"), IDS_VINTAGE, True, tables_of(model))
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS_VINTAGE)), ref, atol=1e-4, rtol=0)
  assert np.abs(ref - reference_logits(sd, VINTAGE, IDS_VINTAGE, False)).max() > 1e-2   # base 1e5 and q/k gain 1.2


@pytest.mark.parametrize("which", ["vintage", "current"])
def test_nanochat_export_round_trip(which, request, tmp_path):
  sd, model, _ = request.getfixturevalue(which)
  mc = VINTAGE if which == "vintage" else CURRENT
  out = tmp_path / "model_000001.safetensors"
  meta = nanochat.save(model, str(out), meta={"step": 1})
  assert meta["model_config"] == mc
  assert json.loads((tmp_path / "meta_000001.json").read_text())["model_config"] == mc
  back = safetensors_io.read(str(out))
  assert set(back) == set(sd)
  for k in sd:
    np.testing.assert_array_equal(back[k], sd[k], err_msg=k)
  again, _ = nanochat.load(str(out))
  a, b = layout.params(model), layout.params(again)
  assert all(np.array_equal(a[k], b[k]) for k in a)
  ids = jnp.asarray(IDS_VINTAGE if which == "vintage" else IDS_CURRENT)
  np.testing.assert_array_equal(forward(again, ids), forward(model, ids))


def test_graft_on_imported_2026_model(current):
  sd, model, _ = current
  ids = jnp.asarray(IDS_CURRENT)
  ref = reference_logits(sd, CURRENT, IDS_CURRENT, True, tables_of(model))
  nn.graft(model, "DMTN")
  try:
    dmtn = np.asarray(forward(model, ids))
  finally:
    nn.graft(model, "ATTN")
  assert np.isfinite(dmtn).all() and np.abs(dmtn - ref).max() > 1e-2
  np.testing.assert_allclose(forward(model, ids), ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("edit,match", [
    (lambda sd, mc: sd.pop("transformer.h.1.mlp.c_fc.weight"), r"missing keys: transformer\.h\.1\.mlp\.c_fc\.weight"),
    (lambda sd, mc: sd.__setitem__("transformer.h.0.attn.bogus", np.zeros(2, np.float32)),
     r"unexpected keys: transformer\.h\.0\.attn\.bogus"),
    (lambda sd, mc: sd.__setitem__("transformer.h.0.attn.c_k.weight", np.zeros((32, 32), np.float32)),
     r"wrong shapes: transformer\.h\.0\.attn\.c_k\.weight \(32, 32\) \(expected \(16, 32\)\)"),
    (lambda sd, mc: mc.__setitem__("n_layer", 3), r"2 layers, the config n_layer=3.*missing keys: transformer\.h\.2\."),
    (lambda sd, mc: mc.__setitem__("vocab_size", 48),
     r"50 vocabulary rows, the config 48.*transformer\.wte\.weight \(50, 32\) \(expected \(48, 32\)\)"),
])
def test_nanochat_layout_errors_are_one_line(tmp_path, edit, match):
  sd, mc = random_state(VINTAGE, current=False), dict(VINTAGE)
  edit(sd, mc)
  with pytest.raises(ValueError, match=match) as e:
    nanochat.load(write(tmp_path, sd, mc))
  assert "\n" not in str(e.value)


def test_missing_meta_is_one_line(tmp_path):
  path = tmp_path / "weights.safetensors"
  safetensors_io.write(str(path), random_state(VINTAGE, current=False))
  with pytest.raises(ValueError, match="no nanochat meta"):
    nanochat.load(str(path))


def test_pt_without_torch_says_how_to_convert(tmp_path, monkeypatch):
  path = tmp_path / "model_000650.pt"
  path.write_bytes(b"not read")
  monkeypatch.setitem(sys.modules, "torch", None)   # import torch -> ImportError
  with pytest.raises(ImportError, match=r"pip install 'attngeo\[torch\]'.*weights_only=True.*st\.save_file") as e:
    safetensors_io.read(str(path))
  assert "\n" not in str(e.value)


def test_pt_state_dict_through_torch(tmp_path):
  torch = pytest.importorskip("torch")
  sd = random_state(VINTAGE, current=False, seed=5)
  sd["transformer.wte.weight"] = sd["transformer.wte.weight"].astype(ml_dtypes.bfloat16).astype(np.float32)
  tsd = {"_orig_mod." + k: torch.from_numpy(v) for k, v in sd.items()}   # torch.compile prefix
  tsd["_orig_mod.transformer.wte.weight"] = tsd["_orig_mod.transformer.wte.weight"].bfloat16()   # nanochat's bf16 wte
  torch.save(tsd, tmp_path / "model_000650.pt")
  (tmp_path / "meta_000650.json").write_text(json.dumps({"model_config": VINTAGE}))
  model, info = nanochat.load(str(tmp_path / "model_000650.pt"))
  assert info["arch"] == "2025-10"
  ref = reference_logits(sd, VINTAGE, IDS_VINTAGE, False)
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS_VINTAGE)), ref, atol=1e-4, rtol=0)
  torch.save({"not": "a state dict"}, tmp_path / "model_000651.pt")
  with pytest.raises(ValueError, match="flat state dict of tensors"):
    safetensors_io.read(str(tmp_path / "model_000651.pt"))


# ----------------------------------------------------------------------------- rotary tables: nanochat's on this machine

GQA_WINDOWS = {"sequence_len": 512, "vocab_size": 50, "n_layer": 4, "n_head": 4, "n_kv_head": 1, "n_embd": 64,
               "window_pattern": "SSL"}
IDS_GQA = np.random.default_rng(8).integers(0, GQA_WINDOWS["vocab_size"], (1, 200))   # > the S window of 128


def test_rope_tables_are_nanochats_on_this_machine(monkeypatch):
  """nanochat 2025-10 rounds its tables to bf16 everywhere; 2026-07 keeps them in its compute dtype
  (common.py `_detect_compute_dtype`): NANOCHAT_DTYPE, else bf16 on CUDA SM >= 8.0, else float32."""
  monkeypatch.delenv("NANOCHAT_DTYPE", raising=False)
  assert nanochat.rope_tables("2025-10")[0] == "bfloat16"
  for platform, capability, want in [("cpu", None, None), ("tpu", None, None), ("gpu", "9.0", "bfloat16"),
                                     ("gpu", "8.0", "bfloat16"), ("gpu", "7.5", None)]:
    device = types.SimpleNamespace(platform=platform, compute_capability=capability)
    monkeypatch.setattr(jax, "devices", lambda *a, device=device: [device])
    assert nanochat.rope_tables("2026-07")[0] == want, (platform, capability)
  for env, want in [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", None)]:
    monkeypatch.setenv("NANOCHAT_DTYPE", env)
    assert nanochat.rope_tables("2026-07")[0] == want
  monkeypatch.setenv("NANOCHAT_DTYPE", "fp8")
  with pytest.raises(ValueError, match="NANOCHAT_DTYPE must be one of"):
    nanochat.rope_tables("2026-07")


def test_2026_import_default_and_bf16_tables_match_their_references(tmp_path, monkeypatch):
  """GQA (4 query heads on 1 key head) and windows S, S, L, L: the default import (float32 tables on
  CPU, nanochat's CPU forward) and `rope_dtype="bfloat16"` (its CUDA tables) each match the numpy
  forward with those tables; the two differ by far more than the tolerance."""
  monkeypatch.delenv("NANOCHAT_DTYPE", raising=False)
  sd = random_state(GQA_WINDOWS, current=True, seed=9)
  path = write(tmp_path, sd, GQA_WINDOWS)
  model, info = nanochat.load(path)
  ref32, ref16 = (reference_logits(sd, GQA_WINDOWS, IDS_GQA, True, t) for t in ("float32", "bfloat16"))
  assert np.abs(ref32 - ref16).max() > 1e-3
  if jax.devices()[0].platform == "cpu":
    assert tables_of(model) == "float32" and info["rope_tables"].startswith("float32 rotary tables (nanochat 2026-07")
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS_GQA)), {"float32": ref32, "bfloat16": ref16}[tables_of(model)],
                             atol=1e-4, rtol=0)
  bf16, info = nanochat.load(path, rope_dtype="bfloat16")
  assert info["rope_tables"] == "bfloat16 rotary tables (set by the caller)"
  np.testing.assert_allclose(forward(bf16, jnp.asarray(IDS_GQA)), ref16, atol=1e-4, rtol=0)


# ----------------------------------------------------------------------------- export: lossless or refuses

REFUSED = {   # field: (a change nanochat's model_config cannot carry, what the one-line refusal names)
    "tie_embeddings": ({"tie_embeddings": True}, "tie_embeddings=True"),
    "learned_positions": ({"learned_positions": True}, "learned_positions=True"),
    "embed_norm": ({"embed_norm": False}, "embed_norm=False"),
    "padded_vocab": ({"padded_vocab": 128}, "padded_vocab=128"),
    "logit_softcap": ({"logit_softcap": 30.0}, "logit_softcap=30.0"),
    "resid_mix": ({"resid_mix": False}, r"nanochat 2025-10.*smear_channels=24"),   # read as the 2025-10 layout
    "smear_channels": ({"smear_channels": 12}, "smear_channels=12"),
    "backout_layer": ({"backout_layer": 0}, "backout_layer=0"),
    "value_embeds": ({"value_embeds": (2,)}, r"value_embeds=\(2,\)"),
    "value_gate_channels": ({"value_gate_channels": 6}, "value_gate_channels=6"),
    "head_dim": ({"head_dim": 16}, "head_dim=16"),
    "mlp_ratio": ({"mlp_ratio": 2.0}, "mlp_ratio=2.0"),
    "mlp_act": ({"mlp_act": "gelu"}, "mlp_act='gelu'"),
    "order": ({"order": "ffn_first"}, "order='ffn_first'"),
    "operator": ({"operator": "DMTN"}, "operator='DMTN'"),
    "learnable_operator": ({"learnable_operator": True}, "learnable_operator=True"),
    "use_rope": ({"use_rope": False}, "use_rope=False"),
    "qk_norm": ({"qk_norm": False}, "qk_norm=False"),
    "qkv_bias": ({"qkv_bias": True}, "qkv_bias=True"),
    "out_bias": ({"out_bias": True}, "out_bias=True"),
    "mlp_bias": ({"mlp_bias": True}, "mlp_bias=True"),
    "norm": ({"norm": "layer"}, "norm='layer'"),
    "norm_scale": ({"norm_scale": True}, "norm_scale=True"),
    "norm_bias": ({"norm": "layer", "norm_bias": True}, "norm_bias=True"),
    "norm_eps": ({"norm_eps": 1e-6}, "norm_eps=1e-06"),
    "qk_norm_scale": ({"qk_norm_scale": True}, "qk_norm_scale=True"),
    "qk_gain": ({"qk_gain": 1.0}, "qk_gain=1.0"),
    "rope_base": ({"rope_base": 10_000.0}, "rope_base=10000.0"),
    "rope_sign": ({"rope_sign": 1}, "rope_sign=1"),
    "rope_style": ({"rope_style": "interleaved"}, "rope_style='interleaved'"),
    "distance_form": ({"distance_form": True, "operator": "DMAP", "qk_norm": False, "num_kv_heads": None},
                      "distance_form=True"),
    "attn_windows": ({"attn_windows": (100, 512, 512)}, r"attn_windows=\(100, 512, 512\) is not a nanochat window"),
}
CARRIED = [   # changes that export → import gives back (2026-07), two models between them
    {"num_kv_heads": 1, "rope_dtype": "bfloat16",   # rope_dtype: machine-dependent in nanochat, recorded in the meta
     "coupling": 2.0, "implementation": "einsum"},  # coupling: CMAP's only, inert under ATTN; compute-only
    {"num_kv_heads": None, "rope_dtype": None, "attn_windows": (512, 128, 512),   # window_pattern "LS"
     "dtype": "bfloat16"},                                                        # compute-only
]


def save_nanochat(model, folder):
  nanochat.save(model, f"{folder}/model_000001.safetensors")


def test_export_covers_every_field():
  export_audit.check_covered(REFUSED, CARRIED)


@pytest.mark.parametrize("field", sorted(REFUSED))
def test_export_refuses_what_nanochat_cannot_carry(field, tmp_path):
  changes, match = REFUSED[field]
  export_audit.check_refused(nanochat.config(CURRENT, "2026-07"), changes, match, save_nanochat, tmp_path / "out")


@pytest.mark.parametrize("changes", CARRIED, ids=str)
def test_export_carries_the_rest(changes, tmp_path):
  export_audit.check_carried(nanochat.config(CURRENT, "2026-07"), changes, save_nanochat,
                             lambda folder: nanochat.load(folder)[0], tmp_path / "out", IDS_CURRENT)


@pytest.mark.parametrize("changes,match", [({"rope_dtype": None}, "rope_dtype=None"),
                                           ({"attn_windows": (32, 64)}, r"attn_windows=\(32, 64\)")])
def test_2025_export_refuses_float32_tables_and_windows(changes, match, tmp_path):
  """2025-10 keeps bf16 tables on every device and has no windows."""
  export_audit.check_refused(nanochat.config(VINTAGE, "2025-10"), changes, match, save_nanochat, tmp_path / "out")


def test_short_window_wider_than_the_context_exports(tmp_path):
  """sequence_len 64: S = 128 ≥ 64, yet an S layer's window (128) is not an L layer's (64)."""
  mc = dict(CURRENT, sequence_len=64, window_pattern="SL")
  model, _ = nanochat.load(write(tmp_path / "src", random_state(mc, current=True, seed=10), mc))
  assert model.cfg.attn_windows == (128, 64, 64)
  assert nanochat.save(model, str(tmp_path / "out" / "model_000001.safetensors"))["model_config"] == mc
  again, _ = nanochat.load(str(tmp_path / "out"))
  assert again.cfg.attn_windows == model.cfg.attn_windows


# ----------------------------------------------------------------------------- files and configs a user may get wrong

@pytest.mark.parametrize("cut", [0, 7, 200], ids=["empty", "header cut", "data cut"])
def test_damaged_safetensors_is_one_line_naming_the_file(tmp_path, cut):
  path = write(tmp_path, random_state(VINTAGE, current=False), VINTAGE)
  with open(path, "r+b") as f:
    f.truncate(cut)
  with pytest.raises(ValueError, match=rf"{path} is not a readable checkpoint") as e:
    nanochat.load(path)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize("field", ["n_kv_head", "n_head", "sequence_len", "n_layer", "n_embd", "vocab_size"])
@pytest.mark.parametrize("value", [0, -4, "4", 2.5, True])
def test_impossible_model_config_is_one_line(tmp_path, field, value):
  mc = dict(VINTAGE, **{field: value})
  with pytest.raises(ValueError, match=rf"nanochat model_config needs positive integers; got {field}={value!r}") as e:
    nanochat.load(write(tmp_path, random_state(VINTAGE, current=False), mc))
  assert "\n" not in str(e.value)


def test_checkpoint_folder_reads_its_latest_step_and_meta(tmp_path):
  """nanochat's checkpoint folder (model_<step>.pt + meta_<step>.json): the latest step, safetensors first."""
  old, new = random_state(VINTAGE, current=False, seed=20), random_state(VINTAGE, current=False, seed=21)
  write(tmp_path, old, VINTAGE, step=100)
  write(tmp_path, new, VINTAGE, step=650)
  (tmp_path / "model_000650.pt").write_bytes(b"not read: the safetensors of the same step comes first")
  model, info = nanochat.load(str(tmp_path))
  assert info["file"] == str(tmp_path / "model_000650.safetensors") and info["meta"]["step"] == 650
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS_VINTAGE)),
                             reference_logits(new, VINTAGE, IDS_VINTAGE, False), atol=1e-4, rtol=0)
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="empty holds no model_NNNNNN.safetensors"):
    nanochat.load(str(tmp_path / "empty"))


def test_exported_files_take_the_umask_mode(vintage, tmp_path):
  """safetensors creates 0600; exports get what open() gives: 0o666 less the umask."""
  _, model, _ = vintage
  for mask in (0o022, 0o077):
    old = os.umask(mask)
    try:
      out = tmp_path / f"u{mask:o}" / "model_000001.safetensors"
      nanochat.save(model, str(out))
    finally:
      os.umask(old)
    for f in (out, out.parent / "meta_000001.json"):
      assert stat.S_IMODE(os.stat(f).st_mode) == 0o666 & ~mask, f
    assert sorted(p.name for p in out.parent.iterdir()) == ["meta_000001.json", "model_000001.safetensors"]
