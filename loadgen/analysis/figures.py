"""Figures of a results directory: one paired time-series figure per seed and an overview.

Reads the run directories named by a summary (``loadgen.analysis.summarize``) and writes PNGs
under ``<results_dir>/figures/``. Uses matplotlib's Agg backend so it works without a display.
"""

from __future__ import annotations

import itertools
import json
import os
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # headless: must precede the pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.axis import Axis  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.layout_engine import PlaceHolderLayoutEngine  # noqa: E402
from matplotlib.ticker import LogFormatter  # noqa: E402

from .recovery import cohort_completion_by_arrival  # noqa: E402
from .replica_figures import TITLE_Y, plot_replica_panels, replica_figures, replica_panel_rows  # noqa: E402
from .runs import RunData, float_column, load_run  # noqa: E402
from .tables import table_arms  # noqa: E402
from .windows import DEGRADED_HIT_RATIO, window_series  # noqa: E402

__all__ = ["write_figures", "arm_colors", "pair_figure", "WINDOW_S", "DPI", "figure_cohort_completion",
           "figure_arm_timeseries", "figure_mix_shift_scatter"]

WINDOW_S = 60.0
DPI = 100
TRIGGER_ALPHA = 0.15
TRIGGER_COLOR = "tab:red"


def arm_colors(summary: Mapping[str, Any]) -> dict[str, str]:
    """A fixed color per arm, so an arm looks the same in every figure of a results directory."""
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {arm: palette[i % len(palette)] for i, arm in enumerate(table_arms(summary))}


class PlainLogFormatter(LogFormatter):
    """A log axis's labels as plain numbers (0.3, 2, 100), not 3x10^-1: matplotlib's own choice of
    which ticks get a label (every decade; minor ticks too on a narrow range)."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def set_log_scale(ax: Axes, axis: str = "y") -> None:
    """``axis`` of ``ax`` on a log scale, labelled in plain numbers."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target.set_major_formatter(PlainLogFormatter())
    target.set_minor_formatter(PlainLogFormatter())


def _minutes(seconds: Any) -> Any:
    """Run-time seconds to minutes (scalars stay scalars, arrays stay arrays)."""
    return np.asarray(seconds, dtype=np.float64) / 60.0


def _trigger_windows(runs: Sequence[RunData]) -> list[tuple[str, float, float]]:
    """Distinct (kind, start_s, end_s) trigger windows over the given runs, in time order."""
    windows = set()
    for run in runs:
        for trigger in run.run_json.get("triggers") or []:
            start_s, end_s = trigger.get("start_s"), trigger.get("end_s")
            if start_s is None or end_s is None:
                continue
            windows.add((str(trigger.get("kind", "trigger")), float(start_s), float(end_s)))
    return sorted(windows, key=lambda w: (w[1], w[2], w[0]))


def _shade_triggers(axes: Sequence[Axes], windows: Sequence[tuple[str, float, float]]) -> None:
    """Shade each trigger window on every panel; label each kind once (top panel only)."""
    labelled: set[str] = set()
    for kind, start_s, end_s in windows:
        for i, ax in enumerate(axes):
            label = None
            if i == 0 and kind not in labelled:
                label = f"trigger: {kind}"
                labelled.add(kind)
            ax.axvspan(
                _minutes(start_s),
                _minutes(end_s),
                color=TRIGGER_COLOR,
                alpha=TRIGGER_ALPHA,
                linewidth=0,
                label=label,
            )


def _window_midpoints_min(starts_s: np.ndarray, widths_s: np.ndarray) -> np.ndarray:
    return _minutes(starts_s + widths_s / 2.0)


def _plot_pair(
    path: Path,
    seed: int,
    runs: Sequence[RunData],
    colors: Mapping[str, str],
    experiment: Any,
) -> None:
    """Save a seed's pair figure (``pair_figure``)."""
    fig = pair_figure(seed, runs, colors, experiment)
    save_png(fig, path)
    plt.close(fig)


