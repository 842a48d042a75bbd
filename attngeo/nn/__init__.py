"""Flax NNX models whose attention is any member of the transport family.

* `config` — `BlockConfig`, `GPTConfig`, `DiTConfig`, `EncoderConfig`, `PointFlowConfig` (JAX-free: the
  CLI validates them before importing JAX);
* `layers` — `Attention`, `Mlp`, `Block`, `graft`, `fold_distance`, `capture_qk` (what every
  model is made of);
* `gpt` — `GPT` (decoder LM, nanochat's depth knob); `encoder` — `Encoder` (BERT / ALBERT, post-LN,
  MLM head); `dit` — `DiT` (SiT/DiT backbone);
  `pointflow` — `PointFlow` (set transformer over points); `embeddings` — time/position embeddings;
* `registry` — config ⇄ dict and rebuilding a model from a run's config.

Model configs nest one `BlockConfig`; `XConfig.create(**fields)` routes block fields into it. The names
below load on first use (PEP 562), so `import attngeo.nn.config` imports neither JAX nor Flax.
"""
import importlib

_HOMES = {
  "config": ("BlockConfig", "DiTConfig", "EncoderConfig", "GPTConfig", "ORDERS", "PointFlowConfig"),
  "dit": ("DiT",),
  "encoder": ("Encoder",),
  "embeddings": ("FinalLayer", "TimestepEmbedder", "sincos_2d", "timestep_embedding"),
  "gpt": ("GPT",),
  "layers": ("Attention", "Block", "Mlp", "attention_modules", "capture_qk", "fold_distance", "graft",
             "resolve_operator", "rope"),
  "pointflow": ("PointFlow",),
  "registry": ("build", "config_dict", "config_from_dict"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name):
  if name in _HOMES:                              # a submodule: `attngeo.nn.layers` after `import attngeo.nn`
    return importlib.import_module(f"{__name__}.{name}")
  if name not in _HOME:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
