"""GPT-2 in the Hugging Face layout (`model.safetensors` + `config.json`) ⇄ the attngeo GPT.

Matched to `transformers`' `models/gpt2/modeling_gpt2.py` (GPT2LMHeadModel; the same forward in
every release since the safetensors files were published). With LN(x) = γ ⊙ (x − μ)/√(σ² + ε) + b
(ε = `layer_norm_epsilon`, 1e-5) and `Conv1D(x) = x·W + b` with W stored `[in, out]`:

    x = wte[t] + wpe[0:n]
    per layer:  x += attn(LN₁(x)),  x += mlp(LN₂(x))
    attn: [q | k | v] = c_attn(x) (W [d, 3d], split in thirds, heads of d/h); causal
          softmax(q·kᵀ/√k)·v, heads concatenated, then c_proj (W [d, d] + b)
    mlp:  c_proj(gelu_new(c_fc(x))), gelu_new the tanh approximation, hidden n_inner (default 4d)
    logits = LN_f(x)·wteᵀ      (lm_head tied to wte)

Keys: `wte.weight [V, d]`, `wpe.weight [P, d]`, `h.i.ln_1.{weight,bias}`,
`h.i.attn.c_attn.{weight [d, 3d], bias [3d]}`, `h.i.attn.c_proj.{weight [d, d], bias}`,
`h.i.ln_2.*`, `h.i.mlp.c_fc.{weight [d, f], bias}`, `h.i.mlp.c_proj.{weight [f, d], bias}`,
`ln_f.{weight,bias}`. Accepted and dropped on import: a `transformer.` prefix, the causal-mask
buffers `h.i.attn.bias` / `h.i.attn.masked_bias`, and `lm_head.weight` when it equals `wte.weight`.
Export writes the unprefixed keys of the hub's file plus a `config.json`, and is lossless or
refuses: `config.json` carries the shapes, `n_inner`, `layer_norm_epsilon` and
`tie_word_embeddings`; a model with any other setting that `config` would not give back is refused
in one line naming it (`layout.unexpressed`).
"""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from attngeo.interop import layout, safetensors_io
from attngeo.nn import presets

SOURCE = "huggingface/transformers src/transformers/models/gpt2/modeling_gpt2.py (GPT2LMHeadModel)"
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)$")


def config(hf: dict, **overrides):
  """The `GPTConfig` of a Hugging Face GPT-2 `config.json` dict.

  Args:
    hf: the config (`vocab_size, n_positions, n_embd, n_layer, n_head`, optional `n_inner`,
      `activation_function`, `layer_norm_epsilon`, `tie_word_embeddings`, ...).
    **overrides: GPTConfig/BlockConfig fields to change (e.g. `operator`).
  """
  from attngeo.nn.gpt import GPTConfig
  need = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
  absent = [k for k in need if k not in hf]
  if absent:
    raise ValueError(f"GPT-2 config.json lacks {absent}")
  act = hf.get("activation_function", "gelu_new")
  unsupported = []
  if act not in GELU_TANH:
    unsupported.append(f"activation_function={act!r} (supported: {GELU_TANH})")
  if not hf.get("scale_attn_weights", True):
    unsupported.append("scale_attn_weights=false")
  if hf.get("scale_attn_by_inverse_layer_idx", False):
    unsupported.append("scale_attn_by_inverse_layer_idx=true")
  if hf.get("add_cross_attention", False):
    unsupported.append("add_cross_attention=true")
  if unsupported:
    raise ValueError("GPT-2 config options not supported: " + ", ".join(unsupported))
  depth, vocab, positions, d, h = layout.positive_ints(hf, ("n_layer", "vocab_size", "n_positions", "n_embd", "n_head"),
                                                      "GPT-2 config.json")
  if d % h:
    raise ValueError(f"GPT-2 needs n_head | n_embd; got n_embd={d}, n_head={h}")
  inner = layout.positive_ints(hf, ("n_inner",), "GPT-2 config.json")[0] if hf.get("n_inner") is not None else 4 * d
  eps = hf.get("layer_norm_epsilon", 1e-5)
  if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < math.inf:
    raise ValueError(f"GPT-2 config.json layer_norm_epsilon must be a finite number >= 0; got {eps!r}")
  fields = dict(depth=depth, vocab_size=vocab, seq_len=positions, width=d,
                num_heads=h, head_dim=d // h, **family_fields(), mlp_ratio=inner / d,
                norm_eps=float(eps), tie_embeddings=bool(hf.get("tie_word_embeddings", True)))
  fields.update(overrides)
  cfg = GPTConfig.create(**fields)
  if int(cfg.width * cfg.block.mlp_ratio) != inner:
    raise ValueError(f"n_inner={inner} is not expressible as an integer multiple of n_embd={d} in float32")
  return cfg


# GPT-2's <|endoftext|>, its bos and eos token: the last of its 50 257 tokens.
GPT2_VOCAB, GPT2_ENDOFTEXT = 50257, 50256


