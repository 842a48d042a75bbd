"""attngeo.stats: Welch's t-test against scipy.stats.ttest_ind(equal_var=False)."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from attngeo import stats


@pytest.mark.parametrize("a, b", [([1.0, 1.1, 0.9], [5.0, 5.2, 4.9]), ([1.0, 1.1, 0.9], [1.02, 0.97, 1.05]),
                                  ([1, 2, 4, 3], [2, 9, 7]), ([2.4444, 2.4421, 2.4480], [2.4229, 2.4150, 2.4302])])
def test_welch_matches_scipy(a, b):
  ref = sps.ttest_ind(a, b, equal_var=False)
  got = stats.welch(a, b)
  assert got.difference == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
  assert got.t == pytest.approx(ref.statistic, rel=1e-10) and got.p == pytest.approx(ref.pvalue, rel=1e-10)
  assert got.df == pytest.approx(ref.df, rel=1e-10)
  swapped = stats.welch(b, a)
  assert swapped.t == pytest.approx(-got.t, rel=1e-12) and swapped.p == pytest.approx(got.p, rel=1e-12)


def test_welch_constant_samples_and_bad_input():
  assert stats.welch([3.0, 3.0], [2.0, 2.0])[::3] == (1.0, 0.0) and stats.welch([3.0, 3.0], [2.0, 2.0]).t == math.inf
  assert stats.welch([2.0, 2.0], [3.0, 3.0]).t == -math.inf
  same = stats.welch([2.0, 2.0, 2.0], [2.0, 2.0])
  assert (same.difference, same.t, same.p) == (0.0, 0.0, 1.0) and math.isnan(same.df)
  with pytest.raises(ValueError, match="at least 2 finite values in sample a"):
    stats.welch([1.0], [1.0, 2.0])
  with pytest.raises(ValueError, match="sample b"):
    stats.welch([1.0, 2.0], [1.0, float("nan")])


def test_untestable_pairs_are_none_not_an_error():
  """A diverged seed (NaN) or a single seed leaves that pair untested; the scan's other pairs stand."""
  assert stats.welch_if_testable([1.0, np.nan, 2.0], [1.0, 2.0]) is None
  assert stats.welch_if_testable([1.0], [1.0, 2.0]) is None
  assert stats.welch_if_testable([1.0, 2.0, 4.0], [3.0, 5.0]) == stats.welch([1.0, 2.0, 4.0], [3.0, 5.0])


def test_holm_is_the_step_down_maximum():
  """p = (0.01, 0.04, 0.03, 0.005): sorted 0.005, 0.01, 0.03, 0.04 scaled by 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04,
  running maximum 0.02, 0.03, 0.06, 0.06, back in the input's order."""
  np.testing.assert_allclose(stats.holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
  np.testing.assert_allclose(stats.holm([0.5, 0.9]), [1.0, 1.0])          # capped at 1
  assert stats.holm([]).shape == (0,)
  with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
    stats.holm([0.2, float("nan")])
