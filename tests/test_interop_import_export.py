"""`attngeo import` / `attngeo export`: a public checkpoint becomes an ordinary run folder that
runs.load_run and the probe read; export writes the same tensors back."""
import hashlib
import json
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_interop_gpt2 import HF, reference_logits, random_state, write_model
from test_interop_nanochat import VINTAGE, write
from test_interop_nanochat import random_state as nanochat_state

from attngeo import cli, files, runs
from attngeo.experiments import import_export
from attngeo.experiments import probe as probe_cli
from attngeo.interop import safetensors_io

forward = nnx.jit(lambda model, ids: model(ids))   # one compiled program per model shape

IDS = np.random.default_rng(7).integers(0, HF["vocab_size"], (2, 16))


def import_gpt2(tmp_path, seed=11):
  sd = random_state(seed=seed)
  src = write_model(tmp_path / "hub", sd)
  run = str(tmp_path / "run")
  assert cli.main(["import", "gpt2", src, "--out", run]) == 0
  return sd, run


def test_gpt2_import_to_run_folder_and_export(tmp_path, capsys):
  sd, run = import_gpt2(tmp_path)
  assert "depth 2, width 32, heads 4 (kv 4), vocab 61, context 24" in capsys.readouterr().out
  model, _, mcfg = runs.load_run(run)
  np.testing.assert_allclose(forward(model, jnp.asarray(IDS)), reference_logits(sd, HF, IDS), atol=1e-4, rtol=0)
  saved = files.read_config(run)
  file_hash = hashlib.sha256((tmp_path / "hub" / "model.safetensors").read_bytes()).hexdigest()
  assert saved["imported"]["kind"] == "gpt2" and saved["imported"]["sha256"] == file_hash
  assert saved["model"]["class"] == "GPTConfig" and saved["model"]["tie_embeddings"] is True
  out = tmp_path / "back" / "model.safetensors"
  assert cli.main(["export", run, "--format", "gpt2", "--out", str(out)]) == 0
  back = safetensors_io.read(str(out))
  assert set(back) == {k for k in sd if k.split(".")[-2:] not in (["attn", "bias"], ["attn", "masked_bias"])}
  for k, v in back.items():
    np.testing.assert_array_equal(v, sd[k], err_msg=k)
  written = json.loads((tmp_path / "back" / "config.json").read_text())
  assert written["n_embd"] == HF["n_embd"]
  printed = capsys.readouterr().out.splitlines()      # the config as written, whole (it was cut at 200 characters)
  assert json.loads(printed[printed.index(next(l for l in printed if l.startswith("wrote "))) + 1]) == written


@pytest.mark.slow
def test_probe_runs_on_an_imported_gpt2(tmp_path):
  _, run = import_gpt2(tmp_path, seed=14)
  rows = probe_cli.main([run, "--data", "random", "--batch", "1", "--seq-len", "12", "--out", str(tmp_path / "p")])
  assert len(rows) == HF["n_layer"] and all(np.isfinite(np.mean(r["head_isometry_defect"])) for r in rows)


def test_nanochat_import_with_fill_then_export(tmp_path):
  sd = nanochat_state(VINTAGE, current=False, seed=12)
  src = write(tmp_path, sd, VINTAGE)
  run = str(tmp_path / "run")
  import_export.import_main(["nanochat", src, "--arch", "2026-07", "--fill-missing", "--out", run])
  imported = files.read_config(run)["imported"]
  assert imported["arch"] == "2026-07" and imported["fill_missing"] and imported["meta"]["step"] == 650
  out = tmp_path / "exp" / "model_000650.safetensors"
  import_export.export_main([run, "--format", "nanochat", "--out", str(out)])
  meta = json.loads((tmp_path / "exp" / "meta_000650.json").read_text())
  assert meta["model_config"] == dict(VINTAGE, window_pattern="L") and meta["step"] == 650
  back = safetensors_io.read(str(out))
  assert back["resid_lambdas"].tolist() == [1.0, 1.0] and not back["value_embeds.1.weight"].any()
  np.testing.assert_array_equal(back["transformer.h.1.attn.c_q.weight"], sd["transformer.h.1.attn.c_q.weight"])
  with pytest.raises(SystemExit) as e:   # a nanochat model is not a GPT-2
    import_export.export_main([run, "--format", "gpt2", "--out", str(tmp_path / "x.safetensors")])
  assert e.value.code == 2


@pytest.mark.parametrize("args,match", [
    (["gpt2", "/nonexistent/model.safetensors", "--out", "R"], "does not exist"),
    (["gpt2", "SRC", "--out", "R", "--set", "norm_eps"], "--set expects FIELD=VALUE"),
    (["gpt2", "SRC", "--out", "R", "--arch", "2025-10"], "nanochat options"),
    (["gpt2", "SRC", "--out", "R", "--set", "no_such_field=1"], "has no field 'no_such_field'"),
    (["gpt2", "BROKEN", "--out", "R"], r"missing keys: h\.0\.mlp\.c_fc\.bias"),
])
def test_import_bad_input_exits_2_with_one_line(tmp_path, capsys, args, match):
  sd = random_state(seed=13)
  src = write_model(tmp_path / "ok", sd)
  sd.pop("h.0.mlp.c_fc.bias")
  broken = write_model(tmp_path / "broken", sd)
  args = [{"SRC": src, "BROKEN": broken, "R": str(tmp_path / "run")}.get(a, a) for a in args]
  with pytest.raises(SystemExit) as e:
    import_export.import_main(args)
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert re.search(match, err), err


