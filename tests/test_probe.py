"""attngeo.probe and `attngeo probe`: read-outs against dense references, selection, the CLI, the hook."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from helpers import Batches

from attngeo import nn, operators, probe, train
from attngeo.experiments import probe as probe_cli


def gpt_loss(m, b, r):
  return optax.softmax_cross_entropy_with_integer_labels(m(b["tokens"][:, :-1]), b["tokens"][:, 1:]).mean(), {}


TOKENS = {"tokens": np.random.default_rng(0).integers(0, 32, (4, 33)).astype(np.int32)}


def tiny_gpt():
  return nn.GPT(nn.GPTConfig.from_depth(3, vocab_size=32, head_dim=8, width=16, operator="DMTN"), rngs=nnx.Rngs(0))


def train_tiny(workdir, hooks=()):
  cfg = train.TrainConfig(steps=10, batch_size=4, workdir=workdir, log_every=5, progress=False)
  return train.train(tiny_gpt(), gpt_loss, Batches(TOKENS), cfg, hooks=hooks)


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("gpt"))
  hook = probe.hook(lambda m, x: m(x), jnp.asarray(TOKENS["tokens"][:1, :12]), every=5)
  res = train_tiny(wd, hooks=(hook,))
  return wd, res, hook


def dense_layer_reference(q, k, m, heads=None):
  """The probe's walk-level read-outs of one layer from first principles, in float64 where it matters."""
  beta, alpha = m.coefficients()
  p = np.float64(operators.markov_matrix(q, k, beta=beta, alpha=alpha, causal=m.causal))[0]   # [h, n, n]
  wv, wo = np.float64(m.wv[...]), np.float64(m.wo[...])
  if heads is not None:
    p, wv, wo = p[heads], wv[:, heads], wo[heads]
  t = np.einsum("dhk,hke->hed", wv, wo)
  w = p.mean(0)
  g = p / np.where(w > 0, p.sum(0), 1.0)                                   # masked edges: T_ij = 0, weight 0
  tij = np.einsum("hij,hde->ijde", g, t)
  lam = np.linalg.svd(tij, compute_uv=False) ** 2
  keep = lam > 1e-14 * lam[..., :1]
  r = np.maximum(keep.sum(-1), 1)
  frob2 = np.maximum((lam**2 * keep).sum(-1), 1e-300)
  delta = np.sqrt(np.clip(1 - (lam * keep).sum(-1) ** 2 / (r * frob2), 0, 1))
  ev = np.sort(np.abs(np.linalg.eigvals(w)))[::-1]
  head_lam = np.linalg.svd(t, compute_uv=False) ** 2
  hk = head_lam > 1e-10 * head_lam[:, :1]
  head = np.sqrt(1 - (head_lam * hk).sum(-1) ** 2 / (hk.sum(-1) * (head_lam**2 * hk).sum(-1)))
  return dict(w=w, effective=(w * delta).sum() / w.shape[0], gap=1 - ev[1], head=head)


def test_report_matches_dense_per_edge_reference_on_a_causal_and_a_bidirectional_model():
  gpt = tiny_gpt()
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  pf = nn.PointFlow(nn.PointFlowConfig.create(width=16, depth=2, num_heads=2, operator="DMTN"), rngs=nnx.Rngs(1))
  pts = jax.random.normal(jax.random.PRNGKey(2), (1, 12, 3))
  for model, run in ((gpt, lambda: gpt(x)), (pf, lambda: pf(pts, jnp.ones((1,))))):
    rows = probe.model_report(model, run, progress=False)
    _, qks = nn.capture_qk(model, run)
    mods = nn.attention_modules(model)
    refs = [dense_layer_reference(q, k, m) for (q, k), m in zip(qks, mods)]
    for row, ref in zip(rows, refs):
      np.testing.assert_allclose(row["effective_isometry_defect"], ref["effective"], rtol=2e-5)
      np.testing.assert_allclose(row["head_isometry_defect"], ref["head"], rtol=2e-5)
      np.testing.assert_allclose(row["spectral_gap"], ref["gap"], rtol=1e-4, atol=1e-5)
      assert row["effective_isometry_defect_se"] == 0 and row["partial_support_mass"] == 0
      assert row["spectrum_converged"] is True              # the gap above comes from a converged solve
    for row, a, b in zip(rows, refs[:-1], refs[1:]):
      np.testing.assert_allclose(row["next_relative_change"], np.linalg.norm(b["w"] - a["w"]) / np.linalg.norm(a["w"]),
                                 rtol=1e-4)


