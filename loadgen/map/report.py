"""map.json and the map's text report: the numbers an operator reads off the map."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

from .analysis import (SAFE_P, boundaries, cell_table, controller_gain, escape_table, highest_safe_rate,
                       seeds_to_show_safe, tipping_table, wilson_interval)
from .budgets import BUDGETER, budget_params
from .bounds import MapBounds
from .grid import MapGrid, MapJob, split_policy

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


def report_factor(trigger_factors: Sequence[float], spec_factor: Optional[float]) -> float:
    """The trigger the report answers for: the spec's burst if the grid has it, else the largest."""
    if spec_factor is not None and round(spec_factor, 9) in trigger_factors:
        return round(spec_factor, 9)
    return max(trigger_factors)


def _report_factor(summary: dict) -> float:
    burst = summary["burst"]
    return report_factor(summary["grid"]["trigger_factors"], burst and burst["spec_extra_rate_factor"])


def recommendation(job: MapJob, grid: MapGrid, cells: Sequence[dict], bounds: MapBounds) -> Optional[dict]:
    """The budget to run, from the budgets the map tested (each ``budgeter`` controller of the
    grid: the spec's params, or the budgets ``--budgets`` searched): the one that stays safe, by
    the 95% upper bound, up to the highest rate under the report's trigger (ties: the larger
    admit fraction, which throttles least); with the session cap it corresponds to for these
    sessions, k = floor(budget / mean session demand)."""
    spec_params = job.spec.controller.params if job.spec.controller.name == BUDGETER else {}
    tried = [(c, budget_params(c, spec_params)) for c in grid.controllers]
    tried = [(c, p) for c, p in tried if p is not None]
    if not tried:
        return None
    factor = report_factor(grid.trigger_factors, job.spec_trigger_factor)
    C = bounds.pool_tokens
    demand = bounds.mean_context_tokens + bounds.mean_output_tokens  # d_s: context + output budget
    budgets = []
    for label, params in tried:
        budgets.append({
            "controller": label, "admit_fraction": params["admit_fraction"], "park_fraction": params["park_fraction"],
            "highest_safe_rate_by_factor": {f"{f:g}": highest_safe_rate(cells, label, f) for f in grid.trigger_factors},
            "highest_safe_rate_observed_by_factor": {f"{f:g}": highest_safe_rate(cells, label, f, key="p")
                                                     for f in grid.trigger_factors}})
    key = f"{factor:g}"
    shown = any(b["highest_safe_rate_by_factor"][key] is not None for b in budgets)
    # none shown safe: the best estimate is the budget whose estimates stay safe the longest
    by = "highest_safe_rate_by_factor" if shown else "highest_safe_rate_observed_by_factor"
    best = max(budgets, key=lambda b: (-1.0 if b[by][key] is None else b[by][key], b["admit_fraction"]))
    ns = [c["n"] for c in cells if c["controller"] == best["controller"] and c["trigger_factor"] == factor]
    budget = best["admit_fraction"] * C
    return {**best, "trigger_factor": factor, "shown_safe": shown,
            "budget_tokens": budget, "pool_tokens": C, "mean_session_demand_tokens": demand,
            "session_cap_k": int(math.floor(budget / demand)),
            "session_cap_k_hi": int(math.floor(best["park_fraction"] * C / demand)),
            "min_seeds_per_cell": min(ns) if ns else 0, "seeds_to_show_safe": seeds_to_show_safe(),
            "budgets_tried": budgets, "budgets_searched": any("@" in b["controller"] for b in budgets)}


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
        f"{_columns_text(grid['controllers'])} = {n['grid']} runs of {summary['run_duration_s'] / 60:g} min; "
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
    lines.append(f"highest rate shown safe: P(degraded) < {SAFE_P:.0%} by the 95% upper bound at every grid rate up to "
                 f"it ({_seeds_per_cell(summary)} seeds per cell; 0 degraded shows it from {seeds_to_show_safe()} seeds):")
    for f in sorted({0.0, factor} & set(grid["trigger_factors"])):
        label = f"trigger x{f:g}" + (" (the spec's)" if f == factor and summary["burst"] else "")
        parts = [f"{row['controller']} {_safe_text(row['highest_safe_rate'], row.get('highest_safe_rate_observed'), top)}"
                 for row in summary["boundaries"] if row["trigger_factor"] == f]
        lines.append(f"  {label}: " + "; ".join(parts))
    # the uncontrolled columns (one per router with --routers), else every column: each on its own line
    columns = [c for c in grid["controllers"] if split_policy(c)[0] == "none"] or grid["controllers"]
    for column in columns:
        tips = [t for t in summary["tipping"] if t["controller"] == column]
        if tips:
            lines.append(f"minimal tipping trigger ({column}; per rate, the seeds some burst up to "
                         f"x{max(grid['trigger_factors']):g} tips, their smallest tipping factors and the median over "
                         "all seeds, '>' unless more than half tip): " + "; ".join(_tipping_text(t) for t in tips))
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
        lines += _recommendation_lines(rec, top)
    return "\n".join(lines)


