"""attngeo.runs: results reused only under the key that made them; atomic writes; content fingerprints."""
import json
import os

import numpy as np
import pytest

from attngeo import files, runs


def test_cached_result_is_returned_only_for_its_key(tmp_path):
  path = tmp_path / "result.json"
  assert files.cached_result(str(path), "k1") is None                     # absent
  files.atomic_write(str(path), json.dumps({"key": "k1", "bpb": 1.5}))
  assert files.cached_result(str(path), "k1") == {"key": "k1", "bpb": 1.5}
  assert files.cached_result(str(path), "k2") is None                      # made under another config
  assert files.cached_result(str(path), "k1", field="evaluation_key") is None
  path.write_text('{"key": "k1", "bp')                                    # cut short by a crash
  assert files.cached_result(str(path), "k1") is None
  assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]              # atomic_write left no temporary


def test_fingerprint_follows_content_not_names():
  a = np.arange(6, dtype=np.float32)
  assert files.fingerprint(a, {"lr": 0.1}) == files.fingerprint(a.copy(), {"lr": 0.1})
  assert files.fingerprint(a, {"lr": 0.1}) != files.fingerprint(a, {"lr": 0.2})
  b = a.copy()
  b[3] += 1e-6
  assert files.fingerprint(a, {"lr": 0.1}) != files.fingerprint(b, {"lr": 0.1})


def test_atomic_write_takes_a_writer_and_leaves_nothing_behind_on_failure(tmp_path):
  """`atomic_write` with a writer, `atomic_npy` and `atomic_json`; a writer that raises leaves neither a temporary nor a
  half file, and an existing file untouched; the temporary is hidden (no `*.npy` glob sees it)."""
  path = tmp_path / "noise.npy"
  seen = []

  def save(tmp):
    seen.append(os.path.basename(tmp))
    with open(tmp, "wb") as f:
      np.save(f, np.arange(3))
  files.atomic_write(str(path), save)
  assert seen[0].startswith(".noise.npy.tmp-") and not seen[0].endswith(".npy")
  np.testing.assert_array_equal(np.load(path), np.arange(3))

  def broken(tmp):
    with open(tmp, "wb") as f:
      f.write(b"half")
    raise OSError("disk full")
  with pytest.raises(OSError, match="disk full"):
    files.atomic_write(str(path), broken)
  np.testing.assert_array_equal(np.load(path), np.arange(3))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["noise.npy"]
  files.atomic_npy(str(tmp_path / "sub" / "a.npy"), np.eye(2))
  np.testing.assert_array_equal(np.load(tmp_path / "sub" / "a.npy"), np.eye(2))
  files.atomic_json(str(tmp_path / "sub" / "r.json"), {"a": 1, "path": tmp_path})
  assert json.loads((tmp_path / "sub" / "r.json").read_text()) == {"a": 1, "path": str(tmp_path)}


def test_write_config_records_each_dataclass_config_class_and_train_config_rebuilds_it(tmp_path):
  from attngeo import train
  from attngeo.lm.config import LMTrain
  wd = str(tmp_path)
  files.write_config(wd, train=LMTrain(steps=3, embedding_lr=0.5), model={"kind": "gpt"})
  saved = files.read_config(wd)
  assert saved["classes"] == {"train": "attngeo.lm.config.LMTrain"}
  assert runs.train_config(wd) == LMTrain(steps=3, embedding_lr=0.5, workdir=wd)
  files.write_config(wd, **saved, extra={"a": 1})                       # read and written back: the record stays
  assert files.read_config(wd)["classes"] == {"train": "attngeo.lm.config.LMTrain"}
  files.write_config(wd, train=saved["train"], classes={"train": "attngeo.lm.recipe.LMTrainConfig"})
  assert runs.train_config(wd) == train.TrainConfig(**{**saved["train"], "mesh": (1, 1, 1), "workdir": wd})  # renamed
  files.write_config(wd, train=train.TrainConfig(steps=2))
  assert type(runs.train_config(wd)) is train.TrainConfig
  for name, message in (("os.path", "not an attngeo class"), ("attngeo.train.Nothing", "does not exist"),
                        ("attngeo.lm.config.LMConfig", "is not an attngeo.train.TrainConfig")):
    files.write_config(wd, train={"steps": 2}, classes={"train": name})
    with pytest.raises(ValueError, match=message):
      runs.train_config(wd)
  files.write_config(wd, train={"steps": 2, "colour": "red"})           # no record, no class has the field
  with pytest.raises(ValueError, match=r"TrainConfig has no field\(s\) \['colour'\]"):
    runs.train_config(wd)