# more arms than this, of engines that differ (routers, say), are drawn as small multiples: one
# panel per engine with its arms (a trigger or a controller apart), not every arm on one axis
MAX_ARMS_OVERLAID = 6
GROUP_COLORS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:orange", "tab:brown")


def _arm_engine(run: RunData) -> str:
    """The engine fields the run's arm sets for itself (a router, say), as a key; "" for none."""
    arm = str(run.run_json["arm"])
    arms = ((run.run_json.get("spec") or {}).get("arms")) or []
    own = next((a.get("engine") for a in arms if a.get("name") == arm), None)
    return json.dumps(own, sort_keys=True) if own else ""


def _common_stem(names: Sequence[str]) -> str:
    """The longest start the names share, cut at a '-' (``round-robin`` of ``round-robin-burst``
    and ``round-robin-no-burst``)."""
    prefix = os.path.commonprefix(list(names))
    if not all(len(n) == len(prefix) or n[len(prefix)] == "-" for n in names):
        prefix = prefix[:prefix.rfind("-") + 1] if "-" in prefix else ""
    return prefix.rstrip("-")


def arm_groups(runs: Sequence[RunData]) -> list[tuple[str, list[RunData]]]:
    """The runs by the engine their arm sets, in arm order, each named by its arms' common stem
    (or its router)."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        groups.setdefault(_arm_engine(run), []).append(run)
    named = []
    for members in groups.values():
        stem = _common_stem([str(r.run_json["arm"]) for r in members])
        named.append((stem or str(members[0].run_json.get("router") or members[0].run_json["arm"]), members))
    return named


def draws_small_multiples(runs: Sequence[RunData]) -> bool:
    """Whether a seed's pair figure is small multiples (``pair_small_multiples``)."""
    return len(runs) > MAX_ARMS_OVERLAID and len({_arm_engine(r) for r in runs}) > 1


def pair_figure(seed: int, runs: Sequence[RunData], colors: Mapping[str, str], experiment: Any) -> Figure:
    """One seed's arms: hit ratio, turn throughput and sessions in system, sharing the x axis; on
    a deployment, each arm's replicas and the imbalance below them (replica_figures.py). Many
    arms of different engines: small multiples (``pair_small_multiples``)."""
    if draws_small_multiples(runs):
        return pair_small_multiples(seed, runs, experiment)
    extra_rows = replica_panel_rows(runs)
    if not extra_rows:
        fig, (ax_hit, ax_tput, ax_sessions) = plt.subplots(
            3, 1, sharex=True, figsize=(10, 9), constrained_layout=True
        )
    else:
        fig = plt.figure(figsize=(12, 9 + 2.2 * extra_rows), constrained_layout=True)
        grid = fig.add_gridspec(3 + extra_rows, 2, height_ratios=[3, 3, 3] + [2.2] * extra_rows)
        ax_hit = fig.add_subplot(grid[0, :])
        ax_tput, ax_sessions = (fig.add_subplot(grid[i, :], sharex=ax_hit) for i in (1, 2))
        plot_replica_panels(fig, grid, 3, runs, colors, sharex=ax_hit)
    for run in runs:
        arm = str(run.run_json["arm"])
        duration_s = float(run.run_json["duration_s"])
        series = window_series(run.turns, 0.0, duration_s, WINDOW_S)
        mid_min = _window_midpoints_min(series.window_starts_s, series.window_widths_s)
        ax_hit.plot(mid_min, series.hit_ratio, color=colors[arm], label=arm, linewidth=1.4)
        ax_tput.plot(mid_min, series.turns_per_s, color=colors[arm], label=arm, linewidth=1.4)
        if run.samples.num_rows:
            t_s = float_column(run.samples, "t_s")
            sessions = float_column(run.samples, "sessions_in_system")
            order = np.argsort(t_s, kind="stable")
            ax_sessions.plot(
                _minutes(t_s[order]), sessions[order], color=colors[arm], label=arm, linewidth=1.4
            )

    ax_hit.axhline(
        DEGRADED_HIT_RATIO, color="0.4", linestyle="--", linewidth=0.8,
        label=f"degraded below {DEGRADED_HIT_RATIO:g}",
    )
    _shade_triggers([ax_hit, ax_tput, ax_sessions], _trigger_windows(runs))
    for i, ax in enumerate((ax_hit, ax_tput, ax_sessions)):
        _mark_control(ax, _control_starts_s(runs), label=i == 0)

    ax_hit.set_ylim(-0.02, 1.02)
    ax_hit.set_ylabel("prefix-cache hit ratio\n(token-weighted)")
    ax_hit.set_title(f"Hit ratio per {WINDOW_S / 60:g}-minute window", y=TITLE_Y)
    ax_tput.set_ylabel("turns / s")
    ax_tput.set_title(f"Turn throughput per {WINDOW_S / 60:g}-minute window (successful turns)",
                      y=TITLE_Y)
    ax_sessions.set_ylabel("sessions")
    ax_sessions.set_title("Sessions in the system (arrived, not finished)", y=TITLE_Y)
    ax_sessions.set_xlabel("run time (minutes)")
    for ax in (ax_hit, ax_tput, ax_sessions):
        ax.grid(True, alpha=0.3)
        ax.set_xlim(left=0)
    ax_tput.set_ylim(bottom=0)
    ax_sessions.set_ylim(bottom=0)
    ax_hit.legend(loc="lower left", fontsize="small")
    fig.suptitle(f"{experiment}: seed {seed}, arms compared")
    return fig


