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


def test_replaced_takes_dotted_names_as_the_flags_do():
  """`config.replaced(cfg, {"inner.width": 16})` is what `--inner.width 16` gives; an unknown name is one line."""
  ap = config.parser("prog")
  config.add_arguments(ap, Outer)
  by_flags = config.from_arguments(ap.parse_args(["--inner.width", "16", "--seeds", "3"]), Outer)
  assert config.replaced(Outer(), {"inner.width": 16, "seeds": (3,)}) == by_flags
  assert config.replaced(Outer(), {"inner": Inner(depth=1)}).inner == Inner(depth=1)     # a whole sub-config
  assert config.replaced(Outer(), {}) == Outer()
  for bad in ({"inner.height": 1}, {"innr.width": 1}):
    with pytest.raises((ValueError, TypeError), match="no field"):
      config.replaced(Outer(), bad)


@pytest.mark.parametrize("tp, text, name", [(tuple[int, ...], "1,x", "int"), (tuple[float, ...], "0.5,y", "float")])
def test_a_bad_list_item_names_the_type_not_a_lambda(tp, text, name):
  """argparse printed `invalid <lambda> value: 'x'` for a list flag (`--train.mesh x`, `--seeds x`)."""
  import argparse
  parse = config.value_parser(tp)
  assert parse("1,2") == (1, 2) if name == "int" else parse("0.5") == (0.5,)
  with pytest.raises(argparse.ArgumentTypeError, match=f"expected comma-separated {name} values; got '{text}'"):
    parse(text)


@dataclasses.dataclass
class Signed:
  mesh: tuple[int, ...] = (1, 1, 1)
  lr: float = 1e-3
  verbose: bool = False


def test_a_negative_value_after_its_flag_is_read_as_the_value(capsys):
  """`--train.mesh -1,1,1` read as an unknown option ("expected one argument"); now the value, whose own
  check answers. An option never becomes a value, and a flag that takes none is left alone."""
  ap = config.parser("prog")
  config.add_arguments(ap, Signed)
  got = config.from_arguments(ap.parse_args(["--mesh", "-1,1,1", "--lr", "-1e-3", "--verbose", "true"]), Signed)
  assert got == Signed(mesh=(-1, 1, 1), lr=-1e-3, verbose=True)
  assert config.from_arguments(ap.parse_args(["--lr", "-.5"]), Signed).lr == -0.5
  with pytest.raises(SystemExit):
    ap.parse_args(["--mesh", "--lr", "2"])
  assert "--mesh: expected one argument" in capsys.readouterr().err