def test_selected_single_head_has_its_head_defect_as_effective_defect():
  """One head: T_ij = T^h on every edge, so δ_eff = δ(T^h) and W = P^h; layers=[0, 2] pairs 0 with 2."""
  model = tiny_gpt()
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  full = probe.model_report(model, lambda: model(x), progress=False)
  one = probe.model_report(model, lambda: model(x), layers=[0, 2], heads=[1], progress=False)
  assert [r["layer"] for r in one] == [0, 2] and one[0]["next_layer"] == 2 and one[1]["next_layer"] is None
  for r, f in zip(one, (full[0], full[2])):
    assert len(r["head_isometry_defect"]) == 1
    np.testing.assert_allclose(r["head_isometry_defect"][0], f["head_isometry_defect"][1], rtol=1e-5)
    np.testing.assert_allclose(r["effective_isometry_defect"], f["head_isometry_defect"][1], rtol=1e-4)
  _, qks = nn.capture_qk(model, lambda: model(x))
  mods = nn.attention_modules(model)
  ws = [dense_layer_reference(*qks[i], mods[i], heads=[1])["w"] for i in (0, 2)]
  np.testing.assert_allclose(one[0]["next_relative_change"], np.linalg.norm(ws[1] - ws[0]) / np.linalg.norm(ws[0]),
                             rtol=1e-4)
  with pytest.raises(ValueError, match="layers must be distinct indices in"):
    probe.model_report(model, lambda: model(x), layers=[3])
  with pytest.raises(ValueError, match="heads must be distinct indices in"):
    probe.model_report(model, lambda: model(x), heads=[0, 0])
  with pytest.raises(ValueError, match="contains no attngeo.nn.Attention"):
    probe.model_report(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), lambda: None)
  first = nn.attention_modules(model)[0]
  first.wq[...] = first.wq[...].at[0, 0, 0].set(jnp.nan)        # a non-finite weight: an error, not a NaN row
  with pytest.raises(ValueError, match="NaN or [Ii]nf"):
    probe.model_report(model, lambda: model(x), progress=False)


def test_probe_cli_writes_all_outputs(gpt_run, tmp_path, capsys):
  wd, _, _ = gpt_run
  text = tmp_path / "text.txt"
  text.write_text("the quick brown fox jumps over the lazy dog " * 20)
  with pytest.raises(SystemExit):          # bytes are ids 0-255; this model reads 32 (they were taken mod 32)
    probe_cli.main([wd, "--data", str(text), "--batch", "1", "--seq-len", "12", "--out", str(tmp_path / "p")])
  assert "a text file is read as bytes (ids 0-255), but this model's vocabulary has 32" in capsys.readouterr().err
  ids = tmp_path / "ids.npy"
  np.save(ids, np.random.default_rng(0).integers(0, 32, (1, 12)))
  rows = probe_cli.main([wd, "--data", str(ids), "--batch", "1", "--seq-len", "12", "--out", str(tmp_path / "p"),
                         "--layers", "0,2", "--no-progress"])
  assert [r["layer"] for r in rows] == [0, 2]
  for name in ("probe.json", "probe.md", "probe.csv", "probe.png"):
    assert os.path.getsize(tmp_path / "p" / name) > 0
  saved = json.loads((tmp_path / "p" / "probe.json").read_text())
  assert saved["step"] == max(int(n) for n in os.listdir(os.path.join(wd, "ckpt")) if n.isdigit())   # the step read
  assert f"checkpoint step {saved['step']}" in (tmp_path / "p" / "probe.md").read_text()
  layer = saved["layers"][0]
  for key, _, _ in probe_cli.QUANTITIES:
    assert key in layer
  assert len(layer["head_isometry_defect"]) == 2 and layer["next_layer"] == 2
  assert all(0 <= v <= 1 for v in layer["rho_skew"])
  assert "| layer |" in capsys.readouterr().out


