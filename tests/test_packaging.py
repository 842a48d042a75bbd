"""Packaging: every package folder is installed, experiments only as attngeo.experiments."""
import ast
import glob
import hashlib
import json
import os
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_package_folder_is_listed_and_experiments_is_namespaced():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    tool = tomllib.load(f)["tool"]["setuptools"]
  listed = set(tool["packages"])
  found = {os.path.relpath(d, ROOT).replace(os.sep, ".") for d, _, files in os.walk(os.path.join(ROOT, "attngeo"))
           if "__init__.py" in files}
  assert found <= listed, f"package folders missing from pyproject's packages: {sorted(found - listed)}"
  assert tool["package-dir"] == {"attngeo.experiments": "experiments"}
  assert "experiments" not in listed
  assert os.path.exists(os.path.join(ROOT, "experiments", "__init__.py"))


def import_graph(*roots: tuple[str, str]) -> dict[str, set[str]]:
  """{module: attngeo modules it imports} of the .py files under each `(folder, package)` root, read with ast:
  module-level and function-level imports alike (a lazy import still ties the two modules together)."""
  import ast
  mods = {}
  for folder, package in roots:
    for d, _, names in os.walk(folder):
      for name in names:
        if name.endswith(".py"):
          rel = os.path.relpath(os.path.join(d, name), folder)[:-3].replace(os.sep, ".")
          mods[(package + "." + rel).removesuffix(".__init__")] = os.path.join(d, name)
  graph = {}
  for mod, path in mods.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          base = ".".join(pkg.split(".")[: len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
        out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
      elif isinstance(node, ast.Import):
        out |= {a.name for a in node.names}
    graph[mod] = {m for m in out if m in mods and m != mod}
  return graph


def test_the_library_and_the_experiments_have_no_import_cycle():
  """attngeo's modules and the experiments (attngeo.experiments) form a DAG (docs/architecture.md's layers): no
  module imports one that imports it, directly or through others. (runs ↔ train was one: the generic file
  helpers now live in attngeo.files; experiments.lm ↔ lm_adapt another: Table 2's protocol is attngeo.lm.table2.)"""
  graph = import_graph((os.path.join(ROOT, "attngeo"), "attngeo"), (os.path.join(ROOT, "experiments"),
                                                                     "attngeo.experiments"))
  assert graph["attngeo.files"] == {"attngeo.interrupts"} and not graph["attngeo.interrupts"], \
      "attngeo.files imports nothing of attngeo but interrupts, a leaf (its staged renames defer SIGINT/SIGTERM)"
  assert graph["attngeo.train_config"] == {"attngeo.files"}, "the trainer's config imports no JAX module"
  assert "attngeo.lm.table2" in graph["attngeo.experiments.lm_adapt"]
  state = {}

  def visit(m, path):
    state[m] = "open"
    for n in sorted(graph[m]):
      assert state.get(n) != "open", f"import cycle: {' → '.join(path + [n])}"
      if n not in state:
        visit(n, path + [n])
    state[m] = "done"
  for m in sorted(graph):
    if m not in state:
      visit(m, [m])



# docs/architecture.md's layers, lowest first: a module imports from its own layer or a lower one, never upward.
LAYERS = (
  ("foundations", {"attngeo", "attngeo._checks", "attngeo._lazy", "attngeo.config", "attngeo.errors", "attngeo.event_file", "attngeo.files",
                   "attngeo.interrupts", "attngeo.hugepages", "attngeo.operator_names", "attngeo.sampler_names",
                   "attngeo.linalg", "attngeo.stats", "attngeo.plotting", "attngeo.runlock", "attngeo.sharding",
                   "attngeo.surfaces", "attngeo.train_config", "attngeo.regularisers_config", "attngeo.nn.config",
                   "attngeo.nn.presets"}),
  ("kernels", {"attngeo.kernels"}),
  ("operators", {"attngeo.operators"}),
  ("read-outs", {"attngeo.markov", "attngeo.eigen", "attngeo.walks", "attngeo.geometry", "attngeo.bandwidth",
                 "attngeo.ricci_estimate", "attngeo.diffmap", "attngeo.connection", "attngeo.magnetic",
                 "attngeo.sample_metrics", "attngeo.image_metrics"}),
  ("nn", {"attngeo.nn"}),
  ("model read-outs", {"attngeo.regularisers", "attngeo.probe"}),
  ("trainer", {"attngeo.train", "attngeo.optim", "attngeo.checkpoint", "attngeo.runs"}),
  ("recipes and data", {"attngeo.lm", "attngeo.flow", "attngeo.data", "attngeo.interop"}),
  ("commands", {"attngeo.experiments", "attngeo.cli"}),
)


def layer_of(module: str) -> int:
  """The index in LAYERS of `module`'s layer: a listed module, or one inside a listed package."""
  for i, (_, members) in enumerate(LAYERS):
    if module in members:
      return i
  for i, (_, members) in enumerate(LAYERS):
    if any(module.startswith(m + ".") for m in members if m != "attngeo"):
      return i
  raise KeyError(module)


def test_no_module_imports_from_a_higher_layer():
  """The layers of docs/architecture.md, read from the import graph: every module has a layer (a new one is
  placed in LAYERS) and imports nothing above it. (regularisers imports nn for its loss hook, so it sits below
  nn beside the probe.)"""
  graph = import_graph((os.path.join(ROOT, "attngeo"), "attngeo"), (os.path.join(ROOT, "experiments"),
                                                                     "attngeo.experiments"))
  unplaced = sorted(m for m in graph if not any(m in members for _, members in LAYERS)
                    and not any(m.startswith(p + ".") for _, members in LAYERS for p in members if p != "attngeo"))
  assert not unplaced, f"modules with no layer in LAYERS: {unplaced}"
  upward = [f"{m} ({LAYERS[layer_of(m)][0]}) imports {n} ({LAYERS[layer_of(n)][0]})"
            for m, targets in graph.items() for n in targets if layer_of(n) > layer_of(m)]
  assert not upward, upward


def test_no_module_reads_another_modules_private_names():
  """A name with a leading underscore is its module's own: no other module imports it or reads it as an
  attribute. Private modules (`_checks`, `_lazy`, `kernels._blocks`) are their package's shared helpers."""
  import ast
  graph = import_graph((os.path.join(ROOT, "attngeo"), "attngeo"), (os.path.join(ROOT, "experiments"),
                                                                     "attngeo.experiments"))
  modules = set(graph)
  found = []
  for folder, package in ((os.path.join(ROOT, "attngeo"), "attngeo"), (os.path.join(ROOT, "experiments"),
                                                                       "attngeo.experiments")):
    for d, _, names in os.walk(folder):
      for name in (n for n in names if n.endswith(".py")):
        path = os.path.join(d, name)
        mod = (package + "." + os.path.relpath(path, folder)[:-3].replace(os.sep, ".")).removesuffix(".__init__")
        with open(path, encoding="utf-8") as f:
          tree = ast.parse(f.read())
        bound = {}                                      # local name -> the attngeo module it is bound to
        for node in ast.walk(tree):
          if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
              full = f"{node.module}.{a.name}"
              if full in modules:
                bound[a.asname or a.name] = full
              elif node.module in modules and a.name.startswith("_") and node.module != mod:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} imports {node.module}.{a.name}")
          elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name in modules})
        for node in ast.walk(tree):
          if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and isinstance(node.value, ast.Name) and bound.get(node.value.id, mod) != mod):
            found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} reads {bound[node.value.id]}.{node.attr}")
  assert not found, found


