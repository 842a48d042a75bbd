"""`attngeo bench-probe`: the Swiss-roll and real-BERT cases end to end (child process, peak RSS, verdict); slow: minutes."""
import os

import pytest


@pytest.mark.slow
def test_bench_probe_swissroll_case(tmp_path):
  from attngeo.experiments import bench_probe
  (row,) = bench_probe.main(["--cases", "swissroll", "--out", str(tmp_path)])
  assert row["warm_s"] > 0 and row["peak_gib"] > 0 and row["verdict"] in ("met", "missed")
  assert os.path.getsize(tmp_path / "bench_probe.md") > 0


@pytest.mark.slow
def test_bench_probe_bert_case_on_the_real_checkpoint(tmp_path):
  pytest.importorskip("torch")
  from attngeo.data import molecules
  try:
    molecules.wheel_file("rxnfp", "models", "transformers", "bert_pretrained", "config.json")
  except FileNotFoundError:
    pytest.skip("rxnfp not installed")
  from attngeo.experiments import bench_probe
  rows = bench_probe.main(["--cases", "bert", "--bert-seqs", "16,24", "--out", str(tmp_path)])
  assert [r["shape"].split("n = ")[1] for r in rows] == ["16, batch 1", "24, batch 1"]
  assert all(r["layers"] == 12 and r["cold_s"] >= r["warm_s"] > 0 for r in rows)


@pytest.mark.parametrize("seqs", ["", "2", "600", "12,x"])
def test_bench_probe_bert_lengths_are_checked_first(seqs, capsys):
  from attngeo.experiments import bench_probe
  with pytest.raises(SystemExit) as e:
    bench_probe.main(["--cases", "bert", "--bert-seqs", seqs, "--out", "/nonexistent/never"])
  assert e.value.code == 2 and "--bert-seqs must be comma-separated integers in (2, 512]" in capsys.readouterr().err
