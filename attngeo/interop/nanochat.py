"""nanochat checkpoints (karpathy/nanochat `nanochat/gpt.py`) ⇄ the attngeo GPT.

Two architectures, each pinned to the commit whose `gpt.py` it matches (`ARCHS`):

* `"2025-10"` — commit ccfe7915ac152c5f52be344fe13b73bf9e75c1c5 (2025-10-16, the d32 release; the
  same model code from the first commit 3a5e0bc until vocab padding in f1bf69d, 2025-12-09). The
  checkpoint the seed's Table 3 starts from is this architecture (Hugging Face
  `karpathy/nanochat-d32`, `model_000650.pt` + `meta_000650.json`). With `rms(x) = x/√(mean x² + ε)`
  (no weight; torch's ε is the float eps of the compute dtype) and t the tokens:

      x = rms(wte[t]);   per layer:  x += c_proj(attn(rms(x))),  x += mlp(rms(x))
      logits = 15·tanh(lm_head(rms(x)) / 15)
      attn: q, k, v = c_q(x), c_k(x), c_v(x) (n_kv_head ≤ n_head key/value heads, GQA);
            q, k ← rms(rot(q)), rms(rot(k)); causal softmax(q·kᵀ/√k)·v
      rot: rotate-half pairs (i, i + k/2), angle −p·θ_i, θ_i = 10000^(−2i/k), cos/sin tables in bfloat16
      mlp: c_proj(relu(c_fc(x))²);  no biases, untied lm_head, MLP width 4·n_embd.

* `"2026-07"` — commit 92d63d4e8bb4df75c3b71618f31ddde2378b2bcd (2026-07-03). On top of the above:
  vocabulary rows padded to a multiple of 64 (logits sliced back); rotary base 100000; q, k × 1.2
  after QK-norm; smear `x_j += λ_s·σ(x_j[:24]·w_s)·x_{j−1}` after the embedding norm; per-layer
  `x ← λ_r[i]·x + λ_0[i]·x0` before each block; value embeddings on layers i with
  `i ≡ n_layer − 1 (mod 2)`, gated into v by `3σ(ve_gate(x[:12]))`; per-layer sliding windows from
  `window_pattern` (tiled, last layer always L; L = sequence_len, S = ⌈sequence_len/4/128⌉·128);
  back-out `x ← x − λ_b·x^(n_layer//2)` before the final norm. The rotary direction (−θ) did not
  change between the two commits; only its base did, and the tables' dtype: 2026-07 keeps them in
  its compute dtype (`nanochat/common.py`: `NANOCHAT_DTYPE` if set, else bfloat16 on a CUDA GPU of
  compute capability ≥ 8.0, float32 elsewhere), so `load` takes the dtype nanochat would use on
  this machine (`rope_tables`) and says which.

The seed author's fork (jcandane/nanochat, `modal/initialize.py`) loads the 2025-10 d32 weights
into the 2026 model code with neutral fills (value embeddings 0, λ_r = 1, λ_0 = 0, smear and
back-out 0, window "L"), so its forward also has base 100000 and the 1.2 gain: `load(...,
arch="2026-07", fill_missing=True)` builds exactly that model.

`save` is lossless or refuses: nanochat's loader builds its model from `model_config` alone
(`GPTConfig(**model_config)`, no other key read), so a model whose settings differ from what
`config` gives for its `model_config` is refused in one line naming them (`layout.unexpressed`).
The one machine-dependent setting, 2026-07's table dtype, is recorded in the meta as
`attngeo_rope_dtype` (a key nanochat ignores) and read back by `load`. A folder is read as
nanochat's checkpoint folder: its latest `model_<step>` (safetensors before `.pt`) and that step's meta.

Key layout (torch `nn.Linear` weights are `[out, in]`; `_orig_mod.` prefixes from torch.compile are
stripped): `transformer.wte.weight [V', d]`, `lm_head.weight [V', d]`, per layer i
`transformer.h.i.attn.c_q.weight [h·k, d]`, `c_k`/`c_v [g·k, d]`, `c_proj [d, h·k]`,
`mlp.c_fc.weight [4d, d]`, `mlp.c_proj.weight [d, 4d]`; 2026 adds `resid_lambdas [L]`,
`x0_lambdas [L]`, `smear_gate.weight [1, 24]`, `smear_lambda [1]`, `backout_lambda [1]`,
`value_embeds.i.weight [V', g·k]`, `transformer.h.i.attn.ve_gate.weight [g, 12]`.
"""
from __future__ import annotations

