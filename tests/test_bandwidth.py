"""attngeo.bandwidth: the sheet rule keeps the Swiss-roll walk on its sheet; the neighbour rule's target."""
import numpy as np
import pytest
from attngeo import bandwidth, data, surfaces


def test_bandwidth_sheet_rule_keeps_the_walk_on_the_swiss_roll():
  """The sheet rule's ε puts ≤ 1e-3 of the walk's mass between the roll's layers (ground truth from the roll
  parameter t: points more than half a turn apart), where the max-slope rule's ε puts > 1e-2 there."""
  n = 2000
  x = data.swiss_roll(n, 123).astype(np.float64)
  t = surfaces.swiss_roll_parameters(n, 123)
  far = np.abs(t[:, None] - t[None]) > np.pi
  d2 = np.sum((x[:, None] - x[None]) ** 2, -1)

  def between_layers(eps):
    k = np.exp(-d2 / eps)
    return float(((k / k.sum(1, keepdims=True)) * far).sum(1).mean())

  bw = bandwidth.bandwidth(x)
  assert bw.rule == "sheet" and bw.eps < bw.eps_max_slope
  assert between_layers(bw.eps) <= 1e-3
  assert between_layers(bw.eps_max_slope) > 1e-2
  assert 1.8 < bw.dimension < 2.2
  old = bandwidth.bandwidth(x, rule="max_slope")
  assert old.rule == "max_slope" and old.eps == bw.eps_max_slope


@pytest.mark.parametrize("points,dim", [(lambda: data.sphere(1500, seed=0), 2), (lambda: data.flat_torus(1500, seed=0), 2),
                                        (lambda: surfaces.sphere(1500, seed=0, dim=5).points, 4)])
def test_bandwidth_dimension_and_rule_without_layers(points, dim):
  """Without layers no pair short-circuits: the max-slope ε stands; the off-diagonal kernel-sum slope gives d."""
  bw = bandwidth.bandwidth(points())
  assert bw.rule == "max_slope" and bw.eps == bw.eps_max_slope
  assert abs(bw.dimension - dim) < 0.25 * dim