def pair_small_multiples(seed: int, runs: Sequence[RunData], experiment: Any) -> Figure:
    """One seed's arms, a panel per engine (``arm_groups``): its arms' hit ratio above their
    sessions in the system, in the group's own colours, so that twenty arms never share one axis
    or cycle through one palette. A deployment's replicas go to replicas-s<seed>.png."""
    groups = arm_groups(runs)
    num_cols = 3 if len(groups) > 4 else 2
    num_rows = -(-len(groups) // num_cols)
    fig = plt.figure(figsize=(5.2 * num_cols, 3.9 * num_rows + 0.7), constrained_layout=True)
    grid = fig.add_gridspec(2 * num_rows, num_cols, height_ratios=[1.15, 1.0] * num_rows)
    windows = _trigger_windows(runs)
    ax_first = None
    labels_by_group = []  # (handles, labels) of each panel
    for i, (name, members) in enumerate(groups):
        row, col = divmod(i, num_cols)
        ax_hit = fig.add_subplot(grid[2 * row, col], sharex=ax_first)
        ax_first = ax_first or ax_hit
        ax_sessions = fig.add_subplot(grid[2 * row + 1, col], sharex=ax_first)
        for j, run in enumerate(members):
            color, arm = GROUP_COLORS[j % len(GROUP_COLORS)], str(run.run_json["arm"])
            series = window_series(run.turns, 0.0, float(run.run_json["duration_s"]), WINDOW_S)
            mid_min = _window_midpoints_min(series.window_starts_s, series.window_widths_s)
            label = (arm[len(name):].lstrip("-") or arm) if arm.startswith(name) else arm
            ax_hit.plot(mid_min, series.hit_ratio, color=color, linewidth=1.2, label=label)
            if run.samples.num_rows:
                t_s = float_column(run.samples, "t_s")
                order = np.argsort(t_s, kind="stable")
                ax_sessions.plot(_minutes(t_s[order]), float_column(run.samples, "sessions_in_system")[order],
                                 color=color, linewidth=1.2)
        ax_hit.axhline(DEGRADED_HIT_RATIO, color="0.4", linestyle="--", linewidth=0.7)
        _shade_triggers([ax_hit, ax_sessions], windows)
        ax_hit.set_ylim(-0.02, 1.02)
        ax_hit.set_title(name, y=TITLE_Y)
        labels_by_group.append(ax_hit.get_legend_handles_labels())
        ax_hit.tick_params(labelbottom=False)
        ax_sessions.set_ylim(bottom=0)
        if col == 0:
            ax_hit.set_ylabel("hit ratio")
            ax_sessions.set_ylabel("sessions\nin system")
        if row == num_rows - 1 or i + num_cols >= len(groups):
            ax_sessions.set_xlabel("run time (minutes)")
        for ax in (ax_hit, ax_sessions):
            ax.grid(True, alpha=0.3)
            ax.set_xlim(left=0)
    if all(labels == labels_by_group[0][1] for _, labels in labels_by_group):  # the same variants everywhere
        fig.legend(*labels_by_group[0], loc="outside lower center", ncols=len(labels_by_group[0][1]),
                   fontsize="small")
    else:
        for ax, (handles, labels) in zip(fig.axes[::2], labels_by_group):
            ax.legend(handles, labels, loc="best", fontsize="x-small")
    fig.suptitle(f"{experiment}: seed {seed}, {len(runs)} arms by engine: hit ratio per {WINDOW_S / 60:g}-minute "
                 f"window above sessions in the system")
    return fig


def _plot_overview(
    path: Path,
    runs_by_arm: Mapping[str, Sequence[RunData]],
    colors: Mapping[str, str],
    experiment: Any,
) -> None:
    """One panel per arm with every seed's hit-ratio series as a thin line."""
    arms = list(runs_by_arm)
    fig, axes = plt.subplots(
        len(arms), 1, sharex=True, sharey=True, squeeze=False,
        figsize=(10, 2.6 * len(arms) + 0.8), constrained_layout=True,
    )
    for ax, arm in zip(axes[:, 0], arms):
        runs = runs_by_arm[arm]
        for run in runs:
            series = window_series(run.turns, 0.0, float(run.run_json["duration_s"]), WINDOW_S)
            mid_min = _window_midpoints_min(series.window_starts_s, series.window_widths_s)
            ax.plot(mid_min, series.hit_ratio, color=colors[arm], linewidth=0.8, alpha=0.6)
        ax.axhline(DEGRADED_HIT_RATIO, color="0.4", linestyle="--", linewidth=0.8)
        _shade_triggers([ax], _trigger_windows(runs))
        _mark_control(ax, _control_starts_s(runs), label=True)
        ax.set_title(f"arm {arm}: {len(runs)} seed(s), one line per seed", y=TITLE_Y)
        ax.set_ylabel("hit ratio")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(left=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower left", fontsize="small")
    axes[-1, 0].set_xlabel("run time (minutes)")
    fig.suptitle(
        f"{experiment}: token-weighted hit ratio per {WINDOW_S / 60:g}-minute window, all seeds"
    )
    save_png(fig, path)
    plt.close(fig)


def write_figures(results_dir: str | os.PathLike, summary: Mapping[str, Any], num_workers: int = 1) -> list[Path]:
    """Write figures/pair-s<seed>.png for each seed run in >1 arm, and figures/overview.png.

    Returns the paths written. Only runs listed in summary["runs"] are drawn. ``num_workers``
    processes draw them at once (loadgen.core.run_pool.run_jobs); the PNGs are the same."""
    from ..core.run_pool import run_jobs

    jobs = figure_jobs(results_dir, summary)
    run_jobs([draw for _, draw in jobs], num_workers)
    return [path for path, _ in jobs]


def figure_jobs(results_dir: str | os.PathLike, summary: Mapping[str, Any],
                load: Callable[[Path], RunData] = load_run) -> list[tuple[Path, Callable[[], None]]]:
    """(path, a function that draws and saves it) for every figure write_figures writes; ``load``
    reads a run directory (a caller drawing several sets of figures reads each run once)."""
    results_path = Path(results_dir)
    figures_dir = results_path / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    colors = arm_colors(summary)
    experiment = summary.get("experiment")
    arm_rank = {arm: i for i, arm in enumerate(colors)}

    runs = [load(results_path / "runs" / entry["run_id"]) for entry in summary.get("runs", [])]
    runs.sort(key=lambda r: (arm_rank[str(r.run_json["arm"])], int(r.run_json["seed"])))

    runs_by_seed: dict[int, list[RunData]] = {}
    runs_by_arm: dict[str, list[RunData]] = {}
    for run in runs:
        runs_by_seed.setdefault(int(run.run_json["seed"]), []).append(run)
        runs_by_arm.setdefault(str(run.run_json["arm"]), []).append(run)

    jobs: list[tuple[Path, Callable[[], None]]] = []
    paired_seeds = []
    for seed in sorted(runs_by_seed):
        seed_runs = runs_by_seed[seed]
        if len({r.run_json["arm"] for r in seed_runs}) < 2:
            continue
        if not draws_small_multiples(seed_runs):  # small multiples leave the replicas to their own figure
            paired_seeds.append(seed)
        path = figures_dir / f"pair-s{seed}.png"
        jobs.append((path, partial(_plot_pair, path, seed, seed_runs, colors, experiment)))

    if runs_by_arm:
        path = figures_dir / "overview.png"
        jobs.append((path, partial(_plot_overview, path, runs_by_arm, colors, experiment)))
    controller_figures = []
    if summary.get("recovery"):
        controller_figures += [("cohort-completion.png", partial(figure_cohort_completion, runs_by_arm, colors, experiment)),
                               ("arms-timeseries.png", partial(figure_arm_timeseries, runs_by_arm, colors, experiment))]
    if _has_mix_shift(runs):
        controller_figures.append(("mix-shift-scatter.png", partial(figure_mix_shift_scatter, summary, colors)))
    if any(r.get("cold_work_drift_s_per_h") is not None for r in summary.get("runs", [])):
        controller_figures.append(("drain.png", partial(figure_drain, summary, colors)))
    controller_figures += replica_figures(runs_by_seed, colors, paired_seeds)  # a deployment's seed without a pair figure
    for name, make in controller_figures:
        jobs.append((figures_dir / name, partial(save_figure, make, figures_dir / name)))
    return jobs


def save_figure(make: Callable[[], Figure], path: Path) -> None:
    save_png(make(), path)


# zlib's fastest level: the same pixels, ~40% less encoding time than Pillow's default (6) for
# files ~10% larger
PNG_COMPRESS_LEVEL = 1


def save_png(fig: Figure, path: Path) -> None:
    """``fig.savefig(path, dpi=DPI)``, laid out once and quickly compressed. With a layout engine
    on, savefig draws the whole figure twice: once (drawing nothing) only to run the layout, once
    for the pixels. Running the layout here at the same dpi and turning the engine off leaves
    savefig one draw; the layout is the same, so are the pixels."""
    with _ticks_computed_once(fig):
        engine = fig.get_layout_engine()
        if engine is not None and not isinstance(engine, PlaceHolderLayoutEngine):
            fig.set_dpi(DPI)
            engine.execute(fig)
            fig.set_layout_engine(None)
        fig.savefig(path, dpi=DPI, pil_kwargs={"compress_level": PNG_COMPRESS_LEVEL})


@contextmanager
def _ticks_computed_once(fig: Figure) -> Iterator[None]:
    """While saving, each axis of ``fig`` computes its ticks once per axes size and view limits.

    matplotlib recomputes an axis' ticks (locator, formatter, every tick's position and label)
    each time anything asks for them: per axes and per layout pass, its tight bbox, each of its
    four spines' extent and its label's position (for every axes sharing the label group) each
    ask again, and the draw asks again: ~10 times per axis a layout pass. Between two asks
    nothing that decides the ticks changes unless the layout moved or resized the axes or the
    limits changed, which the key holds; the answer is then the same list of the same ticks,
    already updated, so it is handed back as it is: 6-9% fewer instructions a figure (callgrind),
    the same pixels (tests/test_figure_ticks_once.py draws figures both ways and compares the
    bytes). matplotlib without ``Axis._update_ticks`` (a private method) is left as it is."""
    axes = [axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)] if hasattr(Axis, "_update_ticks") else []
    for axis in axes:
        axis._update_ticks = partial(_update_ticks_once, axis, {})
    try:
        yield
    finally:
        for axis in axes:
            del axis._update_ticks  # back to the class's method


def _update_ticks_once(axis: Axis, memo: dict) -> list:
    """``Axis._update_ticks`` of ``axis``, computed again only when what it depends on changed:
    the view limits (the ticks' locations and labels, which of them are drawn) and the axes'
    size on the canvas (how many ticks the locator fits)."""
    key = (tuple(axis.get_view_interval()), tuple(axis.axes.bbox.bounds))
    if memo.get("key") != key:
        memo["ticks"] = Axis._update_ticks(axis)
        memo["key"] = key
    return memo["ticks"]


# --------------------------------------------------------------------------------------------
# Controller figures. Built on matplotlib.figure.Figure, not pyplot: no global figure state, so
# a notebook can display what these return and the PNG writer can save it.

COHORT_BIN_S = 300.0
CONTROL_COLOR = "0.2"


def _control_starts_s(runs: Sequence[RunData]) -> list[float]:
    return sorted({float(r.run_json.get("control_start_s") or 0.0) for r in runs} - {0.0})


def _mark_control(ax: Axes, starts_s: Sequence[float], label: bool) -> None:
    for i, start_s in enumerate(starts_s):
        ax.axvline(_minutes(start_s), color=CONTROL_COLOR, linestyle=":", linewidth=1.2,
                   label="control starts" if label and i == 0 else None)


def figure_cohort_completion(runs_by_arm: Mapping[str, Sequence[RunData]], colors: Mapping[str, str],
                             experiment: Any = None, width_s: float = COHORT_BIN_S) -> Figure:
    """Share of each arrival cohort (width_s windows) finished by the run's end, one line per arm,
    pooled over seeds. Late cohorts are short of time in every arm alike."""
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    ax = fig.subplots()
    all_runs = [r for runs in runs_by_arm.values() for r in runs]
    for arm, runs in runs_by_arm.items():
        starts_s, fractions = cohort_completion_by_arrival(runs, width_s)
        ax.plot(_minutes(starts_s + width_s / 2), fractions, marker="o", markersize=3, color=colors[arm],
                label=arm, linewidth=1.4)
    _shade_triggers([ax], _trigger_windows(all_runs))
    _mark_control(ax, _control_starts_s(all_runs), label=True)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"arrival time (minutes; {width_s / 60:g}-minute cohorts)")
    ax.set_ylabel("finished by run end")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize="small")
    ax.set_title(f"{experiment}: cohort completion by arrival cohort, all seeds pooled", y=TITLE_Y)
    return fig