def test_a_probe_whose_figure_meets_a_full_disk_leaves_the_last_outputs_whole(gpt_run, tmp_path, monkeypatch):
  """The tables and the figure land together (`files.staged`): a full disk while the figure is written left new
  tables beside an old (or no) figure."""
  import errno
  wd, _, _ = gpt_run
  ids = tmp_path / "ids.npy"
  np.save(ids, np.random.default_rng(0).integers(0, 32, (1, 12)))
  args = [wd, "--data", str(ids), "--batch", "1", "--seq-len", "12", "--out", str(tmp_path / "p"), "--no-progress"]
  probe_cli.main(args + ["--layers", "0,2"])
  before = {n: (tmp_path / "p" / n).read_bytes() for n in os.listdir(tmp_path / "p")}
  assert sorted(before) == ["probe.csv", "probe.json", "probe.md", "probe.png"]

  from matplotlib.figure import Figure

  def full(fig, path, **kwargs):
    with open(path, "wb") as f:
      f.write(b"\x89PNG half")
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(Figure, "savefig", full)
  with pytest.raises(OSError, match="No space left"):
    probe_cli.main(args + ["--layers", "1"])
  assert {n: (tmp_path / "p" / n).read_bytes() for n in os.listdir(tmp_path / "p")} == before   # no temporary either


def test_probe_cli_rejects_bad_arguments(gpt_run, tmp_path, capsys):
  wd, _, _ = gpt_run
  for argv in ([str(tmp_path)], [wd, "--layers", "7"], [wd, "--heads", "x"], [wd, "--samples", "1"],
               [wd, "--seq-len", "100000"]):
    with pytest.raises(SystemExit) as e:
      probe_cli.main(argv)
    assert e.value.code == 2
  err = capsys.readouterr().err
  assert "not a run folder" in err and "--layers must be distinct indices in [0, 3)" in err
  assert "--seq-len must be at most the model's context" in err      # it ran for minutes, 1 GB and growing


def test_probe_cli_names_its_default_inputs_on_the_terminal_and_in_the_report(gpt_run, tmp_path, capsys):
  """A GPT run without --data is probed on random tokens: said on the terminal and in probe.md/json."""
  wd, _, _ = gpt_run
  probe_cli.main([wd, "--batch", "1", "--seq-len", "12", "--out", str(tmp_path / "p"), "--layers", "0",
                  "--no-progress"])
  out = capsys.readouterr().out
  said = "inputs: random tokens (uniform ids in [0, 32)), 1 × 12 (the default for a GPT model; choose with --data)"
  assert said in out and f"wrote {tmp_path / 'p' / 'probe.md'}, probe.csv, probe.json, probe.png" in out
  assert "inputs: random tokens (uniform ids in [0, 32)), 1 × 12;" in (tmp_path / "p" / "probe.md").read_text()
  assert json.loads((tmp_path / "p" / "probe.json").read_text())["data"] == "random"


