"""Latency figures: per arm over time, the cost of control per controller, and TTFT against
context depth. Built on matplotlib.figure.Figure (no pyplot state): a notebook displays what
these return, write_figures saves them."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..core.arrow_numpy import float_values
from .figures import (DPI, TITLE_Y, _control_starts_s, _mark_control, _minutes, _shade_triggers, _trigger_windows,
                      arm_colors, save_figure, set_log_scale)
from .latency import nearest_rank, turn_latencies
from .runs import RunData, load_run
from .windows_table import read_windows


COLLAPSED_COLOR = "0.15"
MARKERS = ("o", "s", "^", "D", "v", "P")


def collapsed_run_ids(summary: Mapping[str, Any]) -> set[str]:
    """The runs the summary judges persistently degraded: the figures draw them apart, since a
    median over every run hides a collapsed minority."""
    return {str(r["run_id"]) for r in summary.get("runs", []) if r.get("persistently_degraded")}


def run_groups(runs: Sequence[RunData], collapsed: Collection[str]) -> list[tuple[str, list[RunData]]]:
    """("healthy", runs) and ("collapsed", runs), the groups that have runs."""
    groups = {"healthy": [], "collapsed": []}
    for run in runs:
        groups["collapsed" if _run_id(run) in collapsed else "healthy"].append(run)
    return [(name, members) for name, members in groups.items() if members]


def _run_id(run: RunData) -> str:
    return str(run.run_json.get("run_id") or run.run_dir.name)


def median_over_runs(values: np.ndarray) -> np.ndarray:
    """Per column (window), the median of the runs' finite values; NaN where none is finite
    (a chat run's windows without a first token), without numpy's All-NaN warning."""
    values = np.where(np.isfinite(values), values, np.nan)
    out = np.full(values.shape[1], np.nan)
    some = np.isfinite(values).any(axis=0)
    if some.any():
        out[some] = np.nanmedian(values[:, some], axis=0)
    return out


def latency_over_time_series(runs: Sequence[RunData], column: str,
                             tables: Optional[Sequence[pa.Table]] = None) -> tuple[np.ndarray, np.ndarray]:
    """(window midpoints in minutes, median over ``runs`` of the windows' ``column``); ``tables``:
    the runs' windows tables, when the caller has read them already (one read for several columns)."""
    if tables is None:
        tables = [read_windows(r) for r in runs]
    n = min(t.num_rows for t in tables)
    mid_min = _minutes(float_values(tables[0].column("window_start_s"))[:n] + 30.0)
    values = np.vstack([float_values(t.column(column))[:n] for t in tables])
    return mid_min, median_over_runs(values)


def figure_latency_over_time(runs_by_arm: Mapping[str, Sequence[RunData]], colors: Mapping[str, str],
                             experiment: Any, collapsed: Optional[Collection[str]] = None) -> Figure:
    """Per arm, TTFT p50 / p90 per 1-minute window, the median over its healthy runs and, apart,
    over its collapsed (persistently degraded) runs; triggers shaded and control start marked."""
    if collapsed is None:
        collapsed = _collapsed_by_outcome(runs_by_arm)
    arms = list(runs_by_arm)
    fig = Figure(figsize=(10, 2.4 * len(arms) + 0.8), constrained_layout=True)
    axes = fig.subplots(len(arms), 1, sharex=True, squeeze=False)[:, 0]
    for ax, arm in zip(axes, arms):
        runs = runs_by_arm[arm]
        groups = run_groups(runs, collapsed)
        for group, members in groups:
            color = colors[arm] if group == "healthy" else COLLAPSED_COLOR
            tables = [read_windows(r) for r in members]  # read once for both columns
            for column, style in (("ttft_p50_s", "-"), ("ttft_p90_s", "--")):
                mid_min, median = latency_over_time_series(members, column, tables)
                ax.plot(mid_min, median, style, color=color, linewidth=1.2,
                        label=f"{group} ({len(members)}): {column.replace('_s', '').replace('_', ' ')}")
        _shade_triggers([ax], _trigger_windows(runs))
        _mark_control(ax, _control_starts_s(runs), label=True)
        set_log_scale(ax)
        ax.set_ylabel("seconds")
        counts = ", ".join(f"{len(m)} {g}" for g, m in groups)
        ax.set_title(f"arm {arm}: TTFT per minute (gateway wait included), median over runs: {counts}",
                     y=TITLE_Y)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    axes[-1].set_xlabel("run time (minutes)")
    fig.suptitle(f"{experiment}: latency over time (collapsed runs apart, in black)")
    return fig


def _collapsed_by_outcome(runs_by_arm: Mapping[str, Sequence[RunData]]) -> set[str]:
    from .outcomes import run_outcome

    return {_run_id(r) for runs in runs_by_arm.values() for r in runs if run_outcome(r)["persistently_degraded"]}


def figure_cost_of_control(summary: Mapping[str, Any], colors: Mapping[str, str]) -> Figure:
    """Per arm (controller), a row: TTFT p90 and p99, turn throughput, and tasks finished. A row
    each, not a scatter of throughput against latency: controllers that end alike (several caps
    that all keep the engine healthy) would hide one another's points."""
    rows = summary.get("latency_by_arm") or []
    fig = Figure(figsize=(12, 1.2 + 0.45 * max(len(rows), 2)), constrained_layout=True)
    ax_lat, ax_tput, ax_tasks = fig.subplots(1, 3, sharey=True, gridspec_kw={"width_ratios": (2, 1, 1)})
    y = np.arange(len(rows))[::-1]  # the first arm on top, as in the tables
    for yi, row in zip(y, rows):
        color = colors.get(row["arm"], "0.3")
        p90, p99 = row["ttft_s"]["p90"], row["ttft_s"]["p99"]
        if p90 is not None and p99 is not None:
            ax_lat.plot([p90, p99], [yi, yi], "-", color=color, linewidth=1, alpha=0.6)
        for value, marker in ((p90, "o"), (p99, "^")):
            if value is not None:
                ax_lat.scatter([value], [yi], color=color, marker=marker, s=45, zorder=3)
        if row["turns_per_s"] is not None:
            ax_tput.barh(yi, row["turns_per_s"], color=color)
        if row["tasks_arrived"]:
            ax_tasks.barh(yi, row["tasks_finished"] / row["tasks_arrived"], color=color)
    ax_lat.set_yticks(y, [r["arm"] for r in rows])
    set_log_scale(ax_lat, "x")
    ax_lat.set_xlabel("TTFT (s, gateway wait included)")
    ax_lat.set_title("TTFT p90 (o) and p99 (^) per arm", y=TITLE_Y)
    ax_lat.grid(True, alpha=0.3)
    ax_lat.legend(handles=[Line2D([], [], color="0.3", marker=m, linestyle="", label=k) for m, k in (("o", "p90"), ("^", "p99"))],
                  fontsize="small", loc="lower right")
    ax_tput.set_xlabel("turns / s (whole runs)")
    ax_tput.set_title("throughput", y=TITLE_Y)
    ax_tput.grid(True, axis="x", alpha=0.3)
    ax_tasks.set_xlim(0, 1.02)
    ax_tasks.set_xlabel("tasks finished / arrived")
    ax_tasks.set_title("task completion", y=TITLE_Y)
    ax_tasks.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"{summary.get('experiment')}: what control costs, per arm")
    return fig


def ttft_depth_series(runs: Sequence[RunData]) -> dict[str, np.ndarray]:
    """Median TTFT of the runs' turns (pooled) by turn index and by prompt-length decile."""
    lats = [turn_latencies(r.turns) for r in runs]
    turn_index = np.concatenate([x.turn_index for x in lats])
    prompt = np.concatenate([x.prompt_tokens for x in lats])
    ttft = np.concatenate([x.ttft_s for x in lats])
    out = {"turn_index": np.array([]), "median_by_turn_s": np.array([]), "prompt_tokens": np.array([]),
           "median_by_prompt_s": np.array([])}
    if not len(ttft):
        return out
    indices = np.unique(turn_index[np.isfinite(turn_index)])
    out["turn_index"] = indices
    out["median_by_turn_s"] = np.array([nearest_rank(ttft[turn_index == i], 0.5) for i in indices])
    edges = np.unique(np.quantile(prompt, np.linspace(0, 1, 11)))
    if len(edges) > 1:
        bins = np.clip(np.searchsorted(edges, prompt, side="right") - 1, 0, len(edges) - 2)
        out["prompt_tokens"] = np.array([(edges[b] + edges[b + 1]) / 2 for b in range(len(edges) - 1)])
        out["median_by_prompt_s"] = np.array([nearest_rank(ttft[bins == b], 0.5) for b in range(len(edges) - 1)])
    return out


def figure_ttft_vs_depth(runs_by_arm: Mapping[str, Sequence[RunData]], colors: Mapping[str, str],
                         experiment: Any, collapsed: Optional[Collection[str]] = None) -> Figure:
    """Per arm, median TTFT by turn index and by prompt length, over its healthy runs (solid)
    and, apart, its collapsed runs (dashed): pooled, a collapsed minority would vanish under
    the healthy runs' median."""
    if collapsed is None:
        collapsed = _collapsed_by_outcome(runs_by_arm)
    fig = Figure(figsize=(11, 4.2), constrained_layout=True)
    ax_turn, ax_prompt = fig.subplots(1, 2)
    arms = list(runs_by_arm)
    for i, (arm, runs) in enumerate(runs_by_arm.items()):
        # arms whose runs end alike draw the same line: each arm's is narrower than the one before
        # it and drawn over it, so an earlier arm shows as a band around a later one, never hidden
        extra = (len(arms) - 1 - i) * min(2.0, 5.0 / max(len(arms) - 1, 1))
        for group, members in run_groups(runs, collapsed):
            series = ttft_depth_series(members)
            healthy = group == "healthy"
            line = {"color": colors[arm], "linewidth": 1.5 + (extra if healthy else 0.0),
                    "alpha": 1.0 if i == len(arms) - 1 or not healthy else 0.6, "zorder": 2 + i,
                    "label": f"{arm}, {group} ({len(members)})"}
            if len(series["turn_index"]):
                ax_turn.plot(series["turn_index"], series["median_by_turn_s"], "-" if healthy else "--", **line)
            if len(series["prompt_tokens"]):
                ax_prompt.plot(series["prompt_tokens"], series["median_by_prompt_s"], "-" if healthy else "--",
                               marker=MARKERS[i % len(MARKERS)], markersize=4 + (extra if healthy else 0.0), **line)
    for ax, xlabel in ((ax_turn, "turn index"), (ax_prompt, "prompt tokens (deciles)")):
        set_log_scale(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("median TTFT (s)")
        ax.grid(True, alpha=0.3)
    ax_turn.legend(fontsize="small")
    fig.suptitle(f"{experiment}: TTFT against context depth (healthy runs solid, collapsed runs dashed)")
    return fig


def write_latency_figures(results_dir: str | os.PathLike, summary: Mapping[str, Any]) -> list[Path]:
    """figures/latency-over-time.png, ttft-vs-depth.png and, with control, cost-of-control.png."""
    jobs = latency_figure_jobs(results_dir, summary)
    for _, draw in jobs:
        draw()
    return [path for path, _ in jobs]


def latency_figure_jobs(results_dir: str | os.PathLike, summary: Mapping[str, Any],
                        load: Callable[[Path], RunData] = load_run) -> list[tuple[Path, Callable]]:
    """(path, a function that draws and saves it) for every figure write_latency_figures writes
    (``load`` as in figures.figure_jobs)."""
    results_path = Path(results_dir)
    runs_by_arm: dict[str, list[RunData]] = {}
    for entry in summary.get("runs", []):
        runs_by_arm.setdefault(str(entry["arm"]), []).append(load(results_path / "runs" / entry["run_id"]))
    if not runs_by_arm:
        return []
    figures_dir = results_path / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    return [(figures_dir / name, partial(save_figure, make, figures_dir / name))
            for name, make in _latency_makers(runs_by_arm, summary, arm_colors(summary))]


def latency_figures(runs_by_arm: Mapping[str, Sequence[RunData]], summary: Mapping[str, Any],
                    colors: Mapping[str, str]) -> list[tuple[str, Figure]]:
    """(file name, figure) for each latency figure."""
    return [(name, make()) for name, make in _latency_makers(runs_by_arm, summary, colors)]


def _latency_makers(runs_by_arm: Mapping[str, Sequence[RunData]], summary: Mapping[str, Any],
                    colors: Mapping[str, str]) -> list[tuple[str, Callable[[], Figure]]]:
    experiment = summary.get("experiment")
    collapsed = collapsed_run_ids(summary)
    makers = [("latency-over-time.png", partial(figure_latency_over_time, runs_by_arm, colors, experiment, collapsed)),
              ("ttft-vs-depth.png", partial(figure_ttft_vs_depth, runs_by_arm, colors, experiment, collapsed))]
    if summary.get("recovery"):
        makers.append(("cost-of-control.png", partial(figure_cost_of_control, summary, colors)))
    return makers
