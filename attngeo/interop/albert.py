"""Hugging Face ALBERT ⇄ `nn.Encoder`: the "albert" layout of `attngeo.interop.bert` (one module, two layouts)."""
from __future__ import annotations

from attngeo.interop import bert


def load(path: str, hf_config_path: str | dict | None = None, **overrides):
  """`bert.load(path, "albert", ...)`: an ALBERT folder (config.json + weights) as an `nn.Encoder`."""
  return bert.load(path, "albert", hf_config_path, **overrides)


def save(model, path: str, vocab: str | None = None) -> dict:
  """`bert.save(model, path, "albert", vocab)`."""
  return bert.save(model, path, "albert", vocab)
