"""The probe and the connection study on encoders: walk stability in units of the distance from uniform."""
import jax.numpy as jnp
import numpy as np
import pytest

from attngeo import connection, probe


def _walks(rng, b, n, spread, causal=False):
  logits = spread * rng.normal(size=(b, n, n))
  if causal:
    logits = np.where(np.tril(np.ones((n, n))) > 0, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return w / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_uniform_relative_change_matches_numpy(causal):
  rng = np.random.default_rng(0)
  w1, w2 = _walks(rng, 3, 9, 1.0, causal), _walks(rng, 3, 9, 1.0, causal)
  allowed = np.tril(np.ones((9, 9))) if causal else np.ones((9, 9))
  u = allowed / allowed.sum(-1, keepdims=True)
  fro = lambda a: np.sqrt((a ** 2).sum((-2, -1)))                          # noqa: E731
  ref = fro(w2 - w1) / (0.5 * (fro(w1 - u) + fro(w2 - u)))
  got = connection.uniform_relative_change(jnp.asarray(w1, jnp.float32), jnp.asarray(w2, jnp.float32), causal)
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5)
  m = jnp.ones((3, 4))
  pair = probe._pair(jnp.asarray(w1, jnp.float32), jnp.asarray(w2, jnp.float32), m, m, causal=causal)
  np.testing.assert_allclose(float(pair["next_uniform_relative_change"]), ref.mean(), rtol=1e-5)


def test_near_uniform_walks_are_small_raw_but_not_normalised():
  """Two independent near-uniform walks: raw ΔW ≈ 0 for that reason alone, the normalised ratio ≈ √2."""
  rng = np.random.default_rng(1)
  w1, w2 = _walks(rng, 4, 64, 1e-3), _walks(rng, 4, 64, 1e-3)
  raw = np.asarray(connection.relative_change(jnp.asarray(w1), jnp.asarray(w2)))
  norm = np.asarray(connection.uniform_relative_change(jnp.asarray(w1), jnp.asarray(w2)))
  assert raw.max() < 0.01
  np.testing.assert_allclose(norm, np.sqrt(2), rtol=0.05)


def _tiny_run(path, shared):
  """A weights-only run folder of a tiny BERT (or ALBERT: shared layer, factorised embedding) + the rxnfp vocab."""
  import shutil

  from attngeo import nn, runs
  from attngeo.data import molecules
  from attngeo.nn import registry
  try:
    vocab = molecules.wheel_file("rxnfp", "models", "transformers", "bert_pretrained", "vocab.txt")
  except FileNotFoundError:
    pytest.skip("rxnfp not installed")
  extra = dict(embed_dim=8, shared_layers=True) if shared else {}
  cfg = nn.EncoderConfig.create(depth=3, vocab_size=591, seq_len=64, width=16, num_heads=2, **extra)
  runs.write_weights_run(str(path), registry.build(cfg, 0))
  shutil.copy(vocab, path / "vocab.txt")
  return path


@pytest.mark.parametrize("shared", [False, True])
def test_probe_reads_every_layer_of_an_encoder_albert_one_row_per_call(tmp_path, shared):
  from attngeo import runs
  model = runs.load_run(str(_tiny_run(tmp_path / "run", shared)))[0]
  ids = jnp.asarray(np.random.default_rng(0).integers(20, 591, (2, 12)), jnp.int32)
  rows = probe.model_report(model, lambda: model(ids, jnp.ones(ids.shape, bool)), progress=False)
  assert [r["layer"] for r in rows] == [0, 1, 2]
  assert rows[0]["next_uniform_relative_change"] is not None and rows[-1]["next_uniform_relative_change"] is None
  heads = np.array([r["head_isometry_defect"] for r in rows])
  assert np.allclose(heads, heads[0]) == shared         # ALBERT: one layer's transports at every depth
  assert rows[0]["eff_neighbours"] != rows[1]["eff_neighbours"]          # but each call its own walk


@pytest.mark.slow
def test_study_connection_probes_an_encoder_run_and_its_twin(tmp_path):
  from attngeo.experiments import study_connection as study
  run = _tiny_run(tmp_path / "bert", shared=False)
  smiles = tmp_path / "smiles.txt"
  smiles.write_text("CCO\nCCCCCCCC\nc1ccccc1CC\nCCCCCCCN\nCCCCCCCO\n")       # 10 tokens with [CLS], [SEP]: 3
  out = study.run(study.StudyConfig(runs=(str(run),), probe_smiles=str(smiles), seq_len=10, probe_batch=2,
                                    out=str(tmp_path / "study"), progress=False))
  (res,) = out["models"]
  assert res["family"] == study.SMILES_FAMILY and len(res["trained"]) == len(res["init"]) == 3
  assert all(r["next_uniform_relative_change"] > 0 for r in res["init"][:-1])
  with pytest.raises(ValueError, match="--seq-len 12, --probe-batch 3: 1 SMILES have exactly 12 tokens, 3 asked"):
    study.SmilesInputs(study.StudyConfig(probe_smiles=str(smiles), seq_len=12, probe_batch=3), str(run / "vocab.txt"))


def test_study_connection_refuses_probe_smiles_before_writing(tmp_path, capsys):
  """`study connection --runs BERT --out D` at a --seq-len no SMILES has: one line naming the flags to change, and D
  not written (a newcomer found config.json left behind)."""
  from attngeo import cli
  run = _tiny_run(tmp_path / "bert", shared=False)
  smiles = tmp_path / "smiles.txt"
  smiles.write_text("CCO\nCCCCCCCC\nc1ccccc1CC\nCCCCCCCN\nCCCCCCCO\n")
  with pytest.raises(SystemExit) as e:
    cli.main(["study", "connection", "--runs", str(run), "--probe-smiles", str(smiles), "--seq-len", "12",
              "--probe-batch", "3", "--out", str(tmp_path / "study")])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(err) == 1
  assert "1 SMILES have exactly 12 tokens, 3 asked" in err[0] and "give --seq-len one of those lengths" in err[0]
  assert not (tmp_path / "study").exists()


@pytest.mark.slow
def test_probe_command_on_an_encoder_run(tmp_path):
  from attngeo.experiments import probe as probe_cmd
  run = _tiny_run(tmp_path / "albert", shared=True)
  smiles = tmp_path / "smiles.txt"
  smiles.write_text("CCO\nCCCCCCCC\nCCCCCCCN\nc1ccccc1CC\nCCCCCCCO\n")
  rows = probe_cmd.main([str(run), "--data", str(smiles), "--batch", "2", "--out", str(tmp_path / "p"), "--no-progress"])
  assert len(rows) == 3 and (tmp_path / "p" / "probe.md").exists()
  assert "the first 2 SMILES" in (tmp_path / "p" / "probe.md").read_text()
