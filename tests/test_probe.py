"""attngeo.probe and `attngeo probe`: on a tiny trained GPT, every output; the training hook."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from helpers import Batches

from attngeo import nn, probe, train
from attngeo.experiments import probe as probe_cli


def gpt_loss(m, b, r):
  return optax.softmax_cross_entropy_with_integer_labels(m(b["tokens"][:, :-1]), b["tokens"][:, 1:]).mean(), {}


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("gpt"))
  tok = {"tokens": np.random.default_rng(0).integers(0, 32, (4, 33)).astype(np.int32)}
  model = nn.GPT(nn.GPTConfig.from_depth(3, vocab_size=32, head_dim=8, width=16, operator="DMTN"), rngs=nnx.Rngs(0))
  x = jnp.asarray(tok["tokens"][:2, :16])
  hook = probe.hook(lambda m: (lambda: m(x)), every=5)
  res = train.train(model, gpt_loss, Batches(tok), train.TrainConfig(steps=10, batch_size=4, workdir=wd,
                                                                      log_every=5, progress=False), hooks=(hook,))
  return wd, res


def test_probe_cli_writes_all_outputs(gpt_run, tmp_path, capsys):
  wd, _ = gpt_run
  text = tmp_path / "text.txt"
  text.write_text("the quick brown fox jumps over the lazy dog " * 20)
  rows = probe_cli.main([wd, "--data", str(text), "--batch", "2", "--seq-len", "24", "--out", str(tmp_path / "p")])
  assert len(rows) == 3
  for name in ("probe.json", "probe.md", "probe.png"):
    assert os.path.getsize(tmp_path / "p" / name) > 0
  saved = json.loads((tmp_path / "p" / "probe.json").read_text())
  layer = saved["layers"][0]
  for key in ("eff_neighbours", "eps_rev", "rho_skew", "spectral_gap", "curvature", "head_isometry_defect",
              "effective_isometry_defect", "next_relative_change", "next_js_divergence", "next_spectral_distance"):
    assert key in layer
  assert len(layer["head_isometry_defect"]) == 2
  assert all(0 <= v <= 1 for v in layer["rho_skew"])
  assert "| layer |" in capsys.readouterr().out


def test_training_hook_logs_probe_metrics(gpt_run):
  wd, res = gpt_run
  assert "probe/eps_rev" in res.history[0] and "probe/rho_skew" in res.history[1]
  with open(os.path.join(wd, "metrics.jsonl")) as f:
    assert "probe/curvature" in json.loads(f.readline())


def test_layer_stats_of_exact_operator_are_zero():
  ks = jax.random.split(jax.random.PRNGKey(0), 2)
  q, k = jax.random.normal(ks[0], (2, 20, 2, 4)), jax.random.normal(ks[1], (2, 20, 2, 4))
  st = probe.layer_stats(q, k, 0.0, 0.0)
  assert np.all(st["eps_rev"] < 1e-5) and np.all(st["rho_skew"] < 1e-5)
  assert np.all((st["eff_neighbours"] >= 1) & (st["eff_neighbours"] <= 20))


def test_probe_rejects_a_folder_without_a_run(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a run folder"):
    probe_cli.main([str(tmp_path)])
