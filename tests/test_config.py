"""attngeo.config: dataclass fields as command-line flags."""
import dataclasses

import pytest

from attngeo import config


@dataclasses.dataclass
class Inner:
  depth: int = 2
  width: int = 8


@dataclasses.dataclass
class Outer:
  seeds: tuple[int, ...] = (0,)
  inner: Inner = dataclasses.field(default_factory=Inner)


def test_skipped_fields_get_no_flag_and_keep_the_base_value(capsys):
  ap = config.parser("prog")
  config.add_arguments(ap, Outer, skip=("inner.depth",))
  args = ap.parse_args(["--inner.width", "16", "--seeds", "1,2"])
  got = config.from_arguments(args, Outer, Outer(inner=Inner(depth=5)))
  assert got == Outer(seeds=(1, 2), inner=Inner(depth=5, width=16))
  with pytest.raises(SystemExit):
    ap.parse_args(["--inner.depth", "3"])
  assert "unrecognized arguments: --inner.depth 3" in capsys.readouterr().err