def figure_arm_timeseries(runs_by_arm: Mapping[str, Sequence[RunData]], colors: Mapping[str, str],
                          experiment: Any = None) -> Figure:
    """Per arm (one row each): hit ratio per minute and sessions in the system, one line per seed."""
    arms = list(runs_by_arm)
    fig = Figure(figsize=(11, 2.3 * max(1, len(arms)) + 0.8), layout="constrained")
    axes = fig.subplots(max(1, len(arms)), 2, sharex=True, squeeze=False)
    for row, arm in enumerate(arms):
        ax_hit, ax_sessions = axes[row]
        runs = runs_by_arm[arm]
        for run in runs:
            series = window_series(run.turns, 0.0, float(run.run_json["duration_s"]), WINDOW_S)
            ax_hit.plot(_window_midpoints_min(series.window_starts_s, series.window_widths_s), series.hit_ratio,
                        color=colors[arm], linewidth=0.8, alpha=0.6)
            if run.samples.num_rows:
                t_s = float_column(run.samples, "t_s")
                order = np.argsort(t_s, kind="stable")
                ax_sessions.plot(_minutes(t_s[order]), float_column(run.samples, "sessions_in_system")[order],
                                 color=colors[arm], linewidth=0.8, alpha=0.6)
        for ax in (ax_hit, ax_sessions):
            _shade_triggers([ax], _trigger_windows(runs))
            _mark_control(ax, _control_starts_s(runs), label=False)
            ax.grid(True, alpha=0.3)
            ax.set_xlim(left=0)
        ax_hit.axhline(DEGRADED_HIT_RATIO, color="0.4", linestyle="--", linewidth=0.8)
        ax_hit.set_ylim(-0.02, 1.02)
        ax_hit.set_ylabel(f"{arm}\nhit ratio")
        ax_sessions.set_ylabel("sessions in system")
        ax_sessions.set_ylim(bottom=0)
    axes[0, 0].set_title(f"hit ratio per {WINDOW_S / 60:g}-minute window (one line per seed)",
                         y=TITLE_Y)
    axes[0, 1].set_title("sessions in the system (dotted: control starts)", y=TITLE_Y)
    for ax in axes[-1]:
        ax.set_xlabel("run time (minutes)")
    fig.suptitle(f"{experiment}: per-arm time series")
    return fig


