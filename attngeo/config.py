"""Plain dataclass configs with command-line overrides: every field `x_y` becomes `--x-y VALUE`.

    parser = argparse.ArgumentParser(); add_arguments(parser, MyConfig)
    cfg = from_arguments(parser.parse_args(), MyConfig, base=MyConfig())

Types follow the field annotations: bool fields take `true/false`, tuples/lists take
comma-separated values (`--mesh 2,2,2`), `X | None` accepts `none`. A field that is itself a
dataclass (a nested config) gets dotted flags: `--model.block.width 128`. `from_dict` rebuilds
a (nested) config from its `dataclasses.asdict` form, e.g. a run's config.json.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import types
import typing


def value_parser(tp):
  """The function that reads a command-line string as a value of field type `tp` (the rules above)."""
  origin, args = typing.get_origin(tp), typing.get_args(tp)
  if origin in (typing.Union, types.UnionType):
    inner = [a for a in args if a is not type(None)]
    parse = value_parser(inner[0]) if len(inner) == 1 else str
    return lambda s: None if s.lower() == "none" else parse(s)
  if origin in (tuple, list):
    elem = value_parser(args[0]) if args else str

    def to_sequence(s):
      try:
        return origin(elem(x) for x in s.split(",") if x)
      except (ValueError, argparse.ArgumentTypeError):
        name = getattr(elem, "__name__", "value")
        raise argparse.ArgumentTypeError(f"expected comma-separated {name} values; got {s!r}") from None
    return to_sequence
  if tp is bool:
    def to_bool(s):
      if s.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true/false; got {s!r}")
      return s.lower() in ("true", "1", "yes")
    return to_bool
  if tp in (int, float, str):
    return tp
  return str


def _type_name(tp) -> str:
  return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _default(f):
  if f.default is not dataclasses.MISSING:
    return f.default
  if f.default_factory is not dataclasses.MISSING:
    return f.default_factory()
  return None


# `dataclasses.field(..., metadata=NO_FLAG)`: a field the command sets itself, never a flag (`add_arguments`).
NO_FLAG = {"flag": False}


def add_arguments(parser: argparse.ArgumentParser, cls, prefix: str = "", help: dict | None = None,
                  base=None, skip: tuple[str, ...] = ()) -> None:
  """One `--{prefix}{field}` flag per dataclass field (nested dataclasses: `--{field}.{sub}`).

  `help` maps field names to a description shown before the type and default. The default shown
  is `base`'s value (default: the field's default, a nested config's default factory included).
  `skip` names dotted fields the command sets itself (no flag; `from_arguments` keeps `base`'s value), as
  does a field declared with `metadata=NO_FLAG` (one every command sets, e.g. a run's folder).
  """
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    tp = hints[f.name]
    value = getattr(base, f.name) if base is not None else _default(f)
    if prefix + f.name in skip or f.metadata.get("flag", True) is False:
      continue
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
      add_arguments(parser, tp, prefix=f"{prefix}{f.name}.", help=help, base=value, skip=skip)
      continue
    flag = "--" + (prefix + f.name).replace("_", "-")
    text = (help or {}).get(prefix + f.name, "")
    parser.add_argument(flag, dest=prefix + f.name, type=value_parser(tp), default=None, metavar=_type_name(tp).upper(),
                        help=f"{text + ' ' if text else ''}(default: {value})")


def from_arguments(args: argparse.Namespace, cls, base=None, prefix: str = ""):
  """`base` (or `cls()`) with every flag given on the command line applied (nested configs too)."""
  base = cls() if base is None else base
  hints = typing.get_type_hints(cls)
  given = {}
  for f in dataclasses.fields(cls):
    tp = hints[f.name]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
      given[f.name] = from_arguments(args, tp, getattr(base, f.name), prefix=f"{prefix}{f.name}.")
    elif getattr(args, prefix + f.name, None) is not None:
      given[f.name] = getattr(args, prefix + f.name)
  return dataclasses.replace(base, **given)


def replaced(cfg, fields: dict):
  """`cfg` with `fields` replaced, a dotted name (`"train.steps"`) reaching into a nested config: presets and
  protocols written as the flags a user would give (`{"train.steps": 6000}` is `--train.steps 6000`)."""
  nested: dict = {}
  for name, value in fields.items():
    head, _, rest = name.partition(".")
    if head not in {f.name for f in dataclasses.fields(cfg)}:
      raise ValueError(f"{type(cfg).__name__} has no field {head!r} (in {name!r})")
    if rest:
      nested.setdefault(head, {})[rest] = value
    else:
      nested[head] = value
  return dataclasses.replace(cfg, **{k: replaced(getattr(cfg, k), v) if isinstance(v, dict) and
                                     dataclasses.is_dataclass(getattr(cfg, k)) else v for k, v in nested.items()})


def from_dict(cls, fields: dict):
  """`cls(**fields)` with nested dataclass fields rebuilt and JSON lists turned back into tuples.

  Unknown keys are an error naming them (a config written by another version).
  """
  hints = typing.get_type_hints(cls)
  names = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(fields) - names)
  if unknown:
    raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
  out = {}
  for name, value in fields.items():
    tp = hints[name]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(value, dict):
      out[name] = from_dict(tp, value)
    elif isinstance(value, list):
      out[name] = tuple(value)
    else:
      out[name] = value
  return cls(**out)


# ----------------------------------------------------------------------------- command-line helpers

class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
  """Keeps the module docstring's layout and appends each option's default to its help, unless the help already
  says it ("(default: every kernel this backend has …)": argparse's "(default: None)" after it said nothing)."""

  def _get_help_string(self, action):
    text = action.help or ""
    return text if "(default" in text else super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
  """An argparse parser whose errors are one line, `PROG: error: MESSAGE (see PROG --help)`, exit status 2.

  (argparse's own `error` prints the whole usage block first.) Sub-parsers inherit the class. Called
  while an exception is being handled (`except ValueError as e: ap.error(str(e))`), it re-raises that
  exception instead under `ATTNGEO_DEBUG`, so the traceback shows where the error arose (argparse's
  own parse errors stay one line).
  """

  # A value that starts with "-" but is no option: numbers and comma lists (`--train.mesh -1,1,1`, `--lr -1e-3`),
  # which argparse reads as an unknown option and answers "expected one argument" for.
  _NEGATIVE_VALUE = re.compile(r"-(\d|\.\d)[\d.eE+-]*(,-?[\d.eE+-]*)*")

  def parse_known_args(self, args=None, namespace=None):
    """argparse's, after joining `--option VALUE` into `--option=VALUE` where VALUE looks like a negative number
    or a list starting with one and the option takes a value: its own check then names what was expected."""
    args = list(sys.argv[1:] if args is None else args)
    joined = []
    for arg in args:
      action = self._option_string_actions.get(joined[-1]) if joined else None
      if (action is not None and action.nargs is None and self._NEGATIVE_VALUE.fullmatch(arg)
              and arg not in self._option_string_actions):
        joined[-1] = f"{joined[-1]}={arg}"
      else:
        joined.append(arg)
    return super().parse_known_args(joined, namespace)

  def error(self, message):
    handled = sys.exc_info()[1]
    if os.environ.get("ATTNGEO_DEBUG") and handled is not None and not isinstance(handled, argparse.ArgumentError):
      raise handled
    self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parser(prog: str, description: str | None = None, *, show_defaults: bool = False) -> Parser:
  """The parser of the command `prog` ("attngeo lm train"): every command's one factory.

  Errors are one line (`Parser`); the description (the command module's docstring) keeps its layout;
  `show_defaults` appends each option's default to its help (`HelpFormatter`), for options whose help
  does not state it.
  """
  return Parser(prog=prog, description=description,
                formatter_class=HelpFormatter if show_defaults else argparse.RawDescriptionHelpFormatter)


def _int_at_least(minimum: int, what: str):
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f"expected {what}; got {value}")
    return value
  return parse


positive_int = _int_at_least(1, "a positive integer")          # argparse type: an integer ≥ 1
nonnegative_int = _int_at_least(0, "a non-negative integer")   # argparse type: an integer ≥ 0


def positive_float(text: str) -> float:
  """argparse type: a finite number > 0."""
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}") from None
  if not 0 < value < float("inf"):
    raise argparse.ArgumentTypeError(f"expected a finite positive number; got {text}")
  return value


def int_list(text: str) -> tuple[int, ...]:
  """argparse type: comma-separated positive integers, e.g. `256,1024` (at least one; no empty item)."""
  items = [x.strip() for x in text.split(",")]
  if not all(items):
    raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, e.g. 256,1024; got {text!r}")
  return tuple(positive_int(x) for x in items)


def out_folder(text: str) -> str:
  """argparse type: an output folder this process can write, checked before any work and left as it was.

  The deepest part of the path that exists must be a folder in which a folder can be made (one is made and
  removed again: a read-only mount, /proc or a path through a file answer here, not after the work)."""
  import tempfile
  if not text.strip():
    raise argparse.ArgumentTypeError("expected a folder's path; got an empty one")
  path = os.path.abspath(text)
  while not os.path.lexists(path):
    path = os.path.dirname(path)
  if not os.path.isdir(path):
    raise argparse.ArgumentTypeError(f"{text!r} cannot be an output folder: {path} is a file, not a folder")
  try:
    os.rmdir(tempfile.mkdtemp(prefix=".attngeo-probe-", dir=path))
  except OSError as e:
    raise argparse.ArgumentTypeError(f"{text!r} cannot be written: {e.strerror or e} in {path}; choose a writable "
                                     "folder") from None
  return text


def choice_list(choices):
  """argparse type: a comma-separated subset of `choices` (order kept), e.g. `DMAP,ATTN`."""
  def parse(text: str) -> tuple[str, ...]:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in choices]
    if bad or not items:
      raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {', '.join(choices)}; got {text!r}")
    return items
  return parse