ARRAY_LIBRARIES = ("jax", "flax", "optax", "orbax", "chex", "grain")


def test_every_config_dataclass_lives_in_a_module_without_jax():
  """A `...Config` dataclass of the package or its experiments is defined in a module that imports no array
  library at its top (function-local imports are fine), so every command parses and validates it before JAX."""
  found = []
  for path in glob.glob(os.path.join(ROOT, "attngeo", "**", "*.py"), recursive=True) + \
      glob.glob(os.path.join(ROOT, "experiments", "*.py")):
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
    heavy = sorted({(a.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
                    for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                    and getattr(node, "level", 0) == 0 for a in node.names} & set(ARRAY_LIBRARIES))
    configs = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.endswith("Config")
               and any("dataclass" in ast.dump(d) for d in node.decorator_list)]
    if heavy and configs:
      found.append(f"{os.path.relpath(path, ROOT)}: {configs} beside imports of {heavy}")
  assert not found, found


JAX_FREE_CONFIGS = r"""
import dataclasses, json, sys
from attngeo.nn import config as C
import attngeo.data.copying, attngeo.data.molecules, attngeo.data.points, attngeo.data.text, attngeo.sampler_names
cfgs = [C.GPTConfig.from_depth(2, head_dim=32, vocab_size=64, seq_len=16, operator="DMTN").validate(),
        C.DiTConfig.preset("S/2", depth=1, operator=(0.5, 1.0)), C.EncoderConfig.albert(depth=2, operator="CMAP"),
        C.PointFlowConfig.create(dim=2, width=32, operator="DMAP", learnable_operator=True),
        C.BlockConfig(width=12, num_heads=3).validate()]
errors = []
for bad in (lambda: C.GPTConfig.create(operator="FOO"), lambda: C.BlockConfig(width=10, num_heads=3).validate(),
            lambda: C.EncoderConfig.create(classifier="nsp"), lambda: C.DiTConfig.preset("M/3")):
  try:
    bad()
    errors.append(None)
  except ValueError as e:
    errors.append(str(e))
roundtrip = [C.config_from_dict(json.loads(json.dumps(C.config_dict(c)))) == c for c in cfgs[:4]]
print(json.dumps({"heads": [c.block.num_heads if hasattr(c, "block") else c.num_heads for c in cfgs],
                  "errors": errors, "roundtrip": roundtrip, "loaded": sorted(m for m in ("jax", "flax", "grain", "tensorflow") if m in sys.modules)}))
"""


