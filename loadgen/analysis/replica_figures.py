"""Panels of runs on a deployment: per-replica timelines and imbalance over time.

In a seed's pair figure (loadgen/analysis/figures.py), below its three panels: one row per arm,
the hit ratio of each replica's turns per window (left) and each replica's requests, running +
waiting, at each sample (right); then the load imbalance of every arm, the hottest replica's
requests over the replicas' mean at each sample (1: even, N: all on one replica). A seed run in
one arm only has no pair figure: its panels go alone in ``replicas-s<seed>.png``.
"""

from __future__ import annotations

from functools import partial
from typing import Mapping, Optional, Sequence

import pyarrow as pa
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.gridspec import GridSpec

from ..core.arrow_numpy import array
from .replicas import imbalance_over_time, read_replica_samples
from .runs import RunData, float_column
from .windows import DEGRADED_HIT_RATIO, window_series

WINDOW_S = 300.0
# Every figure's titles sit at y=TITLE_Y (axes coordinates), matplotlib's default height, given
# explicitly: left automatic, each titled axes measures its y axis again on every draw and layout
# pass to dodge x tick labels on top or a y offset text, which these figures do not have. The
# same pixels; a quarter of a pair figure's draw.
TITLE_Y = 1.0
REPLICA_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def is_deployment(run: RunData) -> bool:
    return isinstance(run.run_json.get("replicas"), int) and run.run_json["replicas"] > 1 \
        and "replica" in run.turns.column_names


def plot_replica_panels(fig: Figure, grid: GridSpec, first_row: int, runs: Sequence[RunData],
                        colors: Mapping[str, str], sharex: Optional[Axes] = None) -> list[Axes]:
    """Into rows ``first_row``.. of ``grid`` (two columns): per deployment run a row, each
    replica's hit ratio per window (left) and requests (right); then a row across, the load
    imbalance over time of every run. Returns the axes drawn."""
    runs = [r for r in runs if is_deployment(r)]
    drawn = []
    for row, run in enumerate(runs, start=first_row):
        ax_hit = fig.add_subplot(grid[row, 0], sharex=sharex)
        ax_load = fig.add_subplot(grid[row, 1], sharex=sharex or ax_hit)
        sharex = sharex or ax_hit
        n = int(run.run_json["replicas"])
        duration_s = float(run.run_json["duration_s"])
        replica = float_column(run.turns, "replica")
        table = read_replica_samples(run.run_dir)
        for i in range(n):
            color = REPLICA_COLORS[i % len(REPLICA_COLORS)]
            series = window_series(run.turns.filter(array(replica == i, pa.bool_())), 0.0, duration_s, WINDOW_S)
            mid_min = (series.window_starts_s + series.window_widths_s / 2) / 60
            ax_hit.plot(mid_min, series.hit_ratio, color=color, lw=1.2, label=f"replica {i}")
            if table is not None:
                mine = table.filter(array(float_column(table, "replica_index") == i, pa.bool_()))
                load = float_column(mine, "num_running") + float_column(mine, "num_waiting")
                ax_load.plot(float_column(mine, "t_s") / 60, load, color=color, lw=1.0)
        ax_hit.axhline(DEGRADED_HIT_RATIO, color="0.5", ls="--", lw=0.7)
        ax_hit.set_ylim(-0.02, 1.02)
        ax_hit.set_ylabel(f"{run.run_json['arm']}\nhit ratio", fontsize=8)
        ax_load.set_ylabel("requests\n(running + waiting)", fontsize=8)
        if row == first_row:
            ax_hit.legend(fontsize=7, ncol=4)
            ax_hit.set_title(f"hit ratio of each replica's turns per {WINDOW_S / 60:g}-minute window", fontsize=9,
                             y=TITLE_Y)
            ax_load.set_title("each replica's requests", fontsize=9, y=TITLE_Y)
        drawn += [ax_hit, ax_load]
    ax = fig.add_subplot(grid[first_row + len(runs), :], sharex=sharex)
    for run in runs:
        table = read_replica_samples(run.run_dir)
        if table is None:
            continue
        series = imbalance_over_time(table, int(run.run_json["replicas"]))
        arm = str(run.run_json["arm"])
        ax.plot(series["t_s"] / 60, series["load_imbalance"], color=colors.get(arm, "0.3"), lw=1.1, label=arm)
    ax.axhline(1.0, color="0.5", lw=0.7)
    ax.set_xlabel("minute")
    ax.set_ylabel("hottest replica's\nrequests / mean", fontsize=8)
    ax.set_title("load imbalance over time (1: even)", fontsize=9, y=TITLE_Y)
    ax.legend(fontsize=7, ncol=3)
    return drawn + [ax]


def replica_panel_rows(runs: Sequence[RunData]) -> int:
    """Rows ``plot_replica_panels`` draws: one per deployment run and the imbalance; 0 without one."""
    n = sum(1 for r in runs if is_deployment(r))
    return n + 1 if n else 0


def figure_replica_timelines(runs: Sequence[RunData], seed: int, colors: Mapping[str, str]) -> Figure:
    """A seed's per-replica panels alone (a seed with one arm has no pair figure to hold them)."""
    rows = replica_panel_rows(runs)
    fig = Figure(figsize=(12, 2.2 * rows + 0.6), constrained_layout=True)
    plot_replica_panels(fig, fig.add_gridspec(rows, 2), 0, runs, colors)
    fig.suptitle(f"seed {seed}: each replica")
    return fig


def replica_figures(runs_by_seed: Mapping[int, Sequence[RunData]], colors: Mapping[str, str],
                    paired_seeds: Sequence[int]) -> list:
    """(file name, figure maker) of every seed with runs on a deployment whose per-replica panels
    have no pair figure to go in (``paired_seeds`` have one); [] when there are none."""
    return [(f"replicas-s{seed}.png", partial(figure_replica_timelines, runs_by_seed[seed], seed, colors))
            for seed in sorted(runs_by_seed)
            if seed not in paired_seeds and replica_panel_rows(runs_by_seed[seed])]
