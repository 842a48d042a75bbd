"""Figures (PNG via matplotlib's Agg backend): point-cloud panels, sample grids and heat flow on a cloud.

Point clouds of the Swiss roll are drawn in the x–z plane (looking down the roll's axis, where its
spiral is visible without occlusion); 3-D views are available through `point_panels`.
"""
from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import colors  # noqa: E402

from attngeo import files  # noqa: E402

DPI = 110


def _ax3d(fig, rows, cols, i, title):
  ax = fig.add_subplot(rows, cols, i, projection="3d")
  ax.set_title(title, fontsize=8)
  ax.set_xticks([]), ax.set_yticks([]), ax.set_zticks([])
  ax.view_init(elev=12, azim=-70)
  return ax


def _wrap(text: str, inches: float, fontsize: float) -> str:
  """`text` broken into lines that fit `inches` at `fontsize` points (≈ 0.55 em a character): an axis or
  colour-bar label no longer than its axis, so never clipped by the figure's edge."""
  return "\n".join(textwrap.wrap(text, max(int(inches * 72 / (0.55 * fontsize)), 10)))


def _plane(ax, title, lim, fontsize=9):
  ax.set_title(title, fontsize=fontsize)
  ax.set_xlim(-lim, lim), ax.set_ylim(-lim, lim)
  ax.set_aspect("equal")
  ax.set_xticks([]), ax.set_yticks([])
  return ax


def point_panels(rows: list[tuple[str, list[tuple[str, np.ndarray]]]], path: str, size: float = 2.0):
  """Grid of 3-D scatter plots: `rows` = [(row label, [(panel title, points [n, 3]), …]), …] (equal lengths)."""
  ncols = max(len(panels) for _, panels in rows)
  if any(len(panels) != ncols for _, panels in rows):
    raise ValueError(f"every row must have {ncols} panels (no empty cells); got {[len(p) for _, p in rows]}")
  fig = plt.figure(figsize=(size * ncols, size * len(rows)))
  for r, (label, panels) in enumerate(rows):
    for c, (title, pts) in enumerate(panels):
      ax = _ax3d(fig, len(rows), ncols, r * ncols + c + 1, f"{label}\n{title}" if c == 0 else title)
      ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], s=0.3, c=pts[:, 2], cmap="viridis", alpha=0.6)
  fig.tight_layout()
  files.save_figure(fig, path, dpi=DPI)
  plt.close(fig)