import glob
import json
import os
import re

import numpy as np

from attngeo.interop import layout, safetensors_io
from attngeo.nn import presets

ARCHS = {
    "2025-10": {"commit": "ccfe7915ac152c5f52be344fe13b73bf9e75c1c5", "date": "2025-10-16"},
    "2026-07": {"commit": "92d63d4e8bb4df75c3b71618f31ddde2378b2bcd", "date": "2026-07-03"},
}
TORCH_FLOAT32_EPS = float(np.finfo(np.float32).eps)   # F.rms_norm's ε for float32 activations
SOFTCAP = 15.0
PAD_VOCAB_TO = 64
SMEAR_CHANNELS, VE_GATE_CHANNELS = 24, 12
EXTRAS_2026 = ("resid_lambdas", "x0_lambdas", "smear_gate.weight", "smear_lambda", "backout_lambda")
COMPUTE_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": None}   # nanochat dtype -> rope_dtype
RECORDED_ROPE = "attngeo_rope_dtype"   # meta key: the table dtype an attngeo export was computed with
MODEL_FILE = re.compile(r"model_(\d+)\.(safetensors|pt|pth|bin)$")


# ----------------------------------------------------------------------------- config

def short_window(seq_len: int) -> int:
  """nanochat's S window: a quarter of the context rounded up to FA3's 128-token tile (≥ seq_len below 512)."""
  return -(-seq_len // 4 // 128) * 128


def windows(pattern: str, seq_len: int, depth: int) -> tuple[int, ...]:
  """nanochat's per-layer left windows: `pattern` (S/L) tiled over layers, the last layer L."""
  if not isinstance(pattern, str) or not pattern or set(pattern.upper()) - set("SL"):
    raise ValueError(f"window_pattern must be a non-empty string of S and L; got {pattern!r}")
  pattern = pattern.upper()
  short = short_window(seq_len)
  out = [seq_len if pattern[i % len(pattern)] == "L" else short for i in range(depth)]
  out[-1] = seq_len
  return tuple(out)


def rope_tables(arch: str) -> tuple[str | None, str]:
  """(rope_dtype, why): the dtype nanochat `arch` keeps its rotary cos/sin tables in on this machine.

  2025-10 rounds them to bfloat16 on every device. 2026-07 keeps them in its compute dtype
  (`_detect_compute_dtype` in `nanochat/common.py`): `NANOCHAT_DTYPE` when set, else bfloat16 on a
  CUDA GPU of compute capability ≥ 8.0, else float32 (CPU, MPS, older GPUs — and TPUs, where
  nanochat does not run on the accelerator).
  """
  if arch == "2025-10":
    return "bfloat16", "bfloat16 rotary tables (nanochat 2025-10 on every device)"
  env = os.environ.get("NANOCHAT_DTYPE")
  if env is not None:
    if env not in COMPUTE_DTYPES:
      raise ValueError(f"NANOCHAT_DTYPE must be one of {sorted(COMPUTE_DTYPES)}; got {env!r}")
    return COMPUTE_DTYPES[env], f"{env} rotary tables (nanochat 2026-07 under NANOCHAT_DTYPE={env})"
  import jax
  device = jax.devices()[0]
  capability = getattr(device, "compute_capability", None)
  if device.platform == "gpu" and capability is not None and float(capability) >= 8.0:
    return "bfloat16", f"bfloat16 rotary tables (nanochat 2026-07 on this CUDA GPU, SM {capability})"
  return None, (f"float32 rotary tables (nanochat 2026-07 without an Ampere+ CUDA GPU; this machine: "
                f"{device.platform}; --set rope_dtype='\"bfloat16\"' gives its GPU tables)")


def config(model_config: dict, arch: str = "2025-10", **overrides):
  """The `GPTConfig` of a nanochat `meta_*.json`'s `model_config` under architecture `arch`.

  Args:
    model_config: {sequence_len, vocab_size, n_layer, n_head, n_kv_head, n_embd[, window_pattern]}.
    arch: a key of `ARCHS`.
    **overrides: GPTConfig/BlockConfig fields to change (e.g. `norm_eps`, `rope_base`, `operator`);
      `rope_dtype` defaults to `rope_tables(arch)`.
  Returns:
    GPTConfig.
  """
  from attngeo.nn.gpt import GPTConfig
  if arch not in ARCHS:
    raise ValueError(f"nanochat arch must be one of {sorted(ARCHS)}; got {arch!r}")
  need = ("sequence_len", "vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd")
  absent = [k for k in need if k not in model_config]
  if absent:
    raise ValueError(f"nanochat model_config lacks {absent}; it has {sorted(model_config)}")
  d, h, g, depth, vocab, seq = layout.positive_ints(model_config, ("n_embd", "n_head", "n_kv_head", "n_layer",
                                                                   "vocab_size", "sequence_len"), "nanochat model_config")
  if d % h or h % g:
    raise ValueError(f"nanochat needs n_head | n_embd and n_kv_head | n_head; got n_embd={d}, n_head={h}, "
                     f"n_kv_head={g}")
  fields = dict(depth=depth, vocab_size=vocab, seq_len=seq, width=d, num_heads=h, head_dim=d // h,
                num_kv_heads=None if g == h else g, **family_fields())
  if arch == "2026-07":
    padded = -(-vocab // PAD_VOCAB_TO) * PAD_VOCAB_TO
    wins = windows(model_config.get("window_pattern", "L"), seq, depth)   # nanochat patches a missing pattern to L
    fields.update(rope_base=100_000.0, qk_gain=1.2, padded_vocab=None if padded == vocab else padded,
                  attn_windows=() if all(w == seq for w in wins) else wins, resid_mix=True,
                  smear_channels=SMEAR_CHANNELS, backout_layer=depth // 2,
                  value_embeds=tuple(i for i in range(depth) if i % 2 == (depth - 1) % 2),
                  value_gate_channels=VE_GATE_CHANNELS)
  fields.update(overrides)
  if "rope_dtype" not in overrides:
    fields["rope_dtype"] = rope_tables(arch)[0]
  return GPTConfig.create(**fields)


def family_fields() -> dict:
  """The GPTConfig/BlockConfig fields every nanochat GPT has (the 2025-10 layout; 2026-07 adds its extras in
  `convert`): the block preset, nanochat's rotary sign, base and bfloat16 tables (its GPU default; `convert`
  sets the tables of this machine, `rope_tables`), ε, embedding norm and logit soft-cap. What
  `attngeo lm train --compat nanochat` builds on, so that `attngeo export --format nanochat` takes the run."""
  return dict(mlp_ratio=4.0, **presets.fields("nanochat"), rope_sign=-1, rope_base=10_000.0, rope_dtype="bfloat16",
              norm_eps=TORCH_FLOAT32_EPS, embed_norm=True, logit_softcap=SOFTCAP)


def window_pattern(cfg, prefer: str | None = None) -> str:
  """The S/L `window_pattern` giving `cfg`'s windows under nanochat's rule: `prefer` (the source's
  pattern) when it does, else the shortest that does. Windows are told apart by value (L = seq_len,
  S = `short_window`), so an S window wider than the context (S = 128 over sequence_len 64) stays S."""
  wins = tuple(cfg.attn_windows) or (cfg.seq_len,) * cfg.depth
  fits = lambda p: windows(p, cfg.seq_len, cfg.depth) == wins
  if isinstance(prefer, str) and prefer and not set(prefer.upper()) - set("SL") and fits(prefer):
    return prefer
  letters = "".join("L" if w == cfg.seq_len else "S" if w == short_window(cfg.seq_len) else "?" for w in wins)
  pattern = next((letters[:p] for p in range(1, len(letters) + 1) if "?" not in letters[:p] and fits(letters[:p])),
                 None)
  if pattern is None:
    raise ValueError(f"attn_windows={tuple(cfg.attn_windows)} is not a nanochat window_pattern over "
                     f"sequence_len={cfg.seq_len} (L = {cfg.seq_len}, S = {short_window(cfg.seq_len)}, last layer L)")
  return pattern


def model_config(cfg, pattern: str | None = None) -> dict:
  """nanochat's `model_config` dict for a GPTConfig (inverse of `config` on the shape fields; the
  2026 layout adds the `window_pattern`, `pattern` kept when it gives the model's windows)."""
  out = {"sequence_len": cfg.seq_len, "vocab_size": cfg.vocab_size, "n_layer": cfg.depth,
         "n_head": cfg.block.num_heads, "n_kv_head": cfg.block.num_kv_heads or cfg.block.num_heads,
         "n_embd": cfg.width}
  if cfg.resid_mix:
    out["window_pattern"] = window_pattern(cfg, pattern)
  return out


# ----------------------------------------------------------------------------- layout

def expected(cfg) -> dict[str, tuple]:
  """{nanochat key: shape} for a GPTConfig of the nanochat family."""
  b = cfg.block
  d, h, k, rows = cfg.width, b.num_heads, b.dh, cfg.table_rows
  g, hidden = b.num_kv_heads or h, int(d * b.mlp_ratio)
  keys = {"transformer.wte.weight": (rows, d), "lm_head.weight": (rows, d)}
  for i in range(cfg.depth):
    p = f"transformer.h.{i}."
    keys.update({p + "attn.c_q.weight": (h * k, d), p + "attn.c_k.weight": (g * k, d),
                 p + "attn.c_v.weight": (g * k, d), p + "attn.c_proj.weight": (d, h * k),
                 p + "mlp.c_fc.weight": (hidden, d), p + "mlp.c_proj.weight": (d, hidden)})
    if i in cfg.value_embeds:
      keys[p + "attn.ve_gate.weight"] = (g, cfg.value_gate_channels)
  if cfg.resid_mix:
    keys.update({"resid_lambdas": (cfg.depth,), "x0_lambdas": (cfg.depth,)})
  if cfg.smear_channels:
    keys.update({"smear_gate.weight": (1, cfg.smear_channels), "smear_lambda": (1,)})
  if cfg.backout_layer is not None:
    keys["backout_lambda"] = (1,)
  for i in cfg.value_embeds:
    keys[f"value_embeds.{i}.weight"] = (rows, g * k)
  return keys


def _check_family(cfg):
  """Refuse a GPTConfig that nanochat's forward cannot express (export, or overrides gone astray)."""
  b = cfg.block
  bad = presets.mismatches(b, "nanochat")
  if b.mlp_ratio != 4.0:
    bad.append(f"mlp_ratio={b.mlp_ratio} (nanochat: 4.0)")
  if cfg.tie_embeddings or cfg.learned_positions or not cfg.embed_norm:
    bad.append("tie_embeddings/learned_positions must be off and embed_norm on")
  if b.dh * b.num_heads != cfg.width:
    bad.append(f"head_dim·num_heads={b.dh * b.num_heads} must equal width={cfg.width}")
  if bad:
    raise ValueError("not a nanochat-family GPT: " + "; ".join(bad))


def to_attngeo(tensors: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
  """nanochat state dict -> {attngeo parameter path: array} (transposes and head splits only)."""
  b = cfg.block
  d, h, k, g = cfg.width, b.num_heads, b.dh, b.num_kv_heads or b.num_heads
  t = lambda name: np.asarray(tensors[name])
  out = {"embed": t("transformer.wte.weight"), "unembed": t("lm_head.weight").T}
  for i in range(cfg.depth):
    p, q = f"transformer.h.{i}.", f"blocks.{i}."
    out[q + "attn.wq"] = t(p + "attn.c_q.weight").T.reshape(d, h, k)
    out[q + "attn.wk"] = t(p + "attn.c_k.weight").T.reshape(d, g, k)
    out[q + "attn.wv"] = t(p + "attn.c_v.weight").T.reshape(d, g, k)
    out[q + "attn.wo"] = t(p + "attn.c_proj.weight").T.reshape(h, k, d)
    out[q + "mlp.w1"] = t(p + "mlp.c_fc.weight").T
    out[q + "mlp.w2"] = t(p + "mlp.c_proj.weight").T
    if i in cfg.value_embeds:
      out[q + "attn.ve_gate"] = t(p + "attn.ve_gate.weight").T
  if cfg.resid_mix:
    out["resid_lambdas"], out["x0_lambdas"] = t("resid_lambdas"), t("x0_lambdas")
  if cfg.smear_channels:
    out["smear_gate"], out["smear_lambda"] = t("smear_gate.weight").reshape(-1), t("smear_lambda")
  if cfg.backout_layer is not None:
    out["backout_lambda"] = t("backout_lambda")
  if cfg.value_embeds:
    out["value_embed"] = np.stack([t(f"value_embeds.{i}.weight") for i in cfg.value_embeds])
  return out


def from_attngeo(params: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
  """{attngeo parameter path: array} -> nanochat state dict (inverse of `to_attngeo`)."""
  b = cfg.block
  d, h, k, g = cfg.width, b.num_heads, b.dh, b.num_kv_heads or b.num_heads
  out = {"transformer.wte.weight": params["embed"], "lm_head.weight": params["unembed"].T}
  for i in range(cfg.depth):
    p, q = f"transformer.h.{i}.", f"blocks.{i}."
    out[p + "attn.c_q.weight"] = params[q + "attn.wq"].reshape(d, h * k).T
    out[p + "attn.c_k.weight"] = params[q + "attn.wk"].reshape(d, g * k).T
    out[p + "attn.c_v.weight"] = params[q + "attn.wv"].reshape(d, g * k).T
    out[p + "attn.c_proj.weight"] = params[q + "attn.wo"].reshape(h * k, d).T
    out[p + "mlp.c_fc.weight"] = params[q + "mlp.w1"].T
    out[p + "mlp.c_proj.weight"] = params[q + "mlp.w2"].T
    if i in cfg.value_embeds:
      out[p + "attn.ve_gate.weight"] = params[q + "attn.ve_gate"].T
  if cfg.resid_mix:
    out["resid_lambdas"], out["x0_lambdas"] = params["resid_lambdas"], params["x0_lambdas"]
  if cfg.smear_channels:
    out["smear_gate.weight"], out["smear_lambda"] = params["smear_gate"].reshape(1, -1), params["smear_lambda"]
  if cfg.backout_layer is not None:
    out["backout_lambda"] = params["backout_lambda"]
  for j, i in enumerate(cfg.value_embeds):
    out[f"value_embeds.{i}.weight"] = params["value_embed"][j]
  return {name: np.ascontiguousarray(a, np.float32) for name, a in out.items()}


# ----------------------------------------------------------------------------- files

def weights_file(path: str) -> str:
  """`path` itself, or for a folder (nanochat's checkpoint folder) its `model_<step>` file of the
  latest step, `.safetensors` before `.pt`/`.pth`/`.bin`."""
  if not os.path.isdir(path):
    return path
  found = [(int(m.group(1)), m.group(2) != "safetensors", name) for name in os.listdir(path)
           if (m := MODEL_FILE.match(name))]
  if not found:
    raise FileNotFoundError(f"{path} holds no model_NNNNNN.safetensors (or .pt) checkpoint")
  step = max(found)[0]
  return os.path.join(path, min(f for f in found if f[0] == step)[2])


def find_meta(path: str) -> dict | None:
  """The `meta_*.json` beside `model_NNNNNN.*` (same step), or `<name>.meta.json` beside `<name>.*` (what
  `save` writes for other names), or the folder's only `meta_*.json`, else the safetensors metadata
  `nanochat_meta`."""
  folder, name = os.path.split(path)
  m = re.match(r"model_(\d+)\.", name)
  siblings = ([f"meta_{m.group(1)}.json"] if m else []) + [os.path.splitext(name)[0] + ".meta.json"]
  for sibling in siblings:
    if os.path.isfile(os.path.join(folder, sibling)):
      return layout.read_json(os.path.join(folder, sibling))
  metas = sorted(glob.glob(os.path.join(folder or ".", "meta_*.json")))
  if len(metas) == 1 and not m:
    return layout.read_json(metas[0])
  if path.endswith(".safetensors"):
    text = safetensors_io.metadata(path).get("nanochat_meta")
    return json.loads(text) if text else None
  return None


def detect(keys) -> str:
  """The architecture a nanochat state dict's keys belong to."""
  keys = set(keys)
  if {"smear_lambda", "backout_lambda"} <= keys:
    return "2026-07"
  if keys & {"resid_lambdas", "x0_lambdas"} or any(k.startswith("value_embeds.") for k in keys):
    raise ValueError("this nanochat checkpoint is from between the two pinned commits (it has resid/x0 lambdas or "
                     f"value embeddings but no smear/back-out); pass arch= one of {sorted(ARCHS)} with overrides "
                     "(e.g. smear_channels=0, backout_layer=None, qk_gain=1.0, rope_base=10000)")
  return "2025-10"


def _neutral(key: str, shape: tuple) -> np.ndarray:
  """The value of a 2026 extra that makes it a no-op (the seed fork's fills)."""
  return np.ones(shape, np.float32) if key == "resid_lambdas" else np.zeros(shape, np.float32)


def _depth_vocab_hint(tensors, cfg) -> str:
  layers = {int(m.group(1)) for k in tensors if (m := re.match(r"transformer\.h\.(\d+)\.", k))}
  wte = tensors.get("transformer.wte.weight")
  hints = []
  if layers and max(layers) + 1 != cfg.depth:
    hints.append(f"the checkpoint has {max(layers) + 1} layers, the config n_layer={cfg.depth}")
  if wte is not None and wte.shape[0] != cfg.table_rows:
    hints.append(f"the checkpoint has {wte.shape[0]} vocabulary rows, the config {cfg.table_rows}")
  return ("; ".join(hints) + ". ") if hints else ""


def convert(tensors: dict[str, np.ndarray], model_cfg: dict, *, arch: str = "auto", fill_missing: bool = False,
            source: str = "nanochat checkpoint", **overrides):
  """A nanochat state dict + its `model_config` -> (GPTConfig, {attngeo path: array}).

  Args:
    tensors: the state dict (numpy arrays; `_orig_mod.` prefixes allowed).
    model_cfg: the `model_config` of its meta json.
    arch: "auto" (from the keys), or a key of `ARCHS`.
    fill_missing: with arch "2026-07", give the 2026 extras a checkpoint lacks their neutral values.
    source: the file named in errors.
    **overrides: GPTConfig/BlockConfig fields (see `config`).
  """
  tensors = {k.removeprefix("_orig_mod."): v for k, v in tensors.items()}
  arch = detect(tensors) if arch == "auto" else arch
  cfg = config(model_cfg, arch, **overrides)
  _check_family(cfg)
  want = expected(cfg)
  if fill_missing:
    tensors = dict(tensors)
    for key, shape in want.items():
      extra = key in EXTRAS_2026 or key.startswith("value_embeds.") or key.endswith(".ve_gate.weight")
      if key not in tensors and extra:
        tensors[key] = _neutral(key, shape)
    for key in ("transformer.wte.weight", "lm_head.weight"):   # an unpadded vintage table: zero pad rows
      a = tensors.get(key)
      if a is not None and a.shape[0] == cfg.vocab_size < want[key][0]:
        tensors[key] = np.concatenate([a, np.zeros((want[key][0] - a.shape[0], a.shape[1]), a.dtype)])
  try:
    layout.check(layout.shapes(tensors), want, source)
  except ValueError as e:
    raise ValueError(_depth_vocab_hint(tensors, cfg) + f"{e} (nanochat {arch})") from None
  return cfg, to_attngeo(tensors, cfg)


def load(path: str, meta: str | dict | None = None, *, arch: str = "auto", fill_missing: bool = False, **overrides):
  """An `nn.GPT` holding a nanochat checkpoint's weights.

  Args:
    path: `model_NNNNNN.pt` (needs torch), a `.safetensors` of the same state dict, or nanochat's
      checkpoint folder (its latest step: `weights_file`).
    meta: the `meta_NNNNNN.json` path or dict (default: found beside `path`, or in the safetensors
      metadata key `nanochat_meta`).
    arch, fill_missing, **overrides: see `convert`. Without a `rope_dtype` override, 2026-07 takes the
      dtype the meta records (`attngeo_rope_dtype`, from `save`), else `rope_tables`.
  Returns:
    (model, info) with info = {"arch", "commit", "meta", "file", "rope_tables"} (`rope_tables`: the
    table dtype used and why).
  """
  path = weights_file(path)
  if isinstance(meta, str):
    meta = layout.read_json(meta)
  meta = meta if meta is not None else find_meta(path)
  if not isinstance(meta, dict) or not isinstance(meta.get("model_config"), dict):
    raise ValueError(f"{path}: no nanochat meta with a model_config found; pass the meta_NNNNNN.json that came with it")
  tensors = safetensors_io.read(path)
  arch = detect({k.removeprefix("_orig_mod.") for k in tensors}) if arch == "auto" else arch
  if arch not in ARCHS:
    raise ValueError(f"nanochat arch must be one of {sorted(ARCHS)}; got {arch!r}")
  if "rope_dtype" in overrides:
    tables = f"{overrides['rope_dtype'] or 'float32'} rotary tables (set by the caller)"
  elif arch == "2026-07" and meta.get(RECORDED_ROPE) in COMPUTE_DTYPES:
    overrides["rope_dtype"] = COMPUTE_DTYPES[meta[RECORDED_ROPE]]
    tables = f"{meta[RECORDED_ROPE]} rotary tables (recorded by the attngeo export that wrote {path})"
  else:
    overrides["rope_dtype"], tables = rope_tables(arch)
  cfg, arrays = convert(tensors, meta["model_config"], arch=arch, fill_missing=fill_missing, source=path, **overrides)
  del tensors
  model = layout.build(cfg, arrays, source=path)
  return model, {"arch": arch, "commit": ARCHS[arch]["commit"], "meta": meta, "file": path, "rope_tables": tables}


def export_config(cfg, source_pattern: str | None = None) -> tuple[str, dict]:
  """(arch, model_config) that write `cfg` losslessly: the 2026 layout for a model with `resid_mix`,
  else 2025-10; one ValueError line naming every setting that layout's `config` would not give back."""
  arch = "2026-07" if cfg.resid_mix else "2025-10"
  mc = model_config(cfg, source_pattern)
  tables = cfg.block.rope_dtype if arch == "2026-07" and cfg.block.rope_dtype in COMPUTE_DTYPES.values() else \
      rope_tables("2025-10")[0]   # 2026-07: any dtype nanochat computes in (machine-dependent, recorded in the meta)
  layout.unexpressed(cfg, config(mc, arch, rope_dtype=tables), f"nanochat {arch}")
  return arch, mc


def save(model, path: str, *, meta: dict | None = None) -> dict:
  """Write `model` (a nanochat-family GPT) as a nanochat state dict in safetensors, and its meta json.

  Args:
    model: an `nn.GPT` whose config nanochat's forward expresses (e.g. one imported by `load`);
      anything else is refused before a file is written (`export_config`).
    path: the `.safetensors` file; `meta_<step>.json` is written beside it when the name is
      `model_<step>.safetensors`, else `<name>.meta.json`.
    meta: extra meta fields; `model_config` is written from the model's config (a given one's
      `window_pattern` is kept when it gives the same windows); 2026-07 adds `attngeo_rope_dtype`.
  Returns:
    the meta dict written.
  """
  from attngeo import files
  cfg = model.cfg
  meta = dict(meta or {})
  arch, mc = export_config(cfg, (meta.get("model_config") or {}).get("window_pattern"))
  meta.pop(RECORDED_ROPE, None)
  meta["model_config"] = mc
  if arch == "2026-07":
    meta[RECORDED_ROPE] = next(k for k, v in COMPUTE_DTYPES.items() if v == cfg.block.rope_dtype)
  tensors = from_attngeo(layout.params(model), cfg)
  layout.check(layout.shapes(tensors), expected(cfg), "exported state")
  m = re.match(r"model_(\d+)\.safetensors$", os.path.basename(path))
  meta_path = os.path.join(os.path.dirname(path), f"meta_{m.group(1)}.json") if m else \
      os.path.splitext(path)[0] + ".meta.json"
  header = {"format": "nanochat", "nanochat_meta": json.dumps(meta)}
  safetensors_io.refuse_overwrite(path, tensors, header, {meta_path: json.dumps(meta, indent=2)})
  safetensors_io.write(path, tensors, header)
  files.atomic_write(meta_path, json.dumps(meta, indent=2))
  return meta

