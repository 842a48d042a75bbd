"""The order effect of the Swiss-roll scan: e^H̄ against set size, depth and budget, for both orders.

    attngeo swissroll-order [--protocols base,depth4,set1024,full] [--operators DMAP,ATAP,DMTN] [--out DIR]

The seed's MHSA → FFN rows are much sharper (DMAP e^H̄ 1.14, ATAP 9.63, DMTN 11.1) than its
FFN → MHSA rows (27.2, 46.4, 42.4); its protocol (set size, width, depth, budget) is not stated.
This command trains the seed's three operators in both orders under several protocols (each a
change of the `attngeo swissroll` defaults at 1500 steps, the study's budget) and measures every
trained model's effective neighbour count `e^H̄` (exp of the mean row entropy of P, averaged over
heads and layers, t = 1) on point sets of 256, 1024 and 4000 training points (4000 = the whole
training set, what the seed's figure shows), raw and ÷ the set size n. Protocols:

* `base` — the `attngeo swissroll` defaults at 1500 steps (reused from `runs/swissroll` when a scan
  ran with `--train.steps 1500`);
* `depth4` — 4 blocks instead of 2;
* `set1024` — training sets of 1024 points (batch ÷ 4: the same points per step);
* `full` — the `--full` budget of `attngeo swissroll`, 6000 steps (reused from `runs/swissroll_full`).

A condition already trained under the same settings is reused (folders keyed by fingerprint,
`attngeo.experiments.swissroll_config`). Writes order.{md,csv,json} and order.png to `--out`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np

from attngeo import config, data, files, runlock
from attngeo.experiments import report, swissroll_config
from attngeo.experiments.report import Col

# Each protocol's settings over the scan's defaults at `STEPS`, as dotted names (`config.replaced`).
PROTOCOLS = {
    "base": {"out": "runs/swissroll"},
    "depth4": {"model.depth": 4},
    "set1024": {"set_size": 1024, "train.batch_size": 2},
    "set4000": {"set_size": 4000, "train.batch_size": 1, "num_sets": 512},
    "full": {**swissroll_config.FULL, "out": "runs/swissroll_full"},
}
SEED = {("DMAP", "ffn_first"): 27.2, ("DMAP", "attn_first"): 1.14, ("DMTN", "ffn_first"): 42.4,
        ("DMTN", "attn_first"): 11.1, ("ATAP", "ffn_first"): 46.4, ("ATAP", "attn_first"): 9.63}
SIZES = (256, 1024, 4000)
STEPS = 1500          # the order study's budget (the scan's default was 1500 steps when it was measured)
LABELS = {"base": "base (depth 2, sets of 256, 1500 steps)", "depth4": "depth 4", "set1024": "trained on sets of 1024",
          "set4000": "trained on sets of 4000", "full": "6000 steps (--full)"}


def protocol_config(name: str, operators, out: str) -> swissroll_config.SwissRollConfig:
  fields = {"operators": tuple(operators), "orders": swissroll_config.ORDERS, "probe_sizes": SIZES,
            "out": os.path.join(out, name), "train.steps": STEPS, **PROTOCOLS[name]}
  return config.replaced(swissroll_config.SwissRollConfig(), fields)


def run(protocols, operators, out: str, progress: bool = True) -> list[dict]:
  """Every protocol's conditions (each in its scan folder, held while it trains), then the table and figure
  in `out` (held throughout): two processes never write one folder."""
  configs = [dataclasses.replace(protocol_config(name, operators, out), progress=progress) for name in protocols]
  for cfg in configs:
    swissroll_config.validate(cfg)
  with runlock.hold(out):
    t0 = time.perf_counter()
    rows = []
    for name, cfg in zip(protocols, configs):
      with runlock.hold(cfg.out):
        rows += protocol_rows(name, cfg, operators)
    return summarise(rows, protocols, operators, out, time.perf_counter() - t0)


def protocol_rows(name: str, cfg, operators) -> list[dict]:
  """One protocol's conditions (`swissroll_run.run_condition`: trained or read back by key) as table rows."""
  from attngeo.experiments import swissroll_run
  source, cloud = data.point_sets(cloud="swiss_roll", num_points=cfg.num_points, seed=cfg.seed,
                                  set_size=cfg.set_size, num_sets=cfg.num_sets)
  refs = swissroll_run.references(cfg, cloud)
  rows = []
  for order in cfg.orders:
    for op in operators:
      print(f"[{name}] {op} {order}", flush=True)
      r = swissroll_run.run_condition(cfg, op, order, cfg.seed, source, refs)
      by = r["eff_neighbours_by_size"]
      rows.append(dict(protocol=name, operator=op, order=order, set_size=cfg.set_size, depth=cfg.model.depth,
                       steps=cfg.train.steps, e_train=r["eff_neighbours"],
                       **{f"e_{n}": float(np.mean(by[str(n)])) for n in SIZES},
                       **{f"norm_{n}": float(np.mean(by[str(n)])) / n for n in SIZES},
                       e_first=by[str(SIZES[-1])][0], e_last=by[str(SIZES[-1])][-1], per_layer=by,
                       d_nn_ratio=r["d_nn_ratio"], seed_value=SEED.get((op, order))))
  return rows


