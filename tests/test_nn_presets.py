"""Checkpoint-compatibility presets: one home for each family's block options, used by import and export."""
import dataclasses

import pytest

from attngeo.interop import bert, gpt2, nanochat
from attngeo.nn import presets
from attngeo.nn.config import BlockConfig, EncoderConfig, GPTConfig

GPT2_HF = {"n_layer": 1, "vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_head": 2}
BERT_HF = {"num_hidden_layers": 1, "vocab_size": 11, "max_position_embeddings": 8, "hidden_size": 8,
           "num_attention_heads": 2, "intermediate_size": 16, "type_vocab_size": 2, "hidden_act": "gelu"}
NANOCHAT = {"sequence_len": 8, "vocab_size": 11, "n_layer": 1, "n_head": 2, "n_kv_head": 2, "n_embd": 8}


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_each_preset_is_a_valid_block(name):
  names = {f.name for f in dataclasses.fields(BlockConfig)}
  assert set(presets.fields(name)) <= names
  block = BlockConfig(width=8, num_heads=2, **presets.fields(name)).validate()
  assert presets.mismatches(block, name) == []


@pytest.mark.parametrize("name,make", [
    ("gpt2", lambda: gpt2.config(GPT2_HF).block),
    ("bert", lambda: bert.config(BERT_HF, "bert").block),
    ("bert", lambda: EncoderConfig().block),
    ("nanochat", lambda: nanochat.config(NANOCHAT).block),
])
def test_importers_build_on_their_preset(name, make):
  assert presets.mismatches(make(), name) == []


def test_exporters_refuse_a_block_off_the_preset_naming_the_field():
  cfg = gpt2.config(GPT2_HF)
  off = dataclasses.replace(cfg, block=dataclasses.replace(cfg.block, qkv_bias=False))
  with pytest.raises(ValueError, match=r"not a GPT-2-family GPT: qkv_bias=False \(GPT-2: True\)"):
    gpt2._check_family(off)
  chat = nanochat.config(NANOCHAT)
  off = dataclasses.replace(chat, block=dataclasses.replace(chat.block, norm_scale=True))
  with pytest.raises(ValueError, match=r"norm_scale=True \(nanochat: False\)"):
    nanochat._check_family(off)
  enc = EncoderConfig.create(depth=1, width=8, num_heads=2)
  off = dataclasses.replace(enc, block=dataclasses.replace(enc.block, out_bias=False))
  with pytest.raises(ValueError, match=r"out_bias=False \(albert: True\)"):
    bert._check_family(off, "albert")


def test_a_preset_is_a_copy_and_an_unknown_name_is_one_line():
  presets.fields("gpt2")["qkv_bias"] = False
  assert presets.PRESETS["gpt2"]["qkv_bias"] is True
  with pytest.raises(ValueError, match=r"compatibility preset must be one of \['bert', 'dit', 'gpt2', 'nanochat'\]; got 'opt'"):
    presets.fields("opt")
  assert isinstance(GPTConfig.create(depth=1, width=8, num_heads=2, **presets.fields("gpt2")), GPTConfig)