def sample_grid(path: str, rows: list[tuple[str, list[tuple[np.ndarray, np.ndarray]]]], times: list[str], *,
                top: list[tuple[str, np.ndarray, np.ndarray]], noise: np.ndarray | None = None,
                nn_cdfs: dict[str, np.ndarray] | None = None, colour_label: str = "", title: str = "",
                size: float = 2.1, cmap: str = "viridis"):
  """Generated samples per condition (rows) and time (columns), under a row of references.

  Args:
    path: PNG to write.
    rows: [(condition label, [(points [m, 3], colour [m]) per time]), …], every row as long as `times`.
    times: column titles.
    top: reference panels [(title, points [n, 3], colour [n]), …] (the training set, an oracle sample).
    noise: the shared starting noise (t = 0), drawn as a further top panel when given.
    nn_cdfs: {label: d_NN distances} drawn as cumulative distributions in a last top panel ("oracle" dashed).
    colour_label: the colour bar's label; one colour scale (the roll parameter) for every panel.
    title: the figure's title.
  """
  ncols = len(times)
  if any(len(frames) != ncols for _, frames in rows):
    raise ValueError(f"every row must have {ncols} panels, one per time; got {[len(f) for _, f in rows]}")
  colour_all = np.concatenate([c for _, _, c in top] + [c for _, frames in rows for _, c in frames])
  norm = colors.Normalize(float(colour_all.min()), float(colour_all.max()))
  lim = 1.25 * float(max(np.abs(p[:, [0, 2]]).max() for _, p, _ in top))
  fig = plt.figure(figsize=(size * ncols + 1.7, size * (len(rows) + 1) + 1.3))
  width = fig.get_figwidth()                          # the last 1.6 in: the colour bar, its label, the legend
  outer = fig.add_gridspec(len(rows) + 1, 1, left=0.1, right=1 - 1.6 / width, top=1 - 1.05 / fig.get_figheight(),
                           bottom=0.01, hspace=0.12, height_ratios=[1.25] + [1] * len(rows))
  ntop = len(top) + (noise is not None) + bool(nn_cdfs)
  head = outer[0].subgridspec(2, ntop, wspace=0.45, height_ratios=[1, 0.25])
  i = 0
  for t_title, pts, col in top:
    ax = _plane(fig.add_subplot(head[0, i]), t_title, lim, fontsize=8)
    ax.scatter(pts[:, 0], pts[:, 2], s=0.8, c=col, cmap=cmap, norm=norm, linewidths=0)
    i += 1
  if noise is not None:
    ax = _plane(fig.add_subplot(head[0, i]), "t = 0: noise\n(the same for every row)", 3.2, fontsize=8)
    ax.scatter(noise[:, 0], noise[:, 2], s=0.8, c="0.4", linewidths=0)
    i += 1
  if nn_cdfs:
    ax = fig.add_subplot(head[0, i])
    for k, (name, d) in enumerate(nn_cdfs.items()):
      d = np.sort(d)
      oracle = name == "oracle"
      ax.plot(d, np.arange(1, len(d) + 1) / len(d), ls="--" if oracle else "-", lw=1.6 if oracle else 0.9, label=name,
              color="k" if oracle else plt.cm.tab10(k % 10))
    ax.set_xlim(0, float(np.quantile(np.concatenate(list(nn_cdfs.values())), 0.98)))
    ax.set_xlabel("d_NN to training set", fontsize=8), ax.set_ylabel("fraction ≤", fontsize=8)
    ax.set_title("d_NN, final samples", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.04, 1.0), borderaxespad=0, frameon=False,
              handlelength=1.2)                                   # right of the panel: over no data
  for r, (label, frames) in enumerate(rows):
    grid = outer[r + 1].subgridspec(1, ncols, wspace=0.05)
    for c, (pts, col) in enumerate(frames):
      ax = _plane(fig.add_subplot(grid[c]), times[c] if r == 0 else "", lim)
      ax.scatter(pts[:, 0], pts[:, 2], s=0.8, c=col, cmap=cmap, norm=norm, linewidths=0)
      if c == 0:
        ax.set_ylabel(label, fontsize=9)
  rows_box = outer[1:, 0].get_position(fig)          # beside the condition rows: the d_NN legend is above it
  cax = fig.add_axes([1 - 1.3 / width, rows_box.y0 + 0.05 * rows_box.height, 0.18 / width, 0.9 * rows_box.height])
  fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), cax=cax).set_label(
      _wrap(colour_label, 0.9 * rows_box.height * fig.get_figheight(), 9), fontsize=9)
  if title:
    fig.suptitle(title, fontsize=10)
  files.save_figure(fig, path, dpi=DPI)
  plt.close(fig)


