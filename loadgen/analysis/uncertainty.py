"""Paired comparisons of any two arms with uncertainty (docs/results-format.md#comparing-two-arms).

For a metric, the per-seed difference B - A over the seeds both arms ran, its median, a
percentile bootstrap 95% interval of that median (``NUM_RESAMPLES`` resamples of the seeds with
replacement, from a generator seeded with ``BOOTSTRAP_SEED``: the same numbers every time), and
the exact two-sided sign test over the seeds whose difference is not zero.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .latency import stat
from .paired import sign_test_p
from .recovery import COHORT_WINDOW_S, cohort, control_outcome, control_start_of
from .runs import RunData, json_float

NUM_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


def bootstrap_interval(values: Sequence[float], statistic: Callable[[np.ndarray], np.ndarray] | None = None,
                       num_resamples: int = NUM_RESAMPLES, seed: int = BOOTSTRAP_SEED,
                       confidence: float = CONFIDENCE) -> tuple[Optional[float], Optional[float]]:
    """Percentile bootstrap interval of ``statistic`` (default: the median) of ``values``.

    ``statistic`` takes a (num_resamples, n) array and returns one value per row. (None, None)
    without values."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) == 0:
        return None, None
    rng = np.random.Generator(np.random.PCG64(seed))
    picks = rng.integers(0, len(values), size=(num_resamples, len(values)))
    resampled = values[picks]
    stats = statistic(resampled) if statistic else np.median(resampled, axis=1)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return json_float(lo), json_float(hi)


