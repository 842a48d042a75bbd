"""BERT / ALBERT import ⇄ transformers' own classes (eager attention, float32), export, the CLI, bad input.

The references are `transformers`' BertModel/AlbertModel family run on the same weights: on the real
checkpoints that ship in the rxnfp and rxnmapper wheels (`pip install --no-deps rxnfp==0.1.0
rxnmapper==0.4.3`, the `chem` extra for torch + transformers; .ci/run installs both) and on tiny
random models saved by `save_pretrained`. Hidden states of every layer, every layer's attention
probabilities and the MLM / classifier logits must agree to 1e-4 (absolute, float32).
"""
import importlib
import importlib.util
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

# torch and transformers (the chem extra) load at the first test that uses them, not while every xdist worker
# collects the suite (2.3 s each); without them the module is skipped. Collection probes every module-level
# name (`__test__`, `__wrapped__`, `_mock_name`, …): a private name is answered without the import.
pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("torch", "transformers")),
                                reason="needs the chem extra (torch, transformers)")


class _OnFirstUse:
  def __init__(self, name):
    self._name = name

  def __getattr__(self, attr):
    if attr.startswith("_"):
      raise AttributeError(attr)
    return getattr(importlib.import_module(self._name), attr)


torch, transformers = _OnFirstUse("torch"), _OnFirstUse("transformers")

from attngeo import cli, interop, operators, runs  # noqa: E402
from attngeo.interop import layout, safetensors_io  # noqa: E402
from attngeo.nn import graft  # noqa: E402

TOL = 1e-4


def package_dir(name):
  spec = importlib.util.find_spec(name)            # the folder, the package not imported (its deps are absent)
  return None if spec is None else spec.submodule_search_locations[0]


def checkpoint(package, folder):
  root = package_dir(package)
  path = None if root is None else os.path.join(root, "models", "transformers", folder)
  if path is None or not os.path.isdir(path):
    pytest.skip(f"{package} is not installed (pip install --no-deps rxnfp==0.1.0 rxnmapper==0.4.3)")
  return path


REAL = {"bert_pretrained": ("rxnfp", "bert_pretrained", "bert", "BertForPreTraining"),
        "bert_ft": ("rxnfp", "bert_ft", "bert", "BertModel"),
        "bert_ft_10k_25s": ("rxnfp", "bert_ft_10k_25s", "bert", "BertForSequenceClassification"),
        "albert": ("rxnmapper", "albert_heads_8_uspto_all_1310k", "albert", "AlbertForMaskedLM")}


def token_batch(vocab_size, seed=0, n=48):
  """Two sequences [CLS] t… [SEP] of ids drawn from the vocab (special tokens 0–4 excluded), the second padded."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab_size, (2, n)).astype(np.int32)
  ids[:, 0] = 2
  ids[0, -1], ids[1, 31] = 3, 3
  mask = np.ones_like(ids, bool)
  mask[1, 32:] = False
  ids[1, 32:] = 0
  return ids, mask


# Reaction SMILES (inputs only): rxnmapper's README example and a Fischer esterification; the second is shorter,
# so the batch is padded.
REACTIONS = ["CC(C)S.CN(C)C=O.Fc1cccnc1F.O=C([O-])[O-].[K+].[K+]>>CC(C)Sc1ncccc1F", "CC(=O)O.OCC>>CC(=O)OCC"]


def reaction_batch(path, kind):
  """The reactions as the checkpoint's own tokenizer gives them (`attngeo.lm.smiles`, its vocab.txt)."""
  from attngeo.lm.smiles import SmilesTokenizer
  ids, mask = SmilesTokenizer.from_vocab(path, "rxnfp" if kind == "bert" else "rxnmapper").batch(REACTIONS)
  assert mask[1].sum() < mask[0].sum() and (ids != 1).all()                     # padded; no [UNK]
  return ids, mask


def reference(hf_model, ids, mask):
  with torch.no_grad():
    return hf_model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long),
                    output_hidden_states=True, output_attentions=True)


def hf_logits(out):
  """(MLM logits, classifier logits) of a transformers output (None where the class has no such head)."""
  if hasattr(out, "prediction_logits"):
    return out.prediction_logits, out.seq_relationship_logits
  logits = getattr(out, "logits", None)
  return (logits, None) if logits is not None and logits.ndim == 3 else (None, logits)


