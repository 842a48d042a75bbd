"""Data: generated and local point clouds, tfds array_record builders, grain loaders.

* `points` — Swiss roll / sphere / torus and local `.npy`/`.csv` clouds; the `PointSets` builder.
* `loader` — grain pipelines with checkpointable state.
"""
from attngeo.data.loader import loader
from attngeo.data.points import (CLOUDS, PointSets, flat_torus, load_cloud, point_sets, sphere, swiss_roll,
                                  swiss_roll_oracle)

__all__ = ["CLOUDS", "PointSets", "flat_torus", "load_cloud", "loader", "point_sets", "sphere", "swiss_roll",
           "swiss_roll_oracle"]
