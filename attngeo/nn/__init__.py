"""Flax NNX models whose attention is any member of the transport family.

* `layers` — `Attention`, `Mlp`, `BlockConfig`/`Block`, `graft`, `fold_distance`, `capture_qk` (what every
  model is made of);
* `gpt` — `GPT` (decoder LM, nanochat's depth knob); `encoder` — `Encoder` (BERT / ALBERT, post-LN,
  MLM head); `dit` — `DiT` (SiT/DiT backbone);
  `pointflow` — `PointFlow` (set transformer over points); `embeddings` — time/position embeddings;
* `registry` — config ⇄ dict and rebuilding a model from a run's config.

Model configs nest one `BlockConfig`; `XConfig.create(**fields)` routes block fields into it.
"""
from attngeo.nn.dit import DiT, DiTConfig
from attngeo.nn.encoder import Encoder, EncoderConfig
from attngeo.nn.embeddings import FinalLayer, TimestepEmbedder, sincos_2d, timestep_embedding
from attngeo.nn.gpt import GPT, GPTConfig
from attngeo.nn.layers import (ORDERS, Attention, Block, BlockConfig, Mlp, attention_modules, capture_qk, fold_distance,
                               graft, resolve_operator, rope)
from attngeo.nn.pointflow import PointFlow, PointFlowConfig
from attngeo.nn.registry import build, config_dict, config_from_dict

__all__ = ["ORDERS", "Attention", "Block", "BlockConfig", "DiT", "DiTConfig", "Encoder", "EncoderConfig", "FinalLayer",
           "GPT", "GPTConfig", "Mlp", "PointFlow", "PointFlowConfig", "TimestepEmbedder", "attention_modules", "build",
           "capture_qk", "config_dict", "config_from_dict", "fold_distance", "graft", "resolve_operator", "rope",
           "sincos_2d", "timestep_embedding"]
