"""map.json and the map's text report: the numbers an operator reads off the map."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

from .analysis import (SAFE_P, boundaries, cell_table, controller_gain, escape_table, highest_safe_rate,
                       tipping_table)
from .bounds import MapBounds
from .grid import MapGrid, MapJob

MAP_VERSION = 1


def summarize_map(job: MapJob, grid: MapGrid, rows: Sequence[dict], bounds: MapBounds) -> dict:
    """Everything map.json holds, from the outcome rows (sorted: the same rows give the same file)."""
    rows = sorted(rows, key=lambda r: r["run_id"])
    cells = cell_table(rows)
    spec = job.spec
    factors = list(grid.trigger_factors)
    gains = [g for c in grid.controllers if c != "none" and "none" in grid.controllers
             for g in controller_gain(rows, cells, c)]
    summary = {
        "map_version": MAP_VERSION,
        "experiment": spec.experiment,
        "fingerprint": job.fingerprint,
        "run_duration_s": spec.duration_s,
        "burst": None if job.burst is None else {"start_s": job.burst.start_s, "duration_s": job.burst.duration_s,
                                                 "spec_extra_rate_factor": job.burst.extra_rate_factor},
        "grid": grid.to_json(),
        "num_runs": {phase: sum(r["phase"] == phase for r in rows) for phase in ("grid", "bisect", "escape")},
        "num_failed": sum(r["status"] != "completed" for r in rows),
        "bounds": bounds.to_json(),
        "cells": cells,
        "boundaries": boundaries(cells, grid.controllers, factors),
        "tipping": tipping_table(rows, grid.controllers, grid.rates_per_s, grid.seeds, spec.duration_s),
        "escape": escape_table(rows),
        "controller_gain": gains,
        "recommendation": recommendation(job, grid, cells, bounds),
    }
    summary["report"] = format_report(summary)
    return summary


def _report_factor(summary: dict) -> float:
    """The trigger the report answers for: the spec's burst if the grid has it, else the largest."""
    factors = summary["grid"]["trigger_factors"]
    burst = summary["burst"]
    if burst and round(burst["spec_extra_rate_factor"], 9) in factors:
        return round(burst["spec_extra_rate_factor"], 9)
    return max(factors)


def recommendation(job: MapJob, grid: MapGrid, cells: Sequence[dict], bounds: MapBounds) -> Optional[dict]:
    """The budgeter's budget the map tested (the spec's params, else the defaults) and the session
    cap it corresponds to for these sessions: k = floor(budget / mean session demand)."""
    if "budgeter" not in grid.controllers:
        return None
    from controllers import policy_params

    params = {**policy_params("budgeter"),
              **(job.spec.controller.params if job.spec.controller.name == "budgeter" else {})}
    C = bounds.pool_tokens
    demand = bounds.mean_context_tokens + bounds.mean_output_tokens  # d_s: context + output budget
    budget = params["admit_fraction"] * C
    safe = {f: highest_safe_rate(cells, "budgeter", f) for f in grid.trigger_factors}
    return {"controller": "budgeter", "admit_fraction": params["admit_fraction"],
            "park_fraction": params["park_fraction"], "budget_tokens": budget, "pool_tokens": C,
            "mean_session_demand_tokens": demand,
            "session_cap_k": int(math.floor(budget / demand)),
            "session_cap_k_hi": int(math.floor(params["park_fraction"] * C / demand)),
            "highest_safe_rate_by_factor": {f"{f:g}": r for f, r in safe.items()}}


def _rate(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}/s"


def _hours(value_s: Optional[float]) -> str:
    return ">" if value_s is None else f"{value_s / 3600:.3g} h"


