"""The map's figures: phase diagram with the bounds, escape time, minimal tipping trigger and
what each controller buys. Reads map.json's numbers only; matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # headless: must precede the pyplot import

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ..analysis.figures import set_log_scale  # noqa: E402

DPI = 110
HEALTHY_BOUND_STYLE = {"color": "tab:green", "linestyle": "--", "linewidth": 1.6}
DRAIN_BOUND_STYLE = {"color": "tab:purple", "linestyle": ":", "linewidth": 1.8}


def _short(value: float) -> str:
    """0.26 as .26, 1 as 1: an interval's ends fit under the estimate in a narrow cell."""
    return "1" if value >= 0.995 else "0" if value < 0.005 else f"{value:.2f}".lstrip("0")


def _matrix(cells: Sequence[dict], controller: str, rates: Sequence[float], factors: Sequence[float],
            key: str) -> np.ndarray:
    m = np.full((len(factors), len(rates)), np.nan)
    ri = {r: i for i, r in enumerate(rates)}
    fi = {f: i for i, f in enumerate(factors)}
    for c in cells:
        if c["controller"] == controller and c["rate_per_s"] in ri and c["trigger_factor"] in fi:
            value = c.get(key)
            m[fi[c["trigger_factor"]], ri[c["rate_per_s"]]] = np.nan if value is None else value
    return m


def level_edges(p: np.ndarray, level: float) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """The cell edges between a cell with P >= ``level`` and a neighbour below it, in cell-index
    coordinates (cell (i, j) spans j-0.5..j+0.5, i-0.5..i+0.5): a boundary that follows the
    cells the map measured instead of a contour interpolated through them."""
    above = np.where(np.isfinite(p), p >= level, np.nan)
    segments = []
    rows, cols = p.shape
    for i in range(rows):
        for j in range(cols):
            if j + 1 < cols and np.isfinite(above[i, j]) and np.isfinite(above[i, j + 1]) \
                    and above[i, j] != above[i, j + 1]:
                segments.append(((j + 0.5, i - 0.5), (j + 0.5, i + 0.5)))
            if i + 1 < rows and np.isfinite(above[i, j]) and np.isfinite(above[i + 1, j]) \
                    and above[i, j] != above[i + 1, j]:
                segments.append(((j - 0.5, i + 0.5), (j + 0.5, i + 0.5)))
    return segments


def _rate_axis(rates: Sequence[float]):
    """Rate -> the cell-index x coordinate (piecewise linear between grid rates, linear beyond
    with the end spacing), so the analytic bounds land where they fall between the cells."""
    r = np.asarray(rates, dtype=float)
    step_lo = r[1] - r[0] if r.size > 1 else max(abs(r[0]), 1e-3)
    step_hi = r[-1] - r[-2] if r.size > 1 else step_lo

    def x(rate: float) -> float:
        if rate <= r[0]:
            return (rate - r[0]) / step_lo
        if rate >= r[-1]:
            return r.size - 1 + (rate - r[-1]) / step_hi
        return float(np.interp(rate, r, np.arange(r.size)))

    return x


