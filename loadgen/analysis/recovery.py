"""Control outcomes: collapse when control starts, recovery time, cohorts, gateway waits (docs/experiments.md#measurements)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa

from .runs import RunData, float_column, json_float
from .windows import (DEGRADED_HIT_RATIO, EPS_S, LAST_HIT_WINDOW_S, hit_ratio_between, count_windows,
                      window_hit_ratios)

COLLAPSE_WINDOW_S = 300.0
RECOVERED_HIT_RATIO = 0.8
RECOVERY_WINDOW_S = 300.0
RECOVERY_STEP_S = 60.0
RECOVERY_FOLLOW_UP_S = 600.0
COHORT_WINDOW_S = 1200.0


def collapsed_at(turns: pa.Table, at_s: float, window_s: float = COLLAPSE_WINDOW_S,
                 threshold: float = DEGRADED_HIT_RATIO) -> bool:
    """Whether the run was degraded at ``at_s``: hit ratio < threshold over the window_s before it.

    A window with no finished turn counts as degraded (as in persistently_degraded); at time 0
    there is nothing before, so nothing has collapsed.
    """
    if at_s <= 0:
        return False
    start_s = max(0.0, at_s - window_s)
    ratio = window_hit_ratios(turns, np.array([start_s]), at_s - start_s, math.inf)[0]
    return not ratio >= threshold

def recovery_time_s(turns: pa.Table, control_start_s: float, duration_s: float,
                    threshold: float = RECOVERED_HIT_RATIO, window_s: float = RECOVERY_WINDOW_S,
                    step_s: float = RECOVERY_STEP_S, follow_up_s: float = RECOVERY_FOLLOW_UP_S) -> Optional[float]:
    """docs/experiments.md#measurements: from control start to the start of the first window_s window (slid by
    step_s from control start) from which every later window has hit ratio >= threshold.

    Windows end by the run's end; an empty window is not recovered. The recovered stretch must
    be observed for at least ``follow_up_s`` (window start + follow_up_s <= duration_s), else the
    run has not (yet) recovered: None.
    """
    span_s = duration_s - control_start_s
    if span_s < window_s - EPS_S:
        return None
    num_windows = int(math.floor((span_s - window_s) / step_s + EPS_S)) + 1
    starts_s = control_start_s + step_s * np.arange(num_windows, dtype=np.float64)
    good = window_hit_ratios(turns, starts_s, window_s, duration_s) >= threshold
    if not good[-1]:
        return None
    bad = np.flatnonzero(~good)
    first_good = int(bad[-1]) + 1 if bad.size else 0
    if starts_s[first_good] + follow_up_s > duration_s + EPS_S:
        return None
    return float(starts_s[first_good] - control_start_s)


@dataclass
class Cohort:
    """The sessions arriving in a window: how many, how many finished by the run's end, and when."""

    num_sessions: int
    num_completed: int
    arrival_to_completion_s: np.ndarray  # inf for a session not finished by the run's end

    @property
    def done_fraction(self) -> float:
        return self.num_completed / self.num_sessions if self.num_sessions else math.nan

    @staticmethod
    def pooled(cohorts: Iterable["Cohort"]) -> "Cohort":
        cohorts = list(cohorts)
        times = [c.arrival_to_completion_s for c in cohorts]
        return Cohort(sum(c.num_sessions for c in cohorts), sum(c.num_completed for c in cohorts),
                      np.concatenate(times) if times else np.zeros(0))

def cohort(sessions: pa.Table, start_s: float, end_s: float) -> Cohort:
    """Sessions (sessions.parquet rows) arriving in [start_s, end_s)."""
    arrival_s = float_column(sessions, "arrival_s")
    finish_s = float_column(sessions, "finish_s")
    completed = np.array([status == "completed" for status in sessions.column("status").to_pylist()], dtype=bool)
    in_cohort = (arrival_s >= start_s) & (arrival_s < end_s)
    times_s = np.where(completed, finish_s - arrival_s, math.inf)[in_cohort]
    return Cohort(int(in_cohort.sum()), int((completed & in_cohort).sum()), times_s)

def quantile_nearest_rank(values: np.ndarray, q: float) -> float:
    """The nearest-rank q-quantile (the ceil(q n)-th smallest): no interpolation, so it stays
    well defined with infinite values (unfinished sessions). NaN for no values."""
    if len(values) == 0:
        return math.nan
    rank = min(len(values), max(1, math.ceil(q * len(values) - 1e-12)))
    return float(np.sort(values)[rank - 1])

def first_phase_end_s(run_json: Mapping[str, Any]) -> float:
    """The end of a run's first phase: its first session-mix shift, else the run's end."""
    shifts = [float(t["start_s"]) for t in run_json.get("triggers") or []
              if t.get("kind") == "mix_shift" and t.get("start_s") is not None]
    return min(shifts) if shifts else float(run_json["duration_s"])

def first_turn_gateway_waits_s(sessions: pa.Table, arrived_before_s: float, duration_s: float) -> np.ndarray:
    """Gateway wait before the first turn of each session arriving before ``arrived_before_s``.

    A session the gateway never admitted counts with what it had waited by the run's end
    (a lower bound): leaving it out would flatter exactly the limits that hold sessions longest.
    """
    arrival_s = float_column(sessions, "arrival_s")
    admit_s = float_column(sessions, "first_admit_s")
    waits_s = np.where(np.isfinite(admit_s), admit_s - arrival_s, duration_s - arrival_s)
    return waits_s[arrival_s < arrived_before_s]

