"""SiT's work: training, sampling, evaluation and the ATTN → DMTN → DMAP transfer (`attngeo sit`; its
settings: `sit_config`, its command line and what each stage means: `sit`).

The compiled functions (`_generate`, `_validation_loss`) are module-level `nnx.jit`s taking the model
as an argument, so stages with the same graph (graft → adapt) share one compilation.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attngeo import data, files, flow, image_metrics, nn, plotting, probe, regularisers, runs, train
from attngeo.data import images as image_data
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.experiments.sit_config import (FULL_DATA, PLAN_CHIPS, STAGE_OPERATOR, STAGES, SiTConfig,
                                            check_run_folder, from_record, recorded_run, stage_title)
from attngeo.interop import dit as dit_import
from attngeo.nn import dit, registry


def load_init(cfg: SiTConfig):
  """The model `--init` names: a run folder, or an official SiT/DiT checkpoint file."""
  if os.path.isdir(cfg.init):
    return runs.load_run(cfg.init)[0]
  return dit_import.import_checkpoint(cfg.init, num_heads=cfg.num_heads)


def check_compatible(mcfg, images_shape, num_classes: int):
  """One-line errors when the data does not fit the model (shape, channels, label range)."""
  n, h, w, c = images_shape
  if (h, c) != (mcfg.image_size, mcfg.channels):
    raise ValueError(f"images are {h}x{w}x{c} but the model takes {mcfg.image_size}x{mcfg.image_size}x{mcfg.channels}")
  if num_classes > mcfg.num_classes:
    raise ValueError(f"labels must lie in [0, {mcfg.num_classes}) (the model's class count); the data has "
                     f"{num_classes} classes")


def check_data(cfg: SiTConfig):
  """Data-dependent argument errors, before any training: the images load and fit the model."""
  devices = int(np.prod(cfg.train.mesh))                  # the trainer's own check, before anything is written
  if devices != jax.device_count():
    raise ValueError(f"train.mesh {tuple(cfg.train.mesh)} needs {devices} devices; {jax.device_count()} are available")
  x, y, k = data.load_images(cfg.data)
  if cfg.init:
    model = load_init(cfg)
    if model.cfg.block.operator != "ATTN":
      raise ValueError(f"--init {cfg.init} runs operator {model.cfg.block.operator!r}; the transfer starts from an "
                       f"ATTN model (a `sit train --operator ATTN` run, its stage `attn`, or a SiT/DiT checkpoint)")
    check_compatible(model.cfg, x.shape, k)
  else:
    mcfg = cfg.model.dit_config(cfg.operator, image_size=x.shape[1], channels=x.shape[3], num_classes=k)
    if x.shape[1] % mcfg.patch:
      raise ValueError(f"patch={mcfg.patch} does not divide the image size {x.shape[1]}")

    regularisers.check_build(cfg.reg, lambda: nn.DiT(mcfg, rngs=nnx.Rngs(0)))


def loss_fn(model, batch, rng):
  """Flow-matching loss with label dropout to the model's null label (SiT's training objective)."""
  kd, kf = jax.random.split(rng)
  y = flow.drop_labels(batch["label"].astype(jnp.int32), kd, model.cfg.class_dropout_prob, model.cfg.null_label)
  return flow.loss(lambda x, t: model(x, t, y), batch["image"], kf), {}


def train_stage(model, cfg: SiTConfig, source, workdir: str, seed: int, desc: str, **stage):
  """Train `model` under its current operator by `cfg.train`, with `stage`'s fields of it replaced (the adaptation
  stages' `steps`, `lr`, `ema`); leaves the EMA weights in `model` (0 steps: as it is). The warm-up is capped at a
  quarter of the stage.
  The loss is `loss_fn`, plus the `cfg.reg` terms when one is on (`regularisers.regularised`; logged as
  `reg/<term>` metrics)."""
  settings = dataclasses.replace(cfg.train, **stage)
  if settings.steps == 0:
    return []
  tcfg = train.TrainConfig(**{**dataclasses.asdict(settings), "warmup": min(settings.warmup, settings.steps // 4)},
                           seed=seed, workdir=workdir, progress=cfg.progress)
  result = train.train(model, regularisers.regularised(cfg.reg, loss_fn), data.loader(source, tcfg.batch_size, seed),
                       tcfg, desc=desc)
  if result.ema is not None:
    nnx.update(model, result.ema)
  return result.history


@functools.partial(nnx.jit, static_argnames=("sampler", "steps", "guidance"))
def _generate(model, noise, labels, key, *, sampler, steps, guidance):
  """Guided samples from `noise` for `labels` (clipped to [−1, 1] for images, not for latents)."""
  v = flow.guided(lambda x, t, y: model(x, t, y), guidance, model.cfg.null_label)
  x1, _ = flow.sample(lambda x, t: v(x, t, labels), noise, steps=steps, solver=sampler, rng=key)
  return jnp.clip(x1, -1.0, 1.0) if model.cfg.channels in (1, 3) else x1


def generate(model, labels: np.ndarray, seed: int, cfg: SiTConfig, chunk: int = 100) -> np.ndarray:
  """Samples [n, H, W, C] for `labels` [n] from fixed noise (seeded), in chunks."""
  mc = model.cfg
  n = len(labels)
  chunk = min(chunk, n)
  padded = -(-n // chunk) * chunk                          # whole chunks: one compilation
  key = jax.random.PRNGKey(10_000 + seed)
  noise = jax.random.normal(key, (padded, mc.image_size, mc.image_size, mc.channels))
  labels = np.resize(np.asarray(labels, np.int32), padded)
  out = [np.asarray(_generate(model, noise[i:i + chunk], jnp.asarray(labels[i:i + chunk]), jax.random.fold_in(key, i),
                              sampler=cfg.sampler, steps=cfg.sample_steps, guidance=float(cfg.guidance)))
         for i in range(0, padded, chunk)]
  return np.concatenate(out)[:n]


@nnx.jit
def _validation_loss(model, x, y, key):
  return flow.loss(lambda xt, t: model(xt, t, y), x, key)


def validation_loss(model, images: np.ndarray, labels: np.ndarray, seed: int = 0, batch: int = 250) -> float:
  """Flow-matching loss (no label dropout) on held-out images, fixed noise and times."""
  vals = [float(_validation_loss(model, jnp.asarray(images[i:i + batch]), jnp.asarray(labels[i:i + batch], jnp.int32),
                                 jax.random.PRNGKey(seed + i))) * len(images[i:i + batch])
          for i in range(0, len(images), batch)]
  return float(np.sum(vals) / len(images))


def row_labels(class_names, rows: int) -> list[str]:
  """The label of each grid row: row r holds class r (`grid_order`)."""
  return [f"class {name}" for name in list(class_names)[:rows]]


def save_neighbours(samples: np.ndarray, train_images: np.ndarray, rows: int, path: str, title: str, row_labels=None,
                    heldout: float | None = None):
  """Samples beside their nearest training images (pixel ℓ², `image_metrics.nearest_images`), tile for
  tile, the mean distance in the title beside `heldout` (held-out real digits' mean distance to the training
  set, the no-copying reference): a model that copies its training set shows the same digit twice."""
  dist, idx = image_metrics.nearest_images(samples, train_images)
  ref = f"; held-out real digits {heldout:.2f}" if heldout is not None else ""
  plotting.image_panels([("samples", samples), ("nearest training image", train_images[idx])], rows, path,
                        title=f"{' '.join(title.split())}: pixel ℓ² to the nearest\ntraining image, mean "
                              f"{dist.mean():.2f}{ref}", row_labels=row_labels)


def probe_layers(model, images: np.ndarray, labels: np.ndarray, progress: bool = True) -> list[dict]:
  """Per-layer `probe.model_report` of the model on held-out images at t = 1 (the data end)."""
  x, y = jnp.asarray(images), jnp.asarray(labels, jnp.int32)
  return probe.model_report(model, lambda: model(x, jnp.ones((len(x),)), y), progress=progress)


def layer_summary(layers: list[dict]) -> dict:
  keys = ("eff_neighbours", "eps_rev", "rho_skew", "curvature", "spectral_gap", "head_isometry_defect")
  return {k: float(np.mean([np.mean(layer[k]) for layer in layers])) for k in keys}


def evaluate_stage(model, stage: str, title: str, seed: int, cfg: SiTConfig, ev: dict, folder: str,
                   extra: dict) -> dict:
  """Samples, metric, validation loss and probe of one stage; writes stage.json, samples.png, weights.npz."""
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
  recorded = files.read_config(folder) if os.path.exists(os.path.join(folder, "config.json")) else {}
  files.write_config(folder, **{**recorded, "model": registry.config_dict(model)})   # a run folder `sit sample`,
                                                                                    # `probe` and --init can load
  files.atomic_write(os.path.join(folder, "stage.json"), json.dumps(dict(row, per_layer=layers), indent=1, default=float))
  return dict(row, per_layer=layers)


def prepare(cfg: SiTConfig, train_classifier: bool = True):
  """Data, held-out split, classifier (trained once, kept in out/classifier/<data key>/) and evaluation inputs.
  `train_classifier=False` only reuses a cached classifier (ev["classifier"] is None without one)."""
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
  ev["row_labels"] = row_labels(image_data.class_names(cfg.data, k), ev["grid_rows"])
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
        mcfg = cfg.model.dit_config("ATTN", image_size=ev["image_shape"][1], channels=ev["image_shape"][3],
                                    num_classes=ev["num_classes"])
        model = nn.DiT(mcfg, rngs=nnx.Rngs(seed))
        if not os.path.exists(done):
          train_stage(model, cfg, train_src, folder, seed, f"seed{seed} ATTN")
      extra = {"steps": 0 if cfg.init else cfg.train.steps}
    elif stage == "dmtn_graft":
      nn.graft(model, "DMTN")
      model.cfg = model.cfg.with_operator("DMTN")
      extra = {"steps": 0}
    elif stage == "dmtn_adapted":
      if not os.path.exists(done):
        train_stage(model, cfg, train_src, folder, seed, f"seed{seed} DMTN", steps=cfg.adapt_steps, lr=cfg.adapt_lr,
                    ema=cfg.adapt_ema)
      extra = {"steps": cfg.adapt_steps}
    elif stage == "dmap_fold":
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
        train_stage(model, cfg, train_src, folder, seed, f"seed{seed} DMAP", steps=cfg.fold_steps, lr=cfg.adapt_lr,
                    ema=cfg.adapt_ema)
      extra = {"steps": cfg.fold_steps}
    if os.path.exists(done):
      row = files.read_json(done)                  # a damaged one is one line naming it
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


def transfer(cfg: SiTConfig) -> dict:
  t0 = time.perf_counter()
  check_run_folder(cfg, "transfer")
  os.makedirs(cfg.out, exist_ok=True)
  files.write_config(cfg.out, sit=cfg, sit_command="transfer")
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


def train_one(cfg: SiTConfig) -> dict:
  """`sit train`: one model under `cfg.operator`; run folder with weights, samples.png and metric."""
  t0 = time.perf_counter()
  check_run_folder(cfg, "train")                      # again, under the run folder's lock
  recorded = files.read_config(cfg.out) if os.path.exists(os.path.join(cfg.out, "config.json")) else {}
  files.write_config(cfg.out, **{**recorded, "sit": cfg, "sit_command": "train"})   # before training: a killed
                                                                                     # run's resume is checked too
  train_src, ev = prepare(cfg)
  seed = cfg.seeds[0]
  mcfg = cfg.model.dit_config(cfg.operator, image_size=ev["image_shape"][1], channels=ev["image_shape"][3],
                              num_classes=ev["num_classes"])
  model = nn.DiT(mcfg, rngs=nnx.Rngs(seed))
  train_stage(model, cfg, train_src, cfg.out, seed, f"SiT {cfg.operator}")
  row = evaluate_stage(model, "trained", f"{cfg.operator}, {cfg.train.steps:,} steps", seed, cfg, ev, cfg.out,
                       {"steps": cfg.train.steps})
  saved = dict(files.read_config(cfg.out), sit=dataclasses.asdict(cfg), model=registry.config_dict(model))
  files.write_config(cfg.out, **saved)
  report.write(cfg.out, "metric", [row] + ev["reference_rows"], METRIC_COLS[:-1])
  print(f"wrote {cfg.out}/weights.npz, samples.png, metric.md; {time.perf_counter() - t0:.0f} s")
  return row


def load_for_sampling(run: str, cfg: SiTConfig):
  """(model, class names) of the run folder `run` for `sit sample`; one-line errors for a guidance scale the
  model cannot give (no null label) or a folder that holds no model."""
  model = runs.load_run(run)[0]
  flow.check_guidance(cfg.guidance, model.cfg.null_label)
  source = (files.read_config(run).get("sit") or {}).get("data") or ""
  return model, image_data.class_names(source, model.cfg.num_classes)


def sample_run(model, cfg: SiTConfig, out: str, n_per_class: int, class_names=None) -> str:
  """`sit sample`: a grid of guided samples (rows of one class, labelled) from a run's model, saved to `out`."""
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


