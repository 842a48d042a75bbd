"""BERT and ALBERT in the Hugging Face layout (config.json + model.safetensors or pytorch_model.bin) ⇄ `nn.Encoder`.

Matched to `transformers`' `models/bert/modeling_bert.py` and `models/albert/modeling_albert.py`
(5.x; `BertModel`, `BertForPreTraining`/`BertForMaskedLM`, `BertForSequenceClassification`,
`AlbertModel`, `AlbertForMaskedLM`/`AlbertForPreTraining`). The forward is `attngeo.nn.encoder`'s
docstring. A torch `Linear` stores W [out, in] (y = x·Wᵀ + b); attngeo's `wq` is Wᵀ split into
heads [d, h, k], `wo` the output projection's Wᵀ as [h, k, d].

BERT keys (under `bert.` when the file has a head, bare for a `BertModel`):
`embeddings.{word,position,token_type}_embeddings.weight`, `embeddings.LayerNorm.*`,
`encoder.layer.i.attention.self.{query,key,value}.*`, `…attention.output.{dense,LayerNorm}.*`,
`…intermediate.dense.*`, `…output.{dense,LayerNorm}.*`, `pooler.dense.*`; heads
`cls.predictions.{bias, transform.dense.*, transform.LayerNorm.*, decoder.weight}`,
`cls.seq_relationship.*` (NSP), `classifier.*` (sequence labels).
ALBERT keys (under `albert.` when the file has a head): `embeddings.*` (width `embedding_size`),
`encoder.embedding_hidden_mapping_in.*`, `encoder.albert_layer_groups.0.albert_layers.0.{attention.{query,
key,value,dense,LayerNorm}, ffn, ffn_output, full_layer_layer_norm}.*`, `pooler.*`; heads
`predictions.{bias, dense.*, LayerNorm.*, decoder.*}`, `sop_classifier.classifier.*`, `classifier.*`.

Which heads a model has is read from the keys (config.json does not say). Dropped on import, each
checked first: the `position_ids` / `token_type_ids` buffers and, when config.json ties the decoder
to the token table (`tie_word_embeddings`, default true), a decoder weight equal to the table and a
decoder bias equal to the head's `bias`. Untied, the decoder's bias must equal `bias` (one MLM
output bias: transformers < 5 shares the two, 5 uses the decoder's). Export writes what
`save_pretrained` of transformers 5 writes — every other key, with the values it was given (a round
trip is exact) — plus a `config.json` that gives the same model back.
"""
from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from attngeo import runlock
from attngeo.interop import layout, safetensors_io
from attngeo.nn import presets

LAYOUTS = ("bert", "albert")
SOURCES = {"bert": "huggingface/transformers src/transformers/models/bert/modeling_bert.py (BertModel)",
           "albert": "huggingface/transformers src/transformers/models/albert/modeling_albert.py (AlbertModel)"}
PREFIX = {"bert": "bert.", "albert": "albert."}
MLM = {"bert": "cls.predictions.", "albert": "predictions."}
CLASSIFIER_KEYS = {("bert", "nsp"): "cls.seq_relationship", ("bert", "labels"): "classifier",
                   ("albert", "nsp"): "sop_classifier.classifier", ("albert", "labels"): "classifier"}
BUFFERS = re.compile(r"(^|\.)embeddings\.(position_ids|token_type_ids)$")
ALBERT_LAYER = "encoder.albert_layer_groups.0.albert_layers.0."
ACTS = {"gelu": "gelu_erf", "gelu_new": "gelu", "gelu_pytorch_tanh": "gelu"}   # HF hidden_act -> BlockConfig.mlp_act


def _check_kind(kind: str):
  if kind not in LAYOUTS:
    raise ValueError(f"encoder layout must be one of {LAYOUTS}; got {kind!r}")