def summarise(rows: list[dict], protocols, operators, out: str, seconds: float) -> list[dict]:
  """order.{md,csv,json} and order.png in `out`; returns `rows`."""
  big = SIZES[-1]
  cols = ([Col("protocol"), Col("operator"), Col("order", "Order", swissroll_config.ORDER_NAMES.get),
           Col("set_size", "train n"), Col("depth"), Col("steps"), Col("e_train", "e^H̄ (train n)", ".2f")]
          + [Col(f"e_{n}", f"e^H̄ @{n}", ".2f") for n in SIZES]
          + [Col(f"norm_{big}", f"÷ n @{big}", ".4f"), Col("e_first", f"@{big} layer 1", ".2f"),
             Col("e_last", f"@{big} last layer", ".2f"), Col("seed_value", "seed e^H̄", ".3g"),
             Col("d_nn_ratio", "d_NN ÷ floor", ".3f")])
  note = ("e^H̄ = exp(mean row entropy of P), mean over heads and layers (per layer: first and last columns) "
          "of the trained model at t = 1 on sets of n training points; the seed states no set size for its value.")
  with files.staged():                      # the tables and the figure land together (a full disk: none of them)
    report.write(out, "order", rows, cols, payload=rows, note=note)
    figure(rows, os.path.join(out, "order.png"))
  models = ", ".join(dict.fromkeys(protocol_config(p, operators, out).out for p in protocols))
  print()
  report.wrote(out, "order.md", "order.csv", "order.json", "order.png",
               suffix=f"; models in {models}; wall time {seconds:.0f} s")
  return rows


def figure(rows: list[dict], path: str) -> None:
  """e^H̄ (top) and e^H̄/n (bottom) against set size, one panel per operator; seed values as lines."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  ops = list(dict.fromkeys(r["operator"] for r in rows))
  protocols = list(dict.fromkeys(r["protocol"] for r in rows))
  fig, axes = plt.subplots(2, len(ops), figsize=(max(3.6 * len(ops), 6.5), 7.4), squeeze=False)
  n = np.array(SIZES)
  for j, op in enumerate(ops):
    for i, norm in enumerate((False, True)):
      ax = axes[i, j]
      for k, p in enumerate(protocols):
        for order, ls in (("ffn_first", "-"), ("attn_first", "--")):
          r = next((r for r in rows if r["protocol"] == p and r["operator"] == op and r["order"] == order), None)
          if r is None:
            continue
          e = np.array([r[f"e_{s}"] for s in SIZES])
          ax.plot(n, e / n if norm else e, ls, marker="o", ms=3, color=plt.cm.tab10(k),
                  label=f"{LABELS.get(p, p)}, {swissroll_config.ORDER_NAMES[order]}")
      seed = {order: SEED.get((op, order)) for order in ("ffn_first", "attn_first")}
      for order, ls in (("ffn_first", "-"), ("attn_first", "--")):
        if seed[order] is not None and not norm:
          ax.axhline(seed[order], color="k", ls=ls, lw=0.8, alpha=0.6,
                     label=f"the seed's Table 1, {swissroll_config.ORDER_NAMES[order]} (value in the title)")
      ax.set_xscale("log")
      if norm:
        ax.set_ylim(0, None)
      else:
        ax.set_yscale("log")
      ax.set_xticks(n, [str(s) for s in SIZES])
      ax.minorticks_off()
      ax.set_xlabel("set size n (points per set)", fontsize=8)
      ax.set_ylabel("e^H̄ ÷ n" if norm else "e^H̄ (effective neighbours)", fontsize=8)
      values = " / ".join(f"{v:g}" for v in seed.values() if v is not None)
      ax.set_title(f"{op} — normalised" if norm else f"{op} (seed: {values})" if values else op, fontsize=9)
      ax.tick_params(labelsize=7)
  entries = {}                                             # label → handle, over every panel (seed lines too)
  for ax in axes.flat:
    for handle, label in zip(*ax.get_legend_handles_labels()):
      entries.setdefault(label, handle)
  handles = list(entries.values())
  fig.legend(handles, list(entries), loc="lower center", ncol=2, fontsize=7, frameon=False, handlelength=4.5)
  fig.suptitle("Learned neighbourhood size e^H̄ against the set size it is measured on\n(solid FFN → MHSA, "
               "dashed MHSA → FFN; black: the seed's Table 1, FFN → MHSA / MHSA → FFN, set size not stated)",
               fontsize=9)
  fig.tight_layout(rect=(0, 0.22 * ((len(handles) + 1) // 2) / fig.get_figheight() + 0.02, 1, 0.93))
  files.save_figure(fig, path, dpi=110)
  plt.close(fig)


def parser() -> argparse.ArgumentParser:
  ap = config.parser("attngeo swissroll-order", __doc__)
  ap.add_argument("--protocols", default="base,depth4,set1024,full",
                  help=f"comma-separated protocols, each one of {','.join(PROTOCOLS)} "
                       "(default: base,depth4,set1024,full)")
  ap.add_argument("--operators", default="DMAP,ATAP,DMTN",
                  help=f"comma-separated operators, each one of {','.join(swissroll_config.OPERATORS)} "
                       "(default: DMAP,ATAP,DMTN)")
  ap.add_argument("--out", default="runs/swissroll_order", help="output folder (default: runs/swissroll_order)")
  ap.add_argument("--progress", default="true", choices=("true", "false"), help="progress bars (default: true)")
  return ap


def main(argv=None):
  ap = parser()
  args = ap.parse_args(argv)
  protocols = [p for p in args.protocols.split(",") if p]
  operators = [o for o in args.operators.split(",") if o]
  if not protocols or any(p not in PROTOCOLS for p in protocols):
    ap.error(f"--protocols must be a comma-separated list of {','.join(PROTOCOLS)}; got {args.protocols!r}")
  if not operators or any(o not in swissroll_config.OPERATORS for o in operators):
    ap.error(f"--operators must be a comma-separated list of {','.join(swissroll_config.OPERATORS)}; got {args.operators!r}")
  return run(protocols, operators, args.out, progress=args.progress == "true")


if __name__ == "__main__":
  main()
