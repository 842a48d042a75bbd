"""Per-layer geometry of a trained model: Markov, Bakry–Émery and connection-walk read-outs.

    attngeo probe RUN_DIR [--data swiss_roll|sphere|torus|random|noise|FILE.npy|FILE.txt] [--batch 4]
                          [--set-size 256] [--seq-len 64] [--step N] [--layers 0,3] [--heads 0,1]
                          [--samples 32] [--out DIR]

RUN_DIR is a run folder written by `attngeo.train` (config.json + ckpt/) — GPT, DiT, PointFlow, or a
checkpoint imported into a run folder. Inputs: PointFlow takes point sets drawn from a generated
cloud (default swiss_roll) or an [n, dim] .npy/.csv file (t = 1, the data end); GPT takes byte tokens of
a text file, a .npy of token ids [b, n], or random tokens (the default); DiT takes a .npy of images
[b, H, W, C] or Gaussian noise (the default; t = 1, null class); a BERT/ALBERT run (`attngeo import
bert|albert`) takes SMILES (moses, moses-train, reactions — the default — or a file), tokenised by
RUN_DIR/vocab.txt: the first --batch of the commonest token length, so the batch has no padding
(ALBERT's shared layer gives one row per application). `--set-size` shapes PointFlow inputs
only and `--seq-len` GPT inputs only. A path that does not exist, an input of another model, or a shape
option given on a run it does not shape is an error; the inputs probed are printed and named in
probe.md. Prints the per-layer table and writes probe.md / probe.csv / probe.json (every read-out, per
head where it is per head) and probe.png (one panel per quantity against the layer) to --out (default RUN_DIR/probe).
See `attngeo.probe` for the definitions.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import pathlib

import numpy as np

from attngeo import config, data, files, nn, runs
from attngeo.data import molecules, points
from attngeo.experiments import report, timing
from attngeo.experiments.report import Col
from attngeo.lm import tokenizer as tok_lib
from attngeo.lm.smiles import SmilesTokenizer

# (key, label, per-head?) — the quantities of the table and of the figure's panels
QUANTITIES = [("eff_neighbours", "e^H̄", True), ("eps_rev", "ε_rev", True), ("rho_skew", "ρ_skew", True),
              ("curvature", "curvature", False), ("spectral_gap", "spectral gap", False),
              ("head_isometry_defect", "δ heads", True), ("effective_isometry_defect", "δ effective", False),
              ("next_relative_change", "ΔW next (rel. Frobenius)", False),
              ("next_js_divergence", "JS next (nats)", False), ("next_spectral_distance", "spectral dist. next", False)]


def _indices(text: str | None):
  if text is None:
    return None
  try:
    return [int(x) for x in text.split(",") if x.strip()]
  except ValueError:
    return "bad"


# Per model config class (config.json's "model"."class"): the --data it takes, the files it reads, its default.
TAKES = {"PointFlowConfig": "swiss_roll, sphere, torus or an existing .npy/.csv of points [n, dim]",
         "GPTConfig": "an existing text file, an existing .npy of token ids [b, n], or 'random'",
         "DiTConfig": "an existing .npy of images [b, H, W, C], or 'noise'",
         "EncoderConfig": "moses, moses-train, reactions or an existing file of SMILES"}
FILES = {"PointFlowConfig": (".npy", ".csv"), "GPTConfig": ("",), "DiTConfig": (".npy",), "EncoderConfig": ("",)}
DEFAULT_DATA = {"PointFlowConfig": "swiss_roll", "GPTConfig": "random", "DiTConfig": "noise",
                "EncoderConfig": "reactions"}
# The input-shape options of one model kind: option → (its default, the config class it applies to)
DEFAULTS = {"set_size": 256, "seq_len": 64}
SHAPES = {"set_size": "PointFlowConfig", "seq_len": "GPTConfig"}
CLOUD_POINTS = 4000                   # points drawn for a named cloud (the Swiss-roll scan's training set)


def check_data(kind: str | None, data: str | None) -> str | None:
  """--data for a model of config class `kind`, checked before JAX is imported: the model's default input
  when None; a one-line ValueError for a file that does not exist or an input of another model (a point
  cloud or a mistyped path for a token model, a cloud name `data.points.CLOUDS` does not hold)."""
  if kind not in TAKES:                             # not a probed model: runs.load_run names the problem
    return data
  if data is None:
    return DEFAULT_DATA[kind]
  if os.path.isfile(data) and data.endswith(FILES[kind]):
    return data
  if not os.path.exists(data) and (data == DEFAULT_DATA[kind] or kind == "PointFlowConfig" and data in points.CLOUDS
                                   or kind == "EncoderConfig" and data in ("moses", "moses-train")):
    return data
  what = "not a file" if not os.path.exists(data) else "a file this model does not read"
  raise ValueError(f"--data must be {TAKES[kind]} for a {kind.removesuffix('Config')} run; got {data!r} ({what})")


def check_shapes(kind: str | None, args) -> None:
  """Fill --set-size / --seq-len with their defaults; a one-line ValueError for one given on a run of a model
  it does not shape (--set-size on a GPT: its sequences are --seq-len tokens), instead of ignoring it."""
  for key, owner in SHAPES.items():
    flag = "--" + key.replace("_", "-")
    if getattr(args, key) is not None and kind in TAKES and kind != owner:
      raise ValueError(f"{flag} applies to {owner.removesuffix('Config')} runs only; {args.run_dir} is a "
                       f"{kind.removesuffix('Config')} run (its input is {TAKES[kind]})")
    if getattr(args, key) is None:
      setattr(args, key, DEFAULTS[key])


def _token_ids(path: str, vocab: int) -> np.ndarray:
  """Token ids [b, n] from a .npy: integers in [0, vocab), at least two per row."""
  tok = np.load(path)
  if tok.ndim != 2 or tok.shape[1] < 2 or not np.issubdtype(tok.dtype, np.integer):
    raise ValueError(f"--data {path} must hold integer token ids [b, n ≥ 2]; got {tok.dtype} of shape {tok.shape}")
  if tok.size and not (0 <= tok.min() and tok.max() < vocab):
    raise ValueError(f"--data {path} must hold token ids in [0, {vocab}); got [{tok.min()}, {tok.max()}]")
  return tok


def _text_ids(path: str, run_dir: str, vocab_size: int):
  """(token ids [n] of the text file `path`, a phrase naming them): encoded by the run's own tokenizer
  (`RUN_DIR/tokenizer/`, written by `attngeo lm`) when it has one, else its bytes as ids (a byte-level
  model: ids < 256 must fit the vocabulary)."""
  tdir = os.path.join(run_dir, "tokenizer")
  if os.path.exists(os.path.join(tdir, tok_lib.FILE)):
    tok = tok_lib.load(tdir)
    if tok.vocab_size > vocab_size:
      raise ValueError(f"{tdir} has {tok.vocab_size} ids; the run's model reads {vocab_size}")
    return np.asarray(tok.encode(pathlib.Path(path).read_text(encoding="utf-8", errors="replace")), np.int32), \
        f"{path} encoded by the run's tokenizer ({tok.vocab_size} ids)"
  if vocab_size < 256:
    raise ValueError(f"--data {path}: a text file is read as bytes (ids 0-255), but this model's vocabulary has "
                     f"{vocab_size} ids and the run has no tokenizer/; give token ids as FILE.npy")
  return np.frombuffer(pathlib.Path(path).read_bytes(), np.uint8).astype(np.int32), f"bytes of {path} as token ids"


def inputs(model, args, rng):
  """(A zero-argument callable running `model` on a batch built from --data, a phrase naming that batch)."""
  import jax.numpy as jnp

  cfg = model.cfg
  if isinstance(model, nn.PointFlow):
    try:
      cloud = data.load_cloud(args.data, CLOUD_POINTS, args.seed)
    except ValueError as e:
      raise ValueError(f"--data: {e}") from e
    if cloud.shape[1] != cfg.dim:
      raise ValueError(f"--data {args.data} has points of dimension {cloud.shape[1]}; this PointFlow takes {cfg.dim}")
    if not 2 <= args.set_size <= len(cloud):
      raise ValueError(f"--set-size must be in [2, {len(cloud)}] (the points of --data {args.data}); "
                       f"got {args.set_size}")
    idx = np.stack([rng.choice(len(cloud), args.set_size, replace=False) for _ in range(args.batch)])
    x = jnp.asarray(cloud[idx])
    what = f"{args.batch} set{'s' * (args.batch != 1)} of {args.set_size} points of {args.data} (t = 1)"
    return (lambda: model(x, jnp.ones((args.batch,)))), what
  if isinstance(model, nn.GPT):
    if args.seq_len > cfg.seq_len:
      raise ValueError(f"--seq-len must be at most the model's context, {cfg.seq_len}; got {args.seq_len}")
    if args.data == "random":
      tok = rng.integers(0, cfg.vocab_size, (args.batch, args.seq_len))
      what = f"random tokens (uniform ids in [0, {cfg.vocab_size}))"
    elif args.data.endswith(".npy"):
      tok, what = _token_ids(args.data, cfg.vocab_size)[: args.batch, : args.seq_len], f"token ids of {args.data}"
    else:
      raw, what = _text_ids(args.data, args.run_dir, cfg.vocab_size)
      if len(raw) < args.batch * args.seq_len:
        raise ValueError(f"{args.data} has {len(raw)} tokens ({what}); --batch × --seq-len needs "
                         f"{args.batch * args.seq_len}")
      tok = np.stack([raw[i * args.seq_len:(i + 1) * args.seq_len] for i in range(args.batch)])
    tok = jnp.asarray(tok, jnp.int32)
    return (lambda: model(tok)), f"{what}, {tok.shape[0]} × {tok.shape[1]}"
  if isinstance(model, nn.DiT):
    shape = (cfg.image_size, cfg.image_size, cfg.channels)
    if args.data == "noise":
      x, what = jnp.asarray(rng.standard_normal((args.batch, *shape)), jnp.float32), "Gaussian noise images"
    else:
      x, what = np.load(args.data)[: args.batch], f"images of {args.data}"
      if x.ndim != 4 or x.shape[1:] != shape or not np.issubdtype(x.dtype, np.number):
        raise ValueError(f"--data {args.data} must hold images [b, {', '.join(map(str, shape))}]; "
                         f"got {x.dtype} {x.shape}")
      x = jnp.asarray(x, jnp.float32)
    return (lambda: model(x, jnp.ones((x.shape[0],)), jnp.full((x.shape[0],), cfg.num_classes))), \
        f"{what}, {x.shape[0]} × {'×'.join(map(str, shape))} (t = 1, null class)"
  if isinstance(model, nn.Encoder):        # BERT/ALBERT: equal-length SMILES, so the batch has no padding
    tok = SmilesTokenizer.from_vocab(os.path.join(args.run_dir, "vocab.txt"))
    ids = jnp.asarray(tok.equal_length(molecules.load(args.data), args.batch))
    return (lambda: model(ids, jnp.ones(ids.shape, bool))), \
        f"the first {ids.shape[0]} SMILES of {args.data} with the commonest length, {ids.shape[1]} tokens (no padding)"
  raise ValueError(f"no probe inputs for {type(model).__name__}")


def applied_layers(model) -> int:
  """Attention layers as the model applies them, the count `--layers` indexes (layer index = call index, as in
  `probe.model_report`): ALBERT's one shared layer applied `depth` times is `depth` layers; any other model
  calls each `nn.Attention` once."""
  mods = nn.attention_modules(model)
  if isinstance(model, nn.Encoder) and model.cfg.shared_layers:
    return len(mods) * model.cfg.depth
  return len(mods)


def table_rows(rows: list[dict]) -> list[dict]:
  """Per-layer rows with head means (the table's cells) and the effective defect's ± error."""
  out = []
  for r in rows:
    row = {"layer": r["layer"]}
    for key, _, _ in QUANTITIES:
      row[key] = None if r.get(key) is None else float(np.mean(r[key]))
    se = r.get("effective_isometry_defect_se") or 0.0
    row["effective"] = (None if row["effective_isometry_defect"] is None else
                        f"{row['effective_isometry_defect']:.4g}" + (f" ± {se:.2g}" if se > 0 else ""))
    for key, _ in CAUSAL_QUANTITIES + CMAP_QUANTITIES:
      row[key] = None if r.get(key) is None else float(np.mean(r[key]))
    if r.get("cmap_frustration_lower") is not None:
      row["cmap_nu"] = f"[{np.mean(r['cmap_frustration_lower']):.3g}, {np.mean(r['cmap_frustration_upper']):.3g}]"
    out.append(row)
  return out


# Causal layers' reversibility without the mask (their masked ε_rev is 0 by construction: attngeo.probe)
CAUSAL_QUANTITIES = [("eps_rev_unmasked", "ε_rev unmasked (π_τ)")]
# CMAP (magnetic) layers' phase read-outs (head means), as extra columns when the model has such layers
CMAP_QUANTITIES = [("cmap_mean_abs_phase", "CMAP mean |θ|"), ("cmap_lambda_max", "CMAP λ_max(H)"),
                   ("cmap_wilson", "CMAP Wilson loop"), ("cmap_mean_abs_circulation", "CMAP mean |F|")]

COLUMNS = [Col("layer", "layer")] + [
    Col("effective", label, align="right") if key == "effective_isometry_defect" else Col(key, label, ".4g")
    for key, label, _ in QUANTITIES]
CMAP_COLUMNS = [Col(key, label, ".4g") for key, label in CMAP_QUANTITIES] + [Col("cmap_nu", "CMAP ν ∈", align="right")]


def columns(rows: list[dict]) -> list[Col]:
  """The table's columns: the unmasked ε_rev only when some probed layer is causal, CMAP's only when some
  is magnetic."""
  causal = [Col(key, label, ".4g") for key, label in CAUSAL_QUANTITIES
            if any(r.get(key) is not None for r in rows)]
  return COLUMNS + causal + (CMAP_COLUMNS if any(r.get("cmap_mean_abs_phase") is not None for r in rows) else [])


def plot(rows: list[dict], path: str, title: str):
  """One panel per quantity against the layer (integer ticks); per-head values as faint dots."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator
  ncols = 5
  nrows = -(-len(QUANTITIES) // ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.7 * nrows), squeeze=False)
  layers = [r["layer"] for r in rows]
  for ax, (key, label, per_head) in zip(axes.flat, QUANTITIES):
    xs = [r["layer"] for r in rows if r.get(key) is not None]
    vals = [r[key] for r in rows if r.get(key) is not None]
    if per_head:
      for x, v in zip(xs, vals):
        ax.plot([x] * len(v), v, ".", color="0.65", ms=4)
    means = [float(np.mean(v)) for v in vals]
    if key == "effective_isometry_defect":
      ax.errorbar(xs, means, yerr=[r.get("effective_isometry_defect_se") or 0 for r in rows if r.get(key) is not None],
                  fmt="o-", color="C0", capsize=3)
    else:
      ax.plot(xs, means, "o-", color="C0")
    ax.set_title(label + (" (heads: dots)" if per_head else ""), fontsize=9)
    ax.set_xlabel("layer → next probed" if key.startswith("next_") else "layer", fontsize=8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(min(layers) - 0.5, max(layers) + 0.5)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(QUANTITIES):]:
    ax.axis("off")
  fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  files.save_figure(fig, path, dpi=110)
  plt.close(fig)


# Share of the host's memory the probe's programs may bring this process to on the CPU. Its tables grow with
# --batch (per-edge transports, [b, n, n, ·]): `--batch 100000` on a small GPT was ended by the kernel's OOM killer,
# exit 137 and no message. Past the cap an allocation fails as XLA's RESOURCE_EXHAUSTED (numpy's MemoryError),
# which the command reports in one line.
MEMORY_SHARE = 0.85


@contextlib.contextmanager
def bounded():
  """`timing.bounded_data` at `MEMORY_SHARE` of the host's memory on the CPU; nothing elsewhere. XLA:CPU's YNNPACK
  kernels report an allocation refused at the cap as "INTERNAL: YNNPACK operation failed" (after "allocate of <N>
  failed."); raised where the process's peak reached the cap, that error is a MemoryError naming the cap."""
  import jax
  if jax.default_backend() != "cpu":
    yield
    return
  limit = int(MEMORY_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  with timing.bounded_data(limit) as cap:
    try:
      yield
    except Exception as e:
      peak = timing.status_bytes("VmPeak")
      if cap is None or "YNNPACK operation failed" not in str(e) or peak is None or peak < 0.9 * cap:
        raise
      raise MemoryError(f"the probe reached its cap, a {cap / 2**30:.1f} GiB data segment, at most {MEMORY_SHARE:.0%} "
                        "of this machine's memory; its tables grow with --batch and --seq-len") from e


def parser() -> argparse.ArgumentParser:
  ap = config.parser("attngeo probe", __doc__)
  ap.add_argument("run_dir", help="run folder with config.json and ckpt/ (written by attngeo.train or an import)")
  ap.add_argument("--data", default=None,
                  help="PointFlow: swiss_roll | sphere | torus | FILE.npy/.csv [n, dim]; GPT: FILE.txt (bytes) | "
                       "FILE.npy token ids [b, n] | random; DiT: FILE.npy images | noise (default: swiss_roll for "
                       "PointFlow, random for GPT, noise for DiT; the inputs used are printed and in probe.md)")
  ap.add_argument("--batch", type=int, default=4, help="sets / sequences / images probed, ≥ 1 (default: 4)")
  ap.add_argument("--set-size", type=int, default=None,
                  help=f"points per set, PointFlow runs only (refused on others), in [2, points of --data] "
                       f"({CLOUD_POINTS} for a named cloud; default: {DEFAULTS['set_size']})")
  ap.add_argument("--seq-len", type=int, default=None,
                  help=f"tokens per sequence, GPT runs only (refused on others), in [2, the model's context] "
                       f"(default: {DEFAULTS['seq_len']})")
  ap.add_argument("--step", type=int, default=None,
                  help="checkpoint step to load (default: the newest intact one; probe.json records the step loaded)")
  ap.add_argument("--layers", default=None, help="comma-separated attention-layer indices as applied (ALBERT: one per "
                       "application of its shared layer; default: all)")
  ap.add_argument("--heads", default=None, help="comma-separated head indices kept in every layer (default: all)")
  ap.add_argument("--samples", type=int, default=32,
                  help="edges sampled per input for the partial-support part of the effective defect, ≥ 2 (default: 32)")
  ap.add_argument("--triangles", type=int, default=4096,
                  help="triangles sampled per input for a CMAP layer's circulation read-outs, ≥ 2 (default: 4096)")
  ap.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the edge sampling (default: 0)")
  ap.add_argument("--out", default=None, help="output folder (default: RUN_DIR/probe)")
  ap.add_argument("--no-progress", action="store_true", help="no per-layer progress bar (default: shown)")
  return ap


def main(argv=None):
  ap = parser()
  a = ap.parse_args(argv)
  for name, value, low in (("--batch", a.batch, 1), ("--set-size", a.set_size, 2), ("--seq-len", a.seq_len, 2),
                           ("--samples", a.samples, 2), ("--triangles", a.triangles, 2)):
    if value is not None and value < low:
      ap.error(f"{name} must be at least {low}; got {value}")
  if not 0 <= a.seed < 2**32:
    ap.error(f"--seed must be an integer in [0, 2³²) (numpy's and JAX's seeds); got {a.seed}")
  out = a.out or os.path.join(a.run_dir, "probe")
  if files.blocking_file(out):
    ap.error(f"--out {out}: {files.blocking_file(out)} is a file, where the probe writes a folder; choose a "
             f"folder's path")
  layers, heads = _indices(a.layers), _indices(a.heads)
  for flag, given, parsed in (("--layers", a.layers, layers), ("--heads", a.heads, heads)):
    if parsed == "bad":
      ap.error(f"{flag} takes comma-separated integers; got {given!r}")
  default_data = a.data is None
  try:
    kind = (files.read_config(a.run_dir).get("model") or {}).get("class")
    a.data = check_data(kind, a.data)
    check_shapes(kind, a)
  except (FileNotFoundError, ValueError) as e:
    ap.error(str(e))
  from attngeo import nn, probe
  try:
    model, _, mcfg, step = runs.load_run(a.run_dir, a.step, with_step=True)
  except (FileNotFoundError, ValueError) as e:
    ap.error(str(e))
  mods, depth = nn.attention_modules(model), applied_layers(model)
  for name, idx, size, what in (("--layers", layers, depth, f" (the {depth} attention layers as applied)"),
                                ("--heads", heads, min((m.num_heads for m in mods), default=0), "")):
    if idx is not None and (not idx or any(not 0 <= i < size for i in idx) or len(set(idx)) != len(idx)):
      ap.error(f"{name} must be distinct indices in [0, {size}){what}; got {idx}")
  try:
    run, what = inputs(model, a, np.random.default_rng(a.seed))
  except ValueError as e:
    ap.error(str(e))
  print(f"inputs: {what}" + (f" (the default for {nn.model_name(type(model.cfg).__name__)}; choose with --data)" if default_data
                             else ""), flush=True)
  with bounded():
    rows = probe.model_report(model, run, layers=layers, heads=heads, samples=a.samples, seed=a.seed,
                              triangles=a.triangles, progress=not a.no_progress)
  shared = f" ({len(mods)} shared, applied {depth // len(mods)} times)" if depth != len(mods) else ""
  title = f"{os.path.basename(os.path.abspath(a.run_dir))} — {type(model).__name__}, {depth} attention layers{shared}"
  weights = "weights.npz" if step is None else f"checkpoint step {step}"
  note = (f"{title}; weights: {weights}; inputs: {what}; heads {heads if heads is not None else 'all'}. "
          "Per-head quantities are head means (per head in probe.json); δ effective ± its standard error "
          "where edges with a partial gate support were sampled. CMAP layers: walk read-outs of the magnitude, "
          "transport defects not defined (blank), phase read-outs in the CMAP columns.")
  with files.staged():              # the tables and the figure land together, or none of them (a full disk)
    report.write(out, "probe", table_rows(rows), columns(rows), note=note,
                 payload={"run": os.path.abspath(a.run_dir), "step": step, "model": type(mcfg).__name__,
                          "data": a.data, "inputs": what, "batch": a.batch, "heads": heads, "layers": rows})
    plot(rows, os.path.join(out, "probe.png"), title)
  print()
  report.wrote(out, "probe.md", "probe.csv", "probe.json", "probe.png")
  return rows


if __name__ == "__main__":
  main()