def control_start_of(run_json: Mapping[str, Any]) -> float:
    return float(run_json.get("control_start_s") or 0.0)

def _cohort_after_control(run: RunData) -> Cohort:
    start_s = control_start_of(run.run_json)
    return cohort(run.sessions, start_s, start_s + COHORT_WINDOW_S)

def _minutes_or_none(seconds: float) -> Optional[float]:
    return json_float(seconds / 60.0)

def control_outcome(run: RunData) -> dict:
    """The per-run control fields of a summary.json `runs` entry (None where undefined)."""
    info = run.run_json
    duration_s = float(info["duration_s"])
    control_start_s = control_start_of(info)
    recovery_s = recovery_time_s(run.turns, control_start_s, duration_s)
    after_control = _cohort_after_control(run)
    waits_s = first_turn_gateway_waits_s(run.sessions, first_phase_end_s(info), duration_s)
    return {
        "controller": str(info.get("controller") or "none"),
        "control_start_s": control_start_s,
        "collapsed_at_control": collapsed_at(run.turns, control_start_s),
        "recovered": recovery_s is not None,
        "recovery_time_min": None if recovery_s is None else recovery_s / 60.0,
        "cohort_sessions_after_control": after_control.num_sessions,
        "cohort_done_after_control": json_float(after_control.done_fraction),
        "cohort_completion_median_min": _minutes_or_none(
            quantile_nearest_rank(after_control.arrival_to_completion_s, 0.5)),
        "cohort_completion_p90_min": _minutes_or_none(
            quantile_nearest_rank(after_control.arrival_to_completion_s, 0.9)),
        "gateway_wait_p90_first_turn_s": json_float(quantile_nearest_rank(waits_s, 0.9)),
    }

def cohort_completion_by_arrival(runs: Sequence[RunData], width_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Pooled over ``runs``: for arrival windows [k width_s, (k+1) width_s) up to the longest run,
    the window starts and the fraction of their sessions finished by the run's end (NaN if none)."""
    duration_s = max((float(r.run_json["duration_s"]) for r in runs), default=0.0)
    starts_s = width_s * np.arange(count_windows(0.0, duration_s, width_s), dtype=np.float64)
    fractions = np.array([Cohort.pooled(cohort(r.sessions, s, s + width_s) for r in runs).done_fraction
                          for s in starts_s])
    return starts_s, fractions

def has_control(run_jsons: Sequence[Mapping[str, Any]]) -> bool:
    return any((r.get("controller") or "none") != "none" or control_start_of(r) > 0 for r in run_jsons)

def _end_hit_ratio(run: RunData) -> float:
    duration_s = float(run.run_json["duration_s"])
    return hit_ratio_between(run.turns, max(0.0, duration_s - LAST_HIT_WINDOW_S), duration_s)

def recovery_table(runs: Sequence[RunData], arms: Sequence[str]) -> list[dict]:
    """One row per arm for summary.json's `recovery`.

    Outcomes are over the arm's runs that had collapsed when control started (``basis``
    "collapsed"), the population the recovery question is about; over all its runs when none
    had ("all"). Recovery time: median and max over its recovered runs; end hit ratio: mean;
    cohort completion and arrival-to-completion quantiles: pooled over the runs' sessions.
    """
    rows = []
    for arm in arms:
        arm_runs = [r for r in runs if str(r.run_json["arm"]) == arm]
        outcomes = [control_outcome(r) for r in arm_runs]
        collapsed = [i for i, o in enumerate(outcomes) if o["collapsed_at_control"]]
        basis = collapsed or list(range(len(arm_runs)))
        times_min = [outcomes[i]["recovery_time_min"] for i in basis if outcomes[i]["recovered"]]
        hit_ratios = [h for h in (_end_hit_ratio(arm_runs[i]) for i in basis) if math.isfinite(h)]
        pooled = Cohort.pooled(_cohort_after_control(arm_runs[i]) for i in basis)
        rows.append({
            "arm": arm,
            "controller": outcomes[0]["controller"],  # every arm listed has a run
            "control_start_s": outcomes[0]["control_start_s"],
            "num_runs": len(arm_runs),
            "num_collapsed": len(collapsed),
            "basis": "collapsed" if collapsed else "all",
            "num_basis": len(basis),
            "num_recovered": len(times_min),
            "recovery_time_min_median": float(np.median(times_min)) if times_min else None,
            "recovery_time_min_max": max(times_min) if times_min else None,
            "hit_ratio_last10min_mean": float(np.mean(hit_ratios)) if hit_ratios else None,
            "cohort_sessions": pooled.num_sessions,
            "cohort_done": json_float(pooled.done_fraction),
            "cohort_completion_median_min": _minutes_or_none(
                quantile_nearest_rank(pooled.arrival_to_completion_s, 0.5)),
            "cohort_completion_p90_min": _minutes_or_none(
                quantile_nearest_rank(pooled.arrival_to_completion_s, 0.9)),
        })
    return rows