def hf_config(cfg) -> dict:
  """A Hugging Face `config.json` dict for a GPT-2-family GPTConfig. `bos_token_id` and `eos_token_id` are
  GPT-2's <|endoftext|> on GPT-2's own vocabulary and null on any other: an attngeo tokenizer's ids are not
  GPT-2's (an id of 50 256 beside a vocabulary of 265 made Hugging Face warn on loading)."""
  b = cfg.block
  return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": cfg.vocab_size,
          "n_positions": cfg.seq_len, "n_ctx": cfg.seq_len, "n_embd": cfg.width, "n_layer": cfg.depth,
          "n_head": b.num_heads, "n_inner": int(cfg.width * b.mlp_ratio), "activation_function": "gelu_new",
          "layer_norm_epsilon": b.norm_eps, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
          "reorder_and_upcast_attn": False, "tie_word_embeddings": cfg.tie_embeddings,
          **dict.fromkeys(("bos_token_id", "eos_token_id"), GPT2_ENDOFTEXT if cfg.vocab_size == GPT2_VOCAB else None)}


def family_fields() -> dict:
  """The GPTConfig/BlockConfig fields every GPT-2 has: the block preset and learned positions (ε and the MLP
  width come from its config.json). What `attngeo lm train --compat gpt2` builds on, so that
  `attngeo export --format gpt2` takes the run."""
  return dict(**presets.fields("gpt2"), learned_positions=True)


def _check_family(cfg):
  b = cfg.block
  bad = presets.mismatches(b, "gpt2", "GPT-2")
  if not cfg.learned_positions or cfg.embed_norm or cfg.padded_vocab or cfg.logit_softcap or cfg.attn_windows \
     or cfg.resid_mix or cfg.smear_channels or cfg.backout_layer is not None or cfg.value_embeds:
    bad.append("learned_positions must be on and the nanochat extras off")
  if b.dh * b.num_heads != cfg.width:
    bad.append(f"head_dim·num_heads={b.dh * b.num_heads} must equal width={cfg.width}")
  if bad:
    raise ValueError("not a GPT-2-family GPT: " + "; ".join(bad))


def expected(cfg) -> dict[str, tuple]:
  """{GPT-2 key: shape} for a GPT-2-family GPTConfig."""
  d, f = cfg.width, int(cfg.width * cfg.block.mlp_ratio)
  keys = {"wte.weight": (cfg.vocab_size, d), "wpe.weight": (cfg.seq_len, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
  if not cfg.tie_embeddings:
    keys["lm_head.weight"] = (cfg.vocab_size, d)
  for i in range(cfg.depth):
    p = f"h.{i}."
    keys.update({p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
                 p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
                 p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,),
                 p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,),
                 p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,)})
  return keys


