"""Chemistry text offline: MOSES molecule SMILES and USPTO reaction SMILES.

* `moses(split, n=None, seed=0)` — the MOSES benchmark's molecules (Polykovskiy et al. 2020) as the
  `molsets` 0.3.1 wheel (MIT) ships them: `moses/dataset/data/{train, test, test_scaffolds}.csv.gz`
  (1,584,663 / 176,074 / 176,226 SMILES, one column `SMILES`), read by path, never imported (its
  dependencies are not needed). `n` draws a deterministic subset: `n` distinct rows chosen by
  `numpy.random.default_rng(seed).choice(N, n, replace=False)`, kept in file order.
* `reactions(n=None, seed=0)` — 500 USPTO reaction SMILES (`precursors>>products`, atom-map free):
  the first 500 rows of `examples/example_rxns.csv` of github.com/rxn4chemistry/rxnmapper (MIT,
  commit a01ecdc), committed as `reactions.txt` beside this module (no rxnfp/rxnmapper wheel ships
  reactions); the same subset rule.
* `load(source, n=None, seed=0)` — "moses" (the test split: held out from MOSES train), "moses-train",
  "reactions", or a path: a text file of one SMILES per line (blank and `#` lines skipped), or a
  `.csv`/`.csv.gz` with a `SMILES`, `smiles` or `rxn` column.
* `wheel_file(distribution, *parts)` — a file inside an installed wheel (`parts` below its package
  folder), found with `importlib.util.find_spec` (never imported); absent → FileNotFoundError naming
  the install line, `pip install --no-deps molsets==0.3.1 rxnfp==0.1.0 rxnmapper==0.4.3`.
"""
from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
import io
import os

import numpy as np

from attngeo import errors

WHEELS = {"molsets": "moses", "rxnfp": "rxnfp", "rxnmapper": "rxnmapper"}  # distribution → import name
VERSIONS = {"molsets": "0.3.1", "rxnfp": "0.1.0", "rxnmapper": "0.4.3"}
INSTALL = "pip install --no-deps " + " ".join(f"{d}=={v}" for d, v in VERSIONS.items())
MOSES_SPLITS = ("train", "test", "test_scaffolds")
SOURCES = ("moses", "moses-train", "reactions")
REACTIONS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reactions.txt")
COLUMNS = ("SMILES", "smiles", "rxn")


def wheel_file(distribution: str, *parts: str) -> str:
  """Path of `parts` inside the installed `distribution` (a key of `WHEELS`), never importing it."""
  if distribution not in WHEELS:
    raise ValueError(f"distribution must be one of {sorted(WHEELS)}; got {distribution!r}")
  spec = importlib.util.find_spec(WHEELS[distribution])
  root = None if spec is None or not spec.submodule_search_locations else list(spec.submodule_search_locations)[0]
  path = None if root is None else os.path.join(root, *parts)
  if path is None or not os.path.exists(path):
    what = f"{distribution} is not installed" if root is None else f"{distribution} lacks {'/'.join(parts)}"
    raise FileNotFoundError(f"{what}; install the chemistry wheels with: {INSTALL}")
  return path


def _subset(rows: tuple[str, ...], n: int | None, seed: int, what: str) -> list[str]:
  if n is None:
    return list(rows)
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= len(rows):
    raise ValueError(f"n must be an int in [1, {len(rows)}] (the {what} rows) or None; got {n!r}")
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise ValueError(f"seed must be a non-negative int; got {seed!r}")
  idx = np.sort(np.random.default_rng(int(seed)).choice(len(rows), int(n), replace=False))
  return [rows[i] for i in idx]


@functools.lru_cache(maxsize=4)
def _moses_rows(split: str) -> tuple[str, ...]:
  return _read_table(wheel_file("molsets", "dataset", "data", f"{split}.csv.gz"))


def moses(split: str = "test", n: int | None = None, seed: int = 0) -> list[str]:
  """MOSES SMILES of `split` (all, or a deterministic subset of `n`)."""
  if split not in MOSES_SPLITS:
    raise ValueError(f"split must be one of {MOSES_SPLITS}; got {split!r}")
  return _subset(_moses_rows(split), n, seed, f"MOSES {split}")


@functools.lru_cache(maxsize=1)
def _reaction_rows() -> tuple[str, ...]:
  return _read_lines(REACTIONS_FILE)


def reactions(n: int | None = None, seed: int = 0) -> list[str]:
  """The committed USPTO reaction SMILES (all, or a deterministic subset of `n`)."""
  return _subset(_reaction_rows(), n, seed, "reaction")


def load(source: str, n: int | None = None, seed: int = 0) -> list[str]:
  """SMILES of a named source (`SOURCES`) or a file (text: one per line; CSV: a `COLUMNS` column)."""
  if not isinstance(source, (str, os.PathLike)):
    raise errors.InputTypeError(f"source must be one of {SOURCES} or a file path; got {type(source).__name__}")
  if source == "moses":
    return moses("test", n, seed)
  if source == "moses-train":
    return moses("train", n, seed)
  if source == "reactions":
    return reactions(n, seed)
  path = os.fspath(source)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data must be one of {', '.join(SOURCES)} or a SMILES file; no file {path}")
  rows = _read_table(path) if path.endswith((".csv", ".csv.gz")) else _read_lines(path)
  return _subset(rows, n, seed, path)


def _open_text(path: str):
  raw = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
  return io.TextIOWrapper(raw, encoding="utf-8", newline="")


def _read_lines(path: str) -> tuple[str, ...]:
  try:
    with _open_text(path) as f:
      rows = tuple(s for s in (line.strip() for line in f) if s and not s.startswith("#"))
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not UTF-8 text (byte {e.start})") from None
  if not rows:
    raise ValueError(f"{path} holds no SMILES (one per line expected)")
  return rows


def _read_table(path: str) -> tuple[str, ...]:
  try:
    with _open_text(path) as f:
      reader = csv.reader(f)
      header = next(reader, [])
      col = next((header.index(c) for c in COLUMNS if c in header), None)
      if col is None:
        raise ValueError(f"{path} has no column named {' or '.join(COLUMNS)}; its header is {header}")
      rows = tuple(r[col].strip() for r in reader if len(r) > col and r[col].strip())
  except (UnicodeDecodeError, gzip.BadGzipFile, EOFError) as e:
    raise ValueError(f"{path} is not a readable CSV ({type(e).__name__})") from None
  if not rows:
    raise ValueError(f"{path} holds no SMILES below its header")
  return rows
