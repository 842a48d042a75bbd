"""The seed's transfer protocol on a real pretrained encoder: graft, adapt on MOSES, fold DMTN -> DMAP, adapt again.

    attngeo mlm transfer RUN [--operators DMTN,ATAP,DMAP,CMAP] [--steps 100] [--seeds 0,1,2]
                             [--batch 16] [--lr 5e-5] [--train 20000] [--eval 500] [--probe 8] [--out DIR]

RUN is an imported encoder with an MLM head (`attngeo import bert …/rxnfp/…/bert_pretrained --out RUN`; its
`vocab.txt` is the tokenizer). For each data-order seed s, every stage starts from the imported weights:

* `ATTN` — the checkpoint as trained, then the control: the same weights adapted under ATTN for the same
  steps on the same batches (what adaptation alone buys);
* each operator X — `nn.graft(model, X)` (a pure swap of the attention), scored at the graft, then
  adapted (all weights, AdamW, `--steps` steps of `--batch` MOSES-train molecules in the order seed s draws);
* `DMTN→DMAP` — the adapted DMTN folded into DMAP's distance form (`nn.fold_distance`: the same function
  as `graft(·, "DMAP")`, half the query–key parameters), scored, then adapted again (Figures 4–5's chain).

Every score is the masked-token loss (nats) and accuracy of `attngeo.lm.mlm.evaluate` on `--eval` held-out
MOSES test molecules (15 %, 80/10/10, mask seed 0: the same masks at every stage); the training masks are
drawn afresh per step (`fold_in(PRNGKey(s), step)`). Each stage is also read by the probe
(`attngeo.probe.summary`, layer means) on `--probe` held-out molecules of one length (no padding): ε_rev
and ρ_skew of the walks (0 for the exact-A operators DMAP/ATAP by construction), effective neighbours,
the head and effective isometry defects. Prints one row per stage (mean ± sd over seeds) and writes
`results.json`, `table.md` and `transfer.png` (loss per stage, each seed a dot) to --out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import numpy as np

from attngeo import config, files, runs
from attngeo.data import molecules
from attngeo.lm.smiles import SmilesTokenizer

OPERATORS = ("DMTN", "ATAP", "DMAP", "CMAP")


@dataclasses.dataclass(frozen=True)
class TransferConfig:
  """One transfer study: the stages of the module docstring for every seed."""
  operators: tuple[str, ...] = OPERATORS
  steps: int = 100
  seeds: tuple[int, ...] = (0, 1, 2)
  batch: int = 16
  lr: float = 5e-5
  train: int = 20_000          # MOSES-train molecules drawn (data seed 0) to adapt on
  eval: int = 500              # held-out MOSES test molecules scored at every stage
  max_len: int = 96            # training molecules longer than this (tokens, [CLS]/[SEP] included) are skipped
  probe: int = 8               # held-out molecules of one length the probe reads at every stage

  def validate(self):
    from attngeo.nn.layers import resolve_operator
    for name in ("steps", "batch", "train", "eval", "max_len", "probe"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1; got {value!r}")
    if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
      raise ValueError(f"--seeds must be non-negative integers; got {self.seeds!r}")
    if not 0 < self.lr < 1:
      raise ValueError(f"--lr must lie in (0, 1); got {self.lr!r}")
    for op in self.operators:
      resolve_operator(op)
    return self


def adapt(model, tokenizer, ids, mask, cfg: TransferConfig, seed: int, desc: str = "adapt"):
  """`cfg.steps` AdamW steps on the masked-token loss over rows of (ids, mask) in the order `seed` draws; in place."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx
  from tqdm.auto import tqdm

  from attngeo.lm import mlm
  opt = nnx.Optimizer(model, optax.adamw(cfg.lr), wrt=nnx.Param)
  special, key = jnp.asarray(tokenizer.special_ids), jax.random.PRNGKey(seed)

  @nnx.jit
  def step(model, opt, rows_ids, rows_mask, k):
    m = mlm.mask_tokens(k, rows_ids, rows_mask, special, tokenizer.mask_id)

    def loss_fn(model):
      s = mlm.mlm_sums(model.mlm_logits(m.inputs, rows_mask), m.targets, m.selected)
      return s.nll / jnp.maximum(s.count, 1)
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  rng = np.random.default_rng(seed)
  order = np.concatenate([rng.permutation(len(ids)) for _ in range(-(-cfg.steps * cfg.batch // len(ids)))])
  losses = []
  for i in tqdm(range(cfg.steps), desc=desc, leave=False, dynamic_ncols=True):
    rows = order[i * cfg.batch:(i + 1) * cfg.batch]
    losses.append(float(step(model, opt, jnp.asarray(ids[rows]), jnp.asarray(mask[rows]), jax.random.fold_in(key, i))))
  return losses


READOUTS = ("eps_rev", "rho_skew", "eff_neighbours", "head_isometry_defect", "effective_isometry_defect")


def readouts(model, probe_ids) -> dict:
  """Layer means of the probe's `READOUTS` of `model` on `probe_ids` [b, n] (one length: no padding)."""
  import jax
  import jax.numpy as jnp

  from attngeo import probe
  ids = jnp.asarray(probe_ids)
  out = jax.device_get(probe.summary(model, lambda: model(ids, jnp.ones(ids.shape, bool))))
  return {k: None if out.get(k) is None else float(out[k]) for k in READOUTS}


def stages(cfg: TransferConfig) -> list[str]:
  """The stage names `run` records, in order."""
  names = ["ATTN (pretrained)", "ATTN adapted (control)"]
  for op in cfg.operators:
    names += [f"{op} at graft", f"{op} adapted"] + (["DMTN→DMAP folded", "DMTN→DMAP adapted"] if op == "DMTN" else [])
  return names


def run(model, tokenizer, train_smiles, eval_smiles, cfg: TransferConfig, log=print, progress: bool = True) -> dict:
  """{stage: [per-seed {"seed", "loss", "accuracy", "adapt_loss", READOUTS…}]} for `model` (an encoder with an
  MLM head; untouched)."""
  from flax import nnx
  from tqdm.auto import tqdm

  from attngeo.lm import mlm
  from attngeo.nn import fold_distance, graft
  cfg.validate()
  if not getattr(model.cfg, "mlm_head", False):
    raise ValueError("the transfer protocol scores the MLM head: the model must have one (e.g. bert_pretrained)")
  lengths = [len(tokenizer.encode(s)) for s in train_smiles]
  keep = [s for s, n in zip(train_smiles, lengths) if n <= cfg.max_len]
  if not keep:
    raise ValueError(f"no training molecule has ≤ {cfg.max_len} tokens")
  ids, mask = tokenizer.batch(keep, length=max(n for n in lengths if n <= cfg.max_len))
  ids, mask = np.asarray(ids), np.asarray(mask)
  probe_ids = tokenizer.equal_length(list(eval_smiles), cfg.probe)
  score = lambda m: mlm.evaluate(m, tokenizer, eval_smiles, progress=False)          # noqa: E731
  out: dict[str, list] = {}
  bar = tqdm(total=len(stages(cfg)) * len(cfg.seeds), desc="mlm transfer", disable=not progress, dynamic_ncols=True)

  def record(stage, m, seed, losses=None, scored=None):
    r = scored or score(m)
    out.setdefault(stage, []).append({"seed": seed, "loss": r.loss, "accuracy": r.accuracy,
                                      "adapt_loss": None if losses is None else float(np.mean(losses[-10:])),
                                      **(base_readouts if scored else readouts(m, probe_ids))})
    bar.update()
    log(f"seed {seed} {stage:<22} loss {r.loss:.4f} nats, accuracy {r.accuracy:.4f}")

  base, base_readouts = score(model), readouts(model, probe_ids)
  for seed in cfg.seeds:
    record("ATTN (pretrained)", model, seed, scored=base)
    control = nnx.clone(model)
    record("ATTN adapted (control)", control, seed, adapt(control, tokenizer, ids, mask, cfg, seed, "ATTN"))
    for op in cfg.operators:
      m = graft(nnx.clone(model), op)
      record(f"{op} at graft", m, seed)
      record(f"{op} adapted", m, seed, adapt(m, tokenizer, ids, mask, cfg, seed, op))
      if op == "DMTN":
        fold_distance(m)
        record("DMTN→DMAP folded", m, seed)
        record("DMTN→DMAP adapted", m, seed, adapt(m, tokenizer, ids, mask, cfg, seed, "DMAP fold"))
  bar.close()
  return out


def readout_cell(values: list) -> str:
  """The mean over seeds of one read-out; "—" where it does not apply (None); seeds whose value is not finite
  (a walk so close to reducible that its stationary law is not determined in float32: `markov.stationary`)
  are left out of the mean and counted after it, "1.1e-07 (2 of 3 NaN)"."""
  if any(v is None for v in values):
    return "—"
  finite = [v for v in values if np.isfinite(v)]
  bad = len(values) - len(finite)
  head = f"{np.mean(finite):.3g}" if finite else "nan"
  return head + (f" ({bad} of {len(values)} NaN)" if bad else "")


def table(results: dict) -> str:
  """Markdown: one row per stage, mean ± sd over seeds of the held-out loss and accuracy, and the probe's
  layer-mean read-outs (mean over seeds, `readout_cell`)."""
  rows = ["| stage | loss (nats) | accuracy | ε_rev | ρ_skew | eff. neighbours | δ heads | δ effective | seeds |",
          "|---|---|---|---:|---:|---:|---:|---:|---|"]
  for stage, seed_rows in results.items():
    loss, acc = np.array([r["loss"] for r in seed_rows]), np.array([r["accuracy"] for r in seed_rows])
    sd = lambda a: f" ± {a.std(ddof=1):.4f}" if len(a) > 1 else ""                     # noqa: E731
    mean = lambda k: readout_cell([r.get(k) for r in seed_rows])                             # noqa: E731
    rows.append(f"| {stage} | {loss.mean():.4f}{sd(loss)} | {acc.mean():.4f}{sd(acc)} | "
                + " | ".join(mean(k) for k in READOUTS) + f" | {len(seed_rows)} |")
  return "\n".join(rows)


def figure(results: dict, path: str) -> None:
  """Held-out loss per stage (bar: mean over seeds; dots: seeds), the pretrained model's loss dashed."""
  from attngeo.plotting import plt
  names = list(results)
  fig, ax = plt.subplots(figsize=(max(6.0, 0.75 * len(names)), 3.6), constrained_layout=True)
  for i, name in enumerate(names):
    loss = np.array([r["loss"] for r in results[name]])
    color = "0.55" if name.startswith("ATTN") else "C0" if "adapted" in name else "C3"
    ax.bar(i, loss.mean(), color=color, alpha=0.8)
    ax.plot(np.full(len(loss), i), loss, "k.", ms=4)
  ax.axhline(np.mean([r["loss"] for r in results[names[0]]]), color="0.3", ls="--", lw=1)
  ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
  ax.set_ylabel("held-out masked-token loss (nats)")
  ax.set_yscale("log")
  ax.set_title("graft (red) → adapt (blue) on bert_pretrained; grey: ATTN; dashed: the checkpoint", fontsize=9)
  files.save_figure(fig, path, dpi=130)
  plt.close(fig)


def parser() -> argparse.ArgumentParser:
  ap = config.parser("attngeo mlm transfer", __doc__)
  d = TransferConfig()
  ap.add_argument("run", help="an imported encoder run folder with an MLM head and its vocab.txt")
  ap.add_argument("--operators", default=",".join(d.operators), help=f"operators to graft (default {d.operators})")
  ap.add_argument("--steps", type=int, default=d.steps, help=f"adaptation steps per stage (default {d.steps})")
  ap.add_argument("--seeds", default=",".join(map(str, d.seeds)), help="data-order seeds (default 0,1,2)")
  ap.add_argument("--batch", type=int, default=d.batch, help=f"molecules per step (default {d.batch})")
  ap.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate (default {d.lr})")
  ap.add_argument("--train", type=int, default=d.train, help=f"MOSES-train molecules to adapt on (default {d.train})")
  ap.add_argument("--eval", type=int, default=d.eval, help=f"held-out MOSES test molecules (default {d.eval})")
  ap.add_argument("--probe", type=int, default=d.probe, help=f"held-out molecules the probe reads per stage "
                  f"(default {d.probe})")
  ap.add_argument("--progress", default="true", choices=("true", "false"), help="progress bars (default true)")
  ap.add_argument("--out", default="runs/mlm_transfer", help="output folder (default runs/mlm_transfer)")
  return ap


def main(argv=None):
  ap = parser()
  a = ap.parse_args(argv)
  try:
    seeds = tuple(int(s) for s in a.seeds.split(","))
  except ValueError:
    ap.error(f"--seeds must be comma-separated integers; got {a.seeds!r}")
  cfg = TransferConfig(operators=tuple(o.strip() for o in a.operators.split(",") if o.strip()), steps=a.steps,
                       seeds=seeds, batch=a.batch, lr=a.lr, train=a.train, eval=a.eval, probe=a.probe)
  vocab = os.path.join(a.run, "vocab.txt")
  try:
    cfg.validate()
    if not os.path.isfile(vocab):
      raise FileNotFoundError(f"no vocab file {vocab}: RUN must be an `attngeo import bert|albert` run folder")
  except (ValueError, FileNotFoundError) as e:
    ap.error(str(e))
  model, _, _ = runs.load_run(a.run)
  tokenizer = SmilesTokenizer.from_vocab(vocab)
  if not getattr(model.cfg, "mlm_head", False):
    ap.error(f"{a.run}: the transfer protocol scores the MLM head and this encoder has none (use bert_pretrained)")
  t0 = time.perf_counter()
  results = run(model, tokenizer, molecules.moses("train", cfg.train), molecules.moses("test", cfg.eval), cfg,
                progress=a.progress == "true")
  text = table(results)
  print(text)
  print(f"wall time {time.perf_counter() - t0:.0f} s")
  os.makedirs(a.out, exist_ok=True)
  figure(results, os.path.join(a.out, "transfer.png"))
  files.atomic_write(os.path.join(a.out, "table.md"), text + "\n")
  files.atomic_write(os.path.join(a.out, "results.json"),
                     json.dumps({"config": dataclasses.asdict(cfg), "run": os.path.abspath(a.run), "stages": results},
                                indent=1))
  return results


if __name__ == "__main__":
  main()
