"""Public checkpoints ⇄ attngeo models: read the weights people have, write them back.

* `safetensors_io` — flat tensor files: safetensors (first-class, numpy API) and, only when torch
  is installed, `.pt` state dicts through `torch.load(weights_only=True)`;
* `layout` — one-line key/shape checks; filling an abstract model from {parameter path: array};
* `nanochat` — karpathy/nanochat `gpt.py` at the d32 release (2025-10) and at 2026-07;
* `gpt2` — Hugging Face GPT-2 (`model.safetensors` + `config.json`);
* `bert` (layouts "bert" and "albert"; `albert` names the second) — Hugging Face BERT / ALBERT encoders
  (`nn.Encoder`: hidden states, MLM logits).

`load(kind, path, ...)` returns `(model, info)`: an `nn.GPT` whose layers are `nn.Attention`
(`wv [d, h, k]`, `wo [h, k, d]`), so grafting (`nn.graft`) and the probe's read-outs apply. `save`
writes a model back in the layout it came from. `attngeo import` / `attngeo export`
(`attngeo.experiments.import_export`) wrap both and write run folders.
"""
from __future__ import annotations

KINDS = ("nanochat", "gpt2", "bert", "albert")


def _module(kind: str):
  if kind not in KINDS:
    raise ValueError(f"checkpoint kind must be one of {KINDS}; got {kind!r}")
  from importlib import import_module
  return import_module(f"attngeo.interop.{kind}")


def load(kind: str, path: str, **options):
  """(model, info) from a public checkpoint of `kind` (`KINDS`); options go to its `load`."""
  return _module(kind).load(path, **options)


def save(model, kind: str, path: str, **options):
  """Write `model` to `path` (.safetensors) in `kind`'s public layout, plus its config/meta json."""
  return _module(kind).save(model, path, **options)