def import_run(checkpoint: str, out: str, num_heads: int | None, num_classes: int | None) -> str:
  """`sit import`: the checkpoint as a weights-only run folder `out`. The run is written beside `out` and moved
  into place, so an `out` replaced under --overwrite holds the new run alone (no samples, probe or bench of the
  old one), and a kill leaves the old run or the new one (an interrupted swap: the old one in `out.replaced-PID`)."""
  model = dit_import.import_checkpoint(checkpoint, num_heads=num_heads, num_classes=num_classes)
  base = os.path.abspath(out).rstrip(os.sep)
  fresh, old = f"{base}.importing-{os.getpid()}", f"{base}.replaced-{os.getpid()}"
  shutil.rmtree(fresh, ignore_errors=True)
  runs.write_weights_run(fresh, model, source=os.path.abspath(checkpoint))
  if os.path.isdir(base):                     # --overwrite (`sit_config.check_out_free` refused it otherwise)
    os.rename(base, old)
    os.rename(fresh, base)
    shutil.rmtree(old)
  else:
    os.rename(fresh, base)
  c = model.cfg
  print(f"imported {checkpoint}: DiT depth {c.depth}, width {c.block.width}, {c.block.num_heads} heads, "
        f"patch {c.patch}, "
        f"{c.image_size}x{c.image_size}x{c.channels}, {c.num_classes} classes"
        f"{' + null label' if c.null_label is not None else ''}, learned sigma {c.learn_sigma} -> {out}")
  return out


