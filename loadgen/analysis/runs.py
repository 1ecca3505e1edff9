"""Reading what a run wrote: run.json and its Parquet tables, and the column helpers the analysis shares.

Everything in loadgen/analysis is a pure function of the files a run wrote (docs/results-format.md)
and of the definitions in docs/experiments.md#measurements. Nothing reads the system clock.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.arrow_numpy import float_values, succeeded
from ..core.recording import SAMPLE_SCHEMA, SESSION_SCHEMA, TURN_SCHEMA

# the files' schemas are the recorder's: one definition (the test factories keep their own
# copy, written from docs/results-format.md, so tests check code against the contract)
TURNS_SCHEMA = TURN_SCHEMA
SAMPLES_SCHEMA = SAMPLE_SCHEMA
SESSIONS_SCHEMA = SESSION_SCHEMA

# The columns this module actually reads; a file lacking one of them is malformed for us.
_TURNS_REQUIRED = ("finish_s", "prompt_tokens", "cached_tokens", "error")
_SAMPLES_REQUIRED = ("t_s", "sessions_in_system")
_SESSIONS_REQUIRED = ("arrival_s", "first_admit_s", "finish_s", "status")
_RUN_JSON_REQUIRED = ("run_id", "arm", "seed", "duration_s")


@dataclass
class RunData:
    """One run as recorded: run.json as a dict and its Parquet tables.

    ``sessions`` is empty for results written before sessions.parquet existed; the measures
    that need it (cohorts, first-turn gateway waits) are then undefined (None).
    """

    run_dir: Path
    run_json: dict
    turns: pa.Table
    samples: pa.Table
    sessions: pa.Table = field(default_factory=SESSIONS_SCHEMA.empty_table)

def read_run_json(path: Path) -> dict:
    """Parse run.json, raising ValueError naming the file when absent or malformed."""
    if not path.is_file():
        raise ValueError(f"{path}: missing run.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: malformed run.json: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: malformed run.json: expected a JSON object")
    missing = [key for key in _RUN_JSON_REQUIRED if key not in data]
    if missing:
        raise ValueError(f"{path}: malformed run.json: missing keys {missing}")
    return data

def read_parquet(path: str | os.PathLike) -> pa.Table:
    """One Parquet file, whole: ``pq.read_table`` without the dataset layer it goes through (a
    quarter of the time on a run's files, and no import of ``pyarrow.dataset``); the same table."""
    with pq.ParquetFile(path) as file:
        return file.read()


def _read_table(path: Path, schema: pa.Schema, required: Sequence[str]) -> pa.Table:
    """Read one Parquet file, raising ValueError naming the file when absent or malformed."""
    if not path.is_file():
        raise ValueError(f"{path}: missing {path.name}")
    try:
        table = read_parquet(path)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{path}: malformed {path.name}: {exc}") from exc
    missing = [name for name in required if name not in table.column_names]
    if missing:
        if table.num_rows == 0:
            # A writer that closed before its first row may not have written our schema;
            # an empty table with the documented columns means the same thing.
            return schema.empty_table()
        raise ValueError(f"{path}: malformed {path.name}: missing columns {missing}")
    return table

def load_run(run_dir: str | os.PathLike) -> RunData:
    """Load run.json, turns.parquet, samples.parquet and (when present) sessions.parquet."""
    run_path = Path(run_dir)
    run_json = read_run_json(run_path / "run.json")
    turns = _read_table(run_path / "turns.parquet", TURNS_SCHEMA, _TURNS_REQUIRED)
    samples = _read_table(run_path / "samples.parquet", SAMPLES_SCHEMA, _SAMPLES_REQUIRED)
    sessions_path = run_path / "sessions.parquet"
    sessions = (_read_table(sessions_path, SESSIONS_SCHEMA, _SESSIONS_REQUIRED) if sessions_path.is_file()
                else SESSIONS_SCHEMA.empty_table())
    return RunData(run_dir=run_path, run_json=run_json, turns=turns, samples=samples, sessions=sessions)

def float_column(table: pa.Table, name: str) -> np.ndarray:
    """A column as float64 with nulls as NaN."""
    return float_values(table.column(name))

def success_mask(turns: pa.Table) -> np.ndarray:
    """True for turns that succeeded (error null; an empty string is tolerated as success)."""
    return succeeded(turns.column("error")) & np.isfinite(float_column(turns, "finish_s"))


@dataclass
class SuccessfulTurns:
    """The columns of successful turns that window statistics need."""

    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray

def successful_turns(turns: pa.Table) -> SuccessfulTurns:
    mask = success_mask(turns)
    return SuccessfulTurns(
        finish_s=float_column(turns, "finish_s")[mask],
        prompt_tokens=np.nan_to_num(float_column(turns, "prompt_tokens")[mask]),
        cached_tokens=np.nan_to_num(float_column(turns, "cached_tokens")[mask]),
    )

def json_float(value: float) -> Optional[float]:
    """A plain float, or None when undefined (NaN / inf), so json.dumps stays strict."""
    value = float(value)
    return value if math.isfinite(value) else None
