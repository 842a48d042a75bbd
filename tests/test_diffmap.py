"""attngeo.diffmap and `attngeo diffmap`: exact diffusion maps against a dense float64 numpy reference."""
import json

import numpy as np
import pytest
import scipy.linalg

from attngeo import data, diffmap, operators as op
from attngeo.experiments import bench_diffmap, diffmap as diffmap_cli


def reference(x, eps, alpha, k):
  """Dense float64 Coifman–Lafon: λ [k+1], u [n, k+1] (eigenvectors of D^{-1/2} K^α D^{-1/2}), q, d."""
  x = np.asarray(x, np.float64)
  x = x - x.mean(0)
  kern = np.exp(-np.sum((x[:, None] - x[None]) ** 2, -1) / eps)
  q = kern.sum(1)
  ka = kern / np.outer(q, q) ** alpha
  d = ka.sum(1)
  w, u = np.linalg.eigh(ka / np.sqrt(np.outer(d, d)))
  return w[::-1][: k + 1], u[:, ::-1][:, : k + 1], q, d


def angles_deg(u, ref):
  u = u / np.linalg.norm(u, axis=0)
  return np.degrees(np.arccos(np.minimum(1.0, np.abs(np.sum(u * ref, 0)))))


def check_against_reference(dm, x, eps, alpha, k, t):
  w, u_ref, _, d = reference(x, eps, alpha, k)
  assert bool(dm.converged)
  np.testing.assert_allclose(np.asarray(dm.rates[1:], np.float64), 1 - w[1:], rtol=1e-3)   # the target
  np.testing.assert_allclose(np.asarray(dm.values), w, atol=2e-7)
  pi, psi = np.asarray(dm.pi, np.float64), np.asarray(dm.psi, np.float64)
  np.testing.assert_allclose(pi, d / d.sum(), rtol=1e-4)
  assert np.all(angles_deg(psi * np.sqrt(pi)[:, None], u_ref) < 0.05)
  np.testing.assert_allclose(psi.T @ (pi[:, None] * psi), np.eye(k + 1), atol=1e-4)   # orthonormal in L²(π)
  np.testing.assert_allclose(dm.coordinates, psi[:, 1:] * w[1:] ** t, rtol=1e-3, atol=1e-5)
  return w, u_ref


@pytest.mark.parametrize("alpha,t", [(1.0, 1.0), (0.0, 3.0)])
def test_diffusion_map_matches_dense_float64(alpha, t):
  x = data.swiss_roll(700, 123)
  dm = diffmap.diffusion_map(x, 0.05, 6, alpha=alpha, t=t)
  check_against_reference(dm, x, 0.05, alpha, 6, t)


def test_multilevel_start_gives_the_same_answer():
  """Above coarse_min the solve starts from a Nyström-extended quarter; the answer is the full kernel's."""
  x = data.swiss_roll(700, 7)
  dm = diffmap.diffusion_map(x, 0.05, 6, coarse_min=300)
  check_against_reference(dm, x, 0.05, 1.0, 6, 1.0)


def test_nystrom_extension_matches_the_float64_formula():
  """ψ(y) = λ⁻¹ Σ_j P(y, x_j) ψ(x_j), P(y, ·) ∝ K(y, x_j) q_j^{−α}: at the map's own points it returns the
  coordinates; at new points it matches the formula evaluated in float64 on the reference eigenvectors."""
  x_all = data.swiss_roll(800, 11)
  x, y = x_all[:700], x_all[700:]
  eps, k = 0.05, 6
  dm = diffmap.diffusion_map(x, eps, k, alpha=1.0, t=1.0)
  np.testing.assert_allclose(diffmap.nystrom(dm, x), dm.coordinates, rtol=1e-3, atol=1e-5)
  w, u, q, d = reference(x, eps, 1.0, k)
  psi_ref = u / np.sqrt(d / d.sum())[:, None]
  xc = x.astype(np.float64) - x.astype(np.float64).mean(0)
  yc = y.astype(np.float64) - x.astype(np.float64).mean(0)
  ky = np.exp(-np.sum((yc[:, None] - xc[None]) ** 2, -1) / eps) / q[None, :]
  py = ky / ky.sum(1, keepdims=True)
  coords_ref = py @ psi_ref[:, 1:]                        # λ^{t−1} with t = 1
  sign = np.sign(np.sum(np.asarray(dm.psi[:, 1:]) * psi_ref[:, 1:], 0))
  np.testing.assert_allclose(np.asarray(diffmap.nystrom(dm, y)) * sign, coords_ref, rtol=1e-3, atol=1e-3)  # ψ is O(1)


