"""Figures (PNG via matplotlib's Agg backend): point-cloud panels and heat flow on a cloud."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _ax3d(fig, rows, cols, i, title):
  ax = fig.add_subplot(rows, cols, i, projection="3d")
  ax.set_title(title, fontsize=8)
  ax.set_xticks([]), ax.set_yticks([]), ax.set_zticks([])
  ax.view_init(elev=12, azim=-70)
  return ax


def point_panels(rows: list[tuple[str, list[tuple[str, np.ndarray]]]], path: str, size: float = 2.0):
  """Grid of 3-D scatter plots: `rows` = [(row label, [(panel title, points [n, 3]), …]), …]."""
  ncols = max(len(panels) for _, panels in rows)
  fig = plt.figure(figsize=(size * ncols, size * len(rows)))
  for r, (label, panels) in enumerate(rows):
    for c, (title, pts) in enumerate(panels):
      ax = _ax3d(fig, len(rows), ncols, r * ncols + c + 1, f"{label}\n{title}" if c == 0 else title)
      ax.scatter(pts[:, 0], pts[:, 1], pts[:, 2], s=0.3, c=pts[:, 2], cmap="viridis", alpha=0.6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def heat_panels(points: np.ndarray, rows: list[tuple[str, list[tuple[str, np.ndarray]]]], path: str,
                source: int | None = None, size: float = 2.4):
  """Heat (a density over `points` [n, 3]) per panel: `rows` = [(label, [(title, values [n]), …]), …]."""
  ncols = max(len(panels) for _, panels in rows)
  fig = plt.figure(figsize=(size * ncols, size * len(rows)))
  for r, (label, panels) in enumerate(rows):
    for c, (title, vals) in enumerate(panels):
      ax = _ax3d(fig, len(rows), ncols, r * ncols + c + 1, f"{label}: {title}")
      order = np.argsort(vals)
      ax.scatter(points[order, 0], points[order, 1], points[order, 2], s=1.5, c=vals[order], cmap="inferno")
      if source is not None:
        ax.scatter(*points[source], s=30, c="cyan", marker="x")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