def paired_difference(a: Mapping[int, Optional[float]], b: Mapping[int, Optional[float]],
                      num_resamples: int = NUM_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """B - A per seed (seeds where both values are defined), median, bootstrap 95% interval, sign test."""
    seeds = sorted(s for s in set(a) & set(b) if _finite(a[s]) and _finite(b[s]))
    diffs = np.array([float(b[s]) - float(a[s]) for s in seeds], dtype=np.float64)
    num_up, num_down = int((diffs > 0).sum()), int((diffs < 0).sum())
    lo, hi = bootstrap_interval(diffs, num_resamples=num_resamples, seed=seed)
    return {
        "n": len(seeds),
        "per_seed": [{"seed": s, "a": float(a[s]), "b": float(b[s]), "diff": float(d)} for s, d in zip(seeds, diffs)],
        "median_diff": json_float(np.median(diffs)) if len(diffs) else None,
        "ci95": [lo, hi],
        "num_b_higher": num_up, "num_b_lower": num_down,
        "sign_test_p": sign_test_p(num_up, num_up + num_down),
    }


def _finite(value: Any) -> bool:
    return value is not None and not (isinstance(value, bool)) and math.isfinite(float(value))


# The metrics compared by default: (name, how to read it from a summary.json runs entry, unit)
COMPARED_METRICS: list[tuple[str, Callable[[Mapping[str, Any]], Any], str]] = [
    ("hit ratio, last 10 min", lambda r: r.get("hit_ratio_last10min"), ""),
    ("turns/s, last 10 min", lambda r: r.get("turns_per_s_last10min"), "/s"),
    ("sessions in system, last 5 min", lambda r: r.get("sessions_in_system_last5min"), ""),
    ("TTFT p50", lambda r: stat(r, "ttft_s", "p50"), "s"),
    ("TTFT p90", lambda r: stat(r, "ttft_s", "p90"), "s"),
    ("TTFT p90, last 10 min", lambda r: stat(r, "ttft_s", "p90", "latency_last10min"), "s"),
    ("ITL p90", lambda r: stat(r, "itl_s", "p90"), "s"),
    ("turn latency p90", lambda r: stat(r, "turn_s", "p90"), "s"),
    ("gateway wait p90", lambda r: stat(r, "gateway_wait_s", "p90"), "s"),
    ("tasks finished", lambda r: r.get("tasks_finished"), ""),
    ("task completion p50", lambda r: r.get("task_completion_p50_min"), "min"),
    ("cohort done after control", lambda r: r.get("cohort_done_after_control"), ""),
    ("goodput turns/s (SLO)", lambda r: r.get("slo_goodput_turns_per_s"), "/s"),
    ("goodput tasks/s (SLO)", lambda r: r.get("slo_goodput_tasks_per_s"), "/s"),
]


def compare_arms(summary: Mapping[str, Any], arm_a: str, arm_b: str, num_resamples: int = NUM_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> dict:
    """Every metric of COMPARED_METRICS, paired by seed, B - A. ValueError naming a missing arm."""
    runs = summary.get("runs") or []
    arms = list(dict.fromkeys(str(r["arm"]) for r in runs))
    for arm in (arm_a, arm_b):
        if arm not in arms:
            raise ValueError(f"no completed runs of arm {arm!r}; arms with runs: {arms}")
    by_arm = {arm: {int(r["seed"]): r for r in runs if r["arm"] == arm} for arm in (arm_a, arm_b)}
    rows = []
    for name, read, unit in COMPARED_METRICS:
        a = {s: read(r) for s, r in by_arm[arm_a].items()}
        b = {s: read(r) for s, r in by_arm[arm_b].items()}
        result = paired_difference(a, b, num_resamples, seed)
        if result["n"]:
            rows.append({"metric": name, "unit": unit, **result,
                         "median_a": json_float(np.median([p["a"] for p in result["per_seed"]])),
                         "median_b": json_float(np.median([p["b"] for p in result["per_seed"]]))})
    return {"arm_a": arm_a, "arm_b": arm_b, "num_resamples": num_resamples, "bootstrap_seed": seed,
            "metrics": rows}


def _g(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.0f}"


def format_arm_comparison(comparison: Mapping[str, Any]) -> str:
    """The comparison as fixed-width text (one line per metric)."""
    a, b = comparison["arm_a"], comparison["arm_b"]
    header = ["metric", f"median {a}"[:20], f"median {b}"[:20], "median B-A", "95% interval", "B>A", "B<A", "sign p"]
    body = []
    for row in comparison["metrics"]:
        lo, hi = row["ci95"]
        name = row["metric"] + (f" ({row['unit']})" if row["unit"] else "")
        body.append([name, _g(row["median_a"]), _g(row["median_b"]), _g(row["median_diff"]),
                     f"[{_g(lo)}, {_g(hi)}]", str(row["num_b_higher"]), str(row["num_b_lower"]),
                     f"{row['sign_test_p']:.3g}"])
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]

    def join(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    n = max((row["n"] for row in comparison["metrics"]), default=0)
    lines = [f"{b} vs {a} (B = {b}, A = {a}), paired by seed, up to {n} seeds", join(header)]
    lines += [join(cells) for cells in body]
    lines.append(f"median B-A: median over seeds of the difference; 95% interval: bootstrap of that median "
                 f"({comparison['num_resamples']} resamples, seed {comparison['bootstrap_seed']}); "
                 f"sign p: exact two-sided sign test over seeds with a difference")
    return "\n".join(lines)


def recovery_intervals(runs: Sequence[RunData], rows: Sequence[dict], num_resamples: int = NUM_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> list[dict]:
    """Add bootstrap 95% intervals to summary.json `recovery` rows, resampling the arm's basis runs:
    ``recovery_time_min_ci95`` (median over its recovered runs) and ``cohort_done_ci95`` (the
    pooled share of the cohort after control finished). Returns ``rows``."""
    for row in rows:
        arm_runs = [r for r in runs if str(r.run_json["arm"]) == row["arm"]]
        outcomes = [control_outcome(r) for r in arm_runs]
        basis = [i for i, o in enumerate(outcomes) if o["collapsed_at_control"]] or list(range(len(arm_runs)))
        times = [outcomes[i]["recovery_time_min"] for i in basis if outcomes[i]["recovered"]]
        row["recovery_time_min_ci95"] = list(bootstrap_interval(times, num_resamples=num_resamples, seed=seed))
        cohorts = []
        for i in basis:
            start_s = control_start_of(arm_runs[i].run_json)
            cohorts.append(cohort(arm_runs[i].sessions, start_s, start_s + COHORT_WINDOW_S))
        sessions = np.array([c.num_sessions for c in cohorts], dtype=np.float64)
        done = np.array([c.num_completed for c in cohorts], dtype=np.float64)
        if sessions.sum() > 0:  # each resample's pooled share, as Cohort.pooled(...).done_fraction
            rng = np.random.Generator(np.random.PCG64(seed))
            picks = rng.integers(0, len(cohorts), size=(num_resamples, len(cohorts)))
            with np.errstate(divide="ignore", invalid="ignore"):
                shares = done[picks].sum(axis=1) / sessions[picks].sum(axis=1)
            shares = shares[np.isfinite(shares)]
            lo, hi = np.quantile(shares, [(1 - CONFIDENCE) / 2, 1 - (1 - CONFIDENCE) / 2])
            row["cohort_done_ci95"] = [json_float(lo), json_float(hi)]
        else:
            row["cohort_done_ci95"] = [None, None]
    return rows
