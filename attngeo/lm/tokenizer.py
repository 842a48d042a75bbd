"""Tokenizers: byte-level (the default) and byte-level BPE (nanochat's: rustbpe training, tiktoken encoding).

Both map text to ids in `[0, V)` with the same special tokens appended after the ordinary ones
(`SPECIAL_TOKENS`, nanochat's list; `<|bos|>` opens every document):

* `ByteTokenizer` — id = the UTF-8 byte (0–255), specials from 256: `V = 256 + 9`.
* `BPETokenizer` — GPT-4-style byte-level BPE with nanochat's split pattern (`\\p{N}{1,2}`: at most two
  digits per chunk), trained locally by `rustbpe` to `vocab_size − 9` ordinary tokens (256 bytes plus
  merges, rank = id), encoded by `tiktoken` (the same pair nanochat uses, so its tokenizers load here).

`token_bytes()` is nanochat's bpb table: `[V]` int32, the UTF-8 byte length of each ordinary token and
0 for specials (which bits-per-byte therefore never counts). `save(dir)` writes `tokenizer.json`
(JSON only: the merge table as base64 token bytes in rank order, never a pickle) and `token_bytes.npy`
atomically; `load(dir)` reads it back. Text given to `encode` is ordinary text: a literal
`<|bos|>` in it is encoded as its characters, never as the special id.
"""
from __future__ import annotations

import base64
import json
import os
from typing import Iterable

import numpy as np

from attngeo import errors, files

SPECIAL_TOKENS = ("<|bos|>", "<|user_start|>", "<|user_end|>", "<|assistant_start|>", "<|assistant_end|>",
                  "<|python_start|>", "<|python_end|>", "<|output_start|>", "<|output_end|>")
BOS = "<|bos|>"
# nanochat's GPT-4-style pre-tokeniser split (numbers in chunks of at most two digits).
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
                 r"""\s*[\r\n]|\s+(?!\S)|\s+""")
FILE = "tokenizer.json"
KINDS = ("byte", "bpe")


class _Base:
  kind = ""

  @property
  def bos_id(self) -> int:
    return self.special_id(BOS)

  def special_id(self, name: str) -> int:
    if name not in SPECIAL_TOKENS:
      raise ValueError(f"unknown special token {name!r}; known: {SPECIAL_TOKENS}")
    return self.num_ordinary + SPECIAL_TOKENS.index(name)

  @property
  def vocab_size(self) -> int:
    return self.num_ordinary + len(SPECIAL_TOKENS)

  def __call__(self, text, prepend: int | str | None = None):
    return self.encode(text, prepend=prepend)

  def encode(self, text: str | list[str], prepend: int | str | None = None):
    """Ids of `text` (a str → list[int]; a list of str → list of lists), `prepend` (an id or a
    special token's name, e.g. BOS) first."""
    first = [] if prepend is None else [prepend if isinstance(prepend, int) else self.special_id(prepend)]
    if isinstance(text, str):
      return first + self._encode([text])[0]
    if isinstance(text, (list, tuple)):
      return [first + ids for ids in self._encode(list(text))]
    raise errors.InputTypeError(f"text must be a str or a list of str; got {type(text).__name__}")

  def token_bytes(self) -> np.ndarray:
    """[V] int32: UTF-8 byte length of each ordinary token, 0 for special tokens (nanochat's table)."""
    out = np.zeros(self.vocab_size, np.int32)
    out[:self.num_ordinary] = [len(self.id_bytes(i)) for i in range(self.num_ordinary)]
    return out

  def decode(self, ids) -> str:
    """Text of `ids`; special tokens are written by name, invalid UTF-8 as U+FFFD."""
    parts, buf = [], b""
    for i in (int(x) for x in ids):
      if i >= self.num_ordinary:
        parts.append(buf.decode("utf-8", errors="replace") + SPECIAL_TOKENS[i - self.num_ordinary])
        buf = b""
      else:
        buf += self.id_bytes(i)
    return "".join(parts) + buf.decode("utf-8", errors="replace")

  def fingerprint(self) -> str:
    return files.fingerprint(self.to_dict())

  def save(self, directory: str) -> None:
    """Write `directory/tokenizer.json` and `directory/token_bytes.npy` (atomically)."""
    os.makedirs(directory, exist_ok=True)
    files.atomic_write(os.path.join(directory, FILE), json.dumps(self.to_dict()))
    files.atomic_npy(os.path.join(directory, "token_bytes.npy"), self.token_bytes())


