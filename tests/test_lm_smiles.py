"""The SMILES tokenizer against the packages' own regexes (read from their source) and HF's BertTokenizer."""
import ast
import importlib.util
import os
import re

import numpy as np
import pytest

from attngeo.lm import smiles as sm

REACTIONS = [  # reaction SMILES of the kind both checkpoints were trained on (USPTO style, atom-map free)
  "CC(C)S.CN(C)C=O.Fc1cccnc1F.O=C([O-])[O-].[K+].[K+]>>CC(C)Sc1ncccc1F",
  "C1COCCO1.CC(C)(C)OC(=O)CONC(=O)NCc1cccc2ccccc12.Cl>>O=C(O)CONC(=O)NCc1cccc2ccccc12",
  "[Na+].[OH-].CCOC(=O)c1ccc(Br)cc1>>O=C(O)c1ccc(Br)cc1",
  "C[C@H](N)C(=O)O.O=C(Cl)c1ccccc1>>C[C@H](NC(=O)c1ccccc1)C(=O)O",
  "CC%12CCCCC%12.c1ccc2c(c1)[nH]c1ccccc12~[Pt]",
]


def _site(package):
  spec = importlib.util.find_spec(package)
  if spec is None:
    pytest.skip(f"{package} is not installed (pip install --no-deps {package})")
  return os.path.dirname(spec.origin)


def _package_pattern(package, module):
  """SMI_REGEX_PATTERN as the package's source file assigns it (parsed, never imported)."""
  with open(os.path.join(_site(package), module), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SMI_REGEX_PATTERN" for t in node.targets):
      return ast.literal_eval(node.value)
  raise AssertionError(f"no SMI_REGEX_PATTERN in {package}/{module}")


def _vocab_path(package="rxnfp", model="bert_pretrained"):
  return os.path.join(_site(package), "models", "transformers", model, "vocab.txt")


def _reference_ids(pattern, vocab_path, smiles):
  """The packages' logic: re.findall tokens, id = line number, absent → [UNK], [CLS] … [SEP]."""
  with open(vocab_path, encoding="utf-8") as f:
    lines = [t.rstrip("\n") for t in f]
  ids = {t: i for i, t in enumerate(lines)}
  return [ids["[CLS]"]] + [ids.get(t, ids["[UNK]"]) for t in re.findall(pattern, smiles)] + [ids["[SEP]"]]


def test_patterns_are_the_packages():
  assert sm.RXNFP_PATTERN == _package_pattern("rxnfp", "tokenization.py")
  assert sm.RXNMAPPER_PATTERN == _package_pattern("rxnmapper", "smiles_utils.py")


@pytest.mark.parametrize("package,model,pattern", [("rxnfp", "bert_pretrained", "rxnfp"),
                                                   ("rxnmapper", "albert_heads_8_uspto_all_1310k", "rxnmapper")])
def test_encode_matches_the_packages_logic(package, model, pattern):
  path = _vocab_path(package, model)
  tok = sm.SmilesTokenizer.from_vocab(os.path.dirname(path), pattern=pattern)
  for s in REACTIONS[:4]:
    assert tok.encode(s) == _reference_ids(sm.PATTERNS[pattern], path, s)
    assert tok.decode(tok.encode(s)) == s


def test_rxnfp_ring_bond_and_pipe_tokens():
  tok = sm.SmilesTokenizer.from_vocab(_vocab_path(), pattern="rxnfp")
  assert tok.tokenize("C%(123)CC|") == ["C", "%(123)", "C", "C", "|"]
  with pytest.raises(ValueError, match=r"position 1 \('%'\)"):
    sm.SmilesTokenizer.from_vocab(_vocab_path(), pattern="rxnmapper").tokenize("C%(123)C")


def test_encode_matches_transformers_bert_tokenizer():
  """HF's (python) BertTokenizer with the regex as `_tokenize`, as rxnfp's SmilesTokenizer subclasses it."""
  legacy = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy")
  pattern = _package_pattern("rxnfp", "tokenization.py")

  class Reference(legacy.BertTokenizerLegacy):
    def _tokenize(self, text, **kwargs):
      return re.findall(pattern, text)

  path = _vocab_path()
  ref = Reference(path, do_lower_case=False)
  tok = sm.SmilesTokenizer.from_vocab(path)
  for s in REACTIONS:
    assert tok.encode(s) == ref.encode(s)
  enc = ref(REACTIONS, padding="longest")
  ids, mask = tok.batch(REACTIONS)
  np.testing.assert_array_equal(ids, np.array(enc["input_ids"]))
  np.testing.assert_array_equal(mask, np.array(enc["attention_mask"], bool))
  assert ids.dtype == np.int32 and mask.dtype == bool


def test_batch_pads_to_length_and_unknown_tokens():
  tok = sm.SmilesTokenizer.from_vocab(_vocab_path())
  ids, mask = tok.batch(["CCO", "[Xx+]C"], length=8)
  assert ids.shape == mask.shape == (2, 8)
  assert ids[1, 1] == tok.unk_id and ids[1, 2] == tok.token_id("C")
  assert mask.sum(1).tolist() == [5, 4] and (ids[~mask] == tok.pad_id).all()
  special = tok.special_ids
  assert special[[tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id]].all()
  assert not special[tok.token_id("c")] and special.sum() == 5 + sum(t.startswith("[unused") for t in tok.vocab)


def test_unsplittable_smiles_names_the_position():
  tok = sm.SmilesTokenizer.from_vocab(_vocab_path())
  with pytest.raises(ValueError, match=r"position 3 \('X'\)") as e:
    tok.encode("CCOXC")
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"smiles\[1\]: SMILES 'C C' cannot be split at position 1"):
    tok.batch(["CC", "C C"])


