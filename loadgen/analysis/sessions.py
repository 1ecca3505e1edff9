"""Per-session (agent task) results: what each task went through, and the task summary of a run.

One row per sessions.parquet row, joined with its successful turns (docs/results-format.md#per-session-results):
arrival, first admission, finish, turns, total and mean turn latency, gateway wait before the
first turn, time parked at turn boundaries (the gateway waits of its later turns), its cached
share of prompt tokens, and its outcome.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from .latency import nearest_rank, turn_latencies
from .runs import RunData, float_column, json_float

SESSION_RESULT_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("arm", pa.string()), ("seed", pa.int64()), ("session_id", pa.int64()),
    ("session_kind", pa.string()), ("is_trigger_session", pa.bool_()),
    ("arrival_s", pa.float64()), ("first_admit_s", pa.float64()), ("finish_s", pa.float64()),
    ("num_turns", pa.int32()), ("turns_completed", pa.int32()),
    ("task_s", pa.float64()), ("turn_latency_total_s", pa.float64()), ("turn_latency_mean_s", pa.float64()),
    ("ttft_mean_s", pa.float64()), ("first_wait_s", pa.float64()), ("parked_s", pa.float64()),
    ("cached_share", pa.float64()), ("status", pa.string()),
])


def session_results(run: RunData) -> pa.Table:
    """One row per session of the run (empty for results without sessions.parquet)."""
    sessions = run.sessions
    n = sessions.num_rows
    if n == 0:
        return SESSION_RESULT_SCHEMA.empty_table()
    lat = turn_latencies(run.turns)
    ids = float_column(sessions, "session_id")
    # group turns by session: sums over turns with the same id
    index = {sid: i for i, sid in enumerate(ids.tolist())}
    rows = np.array([index.get(sid, -1) for sid in lat.session_id.tolist()], dtype=np.int64)
    known = rows >= 0
    rows = rows[known]

    def per_session(values: np.ndarray) -> np.ndarray:
        values = np.nan_to_num(values[known])
        return np.bincount(rows, weights=values, minlength=n)

    num_ok = np.bincount(rows, minlength=n).astype(np.float64)
    turn_total = per_session(lat.turn_s)
    ttft_total = per_session(lat.ttft_s)
    later = lat.turn_index[known] > 0
    parked = np.bincount(rows[later], weights=np.nan_to_num(lat.gateway_wait_s[known][later]), minlength=n)
    prompt = per_session(lat.prompt_tokens)
    cached = per_session(lat.cached_tokens)
    arrival_s = float_column(sessions, "arrival_s")
    admit_s = float_column(sessions, "first_admit_s")
    finish_s = float_column(sessions, "finish_s")
    status = sessions.column("status").to_pylist()
    completed = np.array([s == "completed" for s in status])
    with np.errstate(divide="ignore", invalid="ignore"):
        columns = {
            "run_id": sessions.column("run_id"), "arm": sessions.column("arm"), "seed": sessions.column("seed"),
            "session_id": sessions.column("session_id"), "session_kind": sessions.column("session_kind"),
            "is_trigger_session": sessions.column("is_trigger_session"),
            "arrival_s": arrival_s, "first_admit_s": admit_s, "finish_s": finish_s,
            "num_turns": sessions.column("num_turns"), "turns_completed": sessions.column("turns_completed"),
            "task_s": np.where(completed, finish_s - arrival_s, math.nan),
            "turn_latency_total_s": turn_total,
            "turn_latency_mean_s": np.where(num_ok > 0, turn_total / num_ok, math.nan),
            "ttft_mean_s": np.where(num_ok > 0, ttft_total / num_ok, math.nan),
            "first_wait_s": admit_s - arrival_s,
            "parked_s": parked,
            "cached_share": np.where(prompt > 0, cached / prompt, math.nan),
            "status": sessions.column("status"),
        }
    return pa.table({name: pa.array(np.asarray(col) if isinstance(col, np.ndarray) else col, type=field.type)
                     for (name, col), field in zip(columns.items(), SESSION_RESULT_SCHEMA)},
                    schema=SESSION_RESULT_SCHEMA)


def task_outcome(run: RunData) -> dict:
    """The task fields of a summary.json `runs` entry (None without sessions.parquet).

    Completion times are over the tasks that finished (arrival to completion, nearest-rank);
    the cohort fields (recovery.py) are the measure that counts unfinished tasks."""
    sessions = run.sessions
    if sessions.num_rows == 0:
        return {"tasks_arrived": None, "tasks_finished": None, "task_completion_p50_min": None,
                "task_completion_p90_min": None}
    completed = np.array([s == "completed" for s in sessions.column("status").to_pylist()], dtype=bool)
    times_s = (float_column(sessions, "finish_s") - float_column(sessions, "arrival_s"))[completed]
    return {
        "tasks_arrived": int(sessions.num_rows),
        "tasks_finished": int(completed.sum()),
        "task_completion_p50_min": json_float(nearest_rank(times_s, 0.5) / 60.0),
        "task_completion_p90_min": json_float(nearest_rank(times_s, 0.9) / 60.0),
    }
