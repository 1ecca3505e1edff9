"""One run's outcome: the fields of its summary.json `runs` entry."""

from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np
import pyarrow as pa

from .attempts import attempt_outcome
from .ideal import hit_ratio_outcome
from .latency import latency_outcome
from .recovery import control_outcome
from .replicas import replica_outcome
from .sessions import task_outcome
from .slo import slo_outcome
from .tokenization import tokenization_outcome
from .runs import RunData, float_column, json_float, success_mask
from .windows import (LAST_HIT_WINDOW_S, LAST_SESSIONS_WINDOW_S, degraded_only_in_final_window, degraded_to_the_end,
                      degraded_windows, ends_degraded, hit_ratio_between, num_turns_between, run_busy_times)


def _mean_sessions_between(samples: pa.Table, start_s: float, end_s: float) -> float:
    t_s = float_column(samples, "t_s")
    sessions = float_column(samples, "sessions_in_system")
    in_span = (t_s >= start_s) & (t_s <= end_s) & np.isfinite(sessions)
    if not in_span.any():
        return math.nan
    return float(sessions[in_span].mean())

def _last_sample_int(samples: pa.Table, name: str) -> Optional[int]:
    if samples.num_rows == 0 or name not in samples.column_names:
        return None
    t_s = float_column(samples, "t_s")
    values = float_column(samples, name)
    finite = np.isfinite(values) & np.isfinite(t_s)
    if not finite.any():
        return None
    return int(values[finite][np.argmax(t_s[finite])])

def _count(run: RunData, key: str, sample_column: str) -> Optional[int]:
    """A run-level count: run.json counts, else the last sample's cumulative total."""
    counts = run.run_json.get("counts") or {}
    if isinstance(counts, Mapping) and counts.get(key) is not None:
        return int(counts[key])
    return _last_sample_int(run.samples, sample_column)

def run_outcome(run: RunData) -> dict:
    """The per-run fields of a summary.json `runs` entry (None where a value is undefined)."""
    info = run.run_json
    duration_s = float(info["duration_s"])
    last_hit_start_s = max(0.0, duration_s - LAST_HIT_WINDOW_S)
    last_hit_width_s = duration_s - last_hit_start_s

    turns_completed = _count(run, "turns_completed", "turns_completed_total")
    if turns_completed is None:
        turns_completed = int(success_mask(run.turns).sum())
    num_last_turns = num_turns_between(run.turns, last_hit_start_s, duration_s)
    hit_last10min = hit_ratio_between(run.turns, last_hit_start_s, duration_s)
    # a window with no finished turn is stalled (degraded) when some session was not thinking
    degraded = degraded_windows(run.turns, info.get("reference_trigger_end_s"), duration_s,
                                busy_s=run_busy_times(run.samples))

    return {
        "run_id": str(info["run_id"]),
        "experiment": info.get("experiment"),
        "arm": str(info["arm"]),
        "seed": int(info["seed"]),
        "engine_flavor": info.get("engine_flavor"),  # vllm | sglang for simulated runs, else None
        "offload_cpu_tokens": info.get("offload_cpu_tokens"),  # the simulated CPU tier, None without one
        "duration_s": duration_s,
        "hit_ratio_last10min": json_float(hit_last10min),
        "sessions_in_system_last5min": json_float(
            _mean_sessions_between(
                run.samples, duration_s - LAST_SESSIONS_WINDOW_S, duration_s
            )
        ),
        "persistently_degraded": degraded_to_the_end(degraded),
        "turns_completed": turns_completed,
        "sessions_completed": _count(run, "sessions_completed", "sessions_completed_total"),
        "turns_per_s_last10min": (
            json_float(num_last_turns / last_hit_width_s) if last_hit_width_s > 0 else None
        ),
        **control_outcome(run),
        # added with latency and SLOs (docs/results-format.md#latency)
        **latency_outcome(run.turns, duration_s),
        # added with retried turns' latency (docs/results-format.md#attempts): beside the latency,
        # the turns retried, cut short or failed, by cause
        **attempt_outcome(run.turns),
        **task_outcome(run),
        **slo_outcome(run),
        # added beside persistently_degraded (docs/results-format.md): how the run ends, and how
        # much of it after the trigger was degraded
        "ends_degraded": ends_degraded(hit_last10min),
        "degraded_windows_after_trigger": (
            json_float(float(degraded.mean())) if len(degraded) else None
        ),
        "degraded_only_in_final_window": degraded_only_in_final_window(degraded),
        # added with lag measurement (docs/results-format.md#lag): a live run whose driver or
        # serve-sim fell behind its time scale; false for simulated runs and older run.json files
        "lagging": bool(info.get("lagging", False)),
        # added with the ideal hit ratio (docs/results-format.md#ideal-hit-ratio): measured vs an
        # infinite cache on the same prompts, whole run and last 10 minutes
        **hit_ratio_outcome(run),
        # added with chat prompts (docs/chat.md#drift): prompt lengths off plan, re-tokenization drift
        **tokenization_outcome(run.turns),
        # added with deployments (docs/deployments.md#records): per-replica outcomes, runs on a deployment only
        **replica_outcome(run),
    }
