"""Lazy package attributes (PEP 562): a package's public names load their home module on first use, so
importing one light submodule (`attngeo.nn.config`, `attngeo.data.points`) imports nothing heavy (JAX, Flax,
grain). Imports nothing of attngeo.

A public name must not be spelled like a submodule: importing a submodule sets it as the package's
attribute, over the name (`tests/test_packaging.py` checks every lazy package)."""
import importlib


def attach(package: str, namespace: dict, homes: dict[str, tuple[str, ...]], submodules=()):
  """`(__getattr__, __dir__, __all__, home)` for the package named `package` whose globals are `namespace`:
  `homes` maps a submodule to the public names it defines (`home[name]` → its submodule); `submodules` (and
  the keys of `homes`) are importable as attributes. A loaded name is cached in `namespace`."""
  home = {name: module for module, names in homes.items() for name in names}
  modules = set(homes) | set(submodules)
  clash = sorted(set(home) & modules)
  if clash:
    raise ImportError(f"{package}: public names spelled like submodules: {clash}")

  def __getattr__(name):
    if name in modules:
      return importlib.import_module(f"{package}.{name}")
    if name not in home:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
    namespace[name] = value
    return value

  names = sorted(home)

  def __dir__():
    return sorted(set(namespace) | set(names))
  return __getattr__, __dir__, names, home