def figure_mix_shift_scatter(summary: Mapping[str, Any], colors: Mapping[str, str]) -> Figure:
    """One point per run: p90 first-turn gateway wait of first-phase sessions vs end hit ratio.

    The trade-off a session-mix shift exposes: a cap tight enough for the long sessions makes the
    short ones queue; a loose one collapses after the shift.
    """
    fig = Figure(figsize=(7.5, 5), layout="constrained")
    ax = fig.subplots()
    # hollow markers of different shapes, so arms landing on the same point stay visible
    for arm, marker in zip(table_arms(summary), itertools.cycle("osD^vPX*")):
        points = [(r["gateway_wait_p90_first_turn_s"], r["hit_ratio_last10min"]) for r in summary.get("runs", [])
                  if r["arm"] == arm and r.get("gateway_wait_p90_first_turn_s") is not None
                  and r["hit_ratio_last10min"] is not None]
        if points:
            waits_s, hit_ratios = zip(*points)
            ax.scatter(waits_s, hit_ratios, marker=marker, s=70, facecolors="none", edgecolors=colors[arm],
                       linewidths=1.6, label=arm)
    ax.set_xscale("symlog", linthresh=1.0)  # waits span 0 (no limit) to many minutes
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("first phase: p90 gateway wait before the first turn (s)")
    ax.set_ylabel("hit ratio, last 10 minutes")
    ax.axhline(DEGRADED_HIT_RATIO, color="0.4", linestyle="--", linewidth=0.8)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    ax.set_title(f"{summary.get('experiment')}: waiting now vs degrading later (one point per run)",
                 y=TITLE_Y)
    return fig