def test_probe_cli_refuses_inputs_a_gpt_cannot_read(gpt_run, tmp_path, capsys):
  """A mistyped path, a point cloud's name, malformed or out-of-vocabulary token ids: one line each, exit 2."""
  wd, _, _ = gpt_run
  np.save(tmp_path / "flat.npy", np.arange(12))
  np.save(tmp_path / "big.npy", np.full((2, 12), 32))
  cases = {"swiss_roll": "--data must be an existing text file, an existing .npy of token ids [b, n], or 'random' "
                         "for a GPT run; got 'swiss_roll' (not a file)",
           str(tmp_path / "typo.txt"): "(not a file)",
           str(tmp_path / "flat.npy"): "must hold integer token ids [b, n ≥ 2]; got int64 of shape (12,)",
           str(tmp_path / "big.npy"): "must hold token ids in [0, 32); got [32, 32]"}
  for data, message in cases.items():
    with pytest.raises(SystemExit) as e:
      probe_cli.main([wd, "--data", data, "--out", str(tmp_path / "p"), "--no-progress"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err
  assert not (tmp_path / "p").exists()                                  # refused before anything is written


def test_probe_cli_refuses_set_size_on_a_gpt_run_instead_of_ignoring_it(gpt_run, tmp_path, capsys):
  """--set-size shapes point sets only: on a GPT run it was silently ignored (64-token sequences probed)."""
  wd, _, _ = gpt_run
  with pytest.raises(SystemExit) as e:
    probe_cli.main([wd, "--set-size", "48", "--out", str(tmp_path / "p"), "--no-progress"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
  assert f"--set-size applies to PointFlow runs only; {wd} is a GPT run (its input is an existing text file" in err
  assert not (tmp_path / "p").exists()
  assert "points per set, PointFlow runs only (refused on others)" in " ".join(probe_cli.parser().format_help().split())


def test_probe_cli_checks_point_sets_against_the_cloud(tmp_path, capsys):
  """PointFlow: --set-size beyond the cloud and points of the wrong dimension are one line, not numpy's error."""
  from attngeo import flow
  wd = str(tmp_path / "pf")
  pf = nn.PointFlow(nn.PointFlowConfig.create(width=16, depth=2, num_heads=2), rngs=nnx.Rngs(0))
  pts = {"points": np.random.default_rng(0).standard_normal((2, 16, 3)).astype(np.float32)}
  train.train(pf, lambda m, b, r: (flow.loss(m, b["points"], r), {}), Batches(pts),
              train.TrainConfig(steps=1, batch_size=2, workdir=wd, log_every=1, progress=False))
  np.save(tmp_path / "plane.npy", np.zeros((50, 2)))
  for argv, message in (([], "--set-size must be in [2, 4000] (the points of --data swiss_roll); got 100000"),
                        (["--data", str(tmp_path / "plane.npy")], "has points of dimension 2; this PointFlow takes 3"),
                        (["--data", "swissroll"], "--data must be swiss_roll, sphere, torus or an existing .npy/.csv"),
                        (["--data", str(tmp_path / "cloud.npy")], "for a PointFlow run; got"),
                        (["--seq-len", "12"], f"--seq-len applies to GPT runs only; {wd} is a PointFlow run")):
    with pytest.raises(SystemExit) as e:
      probe_cli.main([wd, "--set-size", "100000", *argv, "--no-progress", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_training_hook_logs_probe_metrics_without_changing_training(gpt_run, tmp_path):
  wd, res, hook = gpt_run
  # deferred: the probe dispatched at step 5 is collected at step 10; the one at step 10 waits in flush()
  assert res.history[1]["probe/step"] == 5 and "probe/step" not in res.history[0]
  keys = {f"probe/{k}" for k in probe.SUMMARY_KEYS}
  assert keys <= set(res.history[1])
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    assert keys <= set(json.loads(f.readlines()[1]))
  assert hook.flush()["probe/step"] == 10 and hook.flush() is None
  plain = train_tiny(str(tmp_path / "plain"))
  assert [r["loss"] for r in plain.history] == [r["loss"] for r in res.history]


def test_hook_summary_is_the_mean_of_the_report(gpt_run):
  _, res, _ = gpt_run
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  hook = probe.hook(lambda m, b: m(b), x, every=1, defer=False)
  got = hook(1, res.model)
  rows = probe.model_report(res.model, lambda: res.model(x), progress=False)
  for key in ("effective_isometry_defect", "head_isometry_defect", "next_js_divergence", "curvature"):
    vals = [np.mean(r[key]) for r in rows if r[key] is not None]
    np.testing.assert_allclose(got[f"probe/{key}"], np.mean(vals), rtol=1e-4)


def test_layer_stats_of_exact_operator_are_zero():
  ks = jax.random.split(jax.random.PRNGKey(0), 2)
  q, k = jax.random.normal(ks[0], (2, 20, 2, 4)), jax.random.normal(ks[1], (2, 20, 2, 4))
  st = probe.layer_stats(q, k, 0.0, 0.0)
  assert np.all(st["eps_rev"] < 1e-5) and np.all(st["rho_skew"] < 1e-5)
  assert np.all((st["eff_neighbours"] >= 1) & (st["eff_neighbours"] <= 20))


def eps_rev_unmasked64(q, k, beta, alpha, damping=0.01):
  """ε_rev [b, h] of the unmasked walk under π_τ (I − (1 − τ)P) = τ/n · 1ᵀ, all in float64."""
  lg = np.float64(operators.logits(q, k, beta=beta, alpha=alpha).full)
  p = np.exp(lg - lg.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  n = p.shape[-1]
  a = np.eye(n) - (1 - damping) * p
  pi = np.linalg.solve(np.swapaxes(a, -1, -2), np.full(p.shape[:-1], damping / n)[..., None])[..., 0]
  f = pi[..., :, None] * p
  return 0.5 * np.abs(f - np.swapaxes(f, -1, -2)).sum((-2, -1))


def test_causal_layers_read_reversibility_without_the_mask():
  """A causal layer's masked ε_rev is ~0 for any logits (π = δ₀); `eps_rev_unmasked` is the unmasked
  walk's ε_rev under π_τ (a float64 solve), within the damped law's bound of 0 at the exact-A corner, and
  absent on unmasked layers."""
  ks = jax.random.split(jax.random.PRNGKey(3), 2)
  q, k = jax.random.normal(ks[0], (2, 16, 2, 4)), jax.random.normal(ks[1], (2, 16, 2, 4))
  attn = probe.layer_stats(q, k, 1.0, 1.0, causal=True)
  assert np.all(attn["eps_rev"] < 1e-6)
  np.testing.assert_allclose(attn["eps_rev_unmasked"], eps_rev_unmasked64(q, k, 1.0, 1.0).mean(0), rtol=1e-4)
  assert np.all(attn["eps_rev_unmasked"] > 0.05)
  # At the exact-A corner P is reversible under its π, so ε_rev(π_τ) ≤ ‖π_τ − π‖₁ ≤ τ‖u − π‖₁/(1 − (1 − τ)δ(P)).
  corner = probe.layer_stats(q, k, 0.0, 0.0, causal=True)["eps_rev_unmasked"]
  np.testing.assert_allclose(corner, eps_rev_unmasked64(q, k, 0.0, 0.0).mean(0), rtol=1e-3)
  lg = np.float64(operators.logits(q, k, beta=0.0, alpha=0.0).full)
  p = np.exp(lg - lg.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  ev, vec = np.linalg.eig(np.swapaxes(p, -1, -2))                 # π: P's left eigenvector for eigenvalue 1
  pi = np.abs(np.take_along_axis(vec, np.abs(ev - 1).argmin(-1)[..., None, None], -1)[..., 0])
  pi /= pi.sum(-1, keepdims=True)
  np.testing.assert_allclose(np.einsum("...i,...ij->...j", pi, p), pi, atol=1e-10)
  dob = 0.5 * np.abs(p[..., :, None, :] - p[..., None, :, :]).sum(-1).max((-2, -1))
  bound = 0.01 * np.abs(1 / 16 - pi).sum(-1) / (1 - 0.99 * dob)
  assert np.all(corner <= bound.mean(0)) and np.all(corner < attn["eps_rev_unmasked"] / 10)
  assert "eps_rev_unmasked" not in probe.layer_stats(q, k, 1.0, 1.0)
  gpt = tiny_gpt()
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  rows = probe.model_report(gpt, lambda: gpt(x), progress=False)
  _, qks = nn.capture_qk(gpt, lambda: gpt(x))
  for row, (q, k), m in zip(rows, qks, nn.attention_modules(gpt)):
    np.testing.assert_allclose(row["eps_rev_unmasked"], eps_rev_unmasked64(q, k, *m.coefficients())[0], rtol=1e-4)
  from attngeo.experiments import probe as cli
  assert "eps_rev_unmasked" in [c.key for c in cli.columns(cli.table_rows(rows))]


@pytest.mark.parametrize("shape", [(30, 8), (6, 10)])
def test_principal_coordinates_are_the_svd_ones_up_to_sign(shape):
  x = np.random.default_rng(1).standard_normal(shape) * np.array([5.0, 3.0, 2.0] + [0.5] * (shape[1] - 3))
  xc = x - x.mean(0)
  u, s, _ = np.linalg.svd(xc, full_matrices=False)
  ref = u[:, :3] * s[:3]
  got = np.asarray(probe._principal_coordinates(jnp.asarray(x, jnp.float32)))
  got = got * np.sign(np.sum(got * ref, 0))                                # one sign per column
  np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())


def test_grouped_value_heads_probe_as_the_equivalent_full_model():
  """GQA (2 query heads sharing 1 key/value head) probes exactly as the MHA model whose key and value
  heads are the shared one repeated: the probe reads each query head's transport W_O^h W_V^{g(h)}."""
  cfg = nn.GPTConfig.from_depth(2, vocab_size=32, head_dim=8, width=16, operator="DMTN")
  gqa = nn.GPT(dataclasses.replace(cfg, block=dataclasses.replace(cfg.block, num_kv_heads=1)), rngs=nnx.Rngs(3))
  mha = nnx.clone(gqa)
  for m in nn.attention_modules(mha):
    m.wk, m.wv = (w.replace(jnp.repeat(w[...], 2, axis=1)) for w in (m.wk, m.wv))
    m.num_kv_heads = m.num_heads
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  np.testing.assert_allclose(gqa(x), mha(x), atol=1e-5)
  for r, s in zip(probe.model_report(gqa, lambda: gqa(x), progress=False),
                  probe.model_report(mha, lambda: mha(x), progress=False)):
    np.testing.assert_allclose(r["effective_isometry_defect"], s["effective_isometry_defect"], rtol=1e-5)
    np.testing.assert_allclose(r["head_isometry_defect"], s["head_isometry_defect"], rtol=1e-5)


def test_sliding_windows_shorter_than_the_input_are_refused_not_misread():
  cfg = nn.GPTConfig.from_depth(2, vocab_size=32, head_dim=8, width=16, operator="DMTN")
  model = nn.GPT(dataclasses.replace(cfg, attn_windows=(4, 64)), rngs=nnx.Rngs(0))
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  with pytest.raises(ValueError, match=r"layers \[0\] attend through sliding windows .* at most 5 tokens"):
    probe.model_report(model, lambda: model(x), progress=False)
  rows = probe.model_report(model, lambda: model(x[:, :5]), progress=False)     # within every window: exact
  assert len(rows) == 2


def test_cmap_layers_report_the_phase_and_the_rotated_transport_defect(tmp_path):
  """A bidirectional CMAP PointFlow: the phase read-outs equal attngeo.magnetic's dense ones on the same
  q, k (the circulation within its sampling error), the effective defect is that of the rotated edge
  transports `Σ_h g^h W_V^h R(θ^h_ij) W_O^h` formed edge by edge, the per-head defect is None (a head's
  transport depends on the edge), and a causal CMAP GPT reads only the phase's mean."""
  from helpers import defect_from_lam, dense_cmap_transports64
  from attngeo import magnetic
  pf = nn.PointFlow(nn.PointFlowConfig.create(width=16, depth=2, num_heads=2, operator="CMAP", coupling=1.5),
                    rngs=nnx.Rngs(1))
  pts = jax.random.normal(jax.random.PRNGKey(2), (2, 24, 3))
  run = lambda: pf(pts, jnp.ones((2,)))
  rows = probe.model_report(pf, run, progress=False, triangles=20_000)
  _, qks = nn.capture_qk(pf, run)
  for row, (q, k), m in zip(rows, qks, nn.attention_modules(pf)):
    assert row["head_isometry_defect"] is None and row["partial_support_mass"] == 0
    p = operators.markov_matrix(q, k, beta=0.0, alpha=0.0)
    theta = operators.phases(q, k, coupling=1.5)
    truth = []
    for pb, tb in zip(np.asarray(p, np.float64), np.asarray(theta, np.float64)):
      lam = np.linalg.svd(dense_cmap_transports64(pb, tb, m.wv[...], m.wo[...]), compute_uv=False)[..., ::-1] ** 2
      truth.append((pb.mean(0) * defect_from_lam(lam, 1e-14)).sum() / pb.shape[-1])
    np.testing.assert_allclose(row["effective_isometry_defect"], np.mean(truth), rtol=1e-4)
    fr, cv = magnetic.frustration(p, theta), magnetic.curvature(p, theta)
    np.testing.assert_allclose(row["cmap_lambda_max"], (1 - fr.lower).mean(0), rtol=1e-5)
    np.testing.assert_allclose(row["cmap_frustration_upper"], fr.upper.mean(0), rtol=1e-4, atol=1e-6)
    err = np.abs(np.asarray(row["cmap_mean_abs_circulation"]) - np.asarray(cv.mean_abs).mean(0))
    assert np.all(err < 4.5 * np.asarray(row["cmap_mean_abs_circulation_se"])), err
    werr = np.abs(np.asarray(row["cmap_wilson"]) - np.real(np.asarray(cv.wilson)).mean(0))
    assert np.all(werr < 4.5 * np.asarray(row["cmap_wilson_se"])), werr
    np.testing.assert_allclose(row["cmap_frustration_stalled"], np.asarray(fr.stalled, np.float32).mean(0))
    dense_phase = (np.asarray(p) * np.abs(np.asarray(theta))).sum((-2, -1)).mean(0) / p.shape[-1]
    np.testing.assert_allclose(row["cmap_mean_abs_phase"], dense_phase, rtol=1e-5)
  assert np.mean(rows[0]["cmap_mean_abs_phase"]) > 0.01                    # a real phase, not γ = 0
  summ = probe.summary(pf, run)
  assert "head_isometry_defect" not in summ and "eps_rev" in summ
  np.testing.assert_allclose(summ["effective_isometry_defect"], np.mean([r["effective_isometry_defect"] for r in rows]),
                             rtol=1e-5)
  gpt = nn.GPT(nn.GPTConfig.from_depth(2, vocab_size=32, head_dim=8, width=16, operator="CMAP"), rngs=nnx.Rngs(0))
  x = jnp.asarray(TOKENS["tokens"][:1, :12])
  causal = probe.model_report(gpt, lambda: gpt(x), progress=False)
  assert all(r["cmap_mean_abs_phase"] is not None and "cmap_lambda_max" not in r for r in causal)
  from attngeo.experiments import probe as cli
  table = cli.table_rows(rows)
  assert table[0]["effective"] is not None and table[0]["cmap_nu"].startswith("[")
  assert [c.key for c in cli.columns(rows)][-1] == "cmap_nu" and cli.columns(causal)[-1].key == "cmap_nu"
  assert cli.columns([{"layer": 0, "cmap_mean_abs_phase": None}]) == cli.COLUMNS    # no CMAP layer: no CMAP columns
  cli.plot(rows, str(tmp_path / "p.png"), "CMAP")                         # None head defects draw no points


def test_probe_isometry_read_outs_are_the_one_definition():
  """`connection`'s one definition through the probe: an exactly isometric head reads < 10⁻⁶, a head whose
  8th singular value is 10⁻⁴·σ₁ (real: the rank rule σ > 10⁻⁶σ₁ keeps it) reads δ = √(1/8) as in float64,
  not the 0 of the former λ > 10⁻⁶·λ_max cut; the effective defect agrees with the dense route to the trace
  tables' floor `TABLE_FLOOR2` in δ²."""
  from attngeo import connection
  pf = nn.PointFlow(nn.PointFlowConfig.create(width=16, depth=1, num_heads=2, operator="DMTN"), rngs=nnx.Rngs(3))
  m = nn.attention_modules(pf)[0]
  d, h, k = m.wv[...].shape
  o, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(d, d)))
  v, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(d, d)))
  sigma = np.ones((h, k))
  sigma[1, -1] = 1e-4
  m.wv[...] = jnp.asarray(v[:, :h * k].reshape(d, h, k), m.wv[...].dtype)
  m.wo[...] = jnp.asarray(np.transpose(o[:, :h * k].reshape(d, h, k), (1, 2, 0)) * sigma[:, :, None], m.wo[...].dtype)
  pts = jax.random.normal(jax.random.PRNGKey(4), (1, 10, 3))
  run = lambda: pf(pts, jnp.ones((1,)))
  row = probe.model_report(pf, run, progress=False)[0]
  assert row["head_isometry_defect"][0] < 1e-6
  np.testing.assert_allclose(row["head_isometry_defect"][1], np.sqrt(1 / 8), rtol=1e-5)
  (q, kk), = nn.capture_qk(pf, run)[1]
  beta, alpha = m.coefficients()
  p = operators.markov_matrix(q, kk, beta=beta, alpha=alpha, causal=m.causal)[0]
  ref = dense_layer_reference(q, kk, m)["effective"]
  dense = float(connection.effective_isometry_defect_dense(p, connection.head_transports(m.wv[...], m.wo[...])))
  assert abs(dense - ref) <= 1e-5 * ref
  assert abs(row["effective_isometry_defect"] ** 2 - dense**2) <= connection.TABLE_FLOOR2 + 4e-5 * dense**2


def albert_run(folder, depth=3):
  """A weights-only run of a tiny ALBERT-layout encoder (one shared layer applied `depth` times), its
  vocab.txt and a SMILES file of equal-length molecules: what `attngeo import albert` writes, without torch."""
  from attngeo import runs
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "C", "O", "N", "(", ")", "=", "c", "1"]
  model = nn.Encoder(nn.EncoderConfig.albert(depth=depth, vocab_size=len(vocab), seq_len=16, width=16, num_heads=2,
                                             head_dim=8, embed_dim=8), rngs=nnx.Rngs(0))
  os.makedirs(folder, exist_ok=True)
  runs.write_weights_run(str(folder), model)
  (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
  (folder / "mols.txt").write_text("CCO\nCCN\nC=O\nCOC\n")
  return model, str(folder / "mols.txt")


def test_probe_cli_layers_count_albert_s_applications_not_its_one_module(tmp_path, capsys):
  """ALBERT applies one Attention `depth` = 3 times: `--layers` indexes the applications (the call index of the
  report's rows), so 2 is a layer and 3 is out of range, in one line naming the 3 applied layers (the old check
  counted modules: [0, 1), refusing --layers 2)."""
  model, mols = albert_run(tmp_path / "albert")
  assert probe_cli.applied_layers(model) == 3 and len(nn.attention_modules(model)) == 1
  assert probe_cli.applied_layers(tiny_gpt()) == 3
  with pytest.raises(SystemExit) as e:
    probe_cli.main([str(tmp_path / "albert"), "--data", mols, "--layers", "1,3", "--no-progress"])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1         # one line, no usage block or traceback
  assert "--layers must be distinct indices in [0, 3) (the 3 attention layers as applied); got [1, 3]" in err[0]


@pytest.mark.slow
def test_probe_cli_probes_albert_s_applications_by_call_index(tmp_path):
  """`--layers 0,2` on the tiny ALBERT: its rows are the dense walk read-outs of the q, k captured at calls 0
  and 2 of the shared layer (which see different inputs, so they differ)."""
  model, mols = albert_run(tmp_path / "albert")
  rows = probe_cli.main([str(tmp_path / "albert"), "--data", mols, "--batch", "2", "--layers", "0,2", "--no-progress",
                         "--out", str(tmp_path / "p")])
  assert [r["layer"] for r in rows] == [0, 2] and rows[0]["next_layer"] == 2
  from attngeo.lm.smiles import SmilesTokenizer
  ids = jnp.asarray(SmilesTokenizer.from_vocab(str(tmp_path / "albert")).equal_length(["CCO", "CCN"], 2))
  _, qks, mods = nn.capture_qk(model, lambda: model(ids, jnp.ones(ids.shape, bool)), every_call=True)
  assert len(qks) == 3
  for row, call in zip(rows, (0, 2)):
    (q, k), m = qks[call], mods[call]
    ref = [dense_layer_reference(q[i:i + 1], k[i:i + 1], m) for i in range(2)]
    np.testing.assert_allclose(row["spectral_gap"], np.mean([r["gap"] for r in ref]), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(row["head_isometry_defect"], ref[0]["head"], rtol=2e-5)
  assert abs(rows[0]["spectral_gap"] - rows[1]["spectral_gap"]) > 1e-4
  assert "3 attention layers (1 shared, applied 3 times)" in (tmp_path / "p" / "probe.md").read_text()


def test_a_probe_past_its_memory_cap_is_a_memory_error_naming_the_cap(monkeypatch):
  """`--batch 100000` on a small GPT was ended by the OOM killer (exit 137, no message). The report now runs with the
  data segment capped; XLA:CPU reports a refused allocation as "INTERNAL: YNNPACK operation failed", which
  `bounded` turns into a MemoryError (the CLI's one line) only where the process's peak reached the cap."""
  import contextlib

  from attngeo import cli
  from attngeo.experiments import timing
  caps = []

  @contextlib.contextmanager
  def capped(limit):
    caps.append(limit)
    yield 8 * 2**30
  monkeypatch.setattr(timing, "bounded_data", capped)
  ynn = RuntimeError("INTERNAL: YNNPACK operation failed: error")
  for peak, error, expected in ((9 * 2**30, ynn, MemoryError), (2 * 2**30, ynn, RuntimeError),
                                (9 * 2**30, ValueError("a bug"), ValueError)):
    monkeypatch.setattr(timing, "status_bytes", lambda field, peak=peak: peak if field == "VmPeak" else None)
    with pytest.raises(expected) as e:
      with probe_cli.bounded():
        raise error
    if expected is MemoryError:
      assert "the probe reached its cap, a 8.0 GiB data segment, at most 85%" in str(e.value)
      assert cli.out_of_memory(e.value).startswith("out of memory (the probe reached its cap")
  assert caps[0] == int(0.85 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  with probe_cli.bounded():                                 # nothing raised: nothing changed
    pass
