"""MOSES and reaction SMILES offline: counts, deterministic subsets, the tokenizer covers them, one-line errors."""
import gzip
import importlib.util

import numpy as np
import pytest

from attngeo.data import molecules as mol
from attngeo.lm.smiles import SmilesTokenizer


@pytest.fixture(scope="module")
def moses_test_file():
  try:
    return mol.wheel_file("molsets", "dataset", "data", "test.csv.gz")
  except FileNotFoundError:
    pytest.skip(f"molsets not installed ({mol.INSTALL})")


def test_moses_test_split_is_the_file_and_subsets_are_deterministic(moses_test_file):
  with gzip.open(moses_test_file, "rt") as f:
    lines = f.read().splitlines()
  assert lines[0] == "SMILES"
  rows = mol.moses("test")
  assert rows == lines[1:] and len(rows) == 176074
  a, b = mol.moses("test", n=50, seed=3), mol.moses("test", n=50, seed=3)
  assert a == b and len(set(a)) == 50 and set(a) <= set(rows)
  assert a != mol.moses("test", n=50, seed=4)
  order = [rows.index(s) for s in a]
  assert order == sorted(order)


def test_the_tokenizer_splits_real_molecules_and_reactions(moses_test_file):
  tok = SmilesTokenizer.from_vocab(mol.wheel_file("rxnfp", "models", "transformers", "bert_pretrained"))
  rxns = mol.reactions()
  assert len(rxns) == 500 and all(r.count(">>") == 1 for r in rxns)
  ids, mask = tok.batch(rxns + mol.moses("test", n=300))
  assert ids.shape[1] <= 512 and not (ids[mask] == tok.unk_id).any()
  assert mol.reactions(n=7, seed=1) == [rxns[i] for i in np.sort(np.random.default_rng(1).choice(500, 7, False))]


def test_load_files(tmp_path):
  (tmp_path / "a.txt").write_text("# two molecules\nCCO\n\nc1ccccc1\n")
  assert mol.load(tmp_path / "a.txt") == ["CCO", "c1ccccc1"]
  with gzip.open(tmp_path / "b.csv.gz", "wt") as f:
    f.write("id,rxn\n1,CCO>>CC=O\n2,CC>>C=C\n")
  assert mol.load(str(tmp_path / "b.csv.gz"), n=1, seed=0) in (["CCO>>CC=O"], ["CC>>C=C"])
  assert mol.load("reactions", n=3) == mol.reactions(n=3)


@pytest.mark.parametrize("call,err,msg", [
  (lambda p: mol.load(p / "missing.txt"), FileNotFoundError, "data must be one of moses, moses-train, reactions"),
  (lambda p: mol.load(p / "empty.txt"), ValueError, "holds no SMILES"),
  (lambda p: mol.load(p / "c.csv"), ValueError, "no column named SMILES or smiles or rxn"),
  (lambda p: mol.load(p / "bin.txt"), ValueError, "not UTF-8"),
  (lambda p: mol.reactions(n=501), ValueError, r"n must be an int in \[1, 500\]"),
  (lambda p: mol.reactions(n=2, seed=-1), ValueError, "seed must be"),
  (lambda p: mol.moses("valid"), ValueError, "split must be one of"),
  (lambda p: mol.load(3), TypeError, "source must be"),
])
def test_bad_input_is_one_line(tmp_path, call, err, msg):
  (tmp_path / "empty.txt").write_text("# nothing\n\n")
  (tmp_path / "c.csv").write_text("name,formula\nethanol,CCO\n")
  (tmp_path / "bin.txt").write_bytes(b"CC\xff\xfeO\n")
  with pytest.raises(err, match=msg) as e:
    call(tmp_path)
  assert "\n" not in str(e.value)


def test_absent_wheel_names_the_install_line(monkeypatch):
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "moses" else real(name, *a))
  mol._moses_rows.cache_clear()
  with pytest.raises(FileNotFoundError, match=r"molsets is not installed; .*pip install --no-deps molsets==0.3.1"):
    mol.moses("test", n=3)
  mol._moses_rows.cache_clear()
