"""Per-layer geometry of a trained model: Markov, Bakry–Émery and connection-walk read-outs.

    attngeo probe RUN_DIR [--data swiss_roll|sphere|random|FILE.npy|FILE.txt] [--batch 4] [--set-size 256]
                          [--seq-len 64] [--step N] [--out DIR]

RUN_DIR is a run folder written by `attngeo.train` (config.json + ckpt/): GPT, DiT or PointFlow.
Inputs: PointFlow takes point sets drawn from a generated cloud or an [n, dim] .npy file (t = 1);
GPT takes byte tokens of a text file, a .npy of token ids [b, n], or random tokens; DiT takes a
.npy of images [b, H, W, C] or Gaussian noise (t = 1, null class). Writes probe.json, probe.md and
probe.png (per-layer curves) to --out (default RUN_DIR/probe) and prints the table.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from attngeo import data, nn, plotting, probe, runs

COLUMNS = [("eff_neighbours", "e^H̄"), ("eps_rev", "ε_rev"), ("rho_skew", "ρ_skew"), ("spectral_gap", "gap"),
           ("curvature", "curv"), ("head_isometry_defect", "δ heads"), ("effective_isometry_defect", "δ eff"),
           ("next_relative_change", "ΔW next"), ("next_js_divergence", "JS next")]


def inputs(model, args, rng):
  """A zero-argument callable running `model` on a batch built from --data."""
  cfg = model.cfg
  if isinstance(model, nn.PointFlow):
    cloud = data.load_cloud(args.data, 4000, args.seed)
    idx = np.stack([rng.choice(len(cloud), args.set_size, replace=False) for _ in range(args.batch)])
    x = jnp.asarray(cloud[idx])
    return lambda: model(x, jnp.ones((args.batch,)))
  if isinstance(model, nn.GPT):
    if args.data.endswith(".npy"):
      tok = np.load(args.data)[: args.batch, : args.seq_len]
    elif os.path.exists(args.data):
      raw = np.frombuffer(pathlib.Path(args.data).read_bytes(), np.uint8).astype(np.int32) % cfg.vocab_size
      tok = np.stack([raw[i * args.seq_len:(i + 1) * args.seq_len] for i in range(args.batch)])
    else:
      tok = rng.integers(0, cfg.vocab_size, (args.batch, args.seq_len))
    tok = jnp.asarray(tok, jnp.int32)
    return lambda: model(tok)
  if isinstance(model, nn.DiT):
    shape = (args.batch, cfg.image_size, cfg.image_size, cfg.channels)
    x = jnp.asarray(np.load(args.data)[: args.batch]) if args.data.endswith(".npy") else \
        jnp.asarray(rng.standard_normal(shape), jnp.float32)
    return lambda: model(x, jnp.ones((x.shape[0],)), jnp.full((x.shape[0],), cfg.num_classes))
  raise ValueError(f"no probe inputs for {type(model).__name__}")


def to_markdown(rows) -> str:
  lines = ["| layer | " + " | ".join(label for _, label in COLUMNS) + " |",
           "|---:|" + "---:|" * len(COLUMNS)]
  for i, r in enumerate(rows):
    cells = [f"{float(np.mean(r[key])):.4g}" if key in r else "—" for key, _ in COLUMNS]
    lines.append(f"| {i} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(rows, path, title: str = ""):
  import matplotlib.pyplot as plt
  keys = [k for k, _ in COLUMNS]
  fig, axes = plt.subplots(1, len(keys), figsize=(2.2 * len(keys), 2.7))
  for ax, (key, label) in zip(axes, COLUMNS):
    xs = [i for i, r in enumerate(rows) if key in r]
    ax.plot(xs, [float(np.mean(rows[i][key])) for i in xs], "o-")
    ax.set_title(label, fontsize=9)
    ax.set_xlabel("layer", fontsize=8)
    ax.set_xticks(range(len(rows)))                       # layers are integers
    ax.set_xlim(-0.5, len(rows) - 0.5)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv=None):
  ap = argparse.ArgumentParser(prog="attngeo probe", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("run_dir")
  ap.add_argument("--data", default="swiss_roll")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--set-size", type=int, default=256)
  ap.add_argument("--seq-len", type=int, default=64)
  ap.add_argument("--step", type=int, default=None)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", default=None)
  a = ap.parse_args(argv)
  model, _, mcfg = runs.load_run(a.run_dir, a.step)
  rows = probe.model_report(model, inputs(model, a, np.random.default_rng(a.seed)))
  out = a.out or os.path.join(a.run_dir, "probe")
  os.makedirs(out, exist_ok=True)
  md = to_markdown(rows)
  with open(os.path.join(out, "probe.json"), "w") as f:
    json.dump({"model": type(mcfg).__name__, "layers": rows}, f, indent=1)
  with open(os.path.join(out, "probe.md"), "w") as f:
    f.write(md + "\n")
  name = os.path.basename(os.path.normpath(a.run_dir))
  plot(rows, os.path.join(out, "probe.png"), title=f"Per-layer geometry of the "
       f"{type(mcfg).__name__.removesuffix('Config')} run {name} (mean over heads and inputs)")
  print(md)
  print(f"\nwrote {out}/probe.json, probe.md, probe.png")
  return rows


if __name__ == "__main__":
  main()
