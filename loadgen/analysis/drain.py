"""The drain condition: what a cold turn costs, what a session costs cold, and whether a server
whose cache has collapsed works its backlog off once arrivals slow down.

* Cold-turn cost. In runs with prefix caching off every turn recomputes its whole context, so
  in a window where the engine is busy (at least ``MIN_RUNNING`` requests running in every
  sample of it) the window's length is spent on the turns completing in it:
  ``window_s ~ intercept_s x turns + slope_s_per_token x sum of their prompt tokens``. A least
  squares fit over such windows gives the marginal cost of one cold turn of context L,
  ``c(L) = intercept_s + slope_s_per_token x L`` (docs/experiments.md compares it with the
  lines measured on the real engine).
* Session cold work S: the sum of c(L) over a session's turns (the synthetic shape in the
  spec), and the break-even rate 1/S: above it, cold sessions arrive faster than the engine can
  serve them, so a collapsed server cannot drain.
* Drift: for a run whose base rate changes (a ``rate_change`` trigger) while it is collapsed, the
  cold work still owed to the sessions in the system, sum of c(L) over their remaining turns, is
  estimated every ``DRIFT_STEP_S`` from the change to the run's end; its least-squares slope per
  hour is ``cold_work_drift_s_per_h`` (negative: the backlog drains).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ..core.arrow_numpy import int_values
from .runs import RunData, float_column, json_float, success_mask, successful_turns
from .windows import DEGRADED_HIT_RATIO, DEGRADED_WINDOW_S, hit_ratio_between

FIT_WINDOW_S = 60.0
MIN_RUNNING = 4
DRIFT_STEP_S = 600.0

__all__ = ["cold_turn_fit", "drain_fields", "session_contexts", "FIT_WINDOW_S", "MIN_RUNNING", "DRIFT_STEP_S"]


def _engine_spec(run_json: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run's simulated-engine fields (the experiment's, with its arm's overrides)."""
    spec = run_json.get("spec") or {}
    engine = dict(spec.get("engine") or {})
    for arm in spec.get("arms") or ():
        if isinstance(arm, Mapping) and arm.get("name") == run_json.get("arm") and arm.get("engine"):
            engine.update(arm["engine"])
    return engine


def caching_off(run: RunData) -> bool:
    engine = _engine_spec(run.run_json)
    return engine.get("kind", "sim") == "sim" and engine.get("enable_prefix_caching") is False


def session_contexts(run_json: Mapping[str, Any]) -> Optional[list[int]]:
    """Prompt tokens of each turn of the spec's synthetic session, or None for other shapes."""
    sessions = ((run_json.get("spec") or {}).get("workload") or {}).get("sessions") or {}
    if sessions.get("kind", "synthetic") != "synthetic":
        return None
    defaults = {"system_prompt_tokens": 2000, "task_tokens": 4000, "num_turns": 25, "output_tokens": 300,
                "tool_tokens": 1000}
    s = {k: sessions.get(k, v) for k, v in defaults.items()}
    first = s["system_prompt_tokens"] + s["task_tokens"]
    return [first + j * (s["output_tokens"] + s["tool_tokens"]) for j in range(s["num_turns"])]


def _busy_windows(run: RunData) -> list[tuple[float, int, float]]:
    """(window length, turns completed, their prompt tokens) for each window of the run in which
    every sample saw at least MIN_RUNNING running requests."""
    t = float_column(run.samples, "t_s")
    running = float_column(run.samples, "num_running") if "num_running" in run.samples.column_names else None
    if running is None or not len(t):
        return []
    ok = successful_turns(run.turns)
    finish, prompt = ok.finish_s, ok.prompt_tokens
    rows = []
    end = float(run.run_json["duration_s"])
    start = 0.0
    while start + FIT_WINDOW_S <= end + 1e-9:
        stop = start + FIT_WINDOW_S
        inside = (t >= start) & (t < stop)
        if inside.any() and running[inside].min() >= MIN_RUNNING:
            done = (finish >= start) & (finish < stop)
            n = int(done.sum())
            if n:
                rows.append((FIT_WINDOW_S, n, float(prompt[done].sum())))
        start = stop
    return rows


