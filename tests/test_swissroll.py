"""attngeo.experiments.swissroll on a reduced budget: the exact-A theorem on trained models, outputs, resume."""
import json
import os

import numpy as np
import pytest

from attngeo.experiments import swissroll


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("swissroll"))
  cfg = swissroll.SwissRollConfig(operators=("DMAP", "ATAP", "DMTN"), orders=("ffn_first",), steps=60, num_sets=64,
                                  set_size=64, sample_sets=2, sample_steps=8, probe_sets=2, heat_points=200,
                                  ckpt_every=30, out=out, progress=False)
  return cfg, swissroll.run(cfg)


def test_exact_a_operators_learn_reversible_walks(scan):
  _, res = scan
  rows = {r["operator"]: r for r in res["conditions"]}
  for op in ("DMAP", "ATAP"):
    assert rows[op]["eps_rev"] < 1e-3 and rows[op]["rho_skew"] < 1e-6, rows[op]
  assert rows["DMTN"]["rho_skew"] > 1e-2   # free skew part: whatever it learns, it is not zero


def test_scan_writes_every_output(scan):
  cfg, res = scan
  for name in ("table1.md", "table1.csv", "results.json", "samples.png", "heat.png", "config.json"):
    assert os.path.getsize(os.path.join(cfg.out, name)) > 0, name
  per_layer = res["conditions"][0]["per_layer"]
  assert len(per_layer) == cfg.depth and len(per_layer[0]["eps_rev"]) == cfg.heads
  assert np.isfinite([r["d_nn"] for r in res["conditions"]]).all()


def test_rerun_reuses_finished_conditions_and_is_deterministic(scan):
  cfg, res = scan
  path = os.path.join(cfg.out, "conditions", "DMAP_ffn_first", "result.json")
  mtime = os.path.getmtime(path)
  again = swissroll.run(cfg)
  assert os.path.getmtime(path) == mtime
  assert again["conditions"] == res["conditions"]


def test_training_is_deterministic(scan, tmp_path):
  import dataclasses
  cfg, res = scan
  cfg2 = dataclasses.replace(cfg, operators=("DMAP",), out=str(tmp_path))
  again = swissroll.run(cfg2)["conditions"][0]
  first = next(r for r in res["conditions"] if r["operator"] == "DMAP")
  assert again["final_loss"] == first["final_loss"] and again["d_nn"] == first["d_nn"]


def test_cli_help_and_overrides(capsys):
  with pytest.raises(SystemExit):
    swissroll.main(["--help"])
  assert "--full" in capsys.readouterr().out
  args = swissroll.parser().parse_args(["--operators", "DMAP,ATTN", "--steps", "7"])
  cfg = swissroll.config_lib.from_arguments(args, swissroll.SwissRollConfig)
  assert cfg.operators == ("DMAP", "ATTN") and cfg.steps == 7


def test_learnable_operator_scan_trains_per_head_coefficients(tmp_path):
  cfg = swissroll.SwissRollConfig(operators=("DMTN",), orders=("attn_first",), steps=20, num_sets=16, set_size=32,
                                  sample_sets=1, sample_steps=4, probe_sets=1, heat_points=64, ckpt_every=0,
                                  learnable_operator=True, out=str(tmp_path), progress=False)
  row = swissroll.run(cfg)["conditions"][0]
  assert np.isfinite(row["d_nn"]) and len(row["per_layer"][0]["eps_rev"]) == cfg.heads


@pytest.mark.slow
def test_quick_default_scan_meets_the_acceptance_criteria(tmp_path):
  """The README's main job (≈ 7 min on 2 cores): every condition generates the roll, exact-A is reversible."""
  import dataclasses
  res = swissroll.run(dataclasses.replace(swissroll.SwissRollConfig(), out=str(tmp_path), progress=False))
  d_nn = [r["d_nn"] for r in res["conditions"]]
  assert max(d_nn) < 2 * min(d_nn) and max(d_nn) < 3 * res["median_spacing"]
  for r in res["conditions"]:
    if r["operator"] in ("DMAP", "ATAP"):
      assert r["eps_rev"] < 1e-3 and r["rho_skew"] < 1e-6
  assert res["wall_seconds"] < 600
