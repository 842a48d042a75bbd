"""The model configs, importable without JAX: `BlockConfig` and the configs that nest it.

So the CLI can build and validate them before it imports JAX (a bad model field is one line, at once).
Every config is a frozen dataclass; `XConfig.create(**fields)` (the `NestsBlock` mixin) routes each
keyword to the model config if it names one of its fields, else to its `BlockConfig`, and validates.

* `BlockConfig` — what every transformer block shares (`attngeo.nn.layers.Block`);
* `GPTConfig` (`attngeo.nn.gpt.GPT`), `DiTConfig` (`attngeo.nn.dit.DiT`), `EncoderConfig`
  (`attngeo.nn.encoder.Encoder`), `PointFlowConfig` (`attngeo.nn.pointflow.PointFlow`);
* `ClassifierConfig` — the small CNN of the offline image metric (`attngeo.image_metrics.Classifier`);
* `ORDERS`, `NORMS`, `ROPE_STYLES`, `CLASSIFIERS` — the values their string fields take.

Operators are checked by `attngeo.operator_names` (JAX-free). `attngeo.nn.registry` serialises these
configs (`config_dict`); their fields, defaults and order are what run folders and content keys hold.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from attngeo import errors, operator_names
from attngeo.nn import presets

ORDERS = ("attn_first", "ffn_first")
ROPE_STYLES = ("half", "interleaved")
NORMS = ("rms", "layer")
MLP_ACTS = ("gelu", "gelu_erf", "relu2", "silu")       # `attngeo.nn.layers.Mlp`'s activations
DTYPES = ("float32", "bfloat16", "float16", "float64")


def check_distance_form(operator, learnable_operator, qk_norm, num_kv_heads=None, num_heads=None):
  """One ValueError line unless W_+ alone can hold the operator: a fixed DMAP, no QK-norm, no GQA."""
  if operator_names.resolve(operator) != (0.0, 0.0) or operator_names.is_magnetic(operator) or learnable_operator:
    raise ValueError(f"distance_form holds W_+ only, so its operator is a fixed DMAP; got operator={operator!r}, "
                     f"learnable_operator={learnable_operator}")
  if qk_norm:
    raise ValueError("distance_form cannot carry qk_norm: norm(q) + norm(k) is not a function of W_+ x")
  if num_kv_heads not in (None, num_heads):
    raise ValueError("distance_form needs as many key heads as query heads (no GQA): W_+ = (W_Q + W_K)/√2 per head")


@dataclasses.dataclass(frozen=True)
class BlockConfig:
  """What every transformer block shares. `operator`: corner name, (β, α), or 'CMAP' (coupling γ = `coupling`)."""
  width: int = 128
  num_heads: int = 4
  head_dim: int | None = None          # default width // num_heads
  mlp_ratio: float = 4.0
  mlp_act: str = "gelu"
  order: str = "attn_first"           # attn_first: MHSA→FFN; ffn_first: FFN→MHSA
  operator: Any = "ATTN"
  learnable_operator: bool = False
  coupling: float = 1.0               # CMAP's phase coupling γ (initial value when learnable); unused by the family
  use_rope: bool = False
  qk_norm: bool = False
  qkv_bias: bool = False
  implementation: str | None = None
  dtype: str = "float32"              # compute dtype; parameters stay float32
  # Options for imported checkpoints (attngeo.interop); the defaults are attngeo's own blocks.
  num_kv_heads: int | None = None     # GQA: key/value heads shared by num_heads / num_kv_heads queries
  out_bias: bool = False              # bias on W_O (GPT-2)
  mlp_bias: bool = True               # biases in the MLP (nanochat: none)
  norm: str = "rms"                   # rms | layer: pre-norms, final norm and embedding norm
  norm_scale: bool = True             # learnable scale in those norms (nanochat: none)
  norm_bias: bool = False             # learnable bias (layer norm only; GPT-2)
  norm_eps: float = 1e-6              # ε of every norm, QK-norm included
  qk_norm_scale: bool = True          # learnable QK-norm scale (False: parameter-free, nanochat)
  qk_gain: float = 1.0                # q, k multiplied by this after QK-norm (nanochat 2026: 1.2)
  rope_base: float = 10_000.0         # rotary base θ (nanochat 2026: 100000)
  rope_sign: int = 1                  # +1 textbook rotation, −1 nanochat's
  rope_style: str = "half"            # half (rotate-half) | interleaved
  rope_dtype: str | None = None       # round the rotary cos/sin tables to this dtype (nanochat: bfloat16)
  distance_form: bool = False         # DMAP parametrised by W_+ = (W_Q + W_K)/√2 alone (see fold_distance)

  def validate(self):
    for name in ("width", "num_heads") + (("head_dim",) if self.head_dim is not None else ()):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer ≥ 1; got {value!r}")
    for name, low in (("mlp_ratio", 0.0), ("norm_eps", 0.0), ("rope_base", 1.0)):
      value = getattr(self, name)
      if isinstance(value, (bool, str)) or not math.isfinite(float(value)) or not float(value) > low:
        raise ValueError(f"{name} must be a finite number > {low:g}; got {value!r}")
    if int(self.width * self.mlp_ratio) < 1:
      raise ValueError(f"mlp_ratio={self.mlp_ratio} leaves the MLP of width {self.width} without a hidden unit")
    if isinstance(self.qk_gain, (bool, str)) or not math.isfinite(float(self.qk_gain)):
      raise ValueError(f"qk_gain must be a finite number; got {self.qk_gain!r}")
    if self.mlp_act not in MLP_ACTS:
      raise ValueError(f"mlp_act must be one of {MLP_ACTS}; got {self.mlp_act!r}")
    for name in ("dtype", "rope_dtype"):
      value = getattr(self, name)
      if not (value in DTYPES or (name == "rope_dtype" and value is None)):
        raise ValueError(f"{name} must be one of {DTYPES}{' or None' if name == 'rope_dtype' else ''}; got {value!r}")
    if self.order not in ORDERS:
      raise ValueError(f"order must be one of {ORDERS}; got {self.order!r}")
    if self.head_dim is None and self.width % self.num_heads:
      raise ValueError(f"num_heads={self.num_heads} does not divide width={self.width}")
    if self.num_kv_heads is not None and (self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads):
      raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
    if self.norm not in NORMS:
      raise ValueError(f"norm must be one of {NORMS}; got {self.norm!r}")
    if self.norm_bias and self.norm != "layer":
      raise ValueError("norm_bias needs norm='layer' (RMSNorm has no bias)")
    if self.rope_sign not in (1, -1):
      raise ValueError(f"rope_sign must be 1 or -1; got {self.rope_sign!r}")
    if self.rope_style not in ROPE_STYLES:
      raise ValueError(f"rope_style must be one of {ROPE_STYLES}; got {self.rope_style!r}")
    operator_names.resolve(self.operator)
    if self.distance_form:
      check_distance_form(self.operator, self.learnable_operator, self.qk_norm, self.num_kv_heads, self.num_heads)
    if operator_names.is_magnetic(self.operator) and self.dh % 2:
      raise ValueError(f"operator CMAP needs an even head_dim (channel pairs are complex values); got {self.dh}")
    if isinstance(self.coupling, str) or not math.isfinite(float(self.coupling)):
      raise ValueError(f"coupling must be a finite number (CMAP's phase coupling); got {self.coupling!r}")
    return self

  @property
  def dh(self) -> int:
    return self.head_dim or self.width // self.num_heads


class NestsBlock:
  """Mixin for model configs that nest a `block: BlockConfig`.

  `create(**fields)` routes each keyword to the model config if it names one of its fields, else
  to its `BlockConfig` (`GPTConfig.create(depth=2, width=64, operator="DMTN")`), and validates.
  """

  @classmethod
  def create(cls, **fields):
    own = {f.name for f in dataclasses.fields(cls)}
    block_names = {f.name for f in dataclasses.fields(BlockConfig)}
    unknown = sorted(k for k in fields if k not in own and k not in block_names)
    if unknown:
      raise errors.InputTypeError(f"{cls.__name__} has no field {unknown[0]!r} (nor has its BlockConfig)")
    top = {k: v for k, v in fields.items() if k in own}
    base = top.pop("block", None) or cls.__dataclass_fields__["block"].default_factory()
    block = dataclasses.replace(base, **{k: v for k, v in fields.items() if k not in own})
    return cls(**top, block=block.validate())

  def with_operator(self, operator, learnable: bool | None = None):
    """The same config under another operator (what `graft` does to a built model)."""
    blk = dataclasses.replace(self.block, operator=operator,
                              learnable_operator=self.block.learnable_operator if learnable is None else learnable)
    return dataclasses.replace(self, block=blk.validate())


def _gpt_block() -> BlockConfig:
  return BlockConfig(width=256, num_heads=2, head_dim=128, mlp_act="relu2", use_rope=True, qk_norm=True)


@dataclasses.dataclass(frozen=True)
class GPTConfig(NestsBlock):
  """A GPT: `depth` blocks of `block`, vocabulary `vocab_size`, context `seq_len`."""
  depth: int = 4
  vocab_size: int = 256
  seq_len: int = 256
  block: BlockConfig = dataclasses.field(default_factory=_gpt_block)
  # Options for imported checkpoints (attngeo.interop); see the module docstring.
  tie_embeddings: bool = False        # logits through the embedding table (GPT-2)
  learned_positions: bool = False     # absolute position table [seq_len, d] added to the embedding (GPT-2)
  embed_norm: bool = False            # norm right after the embedding (nanochat)
  padded_vocab: int | None = None     # rows of the embedding/unembedding tables (≥ vocab_size; logits sliced)
  logit_softcap: float | None = None  # c·tanh(logits / c) (nanochat: 15)
  attn_windows: tuple[int, ...] = ()  # per-layer sliding window w (query j sees keys j − w … j); () = full
  resid_mix: bool = False             # per-layer λ_r·x + λ_0·x0 before each block (nanochat 2026)
  smear_channels: int = 0             # smear gate input width (nanochat 2026: 24; 0 = off)
  backout_layer: int | None = None    # subtract λ_b × the stream after this block (nanochat 2026: depth // 2)
  value_embeds: tuple[int, ...] = ()  # layers with a gated value embedding (nanochat 2026)
  value_gate_channels: int = 12       # value-embedding gate input width

  @classmethod
  def from_depth(cls, depth: int, *, aspect: int = 64, head_dim: int = 128, width: int | None = None,
                 **fields) -> "GPTConfig":
    """nanochat's rule: width = `aspect`·depth rounded up to a multiple of `head_dim` (or `width`)."""
    for name, value in (("depth", depth), ("aspect", aspect), ("head_dim", head_dim), ("width", width)):
      if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
        raise ValueError(f"{name} must be an integer ≥ 1{' or None' if name == 'width' else ''}; got {value!r}")
    w = width if width is not None else -(-aspect * depth // head_dim) * head_dim
    if w % head_dim:
      raise ValueError(f"head_dim={head_dim} does not divide width={w}: heads must tile the width")
    return cls.create(depth=depth, width=w, num_heads=w // head_dim, head_dim=head_dim, **fields)

  @property
  def width(self) -> int:
    return self.block.width

  @property
  def table_rows(self) -> int:
    """Rows of the embedding tables: `padded_vocab` or `vocab_size`."""
    return self.padded_vocab or self.vocab_size

  def validate(self) -> "GPTConfig":
    self.block.validate()
    for name in ("depth", "vocab_size", "seq_len"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"GPTConfig.{name} must be an integer ≥ 1; got {value!r}")
    if self.padded_vocab is not None and self.padded_vocab < self.vocab_size:
      raise ValueError(f"padded_vocab={self.padded_vocab} must be ≥ vocab_size={self.vocab_size}")
    if self.attn_windows and len(self.attn_windows) != self.depth:
      raise ValueError(f"attn_windows needs one window per layer ({self.depth}); got {len(self.attn_windows)}")
    if any(w < 0 for w in self.attn_windows):
      raise ValueError(f"attn_windows must be ≥ 0; got {self.attn_windows}")
    if self.backout_layer is not None and not 0 <= self.backout_layer < self.depth:
      raise ValueError(f"backout_layer must lie in [0, {self.depth}); got {self.backout_layer}")
    bad = sorted(i for i in self.value_embeds if not 0 <= i < self.depth)
    if bad or len(set(self.value_embeds)) != len(self.value_embeds):
      raise ValueError(f"value_embeds must be distinct layers in [0, {self.depth}); got {self.value_embeds}")
    if self.smear_channels > self.width or (self.value_embeds and self.value_gate_channels > self.width):
      raise ValueError(f"smear_channels / value_gate_channels must be ≤ width={self.width}")
    return self


def _dit_block() -> BlockConfig:
  return BlockConfig(width=384, num_heads=6, qkv_bias=True, out_bias=True)


@dataclasses.dataclass(frozen=True)
class DiTConfig(NestsBlock):
  """Images `image_size`² × `channels`, patches of `patch`², `depth` adaLN-Zero blocks of `block`."""
  image_size: int = 32
  patch: int = 2
  channels: int = 4
  depth: int = 12
  num_classes: int = 1000
  class_dropout_prob: float = 0.1      # label dropout for guidance; > 0 adds the null-label row
  learn_sigma: bool = False            # final layer emits 2·channels (DiT/SiT-XL/2-256 checkpoints)
  time_scale: float = 1.0              # t is embedded as sinusoid(time_scale · t)
  block: BlockConfig = dataclasses.field(default_factory=_dit_block)

  @property
  def null_label(self) -> int | None:
    """The label classifier-free guidance drops to (`num_classes`), or None without a null row."""
    return self.num_classes if self.class_dropout_prob > 0 else None

  @property
  def out_channels(self) -> int:
    return 2 * self.channels if self.learn_sigma else self.channels

  PRESETS = {"S/2": (384, 12, 6, 2), "B/2": (768, 12, 12, 2), "L/2": (1024, 24, 16, 2), "XL/2": (1152, 28, 16, 2)}

  @classmethod
  def preset(cls, name: str, **fields) -> "DiTConfig":
    """A DiT/SiT size (`S/2`, `B/2`, `L/2`, `XL/2`: width, depth, heads, patch) with field overrides."""
    if name not in cls.PRESETS:
      raise ValueError(f"DiT preset must be one of {sorted(cls.PRESETS)}; got {name!r}")
    w, d, h, p = cls.PRESETS[name]
    return cls.create(**{"width": w, "depth": d, "num_heads": h, "patch": p, **fields})


CLASSIFIERS = (None, "nsp", "labels")


def _bert_block() -> BlockConfig:
  return BlockConfig(width=256, num_heads=4, mlp_ratio=2.0, mlp_act="gelu_erf", norm_eps=1e-12,
                     **presets.fields("bert"))


@dataclasses.dataclass(frozen=True)
class EncoderConfig(NestsBlock):
  """A BERT/ALBERT encoder: `depth` post-LN blocks of `block` (ALBERT: one shared block applied `depth` times).

  Defaults are rxnfp's BERT (12 × 256, 4 heads, FFN 512); `albert()` gives rxnmapper's ALBERT.
  """
  depth: int = 12
  vocab_size: int = 591
  seq_len: int = 512                   # rows of the learned position table (HF max_position_embeddings)
  type_vocab_size: int = 2
  embed_dim: int | None = None         # ALBERT's factorised embedding E' (projected to width); None: E' = width
  shared_layers: bool = False          # ALBERT: one layer applied depth times
  mlm_head: bool = True                # BERT cls.predictions / ALBERT predictions
  tie_decoder: bool = True             # MLM decoder = the token table (HF tie_word_embeddings)
  pooler: bool = False                 # tanh(x_0·W_p + b_p)
  classifier: str | None = None        # None | "nsp" (cls.seq_relationship) | "labels" (classifier) on the pooler
  num_labels: int = 2
  pad_token_id: int | None = 0         # the token-table row HF's init zeroes
  initializer_range: float = 0.02      # std of HF's normal init (random-init twins)
  block: BlockConfig = dataclasses.field(default_factory=_bert_block)

  @classmethod
  def create(cls, **fields) -> "EncoderConfig":
    """`NestsBlock.create`, the encoder's own fields validated too."""
    return super().create(**fields).validate()

  @classmethod
  def albert(cls, **fields) -> "EncoderConfig":
    """rxnmapper's ALBERT shape (hidden 256, embedding 128, 8 heads, one layer × 12), fields overriding."""
    return cls.create(**{"embed_dim": 128, "shared_layers": True, "num_heads": 8, **fields})

  @property
  def width(self) -> int:
    return self.block.width

  @property
  def edim(self) -> int:
    """E': the width of the token tables and of the MLM head's decoder."""
    return self.embed_dim or self.block.width

  def validate(self) -> "EncoderConfig":
    self.block.validate()
    for name in ("depth", "vocab_size", "seq_len", "type_vocab_size", "num_labels") + \
                (("embed_dim",) if self.embed_dim is not None else ()):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"EncoderConfig.{name} must be an integer ≥ 1; got {value!r}")
    if self.block.order != "attn_first" or self.block.use_rope or self.block.norm != "layer":
      raise ValueError("an encoder's blocks are post-LN attention → FFN with learned positions: block.order must be "
                       f"'attn_first', use_rope off, norm 'layer'; got order={self.block.order!r}, "
                       f"use_rope={self.block.use_rope}, norm={self.block.norm!r}")
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f"EncoderConfig.classifier must be one of {CLASSIFIERS}; got {self.classifier!r}")
    if self.classifier is not None and not self.pooler:
      raise ValueError("EncoderConfig.classifier reads the pooled first token: it needs pooler=True")
    if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
      raise ValueError(f"EncoderConfig.pad_token_id must lie in [0, {self.vocab_size}) or be None; "
                       f"got {self.pad_token_id!r}")
    if not self.initializer_range > 0:
      raise ValueError(f"EncoderConfig.initializer_range must be > 0; got {self.initializer_range!r}")
    return self


