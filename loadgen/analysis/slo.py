"""Goodput against the spec's SLOs: which turns and tasks met every target (docs/results-format.md#slos-and-goodput).

A turn meets the SLO when its TTFT, mean inter-token latency and turn latency (loadgen/analysis/
latency.py; gateway wait included) are each within the targets given (a one-token turn has no
inter-token latency and meets that target). A task (session) meets it when it finished, its
arrival-to-completion time is within ``task_s``, and the ``percentile``-th (nearest-rank) of each
per-turn metric over its own turns is within target. Goodput is meeting turns (tasks) per second
of run; the shares are over successful turns, and over the tasks that arrived at least ``task_s``
before the run's end (all tasks without a task target), unfinished ones counting as missed.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import numpy as np
import pyarrow as pa

from ..core.spec import SLOSpec
from .latency import TurnLatencies, nearest_rank, turn_latencies
from .runs import RunData, float_column, json_float

_TURN_TARGETS = (("ttft_s", "ttft_s"), ("itl_s", "itl_s"), ("turn_s", "turn_s"))


def slo_of(run_json: Mapping[str, Any]) -> Optional[SLOSpec]:
    """The SLO of a run's resolved spec (run.json "spec"), None when it declares none."""
    spec = run_json.get("spec")
    data = spec.get("slo") if isinstance(spec, Mapping) else None
    return SLOSpec.model_validate(data) if data else None


def turns_meeting(lat: TurnLatencies, slo: SLOSpec) -> np.ndarray:
    """True for each turn meeting every per-turn target of ``slo``."""
    ok = np.ones(len(lat), dtype=bool)
    for target_name, metric in _TURN_TARGETS:
        target = getattr(slo, target_name)
        if target is None:
            continue
        values = getattr(lat, metric)
        within = values <= target
        if metric == "itl_s":
            within |= np.isnan(values)  # one token: no gap to hold to a target
        ok &= within
    return ok


def tasks_meeting(sessions: pa.Table, lat: TurnLatencies, slo: SLOSpec) -> np.ndarray:
    """True for each sessions.parquet row whose task met the SLO (see the module docstring)."""
    arrival_s = float_column(sessions, "arrival_s")
    finish_s = float_column(sessions, "finish_s")
    session_ids = float_column(sessions, "session_id")
    completed = np.array([s == "completed" for s in sessions.column("status").to_pylist()], dtype=bool)
    ok = completed.copy()
    if slo.task_s is not None:
        ok &= (finish_s - arrival_s) <= slo.task_s
    q = slo.percentile / 100.0
    per_turn = [(getattr(slo, t), m) for t, m in _TURN_TARGETS if getattr(slo, t) is not None]
    if per_turn and len(lat):
        order = np.argsort(lat.session_id, kind="stable")
        sorted_ids = lat.session_id[order]
        for i in np.flatnonzero(ok):
            lo, hi = np.searchsorted(sorted_ids, session_ids[i], "left"), np.searchsorted(sorted_ids, session_ids[i], "right")
            rows = order[lo:hi]
            for target, metric in per_turn:
                value = nearest_rank(getattr(lat, metric)[rows], q)
                if value > target:  # NaN (no finite value, e.g. one-token turns) passes
                    ok[i] = False
                    break
    return ok


def slo_outcome(run: RunData) -> dict:
    """The SLO fields of a summary.json `runs` entry; every value None when the spec has no slo."""
    slo = slo_of(run.run_json)
    fields = ("slo_turns_met", "slo_turns_met_share", "slo_goodput_turns_per_s", "slo_tasks_met",
              "slo_tasks_counted", "slo_tasks_met_share", "slo_goodput_tasks_per_s", "slo_met_at_percentile")
    if slo is None:
        return dict.fromkeys(fields)
    duration_s = float(run.run_json["duration_s"])
    lat = turn_latencies(run.turns)
    turn_ok = turns_meeting(lat, slo)
    out = {
        "slo_turns_met": int(turn_ok.sum()),
        "slo_turns_met_share": json_float(turn_ok.mean()) if len(turn_ok) else None,
        "slo_goodput_turns_per_s": json_float(turn_ok.sum() / duration_s),
    }
    if run.sessions.num_rows:
        task_ok = tasks_meeting(run.sessions, lat, slo)
        counted = float_column(run.sessions, "arrival_s") <= duration_s - (slo.task_s or 0.0)
        num_met = int((task_ok & counted).sum())
        out.update(slo_tasks_met=int(task_ok.sum()), slo_tasks_counted=int(counted.sum()),
                   slo_tasks_met_share=json_float(num_met / counted.sum()) if counted.any() else None,
                   slo_goodput_tasks_per_s=json_float(task_ok.sum() / duration_s))
    else:
        out.update(slo_tasks_met=None, slo_tasks_counted=None, slo_tasks_met_share=None,
                   slo_goodput_tasks_per_s=None)
    # the run as a whole: the percentile of each metric over all its turns within target
    q = slo.percentile / 100.0
    met = [nearest_rank(getattr(lat, m), q) <= getattr(slo, t) for t, m in _TURN_TARGETS
           if getattr(slo, t) is not None and math.isfinite(nearest_rank(getattr(lat, m), q))]
    has_turn_targets = any(getattr(slo, t) is not None for t, _ in _TURN_TARGETS)
    out["slo_met_at_percentile"] = all(met) if len(lat) and has_turn_targets else None
    return out
