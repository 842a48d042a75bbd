"""Figures read like a reader needs them: legends over no data, colour bars with labels inside the figure."""
import types

import matplotlib.figure
import numpy as np
import pytest

from attngeo import plotting
from attngeo.experiments import diffmap, swissroll_order


@pytest.fixture
def saved(monkeypatch):
  """The figures a plotting call saves, each with the renderer that drew it (kept past its closing)."""
  figures = []
  savefig = matplotlib.figure.Figure.savefig

  def record(fig, *args, **kwargs):
    out = savefig(fig, *args, **kwargs)
    fig.canvas.draw()                                  # at the figure's own dpi, as fig.bbox is
    fig.saved_renderer = fig.canvas.get_renderer()
    figures.append(fig)
    return out
  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
  return figures


def extent(artist, fig):
  return artist.get_window_extent(fig.saved_renderer)


def colour_bars(fig):
  return [ax for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]      # matplotlib marks a bar's axes


def data_axes(fig):
  return [ax for ax in fig.axes if ax not in colour_bars(fig)]


def assert_legend_over_no_axes(legend, fig):
  box = extent(legend, fig)
  hit = [ax.get_title() for ax in data_axes(fig) if box.overlaps(extent(ax, fig))]
  assert not hit, f"legend over the panels {hit}"


def assert_colour_bar_labelled_inside(fig, label):
  (cax,) = colour_bars(fig)
  text = cax.yaxis.label
  assert text.get_text().replace("\n", " ") == label
  box, frame = extent(text, fig), fig.bbox
  assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1, "label clipped"


def test_sample_grid_puts_the_d_nn_legend_beside_its_panel(saved, tmp_path):
  rng = np.random.default_rng(0)
  pts, col = rng.standard_normal((200, 3)), rng.random(200)
  names = ["oracle"] + [f"{op} {order}" for order in ("FFN → MHSA", "MHSA → FFN")
                        for op in ("DMAP", "DMTN", "ATAP", "ATTN")]
  label = "roll parameter t (generated: t of the final sample's nearest training point)"
  plotting.sample_grid(str(tmp_path / "s.png"), [("DMAP", [(pts, col)] * 2)], ["t = 0.5", "t = 1"],
                       top=[("training set", pts, col)], noise=pts, nn_cdfs={n: rng.random(100) for n in names},
                       colour_label=label)
  (fig,) = saved
  (ax,) = [ax for ax in fig.axes if ax.get_title() == "d_NN, final samples"]
  assert_legend_over_no_axes(ax.get_legend(), fig)
  assert_colour_bar_labelled_inside(fig, label)


def test_heat_panels_name_the_source_outside_the_panels(saved, tmp_path):
  rng = np.random.default_rng(0)
  pts = rng.standard_normal((100, 3))
  panels = [(f"t = {t}", rng.dirichlet(np.ones(100))) for t in (1, 4, 16)]
  plotting.heat_panels(pts, [("ε = 0.05", panels)], str(tmp_path / "h.png"), source=3)
  (fig,) = saved
  (legend,) = fig.legends
  assert [t.get_text() for t in legend.get_texts()] == ["source point"]
  assert_legend_over_no_axes(legend, fig)
  assert_colour_bar_labelled_inside(fig, "probability (log scale, shared by all panels)")


def test_diffusion_map_figure_has_a_labelled_colour_bar_per_colouring(saved, tmp_path):
  rng = np.random.default_rng(0)
  x, coords = rng.standard_normal((50, 3)), rng.standard_normal((50, 3))
  dm = types.SimpleNamespace(eps=0.05, t=1.0, rates=np.linspace(0, 0.1, 4), residuals=np.full(4, 1e-7))
  diffmap._plot(x, coords, dm, str(tmp_path / "d.png"))
  (fig,) = saved
  assert [cax.get_ylabel() for cax in colour_bars(fig)] == ["Ψ₁", "Ψ₃"]


def test_order_figure_names_the_seed_values_in_titles_not_over_the_lines(saved, tmp_path):
  rows = [dict(protocol=p, operator=op, order=order, **{f"e_{n}": 0.1 * n for n in swissroll_order.SIZES})
          for p in ("base", "depth4") for op in ("ATTN", "DMAP") for order in ("ffn_first", "attn_first")]
  swissroll_order.figure(rows, str(tmp_path / "o.png"))
  (fig,) = saved
  assert not [t.get_text() for ax in fig.axes for t in ax.texts]                  # no labels drawn on the data
  seed = swissroll_order.SEED
  assert fig.axes[1].get_title() == f"DMAP (seed: {seed['DMAP', 'ffn_first']:g} / {seed['DMAP', 'attn_first']:g})"
  (legend,) = fig.legends
  labels = [t.get_text() for t in legend.get_texts()]
  assert "the seed's Table 1, MHSA → FFN (value in the title)" in labels         # from DMAP's panel: ATTN has none
  assert_legend_over_no_axes(legend, fig)


def test_adapt_chain_legends_lie_off_the_panels(saved, tmp_path):
  """The control legend sat over the seed's dotted line (loc="best"), the loss legend over the curves."""
  from attngeo.experiments import lm_adapt
  from attngeo.lm import adapt
  rng = np.random.default_rng(0)
  labels, chain = ["A0", "M1", "A1", "M2"], ["ATTN", "DMTN", "ATTN", "DMTN"]
  metrics = lambda: {m: float(rng.random()) for m in adapt.METRICS}
  records = [dict(state=k, seed=s, label=lab, operator=op, steps=4, graft=metrics(), adapted=metrics(),
                  key=f"{k}{s}", graft_key=f"g{k}{s}", curve=[(i, 2.0 + rng.random()) for i in range(4)] if k else [])
             for s in (0, 1) for k, (lab, op) in enumerate(zip(labels, chain))]
  result = dict(labels=labels, chain=chain, records=records)
  summary = adapt.summarise(result)
  seed = lm_adapt.seed_values(result)
  lm_adapt.figure(result, summary, str(tmp_path / "chain.png"), seed, control=summary)
  (fig,) = saved
  legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
  assert len(legends) >= 2
  for legend in legends:
    assert_legend_over_no_axes(legend, fig)


def test_image_grid_tiles_row_major_with_one_pixel_gaps():
  tiles = np.stack([np.full((2, 2, 1), v) for v in np.linspace(-1, 1, 6)])
  grid = plotting.image_grid(tiles, rows=2)
  assert grid.shape == (2 * 3 - 1, 3 * 3 - 1)
  np.testing.assert_allclose(grid[0, 0], 0.0)            # the first tile, −1 → 0
  np.testing.assert_allclose(grid[0, 3], 0.2)            # the second, beside it: −0.6 → 0.2
  np.testing.assert_allclose(grid[3, 6], 1.0)            # the last tile, bottom right
  assert grid[2, 0] == 1.0 and grid[0, 2] == 1.0          # the gaps are white


def test_image_panels_label_the_rows_of_the_first_panel_only(saved, tmp_path):
  imgs = np.random.default_rng(0).uniform(-1, 1, (6, 4, 4, 1))
  plotting.image_panels([("a", imgs), ("b", imgs)], 2, str(tmp_path / "g.png"), title="t", row_labels=["r0", "r1"])
  (fig,) = saved
  first, second = fig.axes
  assert [t.get_text() for t in first.get_yticklabels()] == ["r0", "r1"]
  assert all(not t.get_text() for t in second.get_yticklabels())
  assert (tmp_path / "g.png").stat().st_size > 0
