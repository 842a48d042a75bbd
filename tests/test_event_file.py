"""attngeo.event_file against independent references: the CRC-32C catalogue's check value, tensorboardX's
own CRC and record framing, and tensorboardX's protobuf classes (generated from TensorFlow's .proto files)."""
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from attngeo import event_file


def test_crc32c_check_value_and_tensorboardx_crc():
  from tensorboardX.crc32c import crc32c
  from tensorboardX.record_writer import masked_crc32c
  assert event_file.crc32c(b"123456789") == 0xE3069283                 # the CRC catalogue's check value
  assert event_file.crc32c(b"") == 0
  rng = np.random.default_rng(0)
  for n in (1, 7, 8, 255, 1000):
    data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    assert event_file.crc32c(data) == crc32c(data)
    assert event_file.masked_crc(data) == masked_crc32c(data)


def test_records_frame_as_tensorboardx_frames_them(tmp_path):
  from tensorboardX.record_writer import RecordWriter
  payloads = [b"", b"x", bytes(range(256)) * 3]
  writer = RecordWriter(str(tmp_path / "reference"))
  for p in payloads:
    writer.write(p)
  writer.close()
  assert b"".join(map(event_file.record, payloads)) == (tmp_path / "reference").read_bytes()


@pytest.mark.parametrize("step", [0, 1, 12345678901, -3])
def test_events_are_the_bytes_protobuf_writes(step):
  from tensorboardX.proto import event_pb2, summary_pb2
  scalars = {"loss": 2.5, "lr": 1e-3, "grad/norm": float("inf"), "ünïcode": -0.0, "nan": float("nan"),
             "count": 7, "flag": True, "huge": 1e300, "-huge": -1e39}
  ours = event_file.event(1.7e9 + 0.25, step=step, scalars=scalars)
  values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
  reference = event_pb2.Event(wall_time=1.7e9 + 0.25, step=step, summary=summary_pb2.Summary(value=values))
  assert ours == reference.SerializeToString()
  parsed = event_pb2.Event.FromString(ours)
  assert parsed.step == step and [v.tag for v in parsed.summary.value] == list(scalars)
  top = float(np.finfo(np.float32).max)
  expected = [np.float32(np.copysign(np.inf, v)) if abs(v) > top else np.float32(v) for v in scalars.values()]
  np.testing.assert_array_equal([v.simple_value for v in parsed.summary.value], expected)   # NaN == NaN here
  beyond = event_pb2.Event.FromString(event_file.event(1.0, step=step, scalars={"int": -10**400}))
  assert beyond.summary.value[0].simple_value == -np.inf              # protobuf itself refuses such an int
  header = event_file.event(5.0, file_version="brain.Event:2")
  assert header == event_pb2.Event(wall_time=5.0, file_version="brain.Event:2").SerializeToString()


def test_writer_makes_a_file_tensorboard_globs_and_reads(tmp_path):
  from tensorboardX.proto import event_pb2
  writer = event_file.EventsWriter(str(tmp_path), ".7")
  for step in (1, 2):
    writer.scalars(step, {"loss": 1.0 / step})
  writer.close()
  (name,) = os.listdir(tmp_path)
  assert name.startswith("events.out.tfevents.") and name.endswith(".7")
  data, at, events = (tmp_path / name).read_bytes(), 0, []
  while at < len(data):
    (size,) = struct.unpack("<Q", data[at:at + 8])
    assert struct.unpack("<I", data[at + 8:at + 12])[0] == event_file.masked_crc(data[at:at + 8])
    body = data[at + 12:at + 12 + size]
    assert struct.unpack("<I", data[at + 12 + size:at + 16 + size])[0] == event_file.masked_crc(body)
    events.append(event_pb2.Event.FromString(body))
    at += 16 + size
  assert events[0].file_version == "brain.Event:2"
  assert [(e.step, e.summary.value[0].simple_value) for e in events[1:]] == [(1, 1.0), (2, 0.5)]


def test_training_imports_neither_tensorboardx_nor_torch():
  """tensorboardX's package import pulled torch in (about a second of every training process's start)."""
  code = "import sys, attngeo.train; print(sorted(m for m in ('tensorboardX', 'torch') if m in sys.modules))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.stdout.strip() == "[]", out.stdout