def _label_cells(ax, rates: Sequence[float], factors: Sequence[float]) -> None:
    """Ticks at the cells, labelled with the grid's values (every few rates on a long grid)."""
    step = max(1, len(rates) // 12)
    ax.set_xticks(range(0, len(rates), step), [f"{r:g}" for r in rates[::step]], rotation=45, fontsize=7)
    ax.set_yticks(range(len(factors)), [f"x{f:g}" for f in factors])


def phase_diagram_figure(summary: dict):
    """The phase diagram: one panel per controller, a cell per (rate, trigger factor) of the
    grid on evenly spaced rows and columns labelled with their values (a sparse trigger grid
    stays a row per factor, not a stretched axis), the 10% and 90% boundaries along cell edges
    and the analytic bounds. Returns the figure."""
    grid, bounds = summary["grid"], summary["bounds"]
    rates, factors, controllers = grid["rates_per_s"], grid["trigger_factors"], grid["controllers"]
    to_x = _rate_axis(rates)
    fig, axes = plt.subplots(1, len(controllers), figsize=(max(6.5, 0.45 * len(rates) + 1.5) * len(controllers), 6.5),
                             squeeze=False, layout="constrained", sharey=True)
    xe, ye = np.arange(len(rates) + 1) - 0.5, np.arange(len(factors) + 1) - 0.5
    mesh = None
    for ax, ctl in zip(axes[0], controllers):
        p = _matrix(summary["cells"], ctl, rates, factors, "p")
        lo = _matrix(summary["cells"], ctl, rates, factors, "p_low")
        hi = _matrix(summary["cells"], ctl, rates, factors, "p_high")
        mesh = ax.pcolormesh(xe, ye, p, cmap="RdYlGn_r", vmin=0, vmax=1, shading="flat")
        for level, color in ((0.1, "white"), (0.9, "black")):
            for (x0, y0), (x1, y1) in level_edges(p, level):
                ax.plot([x0, x1], [y0, y1], color=color, linewidth=2.0, solid_capstyle="butt")
        size = 4.5 if len(rates) > 10 else 7
        for i in range(len(factors)):
            for j in range(len(rates)):
                if np.isfinite(p[i, j]):
                    ax.text(j, i, f"{p[i, j]:.2f}\n{_short(lo[i, j])}-{_short(hi[i, j])}", ha="center",
                            va="center", fontsize=size, color="black", linespacing=1.0)
        for rate, style, label in (
                (bounds["healthy_rate_per_s"], HEALTHY_BOUND_STYLE,
                 f"healthy side: lambda T (Z+R0) L = C ({bounds['healthy_rate_per_s']:.4f}/s)"),
                (bounds["drain_rate_per_s"], DRAIN_BOUND_STYLE, f"drain: lambda = 1/S ({bounds['drain_rate_per_s']:.4f}/s)")):
            x = to_x(rate)
            # a bound far off the grid is named at the edge it lies beyond, not drawn there
            if -0.5 <= x <= len(rates) - 0.5:
                ax.axvline(x, **style, label=label)
            else:
                ax.plot([], [], **style, label=label + (" (left of the grid)" if x < 0 else " (right of the grid)"))
        ax.set_xlim(xe[0], xe[-1])
        ax.set_ylim(ye[0], ye[-1])
        _label_cells(ax, rates, factors)
        ax.set_title(f"controller: {ctl}")
        ax.set_xlabel("base arrival rate lambda (sessions/s)")
    axes[0][0].set_ylabel("trigger: burst extra rate factor (x0 = none)")
    axes[0][0].legend(loc="upper right", fontsize=7, framealpha=0.85)
    if mesh is not None:
        fig.colorbar(mesh, ax=axes[0].tolist(), label="P(persistently degraded), cell: P and 95% Wilson interval")
    fig.suptitle(f"{summary['experiment']}: metastability map ({len(grid['seeds'])} seeds per cell; along cell edges, "
                 "white: P reaches 10%, black: 90%)")
    return fig


def figure_phase_diagram(summary: dict, path: Path) -> Path:
    fig = phase_diagram_figure(summary)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def figure_escape(summary: dict, path: Path) -> Path:
    escape = summary["escape"]
    fig, (ax_km, ax_mean) = plt.subplots(1, 2, figsize=(12, 4.5))
    for e in escape:
        t = [0.0] + [row["t_s"] / 3600 for row in e["kaplan_meier"]] + [e["horizon_s"] / 3600]
        s = [1.0] + [row["survival"] for row in e["kaplan_meier"]]
        s.append(s[-1])
        ax_km.step(t, s, where="post", label=f"{e['rate_per_s']:g}/s ({e['num_collapsed']}/{e['num_runs']} collapsed)")
    ax_km.set_xlabel("hours since start (no trigger)")
    ax_km.set_ylabel("P(still healthy): Kaplan-Meier")
    ax_km.set_ylim(-0.02, 1.02)
    ax_km.legend(fontsize=7)
    rates = [e["rate_per_s"] for e in escape]
    for e in escape:
        lo = e["mean_low_s"] / 3600
        if e["mean_s"] is None:  # no collapse: only a lower limit
            ax_mean.plot([e["rate_per_s"]], [lo], marker="^", color="tab:blue")
            continue
        mean = e["mean_s"] / 3600
        hi = e["mean_high_s"] / 3600 if e["mean_high_s"] is not None else mean * 10
        ax_mean.errorbar([e["rate_per_s"]], [mean], yerr=[[mean - lo], [hi - mean]], marker="o", color="tab:blue",
                         capsize=3)
    ax_mean.plot(rates, [e["restricted_mean_s"] / 3600 for e in escape], "s--", color="tab:orange",
                 label="restricted mean (area under KM to the horizon)")
    set_log_scale(ax_mean)
    ax_mean.set_xlabel("base arrival rate lambda (sessions/s)")
    ax_mean.set_ylabel("mean time to collapse (h)")
    ax_mean.set_title("exposure / collapses, exact 95% interval (triangle: none collapsed, lower limit)", fontsize=8)
    ax_mean.legend(fontsize=7)
    fig.suptitle(f"{summary['experiment']}: escape time from the healthy regime")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def figure_tipping(summary: dict, path: Path) -> Path:
    grid = summary["grid"]
    top = max(grid["trigger_factors"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for k, ctl in enumerate(grid["controllers"]):
        rows = [t for t in summary["tipping"] if t["controller"] == ctl]
        color = f"C{k}"
        for t in rows:
            values = [s["min_factor"] for s in t["seeds"]]
            xs = t["rate_per_s"] + (np.arange(len(values)) - len(values) / 2) * 0.00004
            ax.scatter(xs, [top * 1.08 if v is None else v for v in values], s=6, alpha=0.4, color=color,
                       marker=".", label=f"{ctl}: per seed" if t is rows[0] else None)
        med = [(t["rate_per_s"], t["median_min_factor"]) for t in rows if t["median_min_factor"] is not None]
        if med:
            ax.plot(*zip(*med), "o-", color=color, label=f"{ctl}: median over seeds")
    ax.axhline(top * 1.08, color="grey", linewidth=0.5)
    ax.text(ax.get_xlim()[0], top * 1.1, f"no factor up to x{top:g} tips", fontsize=7, color="grey")
    ax.set_xlabel("base arrival rate lambda (sessions/s)")
    ax.set_ylabel("smallest burst factor that tips the run")
    ax.legend(fontsize=8)
    ax.set_title(f"{summary['experiment']}: minimal tipping trigger (per-seed bisection)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def figure_controller(summary: dict, controller: str, path: Path) -> Path:
    grid = summary["grid"]
    rates, factors = grid["rates_per_s"], grid["trigger_factors"]
    gains = [g for g in summary["controller_gain"] if g["controller"] == controller]
    xe, ye = np.arange(len(rates) + 1) - 0.5, np.arange(len(factors) + 1) - 0.5  # a cell per grid value
    fig, axes = plt.subplots(1, 3, figsize=(18, 4.8), sharey=True)
    panels = [("moved", "P(degraded): none minus controller", "RdBu", (-1, 1)),
              ("throughput_ratio_median", "turn throughput, controller / none (both healthy)", "PuOr", (0.8, 1.2)),
              ("latency_ratio_median", "median turn latency, controller / none (both healthy)", "PuOr_r", (0.5, 1.5))]
    for ax, (key, title, cmap, (vmin, vmax)) in zip(axes, panels):
        m = _matrix(gains, controller, rates, factors, key)
        mesh = ax.pcolormesh(xe, ye, m, cmap=cmap, vmin=vmin, vmax=vmax, shading="flat")
        for i, f in enumerate(factors):
            for j, r in enumerate(rates):
                if np.isfinite(m[i, j]):
                    ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=5 if len(rates) > 10 else 7)
        _label_cells(ax, rates, factors)
        fig.colorbar(mesh, ax=ax)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("base arrival rate lambda (sessions/s)")
    axes[0].set_ylabel("trigger: burst extra rate factor")
    fig.suptitle(f"{summary['experiment']}: what {controller} buys (from the start of each run)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def write_map_figures(summary: dict, out_dir: Path) -> list[Path]:
    fig_dir = Path(out_dir) / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    paths = [figure_phase_diagram(summary, fig_dir / "phase-diagram.png"),
             figure_tipping(summary, fig_dir / "tipping-trigger.png")]
    if summary["escape"]:
        paths.append(figure_escape(summary, fig_dir / "escape-time.png"))
    for ctl in summary["grid"]["controllers"]:
        if any(g["controller"] == ctl for g in summary["controller_gain"]):
            paths.append(figure_controller(summary, ctl, fig_dir / f"controller-{ctl}.png"))
    return paths
