"""`attngeo study connection`: its statistics against numpy, and a smoke-sized end-to-end run."""
import json
import math
import os

import numpy as np
import pytest

from attngeo.experiments import study_connection as study


def test_depth_trend_is_the_least_squares_slope_and_third_means():
  v = np.array([5.0, 4.0, 4.5, 2.0, 1.0, 1.5, 0.5])
  got = study.depth_trend(v)
  x = np.linspace(0, 1, 7)
  slope = np.sum((x - x.mean()) * (v - v.mean())) / np.sum((x - x.mean()) ** 2)
  assert got["slope"] == pytest.approx(slope) and got["mean"] == pytest.approx(v.mean())
  assert got["first"] == pytest.approx(np.mean([5.0, 4.0, 4.5])) and got["last"] == pytest.approx(np.mean([1.0, 1.5, 0.5]))
  one = study.depth_trend(np.array([0.3]))
  assert one["first"] == one["last"] == 0.3 and math.isnan(one["slope"])


def fake_result(family, size, params, seed, trained_defect, init_defect, depth=4):
  def rows(defect):
    return [{"layer": i, "head_isometry_defect": [defect + 0.1 * i, defect], "effective_isometry_defect": defect,
             "next_relative_change": None if i == depth - 1 else 1.0 / (i + 1), "next_js_divergence": None if i == depth - 1
             else 0.1, "next_spectral_distance": None if i == depth - 1 else 0.2} for i in range(depth)]
  return dict(family=family, size=size, params=params, seed=seed, depth=depth, held_out=1.0, held_out_init=2.0,
              trained=rows(trained_defect), init=rows(init_defect))


def test_scale_trend_is_the_slope_per_decade_of_parameters():
  results = [fake_result("decoder", "s", 1e5, 0, 0.8, 0.9), fake_result("decoder", "m", 1e6, 0, 0.6, 0.9),
             fake_result("decoder", "l", 1e7, 0, 0.4, 0.9), fake_result("decoder", "l", 1e7, 1, 0.2, 0.9)]
  # effective defect means: 0.8, 0.6, 0.4, 0.2 at log10 params 5, 6, 7, 7
  ref = np.polyfit([5, 6, 7, 7], [0.8, 0.6, 0.4, 0.2], 1)[0]
  assert study.scale_trend(results, "decoder", "trained", "effective_isometry_defect", "mean") == pytest.approx(ref)
  assert study.scale_trend(results, "decoder", "init", "effective_isometry_defect", "mean") == pytest.approx(0, abs=1e-12)
  rows = study.summary_rows(results)
  large = next(r for r in rows if r["size"] == "l" and r["state"] == "trained")
  assert large["seeds"] == 2 and large["effective_isometry_defect:mean"] == pytest.approx(0.3)
  # heads: mean over heads per layer (defect + 0.05·i); the last third of 4 layers (x = i/3 ≥ 2/3) is layers 2, 3
  assert large["head_isometry_defect:last"] == pytest.approx(0.3 + 0.05 * 2.5)
  assert [r["size"] for r in rows[::2]] == ["s", "m", "l"]


def test_bad_configuration_is_one_line():
  with pytest.raises(SystemExit) as e:
    study.main(["--families", "decoder,vision"])
  assert e.value.code == 2
  with pytest.raises(ValueError, match="same length"):
    study.StudyConfig(encoder_widths=(8, 16)).validate()
  with pytest.raises(ValueError, match="not a run folder"):
    study.StudyConfig(runs=("/nonexistent",)).validate()


def test_a_gpt_run_shorter_than_seq_len_is_refused_before_any_write(tmp_path):
  """Re-walk: `--runs` of a GPT with a 64-token context at `--seq-len 101` failed after building the data cache,
  naming the position table, not the flag."""
  run = tmp_path / "g2"
  run.mkdir()
  (run / "config.json").write_text('{"model": {"class": "GPTConfig", "seq_len": 64}}')
  with pytest.raises(ValueError, match=r"--seq-len 101 is longer than the context of .*g2 \(64 tokens\); give --seq-len ≤ 64"):
    study.StudyConfig(runs=(str(run),), seq_len=101, out=str(tmp_path / "out")).validate()
  assert not (tmp_path / "out").exists()


def smoke_argv(out, families):
  # shapes shared with tests/test_probe.py's models (width 16, 2 heads, 12 tokens, samples 32): one compile each
  return ["--families", families, "--corpus", "pydoc", "--seeds", "0", "--decoder-depths", "2", "--decoder-aspect", "8",
          "--decoder-head-dim", "8", "--seq-len", "12", "--decoder-steps", "2", "--decoder-batch", "2",
          "--encoder-widths", "16", "--encoder-depths", "2", "--encoder-heads", "2", "--set-size", "12",
          "--num-sets", "4", "--encoder-steps", "2", "--encoder-batch", "2", "--probe-batch", "1",
          "--probe-samples", "32", "--warmup", "1", "--progress", "false", "--out", str(out)]