def heat_panels(points: np.ndarray, rows: list[tuple[str, list[tuple[str, np.ndarray]]]], path: str,
                source: int | None = None, size: float = 2.4, title: str = "",
                colour_label: str = "probability (log scale, shared by all panels)", floor: float = 1e-6):
  """Heat (a probability over `points` [n, 3]) per panel on one shared log colour scale, x–z plane.

  Args:
    points: the cloud [n, 3].
    rows: [(row label, [(panel title, values [n]), …]), …], every row equally long.
    path: PNG to write.
    source: index of the heat's source point, marked with a star and named in a legend (above the colour bar).
    title: the figure's title (name the model, layer and time unit there).
    colour_label: the colour bar's label.
    floor: values below it are drawn at it (log scale).
  """
  ncols = max(len(panels) for _, panels in rows)
  if any(len(panels) != ncols for _, panels in rows):
    raise ValueError(f"every row must have {ncols} panels (no empty cells); got {[len(p) for _, p in rows]}")
  vmax = max(float(np.max(v)) for _, panels in rows for _, v in panels)
  norm = colors.LogNorm(floor, max(vmax, 10 * floor))
  lim = 1.1 * float(np.abs(points[:, [0, 2]]).max())
  fig, axes = plt.subplots(len(rows), ncols, figsize=(size * ncols + 1.6, size * len(rows) + 0.9), squeeze=False)
  width = fig.get_figwidth()                          # the last 1.4 in: the colour bar, its label, the legend
  for r, (label, panels) in enumerate(rows):
    for c, (p_title, vals) in enumerate(panels):
      ax = _plane(axes[r, c], p_title, lim)
      order = np.argsort(vals)
      ax.scatter(points[order, 0], points[order, 2], s=3, c=np.maximum(vals[order], floor), cmap="inferno", norm=norm,
                 linewidths=0)
      if source is not None:
        ax.scatter(points[source, 0], points[source, 2], s=90, marker="*", facecolor="cyan", edgecolor="k",
                   linewidths=0.6, label="source point")
      if c == 0:
        ax.set_ylabel(label, fontsize=9)
  fig.subplots_adjust(left=0.06, right=1 - 1.4 / width, bottom=0.04, top=1 - 0.9 / fig.get_figheight(), wspace=0.05,
                      hspace=0.15)
  cax = fig.add_axes([1 - 1.15 / width, 0.1, 0.18 / width, 0.7])
  fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap="inferno"), cax=cax).set_label(
      _wrap(colour_label, 0.7 * fig.get_figheight(), 9), fontsize=9)
  if source is not None:                              # above the colour bar, outside every panel
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles[:1], labels[:1], loc="lower left", bbox_to_anchor=(1 - 1.35 / width, 0.82), fontsize=7,
               frameon=False)
  if title:
    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=9)
  files.save_figure(fig, path, dpi=DPI)
  plt.close(fig)


def image_grid(images: np.ndarray, rows: int) -> np.ndarray:
  """[n, H, W, C] in [−1, 1] -> one [rows·H, cols·W(, C)] array in [0, 1] (row-major tiles, 1-px gaps)."""
  n, h, w, c = images.shape
  cols = int(np.ceil(n / rows))
  canvas = np.ones((rows * (h + 1) - 1, cols * (w + 1) - 1, c), np.float32)
  for i, im in enumerate(images):
    r, q = divmod(i, cols)
    canvas[r * (h + 1):r * (h + 1) + h, q * (w + 1):q * (w + 1) + w] = (np.clip(im, -1, 1) + 1) / 2
  return canvas[..., 0] if c == 1 else canvas[..., :3]


def image_panels(panels: list[tuple[str, np.ndarray]], rows: int, path: str, title: str = "", row_labels=None):
  """One PNG of image grids (`image_grid`) side by side, each titled; `row_labels` (one per row) name the rows
  of the first."""
  cols = int(np.ceil(len(panels[0][1]) / rows))
  side = 3.0
  width = max(side * cols / rows, 2.0)
  fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels) + 0.2, side + 0.9), squeeze=False)
  for i, (ax, (name, imgs)) in enumerate(zip(axes[0], panels)):
    ax.imshow(image_grid(imgs, rows), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(name, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([r * (imgs.shape[1] + 1) + (imgs.shape[1] - 1) / 2 for r in range(rows)],
                  row_labels if row_labels is not None and i == 0 else [])
    ax.tick_params(length=0, labelsize=7)
    for spine in ax.spines.values():
      spine.set_visible(False)
  fig.tight_layout(rect=(0, 0, 1, 1 - 0.11 * title.count("\n") - (0.1 if title else 0)))   # room for the title
  if title:
    fig.suptitle(title, fontsize=9)
  files.save_figure(fig, path, dpi=130)
  plt.close(fig)