def assert_parity(model, out, ids, mask):
  """Every hidden state, every layer's attention P and the heads' logits against transformers' (real rows only)."""
  ids_j, mask_j = jnp.asarray(ids), jnp.asarray(mask)
  hs = model.hidden_states(ids_j, mask_j)
  assert len(hs) == len(out.hidden_states) == model.cfg.depth + 1
  for i, (a, b) in enumerate(zip(hs, out.hidden_states)):
    err = np.abs(np.asarray(a) - b.numpy())[mask].max()
    assert err <= TOL, f"hidden state {i}: {err}"
  for i, ref in enumerate(out.attentions):
    attn = model.layers[0 if model.cfg.shared_layers else i].attn
    q, k, _ = attn.qkv(hs[i])
    p = np.asarray(operators.markov_matrix(q, k, beta=1.0, alpha=1.0, mask=mask_j[:, None, None, :]))
    err = np.abs(p - ref.numpy()).transpose(0, 2, 1, 3)[mask].max()
    assert err <= TOL, f"attention of layer {i}: {err}"
  mlm, classes = hf_logits(out)
  if model.cfg.mlm_head:
    err = np.abs(np.asarray(model.mlm_logits(ids_j, mask_j)) - mlm.numpy())[mask].max()
    assert err <= TOL, f"MLM logits: {err}"
  if model.cfg.classifier:
    err = np.abs(np.asarray(model.class_logits(ids_j, mask_j)) - classes.numpy()).max()
    assert err <= TOL, f"classifier logits: {err}"


@pytest.mark.parametrize("name", ["bert_pretrained", "albert",
                                  pytest.param("bert_ft", marks=pytest.mark.slow),
                                  pytest.param("bert_ft_10k_25s", marks=pytest.mark.slow)])
def test_real_checkpoint_matches_transformers(name):
  package, folder, kind, cls = REAL[name]
  path = checkpoint(package, folder)
  model, info = interop.load(kind, path)
  assert info["file"].endswith("pytorch_model.bin")
  hf_model = getattr(transformers, cls).from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()
  for ids, mask in (reaction_batch(path, kind), token_batch(model.cfg.vocab_size)):
    assert_parity(model, reference(hf_model, ids, mask), ids, mask)


# ----------------------------------------------------------------------------- tiny random models

BERT_CFG = dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                max_position_embeddings=64, layer_norm_eps=1e-12, initializer_range=0.2)
TINY = {"BertModel": ("bert", {}), "BertForPreTraining": ("bert", {}),
        "BertForMaskedLM": ("bert", {"tie_word_embeddings": False}),
        "BertForSequenceClassification": ("bert", {"num_labels": 3}),
        "AlbertForMaskedLM": ("albert", {"embedding_size": 8, "num_hidden_layers": 3}),
        "AlbertModel": ("albert", {"embedding_size": 8})}


def tiny_hf(cls, folder, seed=0):
  kind, extra = TINY[cls]
  conf = (transformers.BertConfig if kind == "bert" else transformers.AlbertConfig)(**{**BERT_CFG, **extra})
  torch.manual_seed(seed)
  model = getattr(transformers, cls)(conf).eval()
  with torch.no_grad():                    # HF zeroes biases at init; random ones test their layout too
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
    params = dict(model.named_parameters())
    for name, p in params.items():         # untied (transformers 5), the decoder's bias is a second copy of `bias`
      if name.endswith("predictions.decoder.bias"):
        p.copy_(params[name.replace("decoder.bias", "bias")])
  model.save_pretrained(folder)
  return kind, model