def to_attngeo(tensors: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
  """GPT-2 state dict (canonical keys) -> {attngeo parameter path: array}."""
  d, h, k = cfg.width, cfg.block.num_heads, cfg.block.dh
  t = lambda name: np.asarray(tensors[name])
  out = {"embed": t("wte.weight"), "wpe": t("wpe.weight"), "norm.scale": t("ln_f.weight"), "norm.bias": t("ln_f.bias")}
  if not cfg.tie_embeddings:
    out["unembed"] = t("lm_head.weight").T
  for i in range(cfg.depth):
    p, q = f"h.{i}.", f"blocks.{i}."
    w, bias = t(p + "attn.c_attn.weight"), t(p + "attn.c_attn.bias")
    for j, name in enumerate("qkv"):
      out[q + f"attn.w{name}"] = w[:, j * d:(j + 1) * d].reshape(d, h, k)
      out[q + f"attn.b{name}"] = bias[j * d:(j + 1) * d].reshape(h, k)
    out[q + "attn.wo"] = t(p + "attn.c_proj.weight").reshape(h, k, d)
    out[q + "attn.bo"] = t(p + "attn.c_proj.bias")
    for ln, norm in (("ln_1", "norm_attn"), ("ln_2", "norm_mlp")):
      out[q + f"{norm}.scale"], out[q + f"{norm}.bias"] = t(p + f"{ln}.weight"), t(p + f"{ln}.bias")
    out[q + "mlp.w1"], out[q + "mlp.b1"] = t(p + "mlp.c_fc.weight"), t(p + "mlp.c_fc.bias")
    out[q + "mlp.w2"], out[q + "mlp.b2"] = t(p + "mlp.c_proj.weight"), t(p + "mlp.c_proj.bias")
  return out


def from_attngeo(params: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
  """{attngeo parameter path: array} -> GPT-2 state dict (inverse of `to_attngeo`)."""
  d = cfg.width
  out = {"wte.weight": params["embed"], "wpe.weight": params["wpe"], "ln_f.weight": params["norm.scale"],
         "ln_f.bias": params["norm.bias"]}
  if not cfg.tie_embeddings:
    out["lm_head.weight"] = params["unembed"].T
  for i in range(cfg.depth):
    p, q = f"h.{i}.", f"blocks.{i}."
    out[p + "attn.c_attn.weight"] = np.concatenate([params[q + f"attn.w{n}"].reshape(d, d) for n in "qkv"], 1)
    out[p + "attn.c_attn.bias"] = np.concatenate([params[q + f"attn.b{n}"].reshape(d) for n in "qkv"])
    out[p + "attn.c_proj.weight"] = params[q + "attn.wo"].reshape(d, d)
    out[p + "attn.c_proj.bias"] = params[q + "attn.bo"]
    for ln, norm in (("ln_1", "norm_attn"), ("ln_2", "norm_mlp")):
      out[p + f"{ln}.weight"], out[p + f"{ln}.bias"] = params[q + f"{norm}.scale"], params[q + f"{norm}.bias"]
    out[p + "mlp.c_fc.weight"], out[p + "mlp.c_fc.bias"] = params[q + "mlp.w1"], params[q + "mlp.b1"]
    out[p + "mlp.c_proj.weight"], out[p + "mlp.c_proj.bias"] = params[q + "mlp.w2"], params[q + "mlp.b2"]
  return {name: np.ascontiguousarray(a, np.float32) for name, a in out.items()}


def canonical(tensors: dict[str, np.ndarray], cfg, source: str) -> dict[str, np.ndarray]:
  """Drop a `transformer.` prefix, the causal-mask buffers and a tied `lm_head.weight`."""
  if tensors and all(k.startswith("transformer.") or k == "lm_head.weight" for k in tensors):
    tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
  tensors = {k: v for k, v in tensors.items() if not BUFFERS.match(k)}
  if cfg.tie_embeddings and "lm_head.weight" in tensors:
    head, wte = tensors.pop("lm_head.weight"), tensors.get("wte.weight")
    if wte is not None and (head.shape != wte.shape or not np.array_equal(head, wte)):
      raise ValueError(f"{source}: lm_head.weight differs from wte.weight but config.json ties them "
                       "(tie_word_embeddings is true)")
  return tensors


def convert(tensors: dict[str, np.ndarray], hf: dict, source: str = "GPT-2 checkpoint", **overrides):
  """A GPT-2 state dict + its config.json dict -> (GPTConfig, {attngeo path: array})."""
  cfg = config(hf, **overrides)
  _check_family(cfg)
  tensors = canonical(tensors, cfg, source)
  want = expected(cfg)
  hints = []
  layers = {int(m.group(1)) for key in tensors if (m := re.match(r"h\.(\d+)\.", key))}
  if layers and max(layers) + 1 != cfg.depth:
    hints.append(f"the checkpoint has {max(layers) + 1} layers, config.json n_layer={cfg.depth}")
  if "wte.weight" in tensors and tensors["wte.weight"].shape[0] != cfg.vocab_size:
    hints.append(f"the checkpoint has {tensors['wte.weight'].shape[0]} vocabulary rows, config.json {cfg.vocab_size}")
  try:
    layout.check(layout.shapes(tensors), want, source)
  except ValueError as e:
    raise ValueError(("; ".join(hints) + ". " if hints else "") + str(e) + " (GPT-2)") from None
  return cfg, to_attngeo(tensors, cfg)


def load(path: str, hf_config_path: str | dict | None = None, **overrides):
  """An `nn.GPT` holding a Hugging Face GPT-2 checkpoint's weights.

  Args:
    path: a model folder, or its `model.safetensors` (`pytorch_model.bin` needs torch).
    hf_config_path: its `config.json` path or dict (default: beside the weights).
    **overrides: GPTConfig/BlockConfig fields (e.g. `operator="DMTN"`).
  Returns:
    (model, info) with info = {"source", "config", "file"}.
  """
  weights, cfg_path = layout.paths(path)
  hf = layout.hf_config(weights, cfg_path, hf_config_path, "GPT-2")
  cfg, arrays = convert(safetensors_io.read(weights), hf, source=weights, **overrides)
  return layout.build(cfg, arrays, source=weights), {"source": SOURCE, "config": hf, "file": weights}


def save(model, path: str) -> dict:
  """Write `model` (a GPT-2-family GPT) as `path` (.safetensors, hub key names) and `config.json` beside it.

  A model with a setting `config.json` cannot carry is refused in one line before a file is written.
  Returns:
    the config.json dict written.
  """
  from attngeo import files
  cfg = model.cfg
  hf = hf_config(cfg)
  layout.unexpressed(cfg, config(hf), "GPT-2")
  tensors = from_attngeo(layout.params(model), cfg)
  layout.check(layout.shapes(tensors), expected(cfg), "exported state")
  side, text = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json"), json.dumps(hf, indent=2)
  safetensors_io.refuse_overwrite(path, tensors, {"format": "pt"}, {side: text})   # never a run's config.json
  safetensors_io.write(path, tensors, {"format": "pt"})
  files.atomic_write(side, text)
  return hf
