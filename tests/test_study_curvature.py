"""`attngeo study curvature`: settings, the comparison against `none` (Welch + Holm) and one-line refusals."""
import numpy as np
import pytest
from scipy import stats as sps

from attngeo import cli
from attngeo.experiments import study_curvature as sc


def rows(shift=0.0, seed=0):
  rng = np.random.default_rng(seed)
  return [{key: float(1 + rng.normal(scale=0.01) + (shift if key == "eps_rev" else 0.0)) for key, _ in sc.COLUMNS}
          for _ in range(3)]


def test_compare_tests_each_setting_against_none_with_welch_and_holm():
  per_seed = {"none": rows(), "curvature": rows(shift=0.5, seed=1)}
  out = sc.compare(per_seed)
  assert out["none"]["eps_rev"]["vs_none"] is None
  got = out["curvature"]["eps_rev"]["vs_none"]
  a = [r["eps_rev"] for r in per_seed["curvature"]]
  b = [r["eps_rev"] for r in per_seed["none"]]
  ref = sps.ttest_ind(a, b, equal_var=False)
  np.testing.assert_allclose([got["t"], got["p"]], [ref.statistic, ref.pvalue], rtol=1e-10)
  ps = [out["curvature"][k]["vs_none"]["p"] for k, _ in sc.COLUMNS]
  holm = [out["curvature"][k]["vs_none"]["p_holm"] for k, _ in sc.COLUMNS]
  assert min(holm) == pytest.approx(min(1.0, len(ps) * min(ps)))
  (line,) = sc.reading(out)
  assert line.startswith("curvature: walk read-outs beyond the seed spread (Holm 0.05): ε_rev;")
  assert line.endswith("sample quality unchanged.")


@pytest.mark.parametrize("argv, needle", [
    (["--seeds", "1"], "--seeds must be an integer ≥ 2"),
    (["--curvature", "0", "--reversibility", "0"], "both 0"),
    (["--curvature", "-1"], "--curvature must be a weight ≥ 0"),
    (["--operator", "XMAP"], "--operator must be one of"),
    (["--curvature-target", "nan"], "--curvature-target must be a finite number"),
])
def test_bad_settings_are_one_line_before_any_work(argv, needle, tmp_path, capsys):
  out = tmp_path / "study"
  with pytest.raises(SystemExit) as e:
    cli.main(["study", "curvature", *argv, "--out", str(out)])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1 and needle in err[0], err
  assert not out.exists()


def test_settings_skip_a_zero_weight():
  cfg = sc.CurvatureStudyConfig()
  assert list(sc.settings(cfg)) == ["none", "curvature"]
  assert list(sc.settings(sc.CurvatureStudyConfig(curvature=0.0, reversibility=0.1))) == ["none", "reversibility"]
  assert sc.settings(cfg)["curvature"].curvature == 0.1 and sc.settings(cfg)["curvature"].curvature_target == 0
  assert sc.settings(sc.CurvatureStudyConfig(curvature_target=2.0))["curvature"].curvature_target == 2.0