@pytest.mark.parametrize("cls", list(TINY))
def test_tiny_models_match_and_round_trip_exactly(cls, tmp_path):
  kind, hf_model = tiny_hf(cls, tmp_path / "hf")
  model, _ = interop.load(kind, str(tmp_path / "hf"))
  ids, mask = token_batch(40, n=40)
  assert_parity(model, reference(hf_model, ids, mask), ids, mask)
  written = safetensors_io.read(str(tmp_path / "hf" / "model.safetensors"))
  interop.save(model, kind, str(tmp_path / "out" / "model.safetensors"))
  exported = safetensors_io.read(str(tmp_path / "out" / "model.safetensors"))
  assert set(exported) == set(written)                                   # what save_pretrained writes
  for key in written:
    np.testing.assert_array_equal(exported[key], written[key], err_msg=key)
  again, info = getattr(transformers, cls).from_pretrained(str(tmp_path / "out"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  back, _ = interop.load(kind, str(tmp_path / "out"))
  assert back.cfg == model.cfg
  for key, value in layout.params(model).items():
    np.testing.assert_array_equal(layout.params(back)[key], value, err_msg=key)


def test_pytorch_bin_and_bare_or_prefixed_bodies_are_read(tmp_path):
  _, hf_model = tiny_hf("BertForPreTraining", tmp_path / "hf")
  sd = hf_model.state_dict()                                    # tied decoder and decoder.bias included, as old files
  (tmp_path / "bin").mkdir()
  torch.save(sd, tmp_path / "bin" / "pytorch_model.bin")
  (tmp_path / "bin" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
  a, _ = interop.load("bert", str(tmp_path / "hf"))
  b, info = interop.load("bert", str(tmp_path / "bin"))
  assert info["file"].endswith(".bin") and a.cfg == b.cfg
  for key, value in layout.params(a).items():
    np.testing.assert_array_equal(layout.params(b)[key], value, err_msg=key)


class Evil:
  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, "w"))


@pytest.mark.parametrize("zipped", [True, False])
def test_a_pickle_that_is_not_a_tensor_dict_is_refused_never_run(tmp_path, zipped):
  """A torch file (zip, or the legacy pickle the rxnfp files are) whose pickle calls a function is refused unrun."""
  _, hf_model = tiny_hf("BertModel", tmp_path / "hf")
  os.remove(tmp_path / "hf" / "model.safetensors")
  sentinel, weights = tmp_path / "ran", tmp_path / "hf" / "pytorch_model.bin"
  torch.save({"embeddings.word_embeddings.weight": Evil(str(sentinel))}, weights,
             _use_new_zipfile_serialization=zipped)
  assert not sentinel.exists()
  with pytest.raises(ValueError, match="not a readable checkpoint") as e:
    interop.load("bert", str(tmp_path / "hf"))
  assert "\n" not in str(e.value) and not sentinel.exists()
  torch.save({**hf_model.state_dict(), "note": "not a tensor"}, weights, _use_new_zipfile_serialization=zipped)
  with pytest.raises(ValueError, match="flat state dict of tensors"):
    interop.load("bert", str(tmp_path / "hf"))


@pytest.mark.parametrize("edit, error, match", [
  (lambda d: os.remove(d / "model.safetensors"), FileNotFoundError, "neither model.safetensors nor pytorch_model.bin"),
  (lambda d: os.remove(d / "config.json"), FileNotFoundError, "no BERT config.json"),
  (lambda d: patch(d, hidden_size=32), ValueError, r"wrong shapes: .*\(expected"),
  (lambda d: patch(d, num_hidden_layers=3), ValueError, "the checkpoint has 2 layers, config.json num_hidden_layers=3"),
  (lambda d: patch(d, hidden_act="relu"), ValueError, "hidden_act='relu'"),
  (lambda d: patch(d, vocab_size=-1), ValueError, "positive integers"),
  (lambda d: (d / "config.json").write_text("[1, 2"), ValueError, "not valid JSON"),
])
def test_bad_folders_are_one_line(tmp_path, edit, error, match):
  tiny_hf("BertForPreTraining", tmp_path / "hf")
  edit(tmp_path / "hf")
  with pytest.raises(error, match=match) as e:
    interop.load("bert", str(tmp_path / "hf"))
  assert "\n" not in str(e.value)


def patch(folder, **fields):
  hf = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**hf, **fields}))


def test_untied_decoder_under_a_tying_config_is_refused(tmp_path):
  _, hf_model = tiny_hf("BertForPreTraining", tmp_path / "hf")
  sd = {k: v.clone() for k, v in hf_model.state_dict().items()}
  sd["cls.predictions.decoder.weight"] += 1
  torch.save(sd, tmp_path / "hf" / "pytorch_model.bin")
  os.remove(tmp_path / "hf" / "model.safetensors")
  with pytest.raises(ValueError, match="decoder.weight differs from bert.embeddings.word_embeddings.weight"):
    interop.load("bert", str(tmp_path / "hf"))