def test_nanochat_folder_import_names_its_rotary_tables_and_refused_export_writes_nothing(tmp_path, capsys):
  """`attngeo import nanochat FOLDER`: nanochat's checkpoint folder (it said "no nanochat meta"); the
  summary names the rotary-table dtype; an export the layout cannot carry is one line, no file."""
  from test_interop_nanochat import CURRENT
  write(tmp_path / "ckpt", nanochat_state(CURRENT, current=True, seed=15), CURRENT)
  run = str(tmp_path / "run")
  assert cli.main(["import", "nanochat", str(tmp_path / "ckpt"), "--out", run]) == 0
  out = capsys.readouterr().out
  assert f"imported nanochat {tmp_path / 'ckpt' / 'model_000650.safetensors'}" in out
  assert re.search(r"nanochat 2026-07 \(92d63d4\), (float32|bfloat16) rotary tables \(nanochat 2026-07", out), out
  saved = json.loads((tmp_path / "run" / "config.json").read_text())
  saved["model"]["block"]["rope_sign"] = 1                       # as if the run had been built with attngeo's rotary
  (tmp_path / "run" / "config.json").write_text(json.dumps(saved))
  target = tmp_path / "exp" / "model_000650.safetensors"
  with pytest.raises(SystemExit) as e:
    import_export.export_main([run, "--format", "nanochat", "--out", str(target)])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "rope_sign=1 (nanochat 2026-07: -1)" in err[0], err
  assert not (tmp_path / "exp").exists()


@pytest.mark.parametrize("cut", [0, 100])
def test_damaged_gpt2_file_is_one_line(tmp_path, capsys, cut):
  src = write_model(tmp_path / "hub", random_state(seed=16))
  with open(os.path.join(src, "model.safetensors"), "r+b") as f:
    f.truncate(cut)
  with pytest.raises(SystemExit) as e:
    import_export.import_main(["gpt2", src, "--out", str(tmp_path / "run")])
  assert e.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "model.safetensors is not a readable checkpoint" in err[0], err
  assert not (tmp_path / "run").exists()


def test_a_non_finite_weight_is_refused_naming_the_tensor_and_writes_nothing(tmp_path, capsys):
  """A NaN in a GPT-2 weight was refused only by the trainer's NaN guard ('the training state holds NaN/Inf
  at step 0'), after config.json and ckpt/ were written."""
  sd = random_state(seed=5)
  sd["h.1.mlp.c_fc.weight"] = sd["h.1.mlp.c_fc.weight"].copy()
  sd["h.1.mlp.c_fc.weight"][0, 0] = np.nan
  src = write_model(tmp_path / "hub", sd)
  run = tmp_path / "run"
  with pytest.raises(SystemExit) as e:
    import_export.import_main(["gpt2", src, "--out", str(run)])
  assert e.value.code == 2 and "the weights of blocks.1.mlp.w1 (attngeo parameter) hold NaN or Inf" in capsys.readouterr().err
  assert not run.exists()


def test_gpt2_import_holds_its_folder_and_a_failed_write_leaves_it_reusable(tmp_path, capsys, monkeypatch):
  """Two imports into one folder: the second is refused while the first holds it (they had both said "wrote",
  leaving one model). A write that fails part-way (a full disk) is one line and removes what it added, and an
  unfinished step left in ckpt/ does not block the next import. Export names the step it read."""
  import subprocess
  import sys

  from attngeo import checkpoint
  src = write_model(tmp_path / "hub", random_state(seed=17))
  run = tmp_path / "run"
  code = "import sys, time\nfrom attngeo import runlock\nwith runlock.hold(sys.argv[1]):\n  print('held', flush=True)\n  time.sleep(60)"
  holder = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(SystemExit) as e:
      import_export.import_main(["gpt2", src, "--out", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "is in use by pid" in err[0], err
    assert sorted(os.listdir(run)) == [".lock"]
  finally:
    holder.kill()
    holder.wait()
    holder.stdout.close()
  save = checkpoint.save

  def full_disk(mngr, step, *args):
    os.makedirs(os.path.join(str(mngr.directory), f"{step}.orbax-checkpoint-tmp-1"))
    raise checkpoint.disk_full(str(mngr.directory), 1 << 20, f"checkpoint step {step}")
  monkeypatch.setattr(checkpoint, "save", full_disk)
  with pytest.raises(SystemExit) as e:
    import_export.import_main(["gpt2", src, "--out", str(run)])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and "no space left" in err[0], err
  assert not run.exists() or os.listdir(run) == []                     # (the killed holder's folder stays, empty)
  monkeypatch.setattr(checkpoint, "save", save)
  os.makedirs(run / "ckpt" / "0.orbax-checkpoint-tmp-7")                # a killed write's unfinished step
  import_export.import_main(["gpt2", src, "--out", str(run)])
  assert sorted(os.listdir(run / "ckpt")) == ["0"]
  assert runs.load_run(str(run), with_step=True)[3] == 0
  capsys.readouterr()
  import_export.export_main([str(run), "--format", "gpt2", "--out", str(tmp_path / "x" / "model.safetensors")])
  assert "from checkpoint step 0" in capsys.readouterr().out
