"""TensorBoard event files, written without TensorFlow, tensorboardX or protobuf: scalars only.

An events file is a sequence of TFRecords, each

    uint64 n (little-endian) · uint32 masked_crc(n's 8 bytes) · n bytes of an `Event` proto · uint32 masked_crc(data)

with CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) and `masked_crc(x) = rotr15(crc32c(x)) + 0xA282EAD8
(mod 2³²)`. The first record is `Event{wall_time, file_version: "brain.Event:2"}`; each later one is
`Event{wall_time, step, summary: Summary{value: [Value{tag, simple_value}]}}`. The protobuf fields used
(tensorflow/core/util/event.proto, summary.proto):

    Event:   wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5 (Summary)
    Summary: value = 1 (repeated Value)
    Value:   tag = 1 (string), simple_value = 2 (float)

tensorboardX's writer imported its whole package to write these records — and with it torch where torch
is installed, a second of every training process's start. The records are checked against tensorboardX's
own protobuf classes and CRC in tests/test_event_file.py.
"""
from __future__ import annotations

import math
import os
import socket
import struct
import time

_POLY = 0x82F63B78


def _table() -> tuple[int, ...]:
  out = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (_POLY if crc & 1 else 0)
    out.append(crc)
  return tuple(out)


_TABLE = _table()


def crc32c(data: bytes) -> int:
  """CRC-32C of `data` (`crc32c(b"123456789") == 0xE3069283`, the catalogue's check value)."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
  """TFRecord's masked CRC: the CRC-32C rotated right by 15 bits plus 0xA282EAD8, modulo 2³²."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
  """One TFRecord framing `data`."""
  length = struct.pack("<Q", len(data))
  return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))


def _varint(n: int) -> bytes:
  n &= (1 << 64) - 1                                   # int64 as protobuf writes it: two's complement
  out = bytearray()
  while n > 0x7F:
    out.append((n & 0x7F) | 0x80)
    n >>= 7
  out.append(n)
  return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _float32(value) -> bytes:
  """`value` as a little-endian float32, as C's cast makes it: beyond float32's range it is ±inf (struct
  refuses those values, and an int too large for a double, with OverflowError)."""
  try:
    return struct.pack("<f", float(value))
  except OverflowError:
    return struct.pack("<f", math.inf if value > 0 else -math.inf)


def event(wall_time: float, *, step: int | None = None, scalars: dict[str, float] | None = None,
          file_version: str | None = None) -> bytes:
  """The `Event` proto's bytes: wall_time, and a step with its scalars (float32 `simple_value`s) or a file_version.
  Encoded as protobuf encodes proto3: fields in number order, a step of 0 left out (its default)."""
  out = bytearray(_varint(1 << 3 | 1) + struct.pack("<d", wall_time))
  if step:
    out += _varint(2 << 3) + _varint(int(step))
  if file_version is not None:
    out += _bytes_field(3, file_version.encode())
  if scalars is not None:
    values = b"".join(_bytes_field(1, _bytes_field(1, tag.encode()) + _varint(2 << 3 | 5) + _float32(value))
                      for tag, value in scalars.items())
    out += _bytes_field(5, values)
  return bytes(out)


class EventsWriter:
  """Appends scalar events to a new file `folder/events.out.tfevents.<time>.<host><suffix>` (the name
  TensorBoard globs for); the header record is written on opening. Not thread-safe."""

  def __init__(self, folder: str, suffix: str = ""):
    self.path = os.path.join(folder, f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}{suffix}")
    self._file = open(self.path, "ab")
    self._file.write(record(event(time.time(), file_version="brain.Event:2")))

  def scalars(self, step: int, values: dict[str, float]) -> None:
    """One event at `step` holding `values` (tag → number)."""
    self._file.write(record(event(time.time(), step=step, scalars=values)))

  def flush(self) -> None:
    """Everything written so far on disk (fsync, as tensorboardX's writer did: a full disk shows here)."""
    self._file.flush()
    os.fsync(self._file.fileno())

  def close(self) -> None:
    self.flush()
    self._file.close()