def test_bad_inputs():
  x = data.swiss_roll(50, 1)
  with pytest.raises(ValueError, match="eps must be positive"):
    diffmap.diffusion_map(x, 0.0, 3)
  with pytest.raises(ValueError, match="k must be in"):
    diffmap.diffusion_map(x, 0.1, 49)
  with pytest.raises(ValueError, match="alpha must lie"):
    diffmap.diffusion_map(x, 0.1, 3, alpha=2.0)
  with pytest.raises(ValueError, match="x must have rank 2"):
    diffmap.diffusion_map(x[:, 0], 0.1, 3)
  with pytest.raises(ValueError, match="x must be finite"):
    diffmap.diffusion_map(np.full((50, 3), np.nan, np.float32), 0.1, 3)
  from attngeo import walks
  q = np.ones((8, 4), np.float32)
  for bad in (0, 1.5, None):                 # the geometry's blocks are named settings: None is not one of them
    match = f"block_size must be a positive integer; got {bad!r}"
    for call in (lambda: diffmap.diffusion_map(x, 0.1, 3, block_size=bad), lambda: walks.gaussian(x, 0.1, block_size=bad),
                 lambda: walks.gaussian_walk(x, 0.1, block_size=bad),
                 lambda: diffmap.attention_eigenpairs(q, q, 2, block_size=bad)):
      with pytest.raises(ValueError, match=match):
        call()


def test_diffmap_command_smoke(tmp_path, capsys):
  """`attngeo diffmap`: a .npy file and a built-in cloud, its outputs, and one-line errors."""
  path = tmp_path / "cloud.npy"
  np.save(path, data.swiss_roll(400, 3))
  diffmap_cli.main([str(path), "--k", "3", "--eps", "0.1", "--out", str(tmp_path / "a")])
  out = json.loads((tmp_path / "a" / "diffmap.json").read_text())
  assert out["n"] == 400 and out["converged"] and len(out["rows"]) == 4
  assert np.load(tmp_path / "a" / "coordinates.npy").shape == (400, 3)
  assert (tmp_path / "a" / "diffmap.png").stat().st_size > 0
  assert "1 − λ" in capsys.readouterr().out
  for bad in (["nope.npy"], ["swiss_roll", "--eps", "-1"], ["swiss_roll", "--k", "0"], ["swiss_roll", "--alpha", "3"]):
    with pytest.raises(SystemExit) as e:
      diffmap_cli.main(bad + ["--out", str(tmp_path / "b")])
    assert e.value.code == 2


@pytest.mark.slow
def test_bench_diffmap_smoke(tmp_path):
  bench_diffmap.main(["--sizes", "300", "--reference-max", "300", "--k", "3", "--eps", "0.3", "--out", str(tmp_path)])
  rows = {r["method"]: r for r in json.loads((tmp_path / "bench_diffmap.json").read_text())}
  assert rows["attngeo"]["max_rel_err_rate"] < 1e-3 and rows["attngeo"]["max_angle_deg"] < 0.1
  assert rows["eigsh"]["max_angle_deg"] < 1e-4 and rows["eigsh"]["max_rel_err_rate"] == 0.0


def test_reversible_attention_eigenpairs_match_dense_float64():
  """An exact-A walk between DMAP and ATAP (β = ½: general augmented form, S not PSD) of random q, k: π and
  the leading eigenpairs of the conjugate against the dense logits of `operators.logits` in float64."""
  beta, n = 0.5, 200
  rng = np.random.default_rng(5)
  q, k = rng.standard_normal((n, 8)).astype(np.float32), rng.standard_normal((n, 8)).astype(np.float32)
  lg = np.asarray(op.logits(q[None, :, None], k[None, :, None], beta=beta, alpha=0.0).full[0, 0], np.float64)
  p = np.exp(lg - lg.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  pi = scipy.linalg.svd(np.eye(n) - p.T)[2][-1]
  pi /= pi.sum()
  a = np.sqrt(pi)[:, None] * p / np.sqrt(pi)[None, :]
  assert np.abs(a - a.T).max() < 1e-6                                # reversible: the conjugate is symmetric
  w, u = np.linalg.eigh(0.5 * (a + a.T))
  w, u = w[::-1][:5], u[:, ::-1][:, :5]
  res = diffmap.attention_eigenpairs(q, k, 5, beta=beta, block_size=128)
  assert bool(res.spectrum.converged)
  np.testing.assert_allclose(res.pi, pi, rtol=1e-4, atol=1e-9)
  np.testing.assert_allclose(res.spectrum.values, w, atol=1e-5)
  assert np.all(angles_deg(np.asarray(res.spectrum.vectors, np.float64), u) < 0.1)