@pytest.mark.parametrize("call,err,msg", [
  (lambda t: t.batch(["CCCCC"], length=4), ValueError, r"smiles\[0\] has 7 tokens.*length=4"),
  (lambda t: t.batch([]), ValueError, "at least one"),
  (lambda t: t.batch("CCO"), TypeError, "list of str"),
  (lambda t: t.batch(["CCO"], length=2), ValueError, "length must be"),
  (lambda t: t.encode(""), ValueError, "empty"),
  (lambda t: t.encode(3), TypeError, "must be a str"),
  (lambda t: t.decode([591]), ValueError, r"\[0, 591\)"),
])
def test_bad_input_is_one_line(call, err, msg):
  tok = sm.SmilesTokenizer.from_vocab(_vocab_path())
  with pytest.raises(err, match=msg):
    call(tok)


def test_vocab_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="no vocab file"):
    sm.SmilesTokenizer.from_vocab(tmp_path)
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nC\n")
  with pytest.raises(ValueError, match=r"lacks the special token\(s\) \[MASK\]"):
    sm.SmilesTokenizer.from_vocab(tmp_path)
  (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nC\nC\n")
  with pytest.raises(ValueError, match="'C' twice"):
    sm.SmilesTokenizer.from_vocab(tmp_path)


def test_equal_length_batches_have_no_padding():
  tok = sm.SmilesTokenizer.from_vocab(_vocab_path())
  smiles = ["CCO", "CCCO", "CCN", "c1ccccc1", "CCC", "OCO"]        # token lengths 5, 6, 5, 10, 5, 5
  np.testing.assert_array_equal(tok.equal_length(smiles, 2), tok.batch(["CCO", "CCN"]).ids)
  assert tok.equal_length(smiles, 1, length=10).shape == (1, 10)
  with pytest.raises(ValueError, match=r"1 SMILES have exactly 6 tokens, 2 asked; the commonest lengths are \[5, "):
    tok.equal_length(smiles, 2, length=6)
