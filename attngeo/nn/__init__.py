"""Flax NNX models whose attention is any member of the transport family.

* `config` — `BlockConfig`, `GPTConfig`, `DiTConfig`, `EncoderConfig`, `PointFlowConfig` (JAX-free: the
  CLI validates them before importing JAX);
* `layers` — `Attention`, `Mlp`, `Block`, `graft`, `fold_distance`, `capture_qk` (what every
  model is made of);
* `gpt` — `GPT` (decoder LM, nanochat's depth knob); `encoder` — `Encoder` (BERT / ALBERT, post-LN,
  MLM head); `dit` — `DiT` (SiT/DiT backbone);
  `pointflow` — `PointFlow` (set transformer over points); `embeddings` — time/position embeddings;
* `registry` — rebuilding a model from a run's config (the config ⇄ dict pair lives in `config`);
* `presets` — the `BlockConfig` options each public checkpoint family fixes (GPT-2, BERT, nanochat, DiT),
  which importers build on and exporters check (JAX-free).

Model configs nest one `BlockConfig`; `XConfig.create(**fields)` routes block fields into it. The names
below load on first use (PEP 562), so `import attngeo.nn.config` imports neither JAX nor Flax.
"""
from attngeo import _lazy

_HOMES = {
  "config": ("BlockConfig", "DiTConfig", "EncoderConfig", "GPTConfig", "ORDERS", "PointFlowConfig", "config_dict",
             "config_from_dict", "model_name"),
  "dit": ("DiT",),
  "encoder": ("Encoder",),
  "embeddings": ("FinalLayer", "TimestepEmbedder", "sincos_2d", "timestep_embedding"),
  "gpt": ("GPT",),
  "layers": ("Attention", "Block", "Mlp", "attention_modules", "capture_qk", "fold_distance", "graft",
             "param_count", "resolve_operator", "rope"),
  "pointflow": ("PointFlow",),
  "presets": ("PRESETS",),
  "registry": ("build",),
}
__getattr__, __dir__, __all__, _HOME = _lazy.attach(__name__, globals(), _HOMES)
