"""Model registry: rebuilding a model from its config or from the JSON-able dict of one.

Every attngeo model is built from one frozen config dataclass (`model.cfg`). A run folder's
`config.json` records `{"class": "GPTConfig", **fields}` (nested `block` included); `build`
turns such a dict back into an initialised model of the same shape, so checkpoints can be restored
into it (`attngeo.runs.load_run`). The dict itself (`config_dict`, `config_from_dict`) is made in the
JAX-free `attngeo.nn.config` and re-exported here.
"""
from __future__ import annotations

from flax import nnx

from attngeo.nn.config import (DiTConfig, EncoderConfig, GPTConfig, PointFlowConfig,  # noqa: F401 (re-exported)
                               config_dict, config_from_dict)
from attngeo.nn.dit import DiT
from attngeo.nn.encoder import Encoder
from attngeo.nn.gpt import GPT
from attngeo.nn.pointflow import PointFlow

MODELS = {"GPTConfig": (GPTConfig, GPT), "DiTConfig": (DiTConfig, DiT), "PointFlowConfig": (PointFlowConfig, PointFlow),
          "EncoderConfig": (EncoderConfig, Encoder)}


def build(cfg, seed: int = 0):
  """An initialised model for config `cfg` (a config dataclass or a `config_dict`)."""
  if isinstance(cfg, dict):
    cfg = config_from_dict(cfg)
  name = type(cfg).__name__
  if name not in MODELS:
    raise ValueError(f"no model is registered for {name}; known: {sorted(MODELS)}")
  return MODELS[name][1](cfg, rngs=nnx.Rngs(seed))