def test_model_configs_build_and_validate_without_jax():
  """`attngeo.nn.config` (and the light data modules) in a fresh interpreter: every model config builds,
  validates and round-trips through its JSON dict, a bad one is one ValueError line, and neither JAX, Flax, grain nor TensorFlow is imported."""
  out = subprocess.run([sys.executable, "-c", JAX_FREE_CONFIGS], capture_output=True, text=True, timeout=60,
                       check=True)
  got = json.loads(out.stdout)
  assert got["loaded"] == [], f"importing attngeo.nn.config loaded {got['loaded']}"
  assert got["roundtrip"] == [True] * 4           # config ⇄ dict through JSON, without JAX
  assert got["heads"] == [4, 6, 8, 2, 3]          # GPT: width 64·2 = 128 in heads of 32; S/2: 6; ALBERT: 8
  expected = ["operator must be one of ['ATAP', 'ATTN', 'DMAP', 'DMTN', 'CMAP'] or a (beta, alpha) pair; got 'FOO'",
              "num_heads=3 does not divide width=10",
              "EncoderConfig.classifier reads the pooled first token: it needs pooler=True",
              "DiT preset must be one of ['B/2', 'L/2', 'S/2', 'XL/2']; got 'M/3'"]
  assert got["errors"] == expected


def test_moved_configs_serialise_byte_identically_and_every_public_name_resolves():
  """The configs moved to `attngeo.nn.config` (issue 25): `config_dict` JSON (field order included) and the
  content keys `files.fingerprint` of a config and of its dict are the values the code before the move printed
  (literals below); the old homes (`nn.gpt.GPTConfig`, `nn.layers.BlockConfig`, …) are the same classes; every
  name of `attngeo.nn.__all__` / `attngeo.data.__all__` resolves (they load on first use)."""
  import attngeo.data
  import attngeo.nn
  from attngeo import files
  from attngeo.nn import config as C, dit, encoder, gpt, layers, pointflow, registry
  cfgs = [C.GPTConfig.from_depth(2, head_dim=32, vocab_size=64, seq_len=16, operator="DMTN", attn_windows=(4, 8)),
          C.DiTConfig.preset("S/2", image_size=8, channels=1, depth=1, num_classes=10, operator=(0.5, 1.0)),
          C.EncoderConfig.albert(depth=2, vocab_size=50, operator="CMAP"),
          C.PointFlowConfig.create(dim=2, width=32, operator="DMAP", learnable_operator=True)]
  before = [("00b32ec3df5edc45", "47d16f9e8f1fe38e", "1bb2f0505ab5aa7e"),      # computed at 60e0d66 (before)
            ("d64b63f48c79a695", "bcf0293bc50b1a5e", "c8a1d198d86e1ffd"),
            ("ba2a6e04840c7171", "1e40534dfc1c7fe3", "6a83b94d3c9a81da"),
            ("eb3fe1ec7cf8fd99", "9af51888c8abb3b0", "f44e57d87364f6b7")]
  for cfg, keys in zip(cfgs, before):
    d = registry.config_dict(cfg)
    assert (hashlib.sha256(json.dumps(d).encode()).hexdigest()[:16], files.fingerprint(cfg), files.fingerprint(d)) \
        == keys, type(cfg).__name__
    assert registry.config_from_dict(json.loads(json.dumps(d))) == cfg
  assert (gpt.GPTConfig, dit.DiTConfig, encoder.EncoderConfig, pointflow.PointFlowConfig, layers.BlockConfig,
          layers.NestsBlock, layers.ORDERS) == (C.GPTConfig, C.DiTConfig, C.EncoderConfig, C.PointFlowConfig,
                                                C.BlockConfig, C.NestsBlock, C.ORDERS)
  assert attngeo.nn.GPTConfig is C.GPTConfig and attngeo.nn.GPT is gpt.GPT
  for package in (attngeo.nn, attngeo.data):
    missing = [name for name in package.__all__ if getattr(package, name, None) is None]
    assert not missing and set(package.__all__) <= set(dir(package)), missing
  with pytest.raises(AttributeError, match="has no attribute 'nope'"):
    attngeo.nn.nope  # noqa: B018