def test_file_sha256_is_hashlibs_digest_of_the_bytes(tmp_path):
  import hashlib
  data = np.random.default_rng(0).bytes(3 * (1 << 20) + 17)
  (tmp_path / "f.bin").write_bytes(data)
  assert files.file_sha256(str(tmp_path / "f.bin")) == hashlib.sha256(data).hexdigest()


def test_checkpoint_run_folders_round_trip_and_refuse_a_second_write(tmp_path):
  """`write_checkpoint_run` (imports: step 0 of a training run) → `load_run` gives the same weights and a
  TrainConfig; a folder that already holds a checkpoint is refused in one line and left as it was."""
  from flax import nnx

  from attngeo import nn
  model = nn.GPT(nn.GPTConfig.from_depth(1, head_dim=8, width=16, vocab_size=11, seq_len=8), rngs=nnx.Rngs(2))
  wd = str(tmp_path / "run")
  tcfg = runs.write_checkpoint_run(wd, model, imported={"kind": "test"})
  back, saved_tcfg, mcfg = runs.load_run(wd)
  assert mcfg == model.cfg and saved_tcfg == tcfg and files.read_config(wd)["imported"] == {"kind": "test"}
  for (k, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)), nnx.to_flat_state(nnx.state(back, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(k))
  listing = sorted(os.listdir(wd))
  with pytest.raises(ValueError, match="already holds checkpoints"):
    runs.write_checkpoint_run(wd, model)
  assert sorted(os.listdir(wd)) == listing
  moved = str(tmp_path / "moved")                                   # a moved folder is read where it lies
  os.rename(wd, moved)
  assert runs.load_run(moved)[1].workdir == moved and runs.train_config(moved).workdir == moved


def test_weights_run_folders_round_trip_and_damage_is_one_line(tmp_path):
  """`write_weights_run` → `load_run` gives the same weights (SiT stages, imports: config.json + weights.npz);
  a truncated or byte-flipped weights.npz is refused in one line, never loaded; --step has no meaning there."""
  from flax import nnx

  from attngeo import nn
  model = nn.DiT(nn.DiTConfig(image_size=8, channels=1, patch=2, depth=1, num_classes=3,
                              block=nn.BlockConfig(width=16, num_heads=2)), rngs=nnx.Rngs(3))
  wd = str(tmp_path / "run")
  runs.write_weights_run(wd, model, source="test")
  back, tcfg, mcfg = runs.load_run(wd)
  assert tcfg is None and mcfg == model.cfg and files.read_config(wd)["source"] == "test"
  for (k, a), (_, b) in zip(nnx.to_flat_state(nnx.state(model)), nnx.to_flat_state(nnx.state(back))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(k))
  with pytest.raises(ValueError, match="holds one set of weights"):
    runs.load_run(wd, step=3)
  path = tmp_path / "run" / runs.WEIGHTS
  data = path.read_bytes()
  path.write_bytes(data[: len(data) // 2])
  with pytest.raises(ValueError, match=r"weights.npz is damaged \(BadZipFile"):
    runs.load_run(wd)
  flipped = bytearray(data)
  flipped[len(data) // 3] ^= 0xFF                       # inside a member: zip's CRC catches it
  path.write_bytes(bytes(flipped))
  with pytest.raises(ValueError, match="weights.npz is damaged"):
    runs.load_run(wd)
  assert not [p for p in os.listdir(tmp_path / "run") if p.startswith(".")]   # atomic writes leave no temporary


def test_a_damaged_run_file_is_one_line_naming_it(tmp_path):
  """json's own message ("Invalid control character at: line 1 column 8") named no file."""
  from attngeo import files
  from attngeo.lm import recipe
  (tmp_path / "config.json").write_text('{"train\x01": 1}')
  (tmp_path / "lm.json").write_bytes(b"\xff\xfe{")
  with pytest.raises(ValueError, match=r"config.json is not valid JSON \(Invalid control character"):
    files.read_config(str(tmp_path))
  with pytest.raises(ValueError, match=r"lm.json is not valid JSON \(not UTF-8 text\)"):
    recipe.read_config(str(tmp_path))