def format_report(summary: dict) -> str:
    grid, b = summary["grid"], summary["bounds"]
    n = summary["num_runs"]
    factor = _report_factor(summary)
    lines = [
        f"metastability map of {summary['experiment']}: {len(grid['rates_per_s'])} rates x "
        f"{len(grid['trigger_factors'])} trigger factors x {len(grid['seeds'])} seeds x "
        f"{len(grid['controllers'])} controllers = {n['grid']} runs of {summary['run_duration_s'] / 60:g} min; "
        f"{n['bisect']} bisection runs; {n['escape']} escape runs"
        + (f"; {summary['num_failed']} failed" if summary["num_failed"] else ""),
        f"bounds: healthy side lambda <= {b['healthy_rate_per_s']:.4g}/s (lambda T (Z + R0) L = C: "
        f"{b['sessions_at_healthy']:.1f} sessions of {b['mean_context_tokens']:.0f} tokens, R0 = "
        f"{b['warm_response_at_healthy_s']:.2f} s); drain lambda < 1/S = {b['drain_rate_per_s']:.4g}/s "
        f"(S = {b['session_cold_cost_s']:.1f} s); warm saturation {b['saturation_rate_per_s']:.4g}/s"
        + (f"; rates and C are {b['replicas']} replicas' together, perfectly balanced (N/S for the drain)"
           if b.get("replicas", 1) > 1 else ""),
    ]
    for row in summary["boundaries"]:
        if row["trigger_factor"] not in (0.0, factor):
            continue
        lowest, p_low = min(grid["rates_per_s"]), row["p_at_lowest_rate"]

        def at(level: float, rate: Optional[float]) -> str:
            if rate is None:
                return f"not by {max(grid['rates_per_s']):g}/s"
            return f"<= {rate:g}/s" if rate == lowest and p_low is not None and p_low >= level else _rate(rate)

        lines.append(f"  simulated boundary, {row['controller']}, trigger x{row['trigger_factor']:g}: "
                     f"P(degraded) reaches 10% at {at(0.1, row['rate_p10'])}, 50% at {at(0.5, row['rate_p50'])}, "
                     f"90% at {at(0.9, row['rate_p90'])}")
    for row in summary["boundaries"]:
        if row["controller"] == grid["controllers"][0] and row["trigger_factor"] in (0.0, factor) \
                and row["rate_p50"] is not None and row["rate_p50"] > min(grid["rates_per_s"]):
            lines.append(f"  against the bounds ({row['controller']}, trigger x{row['trigger_factor']:g}): the 50% "
                         f"boundary sits at {row['rate_p50'] / b['healthy_rate_per_s']:.2f} x the healthy-side rate "
                         f"and {row['rate_p50'] / b['drain_rate_per_s']:.2f} x 1/S")
    top = max(grid["rates_per_s"])
    lines.append(f"highest rate with P(degraded) < {SAFE_P:.0%} (every grid rate up to it):")
    for f in sorted({0.0, factor}):
        label = f"trigger x{f:g}" + (" (the spec's)" if f == factor and summary["burst"] else "")
        parts = []
        for row in summary["boundaries"]:
            if row["trigger_factor"] == f:
                safe = row["highest_safe_rate"]
                note = " (the whole grid)" if safe == top else ""
                parts.append(f"{row['controller']} {_rate(safe)}{note}")
        lines.append(f"  {label}: " + ", ".join(parts))
    tips = [t for t in summary["tipping"] if t["controller"] == "none"] or summary["tipping"]
    if tips:
        lines.append(f"minimal tipping trigger ({tips[0]['controller']}, median over seeds; '>' none tips up to "
                     f"x{max(grid['trigger_factors']):g}): " + ", ".join(
                         f"{t['rate_per_s']:g}: " + (">" if t["median_min_factor"] is None else f"{t['median_min_factor']:.3g}")
                         for t in tips))
    for e in summary["escape"]:
        if e["mean_s"] is None:
            mean = f"> {_hours(e['mean_low_s'])} (95% lower limit)"
        else:
            mean = f"{_hours(e['mean_s'])} (95%: {_hours(e['mean_low_s'])} to {_hours(e['mean_high_s'])})"
        lines.append(f"escape time at {e['rate_per_s']:g}/s, no trigger: {e['num_collapsed']}/{e['num_runs']} runs "
                     f"collapsed within {e['horizon_s'] / 3600:g} h; mean time to collapse {mean}; "
                     f"Kaplan-Meier restricted mean {_hours(e['restricted_mean_s'])}")
    for ctl in grid["controllers"]:
        gains = [g for g in summary["controller_gain"] if g["controller"] == ctl]
        if not gains:
            continue
        moved = sum(g["moved_to_healthy"] for g in gains)
        thr = [g["throughput_ratio_median"] for g in gains if g["throughput_ratio_median"] is not None]
        lat = [g["latency_ratio_median"] for g in gains if g["latency_ratio_median"] is not None]
        cost = (f"; where both stay healthy, throughput x{_median(thr):.3f} and median turn latency "
                f"x{_median(lat):.2f} of none (median over cells)") if thr and lat else ""
        lines.append(f"{ctl}: moves {moved} of {len(gains)} cells from collapsed (P >= 90%) to healthy (P < 10%)"
                     f"{cost}")
    rec = summary["recommendation"]
    if rec:
        safe = rec["highest_safe_rate_by_factor"].get(f"{factor:g}")
        lines.append(
            f"recommended: budgeter with admit_fraction {rec['admit_fraction']:g} (a {rec['budget_tokens']:,.0f}-token "
            f"budget of the {rec['pool_tokens']:,}-token pool), park_fraction {rec['park_fraction']:g}; it keeps "
            f"P(degraded) < 10% up to {_rate(safe)} with trigger x{factor:g}. As a session cap for these sessions "
            f"({rec['mean_session_demand_tokens']:,.0f} tokens of demand on average): k = {rec['session_cap_k']}, "
            f"k_hi = {rec['session_cap_k_hi']} (derived, not simulated by this map)")
    return "\n".join(lines)


def _median(values: Sequence[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def write_map(out_dir: Path, summary: dict) -> Path:
    """map.json (the report's text included), atomically."""
    from ..core.recording import write_json_atomic

    path = Path(out_dir) / "map.json"
    write_json_atomic(path, summary)
    return path