@pytest.mark.slow
def test_study_smoke_decoder(tmp_path, capsys):
  payload = study.main(smoke_argv(tmp_path, "decoder"))
  for name in ("study.md", "study.json", "study.png", "study_stability.csv", "study_isometry.csv", "study_scale.csv"):
    assert os.path.getsize(tmp_path / name) > 0
  (m,) = json.loads((tmp_path / "study.json").read_text())["models"]
  assert m["family"] == "decoder" and len(m["trained"]) == len(m["init"]) == 2 and m["params"] > 0
  assert 0 <= m["trained"][0]["effective_isometry_defect"] <= 1 and m["held_out"] > 0
  out = capsys.readouterr().out
  assert "Stability of the effective walk" in out
  assert f"wrote {tmp_path}/study.md, study.json, study.png, study_stability.{{md,csv,json}}, " in out
  assert payload["summary"][0]["family"] == "decoder"


@pytest.mark.slow
def test_study_end_to_end_both_families_rerun_and_run_folders(tmp_path):
  payload = study.main(smoke_argv(tmp_path, "decoder,encoder"))
  assert {m["family"] for m in payload["models"]} == {"decoder", "encoder"}
  again = study.main(smoke_argv(tmp_path, "decoder,encoder"))        # reuses the finished models
  assert [m["trained"] for m in again["models"]] == [m["trained"] for m in payload["models"]]
  assert [m["train_seconds"] for m in again["models"]] == [m["train_seconds"] for m in payload["models"]]
  other = study.main(smoke_argv(tmp_path, "decoder,encoder") + ["--decoder-steps", "3"])   # another recipe: retrained
  dec = [(a, b) for a, b in zip(other["models"], payload["models"]) if a["family"] == "decoder"]
  assert dec and all(a["key"] != b["key"] and a["folder"] != b["folder"] for a, b in dec)
  enc = [(a, b) for a, b in zip(other["models"], payload["models"]) if a["family"] == "encoder"]
  assert enc and all(a["key"] == b["key"] for a, b in enc)              # the encoders' recipe did not change
  # --reprobe: the models reloaded from their checkpoints probe as the trained models in memory did
  fresh = study.main(smoke_argv(tmp_path, "decoder,encoder") + ["--reprobe", "true"])
  for a, b in zip(fresh["models"], payload["models"]):
    np.testing.assert_allclose([x["effective_participation"] for x in a["trained"]],
                               [x["effective_participation"] for x in b["trained"]], rtol=1e-5)
  # the run-folder form (imported checkpoints): the saved model, reloaded and probed, gives the same rows
  m = payload["models"][0]
  folder = tmp_path / "models" / m["folder"]
  reloaded = study.main(smoke_argv(tmp_path / "again", "decoder") + ["--runs", str(folder)])
  (r,) = reloaded["models"]
  assert r["size"] == m["folder"] and r["held_out"] is None
  np.testing.assert_allclose([x["effective_isometry_defect"] for x in r["trained"]],
                             [x["effective_isometry_defect"] for x in m["trained"]], rtol=1e-5)
  np.testing.assert_allclose([x["next_js_divergence"] for x in r["trained"][:-1]],
                             [x["next_js_divergence"] for x in m["trained"][:-1]], rtol=1e-5)


def test_float_probe_tokens_are_refused_not_cast(tmp_path, capsys):
  """A float32 .npy of 'token ids' was cast to int32 and probed (exit 0)."""
  np.save(tmp_path / "ids.npy", np.random.default_rng(0).random((2, 12)).astype(np.float32))
  def attngeo(*argv):
    try:
      return cli.main(list(argv))
    except SystemExit as e:                             # refused while parsing (config.validate)
      return e.code
  from attngeo import cli
  code = attngeo("study", "connection", *smoke_argv(tmp_path / "out", "decoder"),
                 "--probe-tokens", str(tmp_path / "ids.npy"))
  assert code == 2 and "must hold integer token ids [b, n]; got float32 (2, 12)" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()                # refused before config.json or data/ were written
  dit = tmp_path / "dit"
  dit.mkdir()
  (dit / "config.json").write_text('{"model": {"class": "DiTConfig"}}')
  code = attngeo("study", "connection", *smoke_argv(tmp_path / "out", "decoder"), "--runs", str(dit))
  assert code == 2 and "holds a DiT (SiT) model; the study probes GPT" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()