def cold_turn_fit(runs: Sequence[RunData]) -> Optional[dict]:
    """The cold-turn cost line from the cache-off runs among ``runs`` (None without enough busy windows)."""
    cold = [run for run in runs if caching_off(run)]
    rows = [row for run in cold for row in _busy_windows(run)]
    if len(rows) < 3:
        return None
    y = np.array([r[0] for r in rows])
    X = np.array([[r[1], r[2]] for r in rows], dtype=float)
    (intercept, slope), *_ = np.linalg.lstsq(X, y, rcond=None)
    contexts = session_contexts(cold[0].run_json)
    work = sum(intercept + slope * L for L in contexts) if contexts else math.nan
    return {
        "intercept_s": json_float(float(intercept)),
        "slope_s_per_token": json_float(float(slope)),
        "windows": len(rows),
        "session_cold_work_s": json_float(work),
        "break_even_rate_per_s": json_float(1.0 / work) if work > 0 else None,
    }


def _rate_change(run_json: Mapping[str, Any]) -> Optional[tuple[float, float]]:
    """(time, new base rate) of the run's arm's rate_change trigger, if it has one."""
    spec = run_json.get("spec") or {}
    for arm in spec.get("arms") or ():
        if isinstance(arm, Mapping) and arm.get("name") == run_json.get("arm"):
            for trig in arm.get("triggers") or ():
                if trig.get("kind") == "rate_change":
                    at = trig.get("at_s", trig.get("at_min", 0) * 60.0 if "at_min" in trig else None)
                    return float(at), float(trig["arrival_rate_per_s"])
    return None


def _remaining_cold_work(run: RunData, t: float, contexts: list[int], intercept: float, slope: float) -> float:
    """Sum of c(L) over the turns not yet completed at ``t`` of the sessions in the system at ``t``."""
    cost = np.array([intercept + slope * L for L in contexts])
    owed_from = np.concatenate([np.cumsum(cost[::-1])[::-1], [0.0]])  # owed_from[j]: turns j.. onward
    sessions = run.sessions
    arrival = float_column(sessions, "arrival_s")
    finish = float_column(sessions, "finish_s")
    ids = int_values(sessions.column("session_id"))
    in_system = (arrival <= t) & ~(finish <= t)
    mask = success_mask(run.turns)
    turn_sessions = int_values(run.turns.column("session_id"))[mask]
    done_by_t = turn_sessions[float_column(run.turns, "finish_s")[mask] <= t]
    counts = dict(zip(*np.unique(done_by_t, return_counts=True))) if len(done_by_t) else {}
    total = 0.0
    for sid in ids[in_system]:
        total += owed_from[min(int(counts.get(sid, 0)), len(contexts))]
    return total


def drain_fields(run: RunData, fit: Optional[Mapping[str, Any]]) -> dict:
    """``cold_work_drift_s_per_h`` and ``rate_after_change_per_s`` for one run (None when the run's
    rate does not change while it is collapsed, or no cold-turn fit is available)."""
    out = {"cold_work_drift_s_per_h": None, "rate_after_change_per_s": None}
    change = _rate_change(run.run_json)
    contexts = session_contexts(run.run_json)
    if change is None or contexts is None or not len(run.sessions):
        return out
    at, rate = change
    before = hit_ratio_between(run.turns, max(0.0, at - DEGRADED_WINDOW_S), at)
    if not caching_off(run) and not (before < DEGRADED_HIT_RATIO):
        return out  # not collapsed when the rate changed
    out["rate_after_change_per_s"] = rate
    if not fit or fit.get("intercept_s") is None or fit.get("slope_s_per_token") is None:
        return out
    end = float(run.run_json["duration_s"])
    times = np.arange(at + DRIFT_STEP_S, end + 1e-9, DRIFT_STEP_S)
    if len(times) < 2:
        return out
    work = [_remaining_cold_work(run, t, contexts, fit["intercept_s"], fit["slope_s_per_token"]) for t in times]
    slope_per_s = np.polyfit(times, work, 1)[0]
    out["cold_work_drift_s_per_h"] = json_float(float(slope_per_s * 3600.0))
    return out