def _columns_text(columns: list[str]) -> str:
    """The map's columns as the header counts them: controllers, and routers where --routers gave them."""
    controllers = list(dict.fromkeys(split_policy(c)[0] for c in columns))
    routers = list(dict.fromkeys(r for _, r in map(split_policy, columns) if r is not None))
    text = f"{len(controllers)} controller{'s' * (len(controllers) != 1)}"
    return text + (f" x {len(routers)} router{'s' * (len(routers) != 1)}" if routers else "")


def _seeds_per_cell(summary: dict) -> str:
    ns = sorted({c["n"] for c in summary["cells"]})
    return "no" if not ns else str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"


def _safe_text(safe: Optional[float], observed: Optional[float], top: float) -> str:
    """A highest safe rate as the report says it: the top of the grid is a lower limit."""
    if safe is None:
        if observed is None:
            return "no grid rate"
        return f"no grid rate (the estimate stays under {SAFE_P:.0%} up to {_rate_edge(observed, top)})"
    return _rate_edge(safe, top)


def _rate_edge(rate: float, top: float) -> str:
    return f"at least {rate:g}/s, the top of the grid" if rate == top else f"{rate:g}/s"


def _tipping_text(t: dict) -> str:
    tipped = sorted(s["min_factor"] for s in t["seeds"] if s["min_factor"] is not None)
    text = f"{t['rate_per_s']:g}/s: {len(tipped)}/{len(t['seeds'])} tip"
    if tipped:
        text += f" at x{tipped[0]:.3g}" + (f"-x{tipped[-1]:.3g}" if tipped[-1] != tipped[0] else "")
        median = t["median_min_factor"]
        text += f", median {'>' if median is None else ''}x{_top_factor(t) if median is None else format(median, '.3g')}"
    return text


def _top_factor(t: dict) -> str:
    """The largest factor every censored seed was tried at: a censored median is above it."""
    tried = [s["max_not_tipping"] for s in t["seeds"] if s["min_factor"] is None and s["max_not_tipping"] is not None]
    return f"{min(tried):.3g}" if tried else "?"


def _recommendation_lines(rec: dict, top: float) -> list[str]:
    factor = f"{rec['trigger_factor']:g}"
    budget = (f"budgeter with admit_fraction {rec['admit_fraction']:g} (a {rec['budget_tokens']:,.0f}-token budget of "
              f"the {rec['pool_tokens']:,}-token pool), park_fraction {rec['park_fraction']:g}")
    tried = rec["budgets_tried"]
    if rec.get("budgets_searched"):
        lines = [f"budgets tried (--budgets), admit/park, and how far each is shown safe with trigger x{factor}: "
                 + "; ".join(f"{b['admit_fraction']:g}/{b['park_fraction']:g} "
                             + _safe_text(b["highest_safe_rate_by_factor"][factor],
                                          b["highest_safe_rate_observed_by_factor"][factor], top) for b in tried)]
    else:
        lines = ["budgets tried, admit/park: " + ", ".join(f"{b['admit_fraction']:g}/{b['park_fraction']:g}" for b in tried)
                 + (" (the spec's, the only one; --budgets 0.6,0.75,0.9 searches several)" if len(tried) == 1 else "")]
    if rec["shown_safe"]:
        lines.append(f"recommended: {budget}; with trigger x{factor} it keeps P(degraded) < {SAFE_P:.0%} (95% upper "
                     f"bound) up to {_rate_edge(rec['highest_safe_rate_by_factor'][factor], top)}. As a "
                     f"session cap for these sessions ({rec['mean_session_demand_tokens']:,.0f} tokens of demand on "
                     f"average): k = {rec['session_cap_k']}, k_hi = {rec['session_cap_k_hi']} (derived, not simulated "
                     "by this map)")
        return lines
    n = rec["min_seeds_per_cell"]
    observed = rec["highest_safe_rate_observed_by_factor"][factor]
    why = (f"with {n} seeds per cell, 0 degraded still leaves P(degraded) up to {wilson_interval(0, n)[1]:.0%} (95% "
           f"upper bound); {rec['seeds_to_show_safe']} seeds per cell can show P < {SAFE_P:.0%}"
           if n < rec["seeds_to_show_safe"] else "runs degraded at the lowest grid rate already")
    lines.append(f"no budget recommended: none tried is shown safe at any grid rate with trigger x{factor}: {why}"
                 + (f". Best estimate: {budget}, under {SAFE_P:.0%} up to {_rate_edge(observed, top)}"
                    if observed is not None else ""))
    return lines


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
