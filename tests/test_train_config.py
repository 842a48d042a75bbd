"""`attngeo.train_config.check_resumable`: which recorded fields a resume may change, and how a record written
before a field existed is read."""
import json

import pytest

from attngeo import files
from attngeo.train_config import ADDED_FIELDS, TrainConfig, check_resumable


def record(wd, cfg, drop=()):
  files.write_config(str(wd), train=cfg)
  saved = files.read_config(str(wd))
  for name in drop:
    del saved["train"][name]
  (wd / "config.json").write_text(json.dumps(saved))


def test_a_changed_field_is_named_and_watching_fields_may_change(tmp_path):
  record(tmp_path, TrainConfig(lr=1e-3, workdir="a"))
  with pytest.raises(ValueError, match=r"holds a run with another config \(train\.lr 0\.001 → 0\.002\)"):
    check_resumable(str(tmp_path), train=TrainConfig(lr=2e-3))
  check_resumable(str(tmp_path), train=TrainConfig(lr=1e-3, workdir="b", ckpt_every=5, keep=3, log_every=1,
                                                   progress=False))
  with pytest.raises(ValueError, match=r"train\.steps 1000 → 2000"):      # cosine: another trajectory
    check_resumable(str(tmp_path), train=TrainConfig(steps=2000))
  record(tmp_path, TrainConfig(schedule="constant"))
  check_resumable(str(tmp_path), train=TrainConfig(schedule="constant", steps=2000))   # the same one, extended


def test_a_record_from_before_the_split_rates_resumes_at_their_old_values_only(tmp_path):
  """Runs recorded TrainConfig before it held nanochat's split rates; `attngeo.optim` read their defaults."""
  assert {name: getattr(TrainConfig(), name) for name in ADDED_FIELDS} == ADDED_FIELDS   # today's defaults
  record(tmp_path, TrainConfig(optimizer="muon_adamw", schedule="warmdown"), drop=tuple(ADDED_FIELDS))
  check_resumable(str(tmp_path), train=TrainConfig(optimizer="muon_adamw", schedule="warmdown"))
  with pytest.raises(ValueError, match=r"train\.embedding_lr None → 0\.5"):
    check_resumable(str(tmp_path), train=TrainConfig(optimizer="muon_adamw", schedule="warmdown", embedding_lr=0.5))
  with pytest.raises(ValueError, match=r"train\.warmdown_ratio 0\.65 → 0\.3"):
    check_resumable(str(tmp_path), train=TrainConfig(optimizer="muon_adamw", schedule="warmdown",
                                                     warmdown_ratio=0.3))
