"""Model registry: a model's config ⇄ a JSON-able dict, and rebuilding a model from it.

Every attngeo model is built from one frozen config dataclass (`model.cfg`). A run folder's
`config.json` records `{"class": "GPTConfig", **fields}` (nested `block` included); `build`
turns such a dict back into an initialised model of the same shape, so checkpoints can be restored
into it (`attngeo.runs.load_run`).
"""
from __future__ import annotations

import dataclasses

from flax import nnx

from attngeo import config as config_lib
from attngeo.nn.config import DiTConfig, EncoderConfig, GPTConfig, PointFlowConfig
from attngeo.nn.dit import DiT
from attngeo.nn.encoder import Encoder
from attngeo.nn.gpt import GPT
from attngeo.nn.pointflow import PointFlow

MODELS = {"GPTConfig": (GPTConfig, GPT), "DiTConfig": (DiTConfig, DiT), "PointFlowConfig": (PointFlowConfig, PointFlow),
          "EncoderConfig": (EncoderConfig, Encoder)}


def config_dict(model_or_config) -> dict | None:
  """`{"class": "GPTConfig", **fields}` of a model (its `cfg`) or of a config; None if it has none."""
  cfg = getattr(model_or_config, "cfg", model_or_config)
  if not dataclasses.is_dataclass(cfg) or type(cfg).__name__ not in MODELS:
    return None
  return {"class": type(cfg).__name__, **dataclasses.asdict(cfg)}


def config_from_dict(fields: dict):
  """Inverse of `config_dict`: the config dataclass (nested `block` rebuilt, lists as tuples)."""
  fields = dict(fields)
  name = fields.pop("class", None)
  if name not in MODELS:
    raise ValueError(f"unknown model config class {name!r}; known: {sorted(MODELS)}")
  return config_lib.from_dict(MODELS[name][0], fields)


def build(cfg, seed: int = 0):
  """An initialised model for config `cfg` (a config dataclass or a `config_dict`)."""
  if isinstance(cfg, dict):
    cfg = config_from_dict(cfg)
  name = type(cfg).__name__
  if name not in MODELS:
    raise ValueError(f"no model is registered for {name}; known: {sorted(MODELS)}")
  return MODELS[name][1](cfg, rngs=nnx.Rngs(seed))
