"""Figures of runs on a deployment: per-replica timelines and imbalance over time.

``replicas-s<seed>.png``: one row per arm, the hit ratio of each replica's turns per window
(left) and each replica's requests, running + waiting, at each sample (right);
``imbalance.png``: per arm, the hottest replica's requests over the replicas' mean at each
sample (1: even, N: all on one replica), the first seed's runs.
"""

from __future__ import annotations

from functools import partial

from typing import Mapping, Sequence

import pyarrow as pa
from matplotlib.figure import Figure

from .replicas import imbalance_over_time, read_replica_samples
from .runs import RunData, float_column
from .windows import DEGRADED_HIT_RATIO, window_series

WINDOW_S = 300.0
REPLICA_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666")


def is_deployment(run: RunData) -> bool:
    return isinstance(run.run_json.get("replicas"), int) and run.run_json["replicas"] > 1 \
        and "replica" in run.turns.column_names


def figure_replica_timelines(runs: Sequence[RunData], seed: int) -> Figure:
    runs = [r for r in runs if is_deployment(r)]
    fig = Figure(figsize=(12, 2.2 * len(runs) + 0.6), constrained_layout=True)
    axes = fig.subplots(len(runs), 2, sharex=True, squeeze=False)
    for (ax_hit, ax_load), run in zip(axes, runs):
        n = int(run.run_json["replicas"])
        duration_s = float(run.run_json["duration_s"])
        replica = float_column(run.turns, "replica")
        table = read_replica_samples(run.run_dir)
        for i in range(n):
            color = REPLICA_COLORS[i % len(REPLICA_COLORS)]
            series = window_series(run.turns.filter(pa.array(replica == i)), 0.0, duration_s, WINDOW_S)
            mid_min = (series.window_starts_s + series.window_widths_s / 2) / 60
            ax_hit.plot(mid_min, series.hit_ratio, color=color, lw=1.2, label=f"replica {i}")
            if table is not None:
                mine = table.filter(pa.array(float_column(table, "replica_index") == i))
                load = float_column(mine, "num_running") + float_column(mine, "num_waiting")
                ax_load.plot(float_column(mine, "t_s") / 60, load, color=color, lw=1.0)
        ax_hit.axhline(DEGRADED_HIT_RATIO, color="0.5", ls="--", lw=0.7)
        ax_hit.set_ylim(-0.02, 1.02)
        ax_hit.set_ylabel(f"{run.run_json['arm']}\nhit ratio", fontsize=8)
        ax_load.set_ylabel("requests\n(running + waiting)", fontsize=8)
    axes[0][0].legend(fontsize=7, ncol=4)
    axes[0][0].set_title(f"seed {seed}: hit ratio of each replica's turns per {WINDOW_S / 60:g}-minute window")
    axes[0][1].set_title("each replica's requests")
    axes[-1][0].set_xlabel("minute")
    axes[-1][1].set_xlabel("minute")
    return fig


def figure_imbalance(runs: Sequence[RunData], colors: Mapping[str, str]) -> Figure:
    fig = Figure(figsize=(10, 4.2), constrained_layout=True)
    ax = fig.add_subplot()
    for run in runs:
        table = read_replica_samples(run.run_dir)
        if not is_deployment(run) or table is None:
            continue
        series = imbalance_over_time(table, int(run.run_json["replicas"]))
        arm = str(run.run_json["arm"])
        ax.plot(series["t_s"] / 60, series["load_imbalance"], color=colors.get(arm, "0.3"), lw=1.1, label=arm)
    ax.axhline(1.0, color="0.5", lw=0.7)
    ax.set_xlabel("minute")
    ax.set_ylabel("hottest replica's requests / mean")
    ax.set_title("load imbalance over time (1: even)")
    ax.legend(fontsize=7, ncol=3)
    return fig


def replica_figures(runs_by_seed: Mapping[int, Sequence[RunData]], colors: Mapping[str, str]) -> list:
    """(file name, figure maker) of every seed with runs on a deployment; [] when there are none."""
    out = []
    for seed in sorted(runs_by_seed):
        if any(is_deployment(r) for r in runs_by_seed[seed]):
            out.append((f"replicas-s{seed}.png", partial(figure_replica_timelines, runs_by_seed[seed], seed)))
    if out:
        first = runs_by_seed[min(s for s in runs_by_seed if any(is_deployment(r) for r in runs_by_seed[s]))]
        out.append(("imbalance.png", partial(figure_imbalance, first, colors)))
    return out
