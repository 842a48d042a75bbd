"""The SMILES / reaction-SMILES tokenizer of the rxnfp BERT and rxnmapper ALBERT checkpoints.

Both packages split a SMILES with one regular expression (`re.findall`, one token per match) and
map each token to its line number in the checkpoint's `vocab.txt` (a token absent from the vocab
becomes `[UNK]`, as `BertTokenizer._convert_token_to_id` does); a sequence is
`[CLS] t_1 … t_m [SEP]` and a batch is right-padded with `[PAD]`:

* `RXNFP_PATTERN` — `rxnfp.tokenization.SMI_REGEX_PATTERN` (0.1.0), the default;
* `RXNMAPPER_PATTERN` — `rxnmapper.smiles_utils.SMI_REGEX_PATTERN` (0.4.3): the same alternatives
  less `%(nnn)` ring bonds and `|`. On every string the rxnmapper regex splits fully the two give the
  same tokens (the two extra alternatives need a `%(` or a `|`, which the rxnmapper one cannot split).

`re.findall` silently skips characters no alternative matches (`"C%C"` → `C`, `C`); here a SMILES
must be split fully (the concatenated tokens give the SMILES back) or `encode` raises one line that
names the first position no token starts at. The vocab file must hold `[PAD] [UNK] [CLS] [SEP] [MASK]`
once each. `decode` joins the tokens (dropping `[PAD] [CLS] [SEP]`), so `decode(encode(s)) == s`
for every SMILES whose tokens are in the vocab. Pure Python + numpy, no JAX.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import NamedTuple

import numpy as np

from attngeo import errors

RXNFP_PATTERN = (r"(\%\([0-9]{3}\)|\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\||\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>>?|"
                 r"\*|\$|\%[0-9]{2}|[0-9])")
RXNMAPPER_PATTERN = (r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>>?|\*|\$|"
                     r"\%[0-9]{2}|[0-9])")
PATTERNS = {"rxnfp": RXNFP_PATTERN, "rxnmapper": RXNMAPPER_PATTERN}
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
VOCAB_FILE = "vocab.txt"


class Batch(NamedTuple):
  ids: np.ndarray   # [b, n] int32, right-padded with [PAD]
  mask: np.ndarray  # [b, n] bool, True on real tokens ([CLS] … [SEP])


def read_vocab(path: str) -> tuple[str, ...]:
  """Tokens of a `vocab.txt` (one per line, id = line number; `path` may be its folder)."""
  path = os.fspath(path)
  if os.path.isdir(path):
    path = os.path.join(path, VOCAB_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"vocab: no vocab file at {path}")
  with open(path, encoding="utf-8") as f:
    tokens = tuple(line.rstrip("\n") for line in f)
  missing = [t for t in SPECIAL_TOKENS if t not in tokens]
  if missing:
    raise ValueError(f"vocab {path} lacks the special token(s) {', '.join(missing)}")
  seen = set()
  for i, t in enumerate(tokens):
    if t in seen:
      raise ValueError(f"vocab {path} holds {t!r} twice (line {i + 1}); each token must appear once")
    seen.add(t)
  return tokens


@dataclasses.dataclass(frozen=True)
class SmilesTokenizer:
  """Regex split + vocab lookup; `vocab[i]` is the token of id `i`, `pattern` one of `PATTERNS`'."""
  vocab: tuple[str, ...]
  pattern: str = RXNFP_PATTERN

  def __post_init__(self):
    missing = [t for t in SPECIAL_TOKENS if t not in self.vocab]
    if missing:
      raise ValueError(f"vocab lacks the special token(s) {', '.join(missing)}")
    object.__setattr__(self, "_ids", {t: i for i, t in enumerate(self.vocab)})
    object.__setattr__(self, "_regex", re.compile(self.pattern))

  @classmethod
  def from_vocab(cls, path: str, pattern: str = "rxnfp") -> "SmilesTokenizer":
    """The tokenizer of a checkpoint's `vocab.txt` (or the folder holding it); `pattern` "rxnfp"
    (BERT checkpoints) or "rxnmapper" (the ALBERT), or a regex of one group."""
    return cls(read_vocab(path), PATTERNS.get(pattern, pattern))

  @property
  def vocab_size(self) -> int:
    return len(self.vocab)

  def token_id(self, token: str) -> int:
    """Id of `token` ([UNK]'s when absent)."""
    return self._ids.get(token, self._ids["[UNK]"])

  pad_id = property(lambda self: self._ids["[PAD]"])
  unk_id = property(lambda self: self._ids["[UNK]"])
  cls_id = property(lambda self: self._ids["[CLS]"])
  sep_id = property(lambda self: self._ids["[SEP]"])
  mask_id = property(lambda self: self._ids["[MASK]"])

  @property
  def special_ids(self) -> np.ndarray:
    """[V] bool: True on `[PAD] [UNK] [CLS] [SEP] [MASK]` and the `[unusedN]` placeholders."""
    return np.array([t in SPECIAL_TOKENS or (t.startswith("[unused") and t.endswith("]")) for t in self.vocab])

  def tokenize(self, smiles: str) -> list[str]:
    """The regex's tokens of `smiles`, which they must cover fully (else a ValueError naming the position)."""
    if not isinstance(smiles, str):
      raise errors.InputTypeError(f"smiles must be a str; got {type(smiles).__name__}")
    if not smiles:
      raise ValueError("smiles is empty")
    tokens, pos = [], 0
    for m in self._regex.finditer(smiles):
      if m.start() != pos:
        break
      tokens.append(m.group(0))
      pos = m.end()
    if pos != len(smiles):
      raise ValueError(f"SMILES {_short(smiles)} cannot be split at position {pos} ({smiles[pos]!r}): "
                       "no token of the regex starts there")
    return tokens

  def encode(self, smiles: str) -> list[int]:
    """`[CLS] tokens [SEP]` ids of one SMILES."""
    return [self.cls_id] + [self.token_id(t) for t in self.tokenize(smiles)] + [self.sep_id]

  def decode(self, ids) -> str:
    """The SMILES of `ids`: tokens joined, `[PAD] [CLS] [SEP]` dropped, other specials by name."""
    drop = {self.pad_id, self.cls_id, self.sep_id}
    out = []
    for i in (int(x) for x in np.asarray(ids).reshape(-1)):
      if not 0 <= i < self.vocab_size:
        raise ValueError(f"ids must lie in [0, {self.vocab_size}); got {i}")
      if i not in drop:
        out.append(self.vocab[i])
    return "".join(out)

  def batch(self, smiles: list[str], length: int | None = None) -> Batch:
    """Right-padded ids `[b, n]` int32 and mask `[b, n]` bool; `n` = `length` or the longest sequence."""
    if isinstance(smiles, str) or not isinstance(smiles, (list, tuple)):
      raise errors.InputTypeError(f"smiles must be a list of str; got {type(smiles).__name__}")
    if not smiles:
      raise ValueError("smiles must hold at least one SMILES; got an empty list")
    if length is not None and (isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 3):
      raise ValueError(f"length must be an int >= 3 ([CLS], one token, [SEP]) or None; got {length!r}")
    seqs = []
    for i, s in enumerate(smiles):
      try:
        seqs.append(self.encode(s))
      except (TypeError, ValueError) as e:
        raise type(e)(f"smiles[{i}]: {e}") from None
    n = max(map(len, seqs)) if length is None else int(length)
    ids = np.full((len(seqs), n), self.pad_id, np.int32)
    mask = np.zeros((len(seqs), n), bool)
    for i, seq in enumerate(seqs):
      if len(seq) > n:
        raise ValueError(f"smiles[{i}] has {len(seq)} tokens with [CLS] and [SEP]; length={n}")
      ids[i, :len(seq)] = seq
      mask[i, :len(seq)] = True
    return Batch(ids, mask)


  def equal_length(self, smiles: list[str], count: int, length: int | None = None) -> np.ndarray:
    """ids [count, length] int32 of the first `count` SMILES (in list order) with exactly `length` tokens
    ([CLS] and [SEP] included): a batch without padding. `length` None: the commonest length (the
    shortest among equals)."""
    seqs = [self.encode(s) for s in smiles]
    lengths = np.bincount([len(q) for q in seqs])
    n = int(np.argmax(lengths)) if length is None else int(length)
    picked = [q for q in seqs if len(q) == n][:count]
    if len(picked) < count:
      common = [int(x) for x in np.argsort(-lengths, kind="stable")[:3]]
      raise ValueError(f"{len(picked)} SMILES have exactly {n} tokens, {count} asked; the commonest lengths are "
                       f"{common}")
    return np.asarray(picked, np.int32)


def _short(s: str, limit: int = 60) -> str:
  return repr(s if len(s) <= limit else s[:limit] + "…")