def _pointflow_block() -> BlockConfig:
  return BlockConfig(width=64, num_heads=2, mlp_ratio=2.0, order="ffn_first")


@dataclasses.dataclass(frozen=True)
class PointFlowConfig(NestsBlock):
  """Points of dimension `dim`, `depth` blocks of `block` (FFN → MHSA by default)."""
  dim: int = 3
  depth: int = 2
  block: BlockConfig = dataclasses.field(default_factory=_pointflow_block)


# ----------------------------------------------------------------------------- config ⇄ dict

CONFIGS = {c.__name__: c for c in (GPTConfig, DiTConfig, PointFlowConfig, EncoderConfig)}


def config_dict(model_or_config) -> dict | None:
  """`{"class": "GPTConfig", **fields}` of a model (its `cfg`) or of a config; None if it has none.

  JAX-free (a model is only read for its `cfg`): the CLI records and compares configs before JAX loads."""
  cfg = getattr(model_or_config, "cfg", model_or_config)
  if not dataclasses.is_dataclass(cfg) or type(cfg).__name__ not in CONFIGS:
    return None
  return {"class": type(cfg).__name__, **dataclasses.asdict(cfg)}


# How one-line messages name the model a run folder's config.json records (`config_dict`'s "class").
MODEL_NAMES = {"GPTConfig": "a GPT model", "DiTConfig": "a DiT (SiT) model", "PointFlowConfig": "a PointFlow model",
               "EncoderConfig": "an encoder (BERT/ALBERT) model"}


