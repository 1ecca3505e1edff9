"""The map's figures from what they are drawn of: a sparse trigger grid keeps a row per factor
(no axis stretched below zero), and the 10% / 90% boundaries run along cell edges."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from loadgen.map.figures import level_edges, phase_diagram_figure
from tests.map.test_map_report import _summary, _the_small_map


def test_level_edges_separate_the_cells_on_either_side_of_the_level():
    p = np.array([[0.0, 0.5], [0.95, 1.0]])
    assert sorted(level_edges(p, 0.9)) == [((-0.5, 0.5), (0.5, 0.5)), ((0.5, 0.5), (1.5, 0.5))]
    assert sorted(level_edges(p, 0.1)) == [((-0.5, 0.5), (0.5, 0.5)), ((0.5, -0.5), (0.5, 0.5))]
    assert level_edges(np.array([[0.0, np.nan]]), 0.1) == []  # no boundary to an unmeasured cell


def test_a_sparse_trigger_grid_keeps_a_row_per_factor_and_boundaries_on_cell_edges():
    summary = _summary(_the_small_map(), ("none", "budgeter"), range(1, 5))
    fig = phase_diagram_figure(summary)
    try:
        ax = fig.axes[0]
        assert ax.get_ylim() == (-0.5, 1.5)  # factors 0 and 1.5: two rows, nothing below x0
        assert [t.get_text() for t in ax.get_yticklabels()] == ["x0", "x1.5"]
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0.03", "0.035", "0.04", "0.045"]
        assert not ax.collections[1:]  # the mesh only: no interpolated contour
        edges = [line for line in ax.lines if line.get_label().startswith("_") and len(line.get_xdata()) == 2]
        assert edges, "the none panel has cells on both sides of 10%"
        for line in edges:
            for v in list(line.get_xdata()) + list(line.get_ydata()):
                assert (v + 0.5) % 1 == 0, "a boundary runs along cell edges"
        # each cell's text is that cell's estimate
        texts = {(t.get_position()): t.get_text().split("\n")[0] for t in ax.texts}
        cell = {(c["rate_per_s"], c["trigger_factor"]): c["p"] for c in summary["cells"] if c["controller"] == "none"}
        assert texts[(1, 1)] == f"{cell[(0.035, 1.5)]:.2f}"
    finally:
        plt.close(fig)
