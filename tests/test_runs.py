"""attngeo.runs: results reused only under the key that made them; atomic writes; content fingerprints."""
import json

import numpy as np

from attngeo import runs


def test_cached_result_is_returned_only_for_its_key(tmp_path):
  path = tmp_path / "result.json"
  assert runs.cached_result(str(path), "k1") is None                     # absent
  runs.atomic_write(str(path), json.dumps({"key": "k1", "bpb": 1.5}))
  assert runs.cached_result(str(path), "k1") == {"key": "k1", "bpb": 1.5}
  assert runs.cached_result(str(path), "k2") is None                      # made under another config
  assert runs.cached_result(str(path), "k1", field="evaluation_key") is None
  path.write_text('{"key": "k1", "bp')                                    # cut short by a crash
  assert runs.cached_result(str(path), "k1") is None
  assert not list(tmp_path.glob("*.tmp-*"))                               # atomic_write left no temporary


def test_fingerprint_follows_content_not_names():
  a = np.arange(6, dtype=np.float32)
  assert runs.fingerprint(a, {"lr": 0.1}) == runs.fingerprint(a.copy(), {"lr": 0.1})
  assert runs.fingerprint(a, {"lr": 0.1}) != runs.fingerprint(a, {"lr": 0.2})
  b = a.copy()
  b[3] += 1e-6
  assert runs.fingerprint(a, {"lr": 0.1}) != runs.fingerprint(b, {"lr": 0.1})
