"""What the map's outcome rows say: probabilities with intervals, boundaries, escape times,
minimal tipping triggers and what a controller buys. Pure functions of the rows."""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np

from .bisect import degraded_by_factor, tipping_bracket

Z_95 = 1.959963984540054  # two-sided 95% normal quantile
SAFE_P = 0.1
COLLAPSED_P = 0.9


def wilson_interval(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion k/n (95% by default); (0, 1) with n = 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # exact at the ends: with k = 0 the lower limit is 0, with k = n the upper one is 1
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def cell_table(rows: Iterable[dict]) -> list[dict]:
    """P(persistently degraded) per (controller, rate, trigger factor) over the grid's seeds."""
    cells: dict[tuple, list[bool]] = {}
    for r in rows:
        if r["phase"] == "grid" and r["status"] == "completed":
            cells.setdefault((r["controller"], r["rate_per_s"], r["trigger_factor"]), []).append(
                bool(r["persistently_degraded"]))
    out = []
    for (controller, rate, factor), flags in sorted(cells.items()):
        k, n = sum(flags), len(flags)
        lo, hi = wilson_interval(k, n)
        out.append({"controller": controller, "rate_per_s": rate, "trigger_factor": factor, "n": n,
                    "num_degraded": k, "p": k / n, "p_low": lo, "p_high": hi})
    return out


def _p_by_rate(cells: Sequence[dict], controller: str, factor: float, key: str = "p") -> list[tuple[float, float]]:
    return sorted((c["rate_per_s"], c[key]) for c in cells
                  if c["controller"] == controller and c["trigger_factor"] == factor)


def highest_safe_rate(cells: Sequence[dict], controller: str, factor: float, threshold: float = SAFE_P,
                      key: str = "p_high") -> Optional[float]:
    """The highest grid rate up to which every rate keeps P(degraded) under ``threshold``
    (None: not even the lowest rate does). By the 95% Wilson upper bound (``key="p_high"``): a
    cell is safe only when its interval says so, so 0 of 4 degraded (upper bound 0.49) is not;
    ``key="p"`` judges the point estimates."""
    safe = None
    for rate, p in _p_by_rate(cells, controller, factor, key):
        if p >= threshold:
            break
        safe = rate
    return safe


def seeds_to_show_safe(threshold: float = SAFE_P, z: float = Z_95) -> int:
    """The fewest runs per cell with which 0 degraded puts the Wilson upper bound under
    ``threshold``: z^2 / (n + z^2) < threshold."""
    return int(math.floor(z * z * (1 - threshold) / threshold)) + 1


def crossing_rate(cells: Sequence[dict], controller: str, factor: float, level: float) -> Optional[float]:
    """The rate at which P(degraded) first reaches ``level``, linearly interpolated between grid
    rates; None when it never does (or already does at the lowest rate: then that rate)."""
    points = _p_by_rate(cells, controller, factor)
    for i, (rate, p) in enumerate(points):
        if p >= level:
            if i == 0:
                return rate
            r0, p0 = points[i - 1]
            return r0 + (level - p0) / (p - p0) * (rate - r0)
    return None


def boundaries(cells: Sequence[dict], controllers: Sequence[str], factors: Sequence[float]) -> list[dict]:
    """Per controller and factor: where P(degraded) reaches 10%, 50% and 90% (a crossing at the
    lowest grid rate means at or below it: ``p_at_lowest_rate`` tells), the highest safe rate by
    the intervals' upper bounds (``highest_safe_rate``) and by the estimates (``_observed``)."""
    return [{"controller": c, "trigger_factor": f,
             "p_at_lowest_rate": (_p_by_rate(cells, c, f) or [(None, None)])[0][1],
             "rate_p10": crossing_rate(cells, c, f, SAFE_P),
             "rate_p50": crossing_rate(cells, c, f, 0.5), "rate_p90": crossing_rate(cells, c, f, COLLAPSED_P),
             "highest_safe_rate": highest_safe_rate(cells, c, f),
             "highest_safe_rate_observed": highest_safe_rate(cells, c, f, key="p")}
            for c in controllers for f in factors]


# ---------------------------------------------------------------- escape time
def kaplan_meier(times: Sequence[float], events: Sequence[bool]) -> list[dict]:
    """The Kaplan-Meier survival curve: one row per distinct event time, with the number at risk,
    the events, S(t) just after t and Greenwood's standard error. Censored at a time means still
    at risk at that time (censoring is applied after the events at the same time)."""
    data = sorted(zip(times, events))
    at_risk = len(data)
    survival, greenwood = 1.0, 0.0
    out = []
    i = 0
    while i < len(data):
        t = data[i][0]
        num_events = num_censored = 0
        while i < len(data) and data[i][0] == t:
            num_events += bool(data[i][1])
            num_censored += not data[i][1]
            i += 1
        if num_events:
            survival *= 1 - num_events / at_risk
            if at_risk > num_events:
                greenwood += num_events / (at_risk * (at_risk - num_events))
            out.append({"t_s": t, "at_risk": at_risk, "events": num_events, "survival": survival,
                        "se": survival * math.sqrt(greenwood) if at_risk > num_events else 0.0})
        at_risk -= num_events + num_censored
    return out


def _poisson_cdf(k: int, mu: float) -> float:
    if mu <= 0:
        return 1.0
    return sum(math.exp(i * math.log(mu) - mu - math.lgamma(i + 1)) for i in range(k + 1))


def poisson_mean_interval(k: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Garwood) interval of a Poisson mean from k observed events, by bisection."""
    def solve(target, f):  # f increasing in mu from below target to above it
        lo, hi = 0.0, max(10.0, 4.0 * (k + 1) + 20)
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return (lo + hi) / 2
    lower = 0.0 if k == 0 else solve(alpha / 2, lambda mu: 1 - _poisson_cdf(k - 1, mu))
    upper = solve(1 - alpha / 2, lambda mu: 1 - _poisson_cdf(k, mu))
    return lower, upper


def mean_time_to_collapse(times: Sequence[float], events: Sequence[bool]) -> dict:
    """Escape from a metastable state is memoryless, so with exponential times the mean's
    estimate is exposure / events (censored runs add their exposure, not an event), with the
    exact Poisson interval on the event count; no events: only a lower limit."""
    exposure_s = float(sum(times))
    k = int(sum(bool(e) for e in events))
    lo_mu, hi_mu = poisson_mean_interval(k)
    return {"num_runs": len(times), "num_collapsed": k, "exposure_s": exposure_s,
            "mean_s": exposure_s / k if k else None,
            "mean_low_s": exposure_s / hi_mu, "mean_high_s": exposure_s / lo_mu if lo_mu > 0 else None}


def restricted_mean_s(curve: Sequence[dict], horizon_s: float) -> float:
    """Area under the Kaplan-Meier curve up to the horizon: mean time to collapse, capped there."""
    area, t_prev, s_prev = 0.0, 0.0, 1.0
    for row in curve:
        if row["t_s"] > horizon_s:
            break
        area += s_prev * (row["t_s"] - t_prev)
        t_prev, s_prev = row["t_s"], row["survival"]
    return area + s_prev * (horizon_s - t_prev)


def escape_table(rows: Iterable[dict]) -> list[dict]:
    by_rate: dict[float, list[dict]] = {}
    for r in rows:
        if r["phase"] == "escape" and r["status"] == "completed":
            by_rate.setdefault(r["rate_per_s"], []).append(r)
    out = []
    for rate, runs in sorted(by_rate.items()):
        horizon_s = max(r["duration_s"] for r in runs)
        times = [r["collapse_s"] if r["persistently_degraded"] and r["collapse_s"] is not None else r["duration_s"]
                 for r in runs]
        events = [bool(r["persistently_degraded"]) and r["collapse_s"] is not None for r in runs]
        curve = kaplan_meier(times, events)
        out.append({"rate_per_s": rate, "horizon_s": horizon_s, **mean_time_to_collapse(times, events),
                    "restricted_mean_s": restricted_mean_s(curve, horizon_s), "kaplan_meier": curve})
    return out


# ---------------------------------------------------------------- minimal tipping trigger
def tipping_table(rows: Iterable[dict], controllers: Sequence[str], rates: Sequence[float],
                  seeds: Sequence[int], duration_s: float) -> list[dict]:
    """Per (controller, rate): each seed's smallest factor seen to tip its run (bisection's upper
    end), None where no factor tried tips (censored above the largest), and their median
    (censored seeds count as above every factor)."""
    rows = list(rows)
    out = []
    for controller in controllers:
        for rate in rates:
            per_seed = []
            for seed in seeds:
                outcomes = degraded_by_factor(rows, controller, rate, seed, duration_s)
                if not outcomes:
                    continue
                lo, hi = tipping_bracket(outcomes)
                per_seed.append({"seed": seed, "min_factor": hi, "max_not_tipping": lo})
            values = sorted(math.inf if s["min_factor"] is None else s["min_factor"] for s in per_seed)
            median = float(np.median(values)) if values else None
            out.append({"controller": controller, "rate_per_s": rate,
                        "median_min_factor": None if median is None or math.isinf(median) else median,
                        "num_censored": sum(s["min_factor"] is None for s in per_seed), "seeds": per_seed})
    return out


# ---------------------------------------------------------------- what a controller buys
def controller_gain(rows: Iterable[dict], cells: Sequence[dict], controller: str, baseline: str = "none"
                    ) -> list[dict]:
    """Per grid cell: P(degraded) without and with the controller, and, over the seeds where both
    runs stayed healthy, the median ratio controller / baseline of turn throughput after the
    trigger and of median turn latency (its cost when there is nothing to cure)."""
    grid = [r for r in rows if r["phase"] == "grid" and r["status"] == "completed"]
    index = {(r["controller"], r["rate_per_s"], r["trigger_factor"], r["seed"]): r for r in grid}
    p = {(c["controller"], c["rate_per_s"], c["trigger_factor"]): c["p"] for c in cells}
    out = []
    for (ctl, rate, factor), p_ctl in sorted(p.items()):
        if ctl != controller or (baseline, rate, factor) not in p:
            continue
        throughput, latency = [], []
        for (c, r, f, seed), row in index.items():
            if (c, r, f) != (controller, rate, factor):
                continue
            base = index.get((baseline, rate, factor, seed))
            if base is None or row["persistently_degraded"] or base["persistently_degraded"]:
                continue
            if base["turns_per_s_after_trigger"]:
                throughput.append(row["turns_per_s_after_trigger"] / base["turns_per_s_after_trigger"])
            if base["turn_latency_p50_s"] and row["turn_latency_p50_s"] is not None:
                latency.append(row["turn_latency_p50_s"] / base["turn_latency_p50_s"])
        p_base = p[(baseline, rate, factor)]
        out.append({"controller": controller, "rate_per_s": rate, "trigger_factor": factor, "p_baseline": p_base,
                    "p_controller": p_ctl, "moved": p_base - p_ctl,
                    "moved_to_healthy": p_base >= COLLAPSED_P and p_ctl < SAFE_P,
                    "num_healthy_pairs": len(throughput),
                    "throughput_ratio_median": float(np.median(throughput)) if throughput else None,
                    "latency_ratio_median": float(np.median(latency)) if latency else None})
    return out
