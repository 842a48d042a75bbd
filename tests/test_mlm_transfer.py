"""experiments/mlm_transfer: the graft → adapt → fold → adapt chain on a tiny random encoder (smoke test)."""
import math

import pytest
from flax import nnx

from attngeo.experiments import mlm_transfer
from attngeo.lm.smiles import SmilesTokenizer
from attngeo.nn import Encoder, EncoderConfig

VOCAB = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "C", "O", "N", "(", ")", "=", "c", "1")
MOLECULES = ["CCO", "CC(=O)O", "c1ccccc1", "CCN", "CC(C)O", "OCCN"]


@pytest.mark.slow          # ~1 min on a quiet 2-core CPU (every stage compiles its own train step and scorer)
def test_the_chain_runs_and_leaves_the_source_alone(tmp_path):
  model = Encoder(EncoderConfig.create(depth=2, vocab_size=len(VOCAB), seq_len=32, width=16, num_heads=2,
                                       head_dim=8), rngs=nnx.Rngs(0))
  cfg = mlm_transfer.TransferConfig(operators=("DMTN", "CMAP"), steps=2, seeds=(0,), batch=2, train=6, eval=6,
                                    probe=2)
  out = mlm_transfer.run(model, SmilesTokenizer(VOCAB), MOLECULES, MOLECULES, cfg, progress=False)
  assert list(out) == mlm_transfer.stages(cfg) == ["ATTN (pretrained)", "ATTN adapted (control)", "DMTN at graft",
                                                  "DMTN adapted", "DMTN→DMAP folded", "DMTN→DMAP adapted",
                                                  "CMAP at graft", "CMAP adapted"]
  eps = {stage: runs[0]["eps_rev"] for stage, runs in out.items()}
  assert eps["DMTN→DMAP folded"] < 1e-5 < eps["DMTN at graft"]        # exact A: the folded walk is reversible
  mlm_transfer.figure(out, str(tmp_path / "transfer.png"))
  assert (tmp_path / "transfer.png").stat().st_size > 0
  assert all(math.isfinite(r["loss"]) for runs in out.values() for r in runs)
  assert out["DMTN at graft"][0]["loss"] != out["ATTN (pretrained)"][0]["loss"]
  assert "| DMTN→DMAP adapted |" in mlm_transfer.table(out)
  assert model.layers[0].attn.beta == 1.0 and not model.layers[0].attn.distance_form        # the source untouched


@pytest.mark.parametrize("fields, match", [(dict(steps=0), "--steps"), (dict(seeds=()), "--seeds"),
                                           (dict(operators=("XMAP",)), "operator must be one of"),
                                           (dict(probe=0), "--probe")])
def test_bad_settings_are_one_line(fields, match):
  with pytest.raises(ValueError, match=match):
    mlm_transfer.TransferConfig(**fields).validate()


def test_a_readout_that_is_nan_for_some_seeds_is_counted_not_averaged():
  assert mlm_transfer.readout_cell([1e-7, float("nan"), 3e-7]) == "2e-07 (1 of 3 NaN)"
  assert mlm_transfer.readout_cell([float("nan")] * 2) == "nan (2 of 2 NaN)"
  assert mlm_transfer.readout_cell([0.5, None]) == "—"
  assert mlm_transfer.readout_cell([0.25, 0.75]) == "0.5"