def test_export_refuses_a_grafted_model(tmp_path):
  tiny_hf("BertModel", tmp_path / "hf")
  model, _ = interop.load("bert", str(tmp_path / "hf"))
  graft(model, "DMTN")
  with pytest.raises(ValueError, match="another operator than ATTN"):
    interop.save(model, "bert", str(tmp_path / "out" / "model.safetensors"))
  assert not (tmp_path / "out").exists()


def test_cli_import_export_and_bad_input(tmp_path, capsys):
  tiny_hf("AlbertForMaskedLM", tmp_path / "hf")
  torch_model = transformers.AlbertForMaskedLM.from_pretrained(str(tmp_path / "hf"))
  os.remove(tmp_path / "hf" / "model.safetensors")
  torch.save(torch_model.state_dict(), tmp_path / "hf" / "pytorch_model.bin")
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "C"]))
  run = str(tmp_path / "run")
  assert cli.main(["import", "albert", str(tmp_path / "hf"), "--out", run]) == 0
  assert "heads on top: ['MLM']" in capsys.readouterr().out
  assert sorted(os.listdir(run)) == ["config.json", "hf", "vocab.txt", "weights.npz"]
  assert sorted(os.listdir(os.path.join(run, "hf"))) == ["config.json", "model.safetensors"]
  model, _, mcfg = runs.load_run(run)
  direct, _ = interop.load("albert", os.path.join(run, "hf"))               # the converted copy reads without torch
  ids, mask = token_batch(40, n=40)
  np.testing.assert_array_equal(np.asarray(model.mlm_logits(jnp.asarray(ids), jnp.asarray(mask))),
                                np.asarray(direct.mlm_logits(jnp.asarray(ids), jnp.asarray(mask))))
  out = tmp_path / "exp" / "model.safetensors"
  assert cli.main(["export", run, "--format", "albert", "--out", str(out)]) == 0
  transformers.AlbertForMaskedLM.from_pretrained(str(out.parent))
  for out, edit in ((run, None), (str(tmp_path / "bad"), lambda: patch(tmp_path / "hf", hidden_size=32))):
    if edit:                                      # a run folder already there; then shapes that disagree
      edit()
    with pytest.raises(SystemExit) as e:
      cli.main(["import", "albert", str(tmp_path / "hf"), "--out", out])
    assert e.value.code == 2
  bad = tmp_path / "bad"
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith("attngeo import: error: ") and "wrong shapes" in err[-1]
  assert not bad.exists() and not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


# ----------------------------------------------------------------------------- faults: overwrite, full disk, races

def tree(folder):
  """{relative path: bytes} of every file under `folder`."""
  from pathlib import Path
  return {str(p.relative_to(folder)): p.read_bytes() for p in Path(folder).rglob("*") if p.is_file()}


def imported_albert(tmp_path, capsys):
  tiny_hf("AlbertForMaskedLM", tmp_path / "hf")
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "C"]))
  run = str(tmp_path / "run")
  assert cli.main(["import", "albert", str(tmp_path / "hf"), "--out", run]) == 0
  capsys.readouterr()
  return run


def test_export_into_a_run_folder_refuses_and_overwrites_nothing(tmp_path, capsys):
  """F1: `export RUN2 --out RUN2/model.safetensors` overwrote RUN2/config.json with the HF one (the run no longer
  loaded). Any file export would write that holds something else is refused in one line; the same export again
  (byte-identical) is allowed."""
  run = imported_albert(tmp_path, capsys)
  before = tree(run)
  for out in (os.path.join(run, "model.safetensors"), os.path.join(run, "hf", "model.safetensors")):
    with pytest.raises(SystemExit) as e:
      cli.main(["export", run, "--format", "albert", "--out", out])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "export would overwrite" in err[0], err
    assert tree(run) == before
  runs.load_run(run)
  exp = tmp_path / "exp" / "model.safetensors"
  for _ in range(2):                                               # an earlier export of the same model: allowed
    assert cli.main(["export", run, "--format", "albert", "--out", str(exp)]) == 0
  first = tree(exp.parent)
  (exp.parent / "config.json").write_text("{}")                    # anything else there: refused, nothing written
  with pytest.raises(SystemExit):
    cli.main(["export", run, "--format", "albert", "--out", str(exp)])
  assert tree(exp.parent) == {**first, "config.json": b"{}"}


