"""An image metric that works offline: a small classifier trained here, and statistics in its feature space.

NOT Inception-FID. There is no Inception network offline, so a small CNN (`Classifier`: two 3×3
conv + ReLU + 2×2 average-pool stages, a dense ReLU layer of `features` units — the penultimate
features φ — and a linear read-out) is trained on the same training images and kept with the run.
Its numbers compare models evaluated with the SAME classifier only; they are not comparable to
published FIDs. In φ-space, for generated images G and real images R:

* `frechet_distance` — `‖μ_R − μ_G‖² + tr(Σ_R + Σ_G − 2 (Σ_R Σ_G)^{1/2})` of the Gaussians fitted to
  φ(R) and φ(G) (the FID formula, Heusel et al. 2017, on these features); biased upward at small n;
* `precision_recall` — Kynkäänniemi et al. (2019): each real feature's ball reaches its k-th nearest
  real neighbour; precision = share of generated features inside some real ball; recall = the same
  with the roles swapped (balls of the generated set);
* `label_accuracy` — share of samples the classifier assigns to the label they were conditioned on.

`reference_check` calibrates the scale: a held-out real split gives a distance near 0 and the
classifier's own test accuracy; uniform noise in the image range gives a large distance.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from scipy.spatial.distance import cdist

from attngeo.nn.config import ClassifierConfig  # noqa: F401  (the classifier's config, importable without JAX)


class Classifier(nnx.Module):
  """x [b, H, W, C] in [−1, 1] -> logits [b, num_classes]; `features(x)` -> φ [b, features]."""

  def __init__(self, cfg: ClassifierConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    chans = (cfg.channels,) + tuple(cfg.conv)
    self.convs = nnx.List([nnx.Conv(a, b, (3, 3), rngs=rngs) for a, b in zip(chans[:-1], chans[1:])])
    side = cfg.image_size
    for _ in cfg.conv:
      side //= 2
    if side < 1:
      raise ValueError(f"image_size={cfg.image_size} is too small for {len(cfg.conv)} pooling stages")
    self.dense = nnx.Linear(side * side * chans[-1], cfg.features, rngs=rngs)
    self.head = nnx.Linear(cfg.features, cfg.num_classes, rngs=rngs)

  def features(self, x):
    h = x
    for conv in self.convs:
      h = nnx.avg_pool(jax.nn.relu(conv(h)), (2, 2), strides=(2, 2))
    return jax.nn.relu(self.dense(h.reshape(h.shape[0], -1)))

  def __call__(self, x):
    return self.head(self.features(x))


def train_classifier(images: np.ndarray, labels: np.ndarray, cfg: ClassifierConfig, *,
                     progress: bool = False) -> Classifier:
  """Train `Classifier` by Adam (cosine decay) on cross-entropy over `cfg.steps` random minibatches.

  One jitted step per minibatch, dispatched from Python: on XLA CPU a `lax.scan` over the steps
  runs the convolutions ~18× slower (0.38 s against 0.021 s a step at batch 128, 28×28), and a
  single scan cannot be interrupted — Ctrl-C or SIGTERM waited for all of it. `progress` shows a
  tqdm bar with the running loss.
  """
  from tqdm.auto import tqdm

  model = Classifier(cfg, rngs=nnx.Rngs(cfg.seed))
  opt = nnx.Optimizer(model, optax.adam(optax.cosine_decay_schedule(cfg.lr, cfg.steps)), wrt=nnx.Param)
  graphdef, state = nnx.split((model, opt))

  @functools.partial(jax.jit, donate_argnums=0)
  def step(state, x, y):
    m, o = nnx.merge(graphdef, state)
    loss, grads = nnx.value_and_grad(
        lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(m)
    o.update(m, grads)
    return nnx.state((m, o)), loss

  x, y = np.asarray(images, np.float32), np.asarray(labels, np.int32)
  idx = np.random.default_rng(cfg.seed).integers(0, len(images), (cfg.steps, cfg.batch_size))
  with tqdm(idx, desc="classifier", disable=not progress, leave=False, dynamic_ncols=True) as bar:
    for i, batch in enumerate(bar):
      state, loss = step(state, x[batch], y[batch])
      if progress and (i % 50 == 0 or i == cfg.steps - 1):
        bar.set_postfix(loss=f"{float(loss):.3f}")
  nnx.update(model, nnx.state(nnx.merge(graphdef, state)[0]))
  return model


_features = nnx.jit(lambda m, x: m.features(x))
_predict = nnx.jit(lambda m, x: jnp.argmax(m(x), -1))


def _apply(fn, model, images, batch: int = 512) -> np.ndarray:
  return np.concatenate([np.asarray(fn(model, jnp.asarray(images[i:i + batch]))) for i in range(0, len(images), batch)])


def features(model: Classifier, images, batch: int = 512) -> np.ndarray:
  """Penultimate features φ [n, features] (float64) of images [n, H, W, C]."""
  return _apply(_features, model, images, batch).astype(np.float64)


def predict(model: Classifier, images, batch: int = 512) -> np.ndarray:
  """Predicted labels [n]."""
  return _apply(_predict, model, images, batch)


def label_accuracy(model: Classifier, images, labels) -> float:
  """Share of images classified as `labels` (their conditioning label, for samples)."""
  return float(np.mean(predict(model, images) == np.asarray(labels)))


def _psd_sqrt(s):
  w, v = np.linalg.eigh(s)
  return (v * np.sqrt(np.clip(w, 0, None))) @ v.T


def gaussian_frechet(mu1, sigma1, mu2, sigma2) -> float:
  """`‖μ1 − μ2‖² + tr(Σ1 + Σ2 − 2 (Σ1 Σ2)^{1/2})` in float64.

  `tr (Σ1 Σ2)^{1/2} = Σ_i √λ_i(Σ1^{1/2} Σ2 Σ1^{1/2})` (a symmetric PSD eigenproblem, so singular
  covariances — dead ReLU features — are handled without a matrix square root of a non-symmetric product).
  """
  mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
  s1, s2 = np.asarray(sigma1, np.float64), np.asarray(sigma2, np.float64)
  a = _psd_sqrt(s1)
  cross = np.sum(np.sqrt(np.clip(np.linalg.eigvalsh(a @ s2 @ a), 0, None)))
  return float(np.sum((mu1 - mu2) ** 2) + np.trace(s1) + np.trace(s2) - 2 * cross)


def frechet_distance(f1, f2) -> float:
  """Fréchet distance between Gaussians fitted to feature sets f1 [n, d] and f2 [m, d] (n, m ≥ 2)."""
  f1, f2 = np.asarray(f1, np.float64), np.asarray(f2, np.float64)
  return gaussian_frechet(f1.mean(0), np.cov(f1, rowvar=False), f2.mean(0), np.cov(f2, rowvar=False))


def _radii(f, k):
  d = cdist(f, f)
  return np.sort(d, axis=1)[:, k]          # column 0 is the point itself


def precision_recall(real, fake, k: int = 3) -> tuple[float, float]:
  """Improved precision and recall (Kynkäänniemi et al. 2019) with k-NN balls; features [n, d], [m, d]."""
  real, fake = np.asarray(real, np.float64), np.asarray(fake, np.float64)
  if min(len(real), len(fake)) <= k:
    raise ValueError(f"precision/recall with k={k} needs more than {k} real and generated samples; "
                     f"got {len(real)} and {len(fake)}")
  d = cdist(fake, real)                                          # [m, n]
  precision = np.mean(np.any(d <= _radii(real, k)[None, :], axis=1))
  recall = np.mean(np.any(d.T <= _radii(fake, k)[None, :], axis=1))
  return float(precision), float(recall)


def evaluate(model: Classifier, images, labels, reference: np.ndarray, k: int = 3) -> dict:
  """Metric row of images [n, H, W, C] conditioned on `labels`, against reference features [m, d]."""
  f = features(model, images)
  precision, recall = precision_recall(reference, f, k)
  return {"fd": frechet_distance(reference, f), "precision": precision, "recall": recall,
          "accuracy": label_accuracy(model, images, labels), "n": int(len(images))}


def nearest_images(images, reference, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """Pixel-space nearest neighbours: for each of `images` [m, H, W, C], the ℓ² distance to its nearest
  image of `reference` [n, H, W, C] and that image's index, ([m] float64, [m] int). Exact: all pairs,
  `‖x − r‖² = ‖x‖² + ‖r‖² − 2⟨x, r⟩` in float64, `chunk` rows at a time (O(chunk·n) memory)."""
  x = np.asarray(images, np.float64).reshape(len(images), -1)
  r = np.asarray(reference, np.float64).reshape(len(reference), -1)
  if np.shape(images)[1:] != np.shape(reference)[1:] or not len(x) or not len(r):
    raise ValueError(f"images and reference must be non-empty stacks of one image shape; got {np.shape(images)} "
                     f"and {np.shape(reference)}")
  r2 = np.einsum("ij,ij->i", r, r)
  dist, idx = np.empty(len(x)), np.empty(len(x), np.int64)
  for i in range(0, len(x), chunk):
    xs = x[i:i + chunk]
    d2 = np.einsum("ij,ij->i", xs, xs)[:, None] + r2[None] - 2 * xs @ r.T
    idx[i:i + chunk] = np.argmin(d2, 1)
    dist[i:i + chunk] = np.sqrt(np.maximum(d2[np.arange(len(xs)), idx[i:i + chunk]], 0.0))
  return dist, idx


def memorisation(samples, train, heldout) -> dict:
  """Do samples sit closer to the training images than unseen real images do?

  `nn_sample` = mean over samples of the pixel distance to the nearest training image, `nn_heldout` the
  same for held-out real images, `nn_ratio` = nn_sample / nn_heldout: about 1 or above for a model that
  draws new images of the distribution, well below 1 for one that copies training images (a copy is at
  distance 0). Both sets are measured against the same training set, so their sizes need not match. A low
  ratio is necessary for copying, not sufficient: blurred or mode-collapsed samples near the data's mean can
  also sit closer to the training set than real digits do, so read it beside the nearest neighbours
  themselves (`sit`'s neighbours.png).
  """
  ds, dh = nearest_images(samples, train)[0], nearest_images(heldout, train)[0]
  return {"nn_sample": float(ds.mean()), "nn_heldout": float(dh.mean()), "nn_ratio": float(ds.mean() / dh.mean())}


def reference_check(model: Classifier, train_images, test_images, test_labels, seed: int = 0) -> dict:
  """The metric's scale: {"real": held-out split vs training features, "noise": uniform noise}."""
  ref = features(model, train_images)
  noise = np.random.default_rng(seed).uniform(-1, 1, test_images.shape).astype(np.float32)
  return {"real": evaluate(model, test_images, test_labels, ref), "noise": evaluate(model, noise, test_labels, ref)}


def save(model: Classifier, path: str, extra: dict | None = None):
  """Write the classifier (params.npz, then config.json) to folder `path`; `extra` goes in config.json.

  Each file is written through a temporary and a rename, config.json last: a folder with a
  config.json is complete, so a kill mid-save leaves nothing `load` would read half-written.
  """
  from attngeo import files

  os.makedirs(path, exist_ok=True)
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))

  def write(tmp):
    with open(tmp, "wb") as f:
      np.savez(f, *[np.asarray(v) for v in leaves])
  files.atomic_write(os.path.join(path, "params.npz"), write)
  files.atomic_json(os.path.join(path, "config.json"), {"classifier": dataclasses.asdict(model.cfg), **(extra or {})})


def load(path: str) -> tuple[Classifier, dict]:
  """(classifier, the config.json dict) from a folder written by `save`."""
  with open(os.path.join(path, "config.json")) as f:
    meta = json.load(f)
  fields = dict(meta["classifier"], conv=tuple(meta["classifier"]["conv"]))
  model = Classifier(ClassifierConfig(**fields), rngs=nnx.Rngs(0))
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  with np.load(os.path.join(path, "params.npz")) as f:
    saved = [f[f"arr_{i}"] for i in range(len(f.files))]
  if [np.shape(a) for a in saved] != [np.shape(a) for a in leaves]:
    raise ValueError(f"{path}/params.npz does not match its config.json (parameter shapes differ)")
  nnx.update(model, jax.tree.unflatten(treedef, [jnp.asarray(a) for a in saved]))
  return model, meta