def model_name(config_class: str | None) -> str:
  """"a GPT model", "an encoder (BERT/ALBERT) model", … for a config class name; "no model config" for None."""
  if not config_class:
    return "no model config"
  return MODEL_NAMES.get(config_class, f"a {config_class.removesuffix('Config')} model")


def config_from_dict(fields: dict):
  """Inverse of `config_dict`: the config dataclass (nested `block` rebuilt, lists as tuples)."""
  from attngeo import config as config_lib
  fields = dict(fields)
  name = fields.pop("class", None)
  if name not in CONFIGS:
    raise ValueError(f"unknown model config class {name!r}; known: {sorted(CONFIGS)}")
  return config_lib.from_dict(CONFIGS[name], fields)


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
  """The image metric's classifier (`attngeo.image_metrics`): `conv` 3×3 conv + ReLU + 2×2 pool stages on
  [image_size, image_size, channels] images, a dense layer of `features` units (the features φ), a linear
  read-out to `num_classes`; trained for `steps` of `batch_size` at `lr` from `seed`."""
  image_size: int = 28
  channels: int = 1
  num_classes: int = 10
  conv: tuple[int, ...] = (16, 32)
  features: int = 64
  steps: int = 1500
  batch_size: int = 128
  lr: float = 2e-3
  seed: int = 0
