"""`attngeo bench-probe`: the Swiss-roll case end to end (child process, peak RSS, verdict). Slow: minutes."""
import os

import pytest


@pytest.mark.slow
def test_bench_probe_swissroll_case(tmp_path):
  from attngeo.experiments import bench_probe
  (row,) = bench_probe.main(["--cases", "swissroll", "--out", str(tmp_path)])
  assert row["warm_s"] > 0 and row["peak_gib"] > 0 and row["verdict"] in ("met", "missed")
  assert os.path.getsize(tmp_path / "bench_probe.md") > 0