def heads(tensors: dict, kind: str) -> dict:
  """The EncoderConfig head fields a (canonical-key) state dict implies: mlm_head, pooler, classifier, num_labels."""
  pooler = "pooler.dense.weight" if kind == "bert" else "pooler.weight"
  out = {"mlm_head": MLM[kind] + "bias" in tensors, "pooler": pooler in tensors, "classifier": None}
  for (k, name), key in CLASSIFIER_KEYS.items():
    if k == kind and key + ".weight" in tensors:
      out.update(classifier=name, num_labels=int(np.shape(tensors[key + ".weight"])[0]))
  return out


def config(hf: dict, kind: str, **overrides):
  """The `EncoderConfig` of a Hugging Face BERT/ALBERT `config.json` dict (heads come in `overrides`)."""
  from attngeo.nn.encoder import EncoderConfig
  _check_kind(kind)
  name = f"{kind.upper()} config.json"
  need = ["vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "max_position_embeddings"] + (["embedding_size"] if kind == "albert" else [])
  absent = [k for k in need if k not in hf]
  if absent:
    raise ValueError(f"{name} lacks {absent}")
  unsupported = []
  act = hf.get("hidden_act", "gelu")
  if act not in ACTS:
    unsupported.append(f"hidden_act={act!r} (supported: {sorted(ACTS)})")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    unsupported.append(f"position_embedding_type={hf['position_embedding_type']!r} (supported: 'absolute')")
  if hf.get("is_decoder", False) or hf.get("add_cross_attention", False):
    unsupported.append("is_decoder / add_cross_attention (an encoder only)")
  if kind == "albert" and (hf.get("num_hidden_groups", 1) != 1 or hf.get("inner_group_num", 1) != 1):
    unsupported.append(f"num_hidden_groups={hf.get('num_hidden_groups')}, inner_group_num={hf.get('inner_group_num')} "
                       "(supported: 1 and 1, one shared layer)")
  if unsupported:
    raise ValueError(f"{name} options not supported: " + ", ".join(unsupported))
  vocab, d, depth, h, f, positions = layout.positive_ints(hf, need[:6], name)
  types = layout.positive_ints({"type_vocab_size": hf.get("type_vocab_size", 2)}, ("type_vocab_size",), name)[0]
  if d % h:
    raise ValueError(f"{name} needs num_attention_heads | hidden_size; got hidden_size={d}, num_attention_heads={h}")
  eps, std = hf.get("layer_norm_eps", 1e-12), hf.get("initializer_range", 0.02)
  for key, value in (("layer_norm_eps", eps), ("initializer_range", std)):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
      raise ValueError(f"{name} {key} must be a finite number >= 0; got {value!r}")
  pad = hf.get("pad_token_id", 0)
  fields = dict(depth=depth, vocab_size=vocab, seq_len=positions, type_vocab_size=types, width=d, num_heads=h,
                head_dim=d // h, mlp_ratio=f / d, mlp_act=ACTS[act], norm_eps=float(eps),
                initializer_range=float(std) or 0.02,
                pad_token_id=pad if isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < vocab else None,
                tie_decoder=bool(hf.get("tie_word_embeddings", True)))
  if kind == "albert":
    fields.update(embed_dim=layout.positive_ints(hf, ("embedding_size",), name)[0], shared_layers=True)
  fields.update(overrides)
  cfg = EncoderConfig.create(**fields)
  if int(cfg.width * cfg.block.mlp_ratio) != f:
    raise ValueError(f"intermediate_size={f} is not expressible as a multiple of hidden_size={d} in float32")
  return cfg


def hf_config(cfg, kind: str) -> dict:
  """A Hugging Face `config.json` dict for an EncoderConfig of layout `kind`."""
  _check_kind(kind)
  b = cfg.block
  head = "ForMaskedLM" if cfg.mlm_head else ("ForSequenceClassification" if cfg.classifier == "labels" else "Model")
  if cfg.mlm_head and cfg.classifier == "nsp":
    head = "ForPreTraining"
  out = {"architectures": [("Bert" if kind == "bert" else "Albert") + head], "model_type": kind,
         "vocab_size": cfg.vocab_size, "hidden_size": cfg.width, "num_hidden_layers": cfg.depth,
         "num_attention_heads": b.num_heads, "intermediate_size": int(cfg.width * b.mlp_ratio),
         "hidden_act": "gelu" if b.mlp_act == "gelu_erf" else "gelu_new",
         "max_position_embeddings": cfg.seq_len, "type_vocab_size": cfg.type_vocab_size,
         "layer_norm_eps": b.norm_eps, "initializer_range": cfg.initializer_range,
         "tie_word_embeddings": cfg.tie_decoder, "position_embedding_type": "absolute", "num_labels": cfg.num_labels}
  if cfg.pad_token_id is not None:
    out["pad_token_id"] = cfg.pad_token_id
  if kind == "albert":
    out.update(embedding_size=cfg.edim, num_hidden_groups=1, inner_group_num=1)
  return out


def _check_family(cfg, kind: str):
  b = cfg.block
  bad = presets.mismatches(b, "bert", kind)
  if b.mlp_act not in ACTS.values():
    bad.append(f"mlp_act={b.mlp_act!r} ({kind}: one of {sorted(set(ACTS.values()))})")
  if b.dh * b.num_heads != cfg.width:
    bad.append(f"head_dim·num_heads={b.dh * b.num_heads} must equal width={cfg.width}")
  albert = kind == "albert"
  if cfg.shared_layers != albert or (cfg.embed_dim is not None) != albert:
    bad.append(f"shared_layers={cfg.shared_layers}, embed_dim={cfg.embed_dim} ({kind}: "
               + ("one shared layer and a factorised embedding" if albert else "per-layer weights, no embed_dim") + ")")
  if bad:
    raise ValueError(f"not a {kind.upper()}-family encoder: " + "; ".join(bad))


def _layer_keys(kind: str, i: int) -> dict[str, str]:
  """{role: HF key prefix} of layer i (ALBERT: the shared layer)."""
  if kind == "albert":
    p = ALBERT_LAYER
    return {"q": p + "attention.query", "k": p + "attention.key", "v": p + "attention.value",
            "o": p + "attention.dense", "ln1": p + "attention.LayerNorm", "ffn1": p + "ffn", "ffn2": p + "ffn_output",
            "ln2": p + "full_layer_layer_norm"}
  p = f"encoder.layer.{i}."
  return {"q": p + "attention.self.query", "k": p + "attention.self.key", "v": p + "attention.self.value",
          "o": p + "attention.output.dense", "ln1": p + "attention.output.LayerNorm", "ffn1": p + "intermediate.dense",
          "ffn2": p + "output.dense", "ln2": p + "output.LayerNorm"}


def _linear(key: str, weight: str, bias: str, how: str, bias_how: str = "copy") -> list[tuple[str, str, str]]:
  return [(key + ".weight", weight, how), (key + ".bias", bias, bias_how)]


def _pairs(cfg, kind: str) -> list[tuple[str, str, str]]:
  """(HF key, attngeo path, how) for every tensor of the layout, how ∈ {'copy', 'T' (a Linear's weight), 'qkv',
  'bias' (split into heads), 'o'}: the one table both directions read."""
  body = "" if not (cfg.mlm_head or cfg.classifier) else PREFIX[kind]
  out = [(body + f"embeddings.{name}_embeddings.weight", path, "copy")
         for name, path in (("word", "embed"), ("position", "wpe"), ("token_type", "wtt"))]
  out += _linear(body + "embeddings.LayerNorm", "embed_norm.scale", "embed_norm.bias", "copy")
  if kind == "albert":
    out += _linear(body + "encoder.embedding_hidden_mapping_in", "embed_proj", "embed_proj_bias", "T")
  for i in range(1 if cfg.shared_layers else cfg.depth):
    keys, q = _layer_keys(kind, i), f"layers.{i}."
    for role in "qkv":
      out += _linear(body + keys[role], q + f"attn.w{role}", q + f"attn.b{role}", "qkv", "bias")
    out += _linear(body + keys["o"], q + "attn.wo", q + "attn.bo", "o")
    for ln, norm in (("ln1", "norm_attn"), ("ln2", "norm_mlp")):
      out += _linear(body + keys[ln], q + f"{norm}.scale", q + f"{norm}.bias", "copy")
    for ffn, w in (("ffn1", "1"), ("ffn2", "2")):
      out += _linear(body + keys[ffn], q + f"mlp.w{w}", q + f"mlp.b{w}", "T")
  if cfg.pooler:
    out += _linear(body + ("pooler.dense" if kind == "bert" else "pooler"), "pooler", "pooler_bias", "T")
  if cfg.mlm_head:
    h = MLM[kind]
    inner = h + "transform." if kind == "bert" else h
    out += _linear(inner + "dense", "mlm_dense", "mlm_dense_bias", "T")
    out += _linear(inner + "LayerNorm", "mlm_norm.scale", "mlm_norm.bias", "copy")
    out.append((h + "bias", "mlm_bias", "copy"))
    if not cfg.tie_decoder:                    # transformers 5 then adds the decoder's own bias: the same values
      out += [(h + "decoder.weight", "mlm_decoder", "T"), (h + "decoder.bias", "mlm_bias", "copy")]
  if cfg.classifier:
    out += _linear(CLASSIFIER_KEYS[(kind, cfg.classifier)], "classifier", "classifier_bias", "T")
  return out


def expected(cfg, kind: str) -> dict[str, tuple]:
  """{HF key: shape} for an EncoderConfig of layout `kind` (the keys export writes)."""
  from flax import nnx
  from attngeo.nn.encoder import Encoder
  model = nnx.eval_shape(lambda: Encoder(cfg, rngs=nnx.Rngs(0)))
  params = nnx.to_flat_state(nnx.state(model, nnx.Param))
  shapes = {".".join(map(str, p)): tuple(v.get_value().shape) for p, v in params}
  out = {}
  for key, path, how in _pairs(cfg, kind):
    s = shapes[path]
    out[key] = {"copy": lambda: s, "T": lambda: s[::-1], "qkv": lambda: (s[1] * s[2], s[0]),
                "bias": lambda: (s[0] * s[1],), "o": lambda: (s[2], s[0] * s[1])}[how]()
  return out


def to_attngeo(tensors: dict[str, np.ndarray], cfg, kind: str) -> dict[str, np.ndarray]:
  """HF state dict (the keys of `expected`) -> {attngeo parameter path: array}."""
  h, k = cfg.block.num_heads, cfg.block.dh
  out = {}
  for key, path, how in _pairs(cfg, kind):
    t = np.asarray(tensors[key])
    out[path] = {"copy": lambda: t, "T": lambda: t.T, "qkv": lambda: t.T.reshape(-1, h, k),
                 "bias": lambda: t.reshape(h, k), "o": lambda: t.T.reshape(h, k, -1)}[how]()
  return out


def from_attngeo(params: dict[str, np.ndarray], cfg, kind: str) -> dict[str, np.ndarray]:
  """{attngeo parameter path: array} -> HF state dict (inverse of `to_attngeo`)."""
  out = {}
  for key, path, how in _pairs(cfg, kind):
    p = np.asarray(params[path])
    out[key] = {"copy": lambda: p, "T": lambda: p.T, "qkv": lambda: p.reshape(p.shape[0], -1).T,
                "bias": lambda: p.reshape(-1), "o": lambda: p.reshape(-1, p.shape[-1]).T}[how]()
  return {name: np.ascontiguousarray(a, np.float32) for name, a in out.items()}


def canonical(tensors: dict[str, np.ndarray], hf: dict, kind: str, source: str) -> dict[str, np.ndarray]:
  """The keys `expected` names: buffers dropped, a tied decoder weight / duplicated decoder bias checked and dropped.

  The body is under the `bert.` / `albert.` prefix exactly when the file has a head (as HF's classes save it);
  a bare body with heads (or a prefixed one without) is rewritten to that form.
  """
  tensors = {k: v for k, v in tensors.items() if not BUFFERS.search(k)}
  prefix = PREFIX[kind]
  bare = {k.removeprefix(prefix): v for k, v in tensors.items()}
  head_fields = heads(bare, kind)
  has_head = head_fields["mlm_head"] or head_fields["classifier"] is not None
  body = ("embeddings.", "encoder.", "pooler.")
  tensors = {(prefix + k if has_head and k.startswith(body) else k): v for k, v in bare.items()}
  h, table = MLM[kind], (prefix if has_head else "") + "embeddings.word_embeddings.weight"
  tied = hf.get("tie_word_embeddings", True)
  for dup, original in ((h + "decoder.weight", table), (h + "decoder.bias", h + "bias")):
    if dup in tensors and (tied or dup.endswith("bias")):
      a, b = tensors[dup], tensors.get(original)
      if b is not None and (np.shape(a) != np.shape(b) or not np.array_equal(a, b)):
        raise ValueError(f"{source}: {dup} differs from {original}, but "
                         + ("config.json ties them (tie_word_embeddings is true)" if tied else
                            "the MLM head has one output bias (transformers < 5 shares it)"))
      if tied:
        tensors.pop(dup)
  return tensors


def convert(tensors: dict[str, np.ndarray], hf: dict, kind: str, source: str = "checkpoint", **overrides):
  """A BERT/ALBERT state dict + its config.json dict -> (EncoderConfig, {attngeo path: array})."""
  _check_kind(kind)
  tensors = canonical(tensors, hf, kind, source)
  cfg = config(hf, kind, **{**heads({k.removeprefix(PREFIX[kind]): v for k, v in tensors.items()}, kind), **overrides})
  _check_family(cfg, kind)
  hints = []
  layers = {int(m.group(1)) for key in tensors if (m := re.search(r"encoder\.layer\.(\d+)\.", key))}
  if kind == "bert" and layers and max(layers) + 1 != cfg.depth:
    hints.append(f"the checkpoint has {max(layers) + 1} layers, config.json num_hidden_layers={cfg.depth}")
  try:
    layout.check(layout.shapes(tensors), expected(cfg, kind), source)
  except ValueError as e:
    raise ValueError(("; ".join(hints) + ". " if hints else "") + str(e) + f" ({kind.upper()})") from None
  return cfg, to_attngeo(tensors, cfg, kind)


def load(path: str, kind: str = "bert", hf_config_path: str | dict | None = None, **overrides):
  """An `nn.Encoder` holding a Hugging Face BERT/ALBERT checkpoint's weights.

  Args:
    path: a model folder, or its `model.safetensors` / `pytorch_model.bin` (the .bin needs torch and is read
      through `torch.load(weights_only=True)`: a pickle holding anything but tensors is refused, never run).
    kind: "bert" | "albert".
    hf_config_path: its `config.json` path or dict (default: beside the weights).
    **overrides: EncoderConfig/BlockConfig fields (e.g. `operator="DMTN"`).
  Returns:
    (model, info) with info = {"source", "config", "file", "tensors"} (`tensors`: the state dict as read, for
    the run folder's safetensors copy).
  """
  from attngeo.nn.encoder import Encoder
  _check_kind(kind)
  weights, cfg_path = layout.paths(path)
  hf = layout.hf_config(weights, cfg_path, hf_config_path, kind.upper())
  tensors = safetensors_io.read(weights)
  cfg, arrays = convert(tensors, hf, kind, source=weights, **overrides)
  model = layout.build(cfg, arrays, source=weights, model_class=Encoder)
  return model, {"source": SOURCES[kind], "config": hf, "file": weights, "tensors": tensors}


def save(model, path: str, kind: str = "bert", vocab: str | None = None) -> dict:
  """Write `model` (a `kind`-family Encoder) as `path` (.safetensors, HF key names) and `config.json` beside it,
  and a copy of `vocab` (a vocab.txt; HF folders keep the tokenizer there) as `vocab.txt` beside it.

  A model whose settings the HF files cannot carry, or a file there that is not this very export
  (`safetensors_io.refuse_overwrite`: a run folder's own config.json), is refused in one line before a
  file is written.
  Returns:
    the config.json dict written.
  """
  import shutil

  from attngeo import files, operators
  from attngeo.nn.layers import attention_modules
  cfg = model.cfg
  _check_kind(kind)
  _check_family(cfg, kind)
  grafted = [i for i, m in enumerate(attention_modules(model)) if m.distance_form or m.magnetic or
             m.learnable_operator or (m.beta, m.alpha) != operators.ATTN]
  if grafted:
    raise ValueError(f"cannot export to {kind} without changing the model: attention layers {grafted} run another "
                     f"operator than ATTN ({kind}'s files carry softmax attention only)")
  hf = hf_config(cfg, kind)
  tensors = from_attngeo(layout.params(model), cfg, kind)
  layout.check(layout.shapes(tensors), expected(cfg, kind), "exported state")
  folder, text = os.path.dirname(os.path.abspath(path)), json.dumps(hf, indent=2)
  copies = {}
  if vocab is not None:
    with open(vocab, "rb") as f:
      copies[os.path.join(folder, "vocab.txt")] = f.read()
  safetensors_io.refuse_overwrite(path, tensors, {"format": "pt"}, {os.path.join(folder, "config.json"): text,
                                                                    **copies})
  safetensors_io.write(path, tensors, {"format": "pt"})
  files.atomic_write(os.path.join(folder, "config.json"), text)
  if vocab is not None:
    files.atomic_write(os.path.join(folder, "vocab.txt"), lambda tmp: shutil.copyfile(vocab, tmp))
  return hf


HF_DIR = "hf"     # in an imported run folder: the checkpoint as safetensors and its config.json
TMP_DIR = ".import.tmp"   # inside `out` while an import holds it: what it writes before moving it up


def check_out(out: str) -> None:
  """One ValueError line unless `out` is absent or an empty folder (its lock and a killed import's `TMP_DIR`
  aside): an import never writes into a folder that holds anything."""
  if os.path.exists(out) and (not os.path.isdir(out) or set(os.listdir(out)) - {runlock.LOCK_NAME, TMP_DIR}):
    raise ValueError(f"--out {out} exists and is not an empty folder; choose a new run folder")


def write_imported_run(out: str, model, info: dict, imported: dict) -> None:
  """An imported run folder at `out`: `runs.write_weights_run` (config.json + weights.npz, what `runs.load_run`
  reads), the checkpoint's `vocab.txt` (where one lies beside its weights: the tokenizer of `attngeo.lm.smiles`)
  and `hf/` (the checkpoint's tensors as read, now model.safetensors, and its config.json).

  `out` (absent or empty: `check_out`) is held (`attngeo.runlock`: a second import of it is refused in one line)
  while everything is written into `out/TMP_DIR` and then moved up, config.json last, so a failure leaves nothing
  (and a folder it created is removed). A `TMP_DIR` left by a killed import (`kill -9`) is removed first: under
  the lock its owner is gone.
  """
  import shutil

  from attngeo import runs
  out = os.path.abspath(out)
  check_out(out)
  with runlock.hold(out):
    check_out(out)
    tmp = os.path.join(out, TMP_DIR)
    shutil.rmtree(tmp, ignore_errors=True)
    moved = []
    try:
      hf = os.path.join(tmp, HF_DIR)
      safetensors_io.write(os.path.join(hf, "model.safetensors"), info["tensors"], {"format": "pt"})
      with open(os.path.join(hf, "config.json"), "w", encoding="utf-8") as f:
        json.dump(info["config"], f, indent=2)
      vocab = os.path.join(os.path.dirname(info["file"]), "vocab.txt")
      if os.path.isfile(vocab):
        shutil.copyfile(vocab, os.path.join(tmp, "vocab.txt"))
      runs.write_weights_run(tmp, model, imported=imported)
      for name in sorted(os.listdir(tmp), key=lambda n: n == "config.json"):
        os.rename(os.path.join(tmp, name), os.path.join(out, name))
        moved.append(os.path.join(out, name))
      os.rmdir(tmp)
    except BaseException:
      for path in [tmp] + moved:
        if os.path.isdir(path):
          shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
          os.remove(path)
      raise