BENCH_COLS = [Col("sampler", "Sampler"), Col("steps", "Steps"), Col("guidance", "Guidance", "g"),
              Col("samples_per_s", "Samples/s", ".1f"), Col("fd", "FD (clf)", ".2f"),
              Col("precision", "Precision", ".2f"),
              Col("recall", "Recall", ".2f"), Col("accuracy", "Label acc.", ".3f"), Col("nn_ratio", "NN ratio", ".2f")]


def bench_inputs(model, run: str, args) -> tuple[SiTConfig, dict | None, np.ndarray, str]:
  """`sit sample --bench`'s settings: the recorded run's guidance, seed and evaluation sample count unless the
  flags give them (so the default reproduces the run's own metric row), its evaluation inputs (`prepare` on the
  run's data, with its CACHED classifier only: the bench never trains one) or None, the labels, and a note
  saying why there is no metric when there is none."""
  root, rec = recorded_run(run)
  fields = {k: v for k, v in rec.items() if k in ("guidance", "eval_samples", "grid_per_class", "seeds")}
  stage_seed = re.fullmatch(r"seed(\d+)", os.path.basename(os.path.dirname(os.path.abspath(run))))
  if root and os.path.abspath(root) != os.path.abspath(run) and stage_seed:
    fields["seeds"] = (int(stage_seed.group(1)),)        # a transfer stage: its own seed, not the transfer's first
  given = {k: getattr(args, k) for k in ("guidance", "seeds", "eval_samples") if getattr(args, k) is not None}
  cfg = dataclasses.replace(SiTConfig(), **{**fields, **given, "seeds": tuple(given.get("seeds", fields.get("seeds",
                                                                                                  (0,))))})
  k = model.cfg.num_classes
  labels = (np.arange(cfg.eval_samples) % k if "eval_samples" in given
            else np.arange(max(cfg.eval_samples, cfg.grid_per_class * k)) % k)       # `prepare`'s sample labels
  if rec and not rec.get("metric", True):
    return cfg, None, labels, "no metric: the run was made with --metric false"
  if not rec or model.cfg.channels not in (1, 3):
    return cfg, None, labels, "no metric: the run records no sit data with a classifier metric (an import, latents)"
  base = dataclasses.replace(from_record(rec), out=root, progress=False)
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


def full_plan(cfg: SiTConfig, mfu: float) -> dict:
  """The --full protocol's cost: training FLOPs (`nn.dit.flops_per_image` × images) and chip-hours at `mfu`.

  Sampling, the probe and the metric are not counted (5 stages × `eval_samples` images)."""
  mcfg = nn.DiTConfig.preset(cfg.model.preset, **FULL_DATA)
  images = (cfg.train.steps + cfg.adapt_steps + cfg.fold_steps) * cfg.train.batch_size * len(cfg.seeds)
  flops = dit.flops_per_image(mcfg)
  plan = dict(preset=cfg.model.preset, tokens=(mcfg.image_size // mcfg.patch) ** 2, flops_per_image=flops,
              images=images, total_flops=images * flops, mfu_assumed=mfu)
  plan["chip_hours"] = {chip: plan["total_flops"] / (train.PEAK_FLOPS[chip] * mfu) / 3600 for chip in PLAN_CHIPS}
  plan["wall_hours"] = {chip: hours / PLAN_CHIPS[chip] for chip, hours in plan["chip_hours"].items()}
  return plan
