"""attngeo.lm.tokenizer: byte and BPE tokenizers, the token_bytes table, saving and loading."""
import json
import re

import numpy as np
import pytest

from attngeo.lm import tokenizer as tok_lib

TEXT = "Café au lait, 2024 — naïve résumé! 12345 x\n\tend <|bos|>"


def training_texts():
  from pydoc_data import topics
  return [topics.topics[k] for k in sorted(topics.topics)][:30] + ["year 1999 and 20240101 and 3.14159"] * 20


def test_byte_tokenizer_ids_specials_and_table():
  tok = tok_lib.ByteTokenizer()
  assert tok.vocab_size == 256 + len(tok_lib.SPECIAL_TOKENS) and tok.bos_id == 256
  ids = tok.encode(TEXT, prepend=tok.bos_id)
  assert ids == [256] + list(TEXT.encode("utf-8"))        # a literal "<|bos|>" in text is ordinary bytes
  assert tok.decode(ids) == "<|bos|>" + TEXT
  table = tok.token_bytes()
  assert table.dtype == np.int32 and np.all(table[:256] == 1) and np.all(table[256:] == 0)
  assert tok.encode(["a", "bc"], prepend="<|bos|>") == [[256, 97], [256, 98, 99]]


def test_bpe_trains_to_the_vocab_size_and_tables_token_bytes():
  tok = tok_lib.BPETokenizer.train(training_texts(), 400)
  assert tok.vocab_size == 400 and tok.num_ordinary == 400 - len(tok_lib.SPECIAL_TOKENS)
  ids = tok.encode(TEXT)
  assert tok.decode(ids) == TEXT and len(ids) < len(TEXT.encode())
  # the byte table against tiktoken's own per-token bytes
  expect = [len(tok.enc.decode_single_token_bytes(i)) for i in range(tok.num_ordinary)]
  np.testing.assert_array_equal(tok.token_bytes(), expect + [0] * len(tok_lib.SPECIAL_TOKENS))
  assert sum(tok.token_bytes()[i] for i in ids) == len(TEXT.encode("utf-8"))
  # nanochat's split: numbers are chunked by at most two digits, so no token holds three digits
  assert not any(re.search(rb"\d\d\d", tok.id_bytes(i)) for i in range(tok.num_ordinary))
  assert tok.enc.encode_single_token("<|bos|>") == tok.bos_id


def test_save_load_roundtrip_and_bad_files(tmp_path):
  tok = tok_lib.BPETokenizer.train(training_texts(), 300)
  tok.save(str(tmp_path))
  back = tok_lib.load(str(tmp_path))
  assert back.encode(TEXT) == tok.encode(TEXT) and back.fingerprint() == tok.fingerprint()
  np.testing.assert_array_equal(np.load(tmp_path / "token_bytes.npy"), tok.token_bytes())
  assert not list(tmp_path.glob("*.tmp*"))
  with pytest.raises(FileNotFoundError, match=r"nowhere/tokenizer.json: no tokenizer file"):
    tok_lib.load(str(tmp_path / "nowhere"))
  (tmp_path / "tokenizer.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"tokenizer.json: not a valid attngeo tokenizer file"):
    tok_lib.load(str(tmp_path))
  (tmp_path / "tokenizer.json").write_text(json.dumps({"kind": "word", "specials": list(tok_lib.SPECIAL_TOKENS)}))
  with pytest.raises(ValueError, match="kind must be one of"):
    tok_lib.load(str(tmp_path))


def test_bad_arguments():
  with pytest.raises(ValueError, match="vocab_size must be at least 265"):
    tok_lib.BPETokenizer.train(["abc"], 100)
  with pytest.raises(ValueError, match="tokenizer must be one of"):
    tok_lib.create("word")
  with pytest.raises(TypeError, match="text must be a str"):
    tok_lib.ByteTokenizer().encode(5)
