"""Factories for tests: small synthetic results directories in the documented format.

The schemas below are written out from docs/results-format.md on purpose (not imported from
loadgen) so that tests check the code against the contract, not against itself.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

DOC_TURNS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("arm", pa.string()),
        ("seed", pa.int64()),
        ("session_id", pa.int64()),
        ("turn_index", pa.int32()),
        ("is_trigger_session", pa.bool_()),
        ("session_kind", pa.string()),
        ("ready_s", pa.float64()),
        ("admit_s", pa.float64()),
        ("first_token_s", pa.float64()),
        ("finish_s", pa.float64()),
        ("prompt_tokens", pa.int64()),
        ("cached_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("gateway_wait_s", pa.float64()),
        ("num_preemptions", pa.int32()),
        ("error", pa.string()),
        ("itl_mean_s", pa.float64()),
        ("itl_max_s", pa.float64()),
        ("planned_prompt_tokens", pa.int64()),
        ("retokenization_drift_tokens", pa.int64()),
        ("cacheable_prefix_tokens", pa.int64()),
        ("attempt", pa.int32()),
        ("submitted_s", pa.float64()),
        ("planned_output_tokens", pa.int64()),
    ]
)

DOC_SAMPLES_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("t_s", pa.float64()),
        ("sessions_in_system", pa.int64()),
        ("sessions_thinking", pa.int64()),
        ("sessions_gateway_waiting", pa.int64()),
        ("sessions_parked", pa.int64()),
        ("sessions_in_engine", pa.int64()),
        ("num_running", pa.int64()),
        ("num_waiting", pa.int64()),
        ("kv_usage", pa.float64()),
        ("resident_demand_tokens", pa.int64()),
        ("resident_demand_ratio", pa.float64()),
        ("pool_tokens", pa.int64()),
        ("prefix_cache_queries_total", pa.int64()),
        ("prefix_cache_hits_total", pa.int64()),
        ("num_preemptions_total", pa.int64()),
        ("turns_completed_total", pa.int64()),
        ("sessions_arrived_total", pa.int64()),
        ("sessions_completed_total", pa.int64()),
        ("gateway_limit", pa.float64()),
        ("sessions_admitted", pa.int64()),
    ]
)

DOC_SESSIONS_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("arm", pa.string()),
        ("seed", pa.int64()),
        ("session_id", pa.int64()),
        ("is_trigger_session", pa.bool_()),
        ("session_kind", pa.string()),
        ("num_turns", pa.int32()),
        ("arrival_s", pa.float64()),
        ("first_admit_s", pa.float64()),
        ("finish_s", pa.float64()),
        ("turns_completed", pa.int32()),
        ("num_parks", pa.int32()),
        ("status", pa.string()),
        ("error", pa.string()),
    ]
)

_POOL_TOKENS = 400_000


def turn_row(
    finish_s: float,
    prompt_tokens: int,
    cached_tokens: int,
    error: Optional[str] = None,
    **overrides: Any,
) -> dict:
    """One turns.parquet row (the fields a test cares about; write_run_dir fills the rest)."""
    return {
        "finish_s": float(finish_s),
        "prompt_tokens": int(prompt_tokens),
        "cached_tokens": int(cached_tokens),
        "error": error,
        **overrides,
    }


def sample_row(t_s: float, sessions_in_system: int, **overrides: Any) -> dict:
    """One samples.parquet row (write_run_dir fills the rest)."""
    return {"t_s": float(t_s), "sessions_in_system": int(sessions_in_system), **overrides}


def session_row(arrival_s: float, first_admit_s: float = math.nan, finish_s: float = math.nan,
                **overrides: Any) -> dict:
    """One sessions.parquet row: finished (status completed) when finish_s is given, else in the system."""
    return {"arrival_s": float(arrival_s), "first_admit_s": float(first_admit_s), "finish_s": float(finish_s),
            **overrides}


def steady_turns(
    start_s: float, end_s: float, every_s: float, hit_ratio: float, prompt_tokens: int = 10_000
) -> list[dict]:
    """Successful turns finishing every every_s in [start_s, end_s) with a fixed hit ratio."""
    num_turns = int(math.ceil((end_s - start_s) / every_s))
    cached_tokens = int(round(prompt_tokens * hit_ratio))
    return [
        turn_row(start_s + i * every_s, prompt_tokens, cached_tokens) for i in range(num_turns)
    ]


def _full_turn(row: Mapping[str, Any], index: int, run_id: str, arm: str, seed: int) -> dict:
    finish_s = float(row["finish_s"])
    failed = row.get("error") is not None
    ready_s = finish_s - 5.0
    full = {
        "run_id": run_id,
        "arm": arm,
        "seed": seed,
        "session_id": index,
        "turn_index": 0,
        "is_trigger_session": False,
        "session_kind": "synthetic",
        "ready_s": ready_s,
        "admit_s": ready_s,
        "first_token_s": math.nan if failed else finish_s - 1.0,
        "finish_s": finish_s,
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "output_tokens": 100,
        "gateway_wait_s": 0.0,
        "num_preemptions": 0,
        "error": None,
        "cacheable_prefix_tokens": None,
        "attempt": 1,
        "submitted_s": ready_s,
        "planned_output_tokens": 100,
    }
    full.update(row)
    return full


def _full_sample(row: Mapping[str, Any], run_id: str) -> dict:
    sessions = int(row["sessions_in_system"])
    full = {
        "run_id": run_id,
        "t_s": float(row["t_s"]),
        "sessions_in_system": sessions,
        "sessions_thinking": sessions,
        "sessions_gateway_waiting": 0,
        "sessions_parked": 0,
        "sessions_in_engine": 0,
        "num_running": 0,
        "num_waiting": 0,
        "kv_usage": 0.5,
        "resident_demand_tokens": 1000 * sessions,
        "resident_demand_ratio": 1000 * sessions / _POOL_TOKENS,
        "pool_tokens": _POOL_TOKENS,
        "prefix_cache_queries_total": 0,
        "prefix_cache_hits_total": 0,
        "num_preemptions_total": 0,
        "turns_completed_total": 0,
        "sessions_arrived_total": 0,
        "sessions_completed_total": 0,
        "gateway_limit": math.nan,
        "sessions_admitted": sessions,
    }
    full.update(row)
    return full


def _full_session(row: Mapping[str, Any], index: int, run_id: str, arm: str, seed: int) -> dict:
    finished = not math.isnan(float(row["finish_s"]))
    full = {
        "run_id": run_id,
        "arm": arm,
        "seed": seed,
        "session_id": index,
        "is_trigger_session": False,
        "session_kind": "synthetic",
        "num_turns": 25,
        "turns_completed": 25 if finished else 0,
        "num_parks": 0,
        "status": "completed" if finished else "in_system",
    }
    full.update(row)
    return full


def write_run_dir(
    root: Path | str,
    run_id: str,
    arm: str,
    seed: int,
    turns_rows: Sequence[Mapping[str, Any]],
    samples_rows: Sequence[Mapping[str, Any]],
    triggers: Sequence[Mapping[str, Any]],
    duration_s: float,
    reference_trigger_end_s: Optional[float],
    experiment: str = "exp",
    status: str = "completed",
    spec: Optional[Mapping[str, Any]] = None,
    counts: Optional[Mapping[str, int]] = None,
    sessions_rows: Optional[Sequence[Mapping[str, Any]]] = None,
    controller: str = "none",
    control_start_s: float = 0.0,
) -> Path:
    """Write <root>/runs/<run_id>/{turns,samples[,sessions]}.parquet and run.json; return the run dir.

    Rows may give only some columns (see turn_row / sample_row / session_row); the others get
    plausible defaults. Columns and types are exactly those of docs/results-format.md. Without
    sessions_rows no sessions.parquet is written (as in results from before it existed).
    """
    run_dir = Path(root) / "runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)

    turns = [_full_turn(row, i, run_id, arm, seed) for i, row in enumerate(turns_rows)]
    turns_table = pa.Table.from_pylist(turns, schema=DOC_TURNS_SCHEMA)
    pq.write_table(turns_table, run_dir / "turns.parquet")

    samples = [_full_sample(row, run_id) for row in samples_rows]
    pq.write_table(
        pa.Table.from_pylist(samples, schema=DOC_SAMPLES_SCHEMA), run_dir / "samples.parquet"
    )
    if sessions_rows is not None:
        sessions = [_full_session(row, i, run_id, arm, seed) for i, row in enumerate(sessions_rows)]
        pq.write_table(
            pa.Table.from_pylist(sessions, schema=DOC_SESSIONS_SCHEMA), run_dir / "sessions.parquet"
        )

    num_ok_turns = sum(1 for row in turns if row["error"] is None)
    run_json = {
        "run_id": run_id,
        "experiment": experiment,
        "arm": arm,
        "seed": seed,
        "status": status,
        "error": None if status == "completed" else "synthetic failure",
        "duration_s": float(duration_s),
        "pool_tokens": _POOL_TOKENS,
        "engine": "sim",
        "controller": controller,
        "control_start_s": float(control_start_s),
        "triggers": [dict(t) for t in triggers],
        "reference_trigger_end_s": reference_trigger_end_s,
        "loadgen_version": "0.1.0",
        "spec": dict(spec) if spec is not None else {"name": experiment},
        "counts": (
            dict(counts)
            if counts is not None
            else {"sessions_arrived": 0, "sessions_completed": 0, "turns_completed": num_ok_turns}
        ),
    }
    (run_dir / "run.json").write_text(json.dumps(run_json, indent=2))
    return run_dir
