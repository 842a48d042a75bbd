"""Plain dataclass configs with command-line overrides: every field `x_y` becomes `--x-y VALUE`.

    parser = argparse.ArgumentParser(); add_arguments(parser, MyConfig)
    cfg = from_arguments(parser.parse_args(), MyConfig, base=MyConfig())

Types follow the field annotations: bool fields take `true/false`, tuples/lists take
comma-separated values (`--mesh 2,2,2`), `X | None` accepts `none`.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing


def _parse(tp):
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin in (typing.Union, types.UnionType):
    inner = [a for a in args if a is not type(None)]
    parse = _parse(inner[0]) if len(inner) == 1 else str
    return lambda s: None if s.lower() == "none" else parse(s)
  if origin in (tuple, list):
    elem = _parse(args[0]) if args else str
    return lambda s: origin(elem(x) for x in s.split(",") if x)
  if tp is bool:
    def to_bool(s):
      if s.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true/false; got {s!r}")
      return s.lower() in ("true", "1", "yes")
    return to_bool
  if tp in (int, float, str):
    return tp
  return str


def add_arguments(parser: argparse.ArgumentParser, cls, prefix: str = "") -> None:
  """One `--{prefix}{field}` flag per dataclass field (default: keep the config's value)."""
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    flag = "--" + (prefix + f.name).replace("_", "-")
    default = f.default if f.default is not dataclasses.MISSING else None
    parser.add_argument(flag, dest=prefix + f.name, type=_parse(hints[f.name]), default=None,
                        help=f"{cls.__name__}.{f.name} (default: {default})")


def from_arguments(args: argparse.Namespace, cls, base=None, prefix: str = ""):
  """`base` (or `cls()`) with every flag given on the command line applied."""
  base = cls() if base is None else base
  given = {f.name: getattr(args, prefix + f.name) for f in dataclasses.fields(cls)
           if getattr(args, prefix + f.name, None) is not None}
  return dataclasses.replace(base, **given)