@pytest.mark.parametrize("kind", ["gpt2", "nanochat"])
def test_gpt_exporters_overwrite_no_other_config(tmp_path, kind):
  """F1 in the GPT-2 / nanochat exporters: a config.json / meta json there that is not this export stays."""
  import export_audit

  from attngeo.interop import gpt2, nanochat
  cfg = (gpt2.config({"vocab_size": 11, "n_positions": 8, "n_embd": 8, "n_layer": 1, "n_head": 2}) if kind == "gpt2"
         else nanochat.config({"sequence_len": 8, "vocab_size": 11, "n_layer": 1, "n_head": 2, "n_kv_head": 2,
                               "n_embd": 8}, "2025-10"))
  model, out = export_audit.randomized(cfg), tmp_path / "model_000001.safetensors"
  side = tmp_path / ("config.json" if kind == "gpt2" else "meta_000001.json")
  interop.save(model, kind, str(out))
  interop.save(model, kind, str(out))                               # the same export again
  before = out.read_bytes()
  with pytest.raises(ValueError, match=f"export would overwrite {out}"):   # another model's weights
    interop.save(export_audit.randomized(cfg, seed=1), kind, str(out))
  assert out.read_bytes() == before
  side.write_text('{"mine": 1}')
  with pytest.raises(ValueError, match=f"export would overwrite {side}") as e:
    interop.save(model, kind, str(out))
  assert "\n" not in str(e.value) and side.read_text() == '{"mine": 1}'


def test_export_carries_vocab_txt_and_import_reads_it_back(tmp_path, capsys):
  """F15: export wrote no vocab.txt, so export → import → `mlm eval` needed --vocab."""
  run = imported_albert(tmp_path, capsys)
  exp = tmp_path / "exp" / "model.safetensors"
  assert cli.main(["export", run, "--format", "albert", "--out", str(exp)]) == 0
  vocab = (tmp_path / "hf" / "vocab.txt").read_bytes()
  assert (exp.parent / "vocab.txt").read_bytes() == vocab
  assert cli.main(["import", "albert", str(exp.parent), "--out", str(tmp_path / "again")]) == 0
  assert (tmp_path / "again" / "vocab.txt").read_bytes() == vocab
  os.remove(os.path.join(run, "vocab.txt"))               # a run without one: exported, and said so
  capsys.readouterr()
  assert cli.main(["export", run, "--format", "albert", "--out", str(tmp_path / "bare" / "model.safetensors")]) == 0
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"attngeo export: warning: {os.path.join(run, 'vocab.txt')} is absent: the export holds the weights "
                 "and config.json, no vocab.txt (a tokenizer must come from elsewhere)"], err
  assert not (tmp_path / "bare" / "vocab.txt").exists()


SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def test_a_full_disk_during_import_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
  """F3: safetensors' writer raises SafetensorError('… No space left on device (os error 28)'), which the CLI's
  disk-full handler (OSError/RuntimeError only) passed on as a traceback."""
  import safetensors.numpy
  from safetensors import SafetensorError
  tiny_hf("AlbertForMaskedLM", tmp_path / "hf")
  capsys.readouterr()                                   # the progress bar of save_pretrained

  def full(*args, **kwargs):
    raise SafetensorError(SAFETENSORS_FULL)
  monkeypatch.setattr(safetensors.numpy, "save_file", full)
  run = tmp_path / "run"
  assert cli.main(["import", "albert", str(tmp_path / "hf"), "--out", str(run)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("attngeo import: error: no space left on device writing "), err
  assert sorted(os.listdir(tmp_path)) == ["hf"]


EFBIG_IMPORT = """
import resource, sys
from attngeo import cli
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))   # SIGXFSZ: Python ignores it
sys.exit(cli.main(sys.argv[1:]))
"""


def test_the_file_size_limit_during_import_is_one_line_and_leaves_nothing(tmp_path, capsys):
  """F4: under `ulimit -f` the write fails with EFBIG ('File too large (os error 27)'): a traceback before."""
  import subprocess
  import sys
  tiny_hf("AlbertForMaskedLM", tmp_path / "hf")
  capsys.readouterr()                                   # the progress bar of save_pretrained
  assert os.path.getsize(tmp_path / "hf" / "model.safetensors") > 4096
  out = subprocess.run([sys.executable, "-c", EFBIG_IMPORT, "import", "albert", str(tmp_path / "hf"), "--out",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, ATTNGEO_HUGEPAGES="0"))
  err = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(err) == 1, out.stderr[-3000:]
  assert err[0].startswith("attngeo import: error: file too large for the file-size limit (ulimit -f) writing ")
  assert sorted(os.listdir(tmp_path)) == ["hf"]


@pytest.mark.parametrize("where", ["read-only parent", "a file"])
def test_an_unusable_out_is_refused_before_the_load(tmp_path, monkeypatch, capsys, where):
  """F5/F6: a read-only --out parent failed in tempfile.mkdtemp only after the model was loaded (a traceback);
  a file at --out is one line too. Both before any load, nothing written."""
  tiny_hf("AlbertModel", tmp_path / "hf")
  capsys.readouterr()                                   # the progress bar of save_pretrained
  (tmp_path / "F").write_text("mine")
  out = "/sys/attngeo-run/run" if where == "read-only parent" else str(tmp_path / "F")
  monkeypatch.setattr(interop, "load", lambda *a, **k: pytest.fail("loaded before --out was checked"))
  with pytest.raises(SystemExit) as e:
    cli.main(["import", "albert", str(tmp_path / "hf"), "--out", out])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"attngeo import: error: --out {out} "), err
  assert sorted(os.listdir(tmp_path)) == ["F", "hf"] and (tmp_path / "F").read_text() == "mine"


def test_an_import_holds_its_out_and_clears_what_a_killed_one_left(tmp_path, capsys):
  """F8: two imports of one --out raced to os.rmdir(out) ('Directory not empty'): the second is now refused in
  one line while the first holds --out. F9: a killed import's temporary stayed forever; the next one removes it."""
  import subprocess
  import sys
  tiny_hf("AlbertModel", tmp_path / "hf")
  capsys.readouterr()                                   # the progress bar of save_pretrained
  run = tmp_path / "run"
  holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom attngeo import runlock\nwith runlock.hold(sys.argv[1]):"
                             "\n  print('held', flush=True)\n  sys.stdin.readline()", str(run)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(SystemExit) as e:
      cli.main(["import", "albert", str(tmp_path / "hf"), "--out", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f"is in use by pid {holder.pid}" in err[0], err
  finally:
    holder.kill()                                       # kill -9 mid-import: its lock and temporary stay
    holder.wait()
    holder.stdin.close()
    holder.stdout.close()
  (run / ".import.tmp" / "hf").mkdir(parents=True)
  (run / ".import.tmp" / "hf" / "model.safetensors").write_bytes(b"partial")
  assert cli.main(["import", "albert", str(tmp_path / "hf"), "--out", str(run)]) == 0
  assert sorted(os.listdir(run)) == ["config.json", "hf", "weights.npz"]
  assert sorted(os.listdir(tmp_path)) == ["hf", "run"]


def test_a_pickle_torch_refuses_is_one_line_without_its_advice(tmp_path, capsys):
  """F16: a pickle that is not a tensor dict printed torch's UserWarning (2 lines) first, and the error passed on
  torch's advice to retry with weights_only=False."""
  import pickle
  tiny_hf("AlbertModel", tmp_path / "hf")
  capsys.readouterr()                                   # the progress bar of save_pretrained
  os.remove(tmp_path / "hf" / "model.safetensors")
  with open(tmp_path / "hf" / "pytorch_model.bin", "wb") as f:
    pickle.dump({"a": 1}, f, protocol=4)                # protocol 4: torch warns it is not its default
  with pytest.raises(SystemExit) as e:
    cli.main(["import", "albert", str(tmp_path / "hf"), "--out", str(tmp_path / "run")])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "holds more than tensors (Unsupported operand" in err[0], err
  assert "weights_only" not in err[0] and not (tmp_path / "run").exists()