def _has_mix_shift(runs: Sequence[RunData]) -> bool:
    return any(t.get("kind") == "mix_shift" for r in runs for t in r.run_json.get("triggers") or [])


def figure_drain(summary: Mapping[str, Any], colors: Mapping[str, str]) -> Figure:
    """Drift of the cold work a collapsed run still owes, per hour, against its arrival rate after
    the drop, one point per run; the break-even rate 1/S of the cold-turn fit marked."""
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for run in summary.get("runs", []):
        drift = run.get("cold_work_drift_s_per_h")
        if drift is None:
            continue
        ax.scatter(run["rate_after_change_per_s"], drift / 3600.0, color=colors.get(run["arm"], "0.3"), s=30,
                   label=run["arm"])
    ax.axhline(0.0, color="0.6", lw=0.8)
    fit = summary.get("cold_turn_fit") or {}
    if fit.get("break_even_rate_per_s"):
        ax.axvline(fit["break_even_rate_per_s"], color="0.2", ls="--", lw=1.0,
                   label=f"1/S = {fit['break_even_rate_per_s']:.4f}/s")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=8)
    ax.set_xlabel("base arrival rate after the drop (sessions/s)")
    ax.set_ylabel("drift of owed cold work (engine-hours per hour)")
    ax.set_title(f"{summary.get('experiment')}: does the backlog drain?", fontsize=10, y=TITLE_Y)
    fig.tight_layout()
    return fig