# Public names defined in two attngeo modules with different signatures today, each a protocol the modules
# share on purpose (the importers' load/save/convert/…) or a clash still to be renamed; a new clash fails.
KNOWN_NAME_CLASHES = frozenset({
  # importer protocol (attngeo.interop.*): one module per checkpoint format, same job, own arguments
  "canonical", "config", "convert", "expected", "from_attngeo", "hf_config", "load", "save", "to_attngeo",
  # verbs read with their module: train.train vs lm.recipe.train, flow.sample vs regularisers.sample, …
  "attention", "build", "check", "content_key", "curvature", "evaluate", "from_dict", "graft", "loader",
  "model_config", "read_config", "reversibility", "sample", "summarise", "train", "train_config"})


def public_functions() -> dict[str, dict[str, str]]:
  """{name: {module file: signature}} of every public module-level function under attngeo/, read with ast
  (a re-export is an import, not a def, so the same object imported elsewhere is not counted twice)."""
  import ast
  out = {}
  for d, _, names in os.walk(os.path.join(ROOT, "attngeo")):
    for name in sorted(names):
      if name.endswith(".py"):
        path = os.path.join(d, name)
        with open(path, encoding="utf-8") as f:
          tree = ast.parse(f.read())
        for node in tree.body:
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            out.setdefault(node.name, {})[os.path.relpath(path, ROOT)] = ast.unparse(node.args)
  return out


def test_no_public_name_is_defined_twice_with_different_signatures():
  """`magnetic.isometry_defect(p, theta)` beside `connection.isometry_defect(t)` read as one function; names
  that mean different things are spelled apart (magnetic: phase_rotations, phase_isometry_defect,
  rotation_laplacian_matrix, symmetrised_flows)."""
  funcs = public_functions()
  assert funcs["isometry_defect"] == {os.path.join("attngeo", "connection.py"): "t, rtol: float=RANK_RTOL"}
  clashes = {name for name, where in funcs.items() if len(where) > 1 and len(set(where.values())) > 1}
  new = sorted(clashes - KNOWN_NAME_CLASHES)
  assert not new, {name: funcs[name] for name in new}
  for name in ("edge_transports", "isometry_defect", "connection_laplacian_matrix", "flows", "phase_heads", "spectrum",
               "stationary", "summary"):
    assert name not in clashes and name not in KNOWN_NAME_CLASHES


@pytest.mark.parametrize("package", ["attngeo.data", "attngeo.nn"])
def test_no_submodule_import_replaces_a_lazy_public_name(package):
  """Importing a submodule sets it as an attribute of its package, over a lazily loaded name of the same
  spelling (`attngeo.data.loader` the function was replaced by the module `loader.py`, and every
  `data.loader(...)` call of swissroll, sit and study failed). After every submodule is imported, each
  public name is still the object its home module defines."""
  import importlib
  import pkgutil
  pkg = importlib.import_module(package)
  for info in pkgutil.iter_modules(pkg.__path__):
    importlib.import_module(f"{package}.{info.name}")
  for name in pkg.__all__:
    home = importlib.import_module(f"{package}.{pkg._HOME[name]}")
    assert getattr(pkg, name) is getattr(home, name), f"{package}.{name}"


def test_a_lazy_name_spelled_like_a_submodule_is_refused_at_import():
  from attngeo import _lazy
  with pytest.raises(ImportError, match=r"attngeo.data: public names spelled like submodules: \['loader'\]"):
    _lazy.attach("attngeo.data", {}, {"loader": ("loader",)})