class ByteTokenizer(_Base):
  """UTF-8 bytes as ids 0–255; `SPECIAL_TOKENS` at 256… (V = 265)."""
  kind = "byte"
  num_ordinary = 256

  def _encode(self, texts):
    return [list(t.encode("utf-8")) for t in texts]

  def id_bytes(self, i: int) -> bytes:
    return bytes([i]) if 0 <= i < 256 else b""

  def to_dict(self) -> dict:
    return {"kind": self.kind, "specials": list(SPECIAL_TOKENS)}


class BPETokenizer(_Base):
  """Byte-level BPE: `ranks` maps token bytes → id (rank order: the 256 bytes, then merges)."""
  kind = "bpe"

  def __init__(self, ranks: dict[bytes, int], pattern: str = SPLIT_PATTERN):
    import tiktoken
    if sorted(ranks.values()) != list(range(len(ranks))):
      raise ValueError("BPE ranks must be the ids 0..n-1, each once")
    self.ranks, self.pattern, self.num_ordinary = dict(ranks), pattern, len(ranks)
    self._by_id = [b""] * len(ranks)
    for tok, i in ranks.items():
      self._by_id[i] = tok
    specials = {name: len(ranks) + j for j, name in enumerate(SPECIAL_TOKENS)}
    self.enc = tiktoken.Encoding(name="attngeo-bpe", pat_str=pattern, mergeable_ranks=self.ranks,
                                 special_tokens=specials)

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, pattern: str = SPLIT_PATTERN) -> "BPETokenizer":
    """Train on `texts` with rustbpe to `vocab_size` ids in all (`vocab_size − 9` ordinary tokens)."""
    import rustbpe
    ordinary = vocab_size - len(SPECIAL_TOKENS)
    if ordinary < 256:
      raise ValueError(f"vocab_size must be at least {256 + len(SPECIAL_TOKENS)} (256 bytes + "
                       f"{len(SPECIAL_TOKENS)} specials); got {vocab_size}")
    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(texts), ordinary, pattern=pattern)
    return cls({bytes(tok): rank for tok, rank in trainer.get_mergeable_ranks()}, trainer.get_pattern())

  def _encode(self, texts):
    return self.enc.encode_ordinary_batch(texts) if len(texts) > 1 else [self.enc.encode_ordinary(texts[0])]

  def id_bytes(self, i: int) -> bytes:
    return self._by_id[i] if 0 <= i < self.num_ordinary else b""

  def to_dict(self) -> dict:
    return {"kind": self.kind, "specials": list(SPECIAL_TOKENS), "pattern": self.pattern,
            "ranks": [base64.b64encode(t).decode("ascii") for t in self._by_id]}


def create(kind: str = "byte", texts: Iterable[str] | None = None, vocab_size: int = 4096):
  """A byte tokenizer, or a BPE tokenizer trained on `texts` to `vocab_size`."""
  if kind == "byte":
    return ByteTokenizer()
  if kind == "bpe":
    if texts is None:
      raise ValueError("a BPE tokenizer needs texts to train on")
    return BPETokenizer.train(texts, vocab_size)
  raise ValueError(f"tokenizer must be one of {KINDS}; got {kind!r}")


def from_dict(d: dict):
  if d.get("specials") != list(SPECIAL_TOKENS):
    raise ValueError(f"tokenizer special tokens {d.get('specials')} differ from {list(SPECIAL_TOKENS)}")
  if d.get("kind") == "byte":
    return ByteTokenizer()
  if d.get("kind") == "bpe":
    return BPETokenizer({base64.b64decode(t): i for i, t in enumerate(d["ranks"])}, d["pattern"])
  raise ValueError(f"tokenizer kind must be one of {KINDS}; got {d.get('kind')!r}")


def load(directory: str):
  """The tokenizer saved in `directory` (a run folder's `tokenizer/`)."""
  path = os.path.join(directory, FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path}: no tokenizer file (a run folder keeps its tokenizer in tokenizer/{FILE})")
  try:
    with open(path) as f:
      d = json.load(f)
    return from_dict(d)
  except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
    raise ValueError(f"{path}: not a valid attngeo tokenizer file ({e})") from None
