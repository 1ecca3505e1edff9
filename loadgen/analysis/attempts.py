"""Turns by outcome: how many were retried, cut short or failed, and why (summary.json `runs`,
docs/results-format.md#attempts).

turns.parquet has a row per attempt (a retried turn's failed attempts too). A turn's outcome is
its last attempt's: failed when that one failed, truncated when it succeeded with fewer output
tokens than it asked for. A failure's cause is read from its error text, as the live driver
writes it (loadgen/live/raw_http.py, loadgen/live/http_client.py)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pyarrow as pa

from ..core.arrow_numpy import int_values
from .runs import float_column, json_float

# (cause, what the error text starts with or contains), first match wins
_CAUSES = (
    ("timeout", ("timeout after",)),
    ("connect", ("ClientConnectorError",)),
    ("disconnected", ("ServerDisconnectedError", "ClientOSError", "Connection reset")),
    ("cut_short", ("stream ended without usage", "ClientPayloadError")),
    ("malformed", ("malformed response", "JSONDecodeError", "ValueError")),
    ("stream_error", ("StreamError",)),
    ("http_4xx", ("HTTP 4",)),
    ("http_5xx", ("HTTP 5",)),
)


# an answer with an HTTP error status: "HttpStatusError: HTTP 400: <body>" (raw_http.HttpStatusError)
_STATUS = re.compile(r"^(?:\w+: )?HTTP ([45])\d\d\b")


def failure_cause(error: str) -> str:
    """The cause of a failed attempt, from its error text ("other" when none is recognised). An
    HTTP status decides first: its body may say anything ("ValueError: prompt too long", "timeout
    after 5 s") without the request having been malformed or timed out on the client."""
    status = _STATUS.match(error)
    if status:
        return f"http_{status.group(1)}xx"
    for cause, markers in _CAUSES:
        if any(marker in error for marker in markers):
            return cause
    return "other"


def turn_of_row(turns: pa.Table) -> np.ndarray:
    """For each row, the index of its turn (session_id, turn_index) among the table's turns."""
    sessions = int_values(turns.column("session_id"))
    turn_index = int_values(turns.column("turn_index"))
    _, inverse = np.unique(np.stack([sessions, turn_index]), axis=1, return_inverse=True)
    return inverse.reshape(-1)


def attempt_outcome(turns: pa.Table) -> dict:
    """The attempt fields of a summary.json `runs` entry."""
    errors = turns.column("error").to_pylist() if "error" in turns.column_names else []
    num_rows = len(errors)
    failed_attempts = Counter(failure_cause(e) for e in errors if e)
    if num_rows == 0 or not {"session_id", "turn_index"} <= set(turns.column_names):
        return {"turn_attempts": num_rows, "turns_retried": 0, "retries_per_turn_mean": 0.0 if num_rows else None,
                "retries_per_turn_max": 0, "turns_failed": sum(failed_attempts.values()), "turns_truncated": 0,
                "failed_attempts_by_cause": dict(failed_attempts), "failed_turns_by_cause": dict(failed_attempts)}
    if not failed_attempts:  # no failure, no retry: every row is a turn of one attempt
        num_turns, attempts, last_row = num_rows, np.ones(num_rows, dtype=np.int64), np.arange(num_rows)
    else:
        turn = turn_of_row(turns)
        num_turns = int(turn.max()) + 1
        attempts = np.bincount(turn, minlength=num_turns)
        last_row = np.zeros(num_turns, dtype=np.int64)
        np.maximum.at(last_row, turn, np.arange(num_rows))  # rows are written in order: the last is the last attempt
    failed_turns = Counter(failure_cause(errors[i]) for i in last_row if errors[i])
    truncated = 0
    if "planned_output_tokens" in turns.column_names:
        output = float_column(turns, "output_tokens")[last_row]
        planned = float_column(turns, "planned_output_tokens")[last_row]
        succeeded = np.array([not errors[i] for i in last_row], dtype=bool)
        truncated = int((succeeded & (output < planned)).sum())
    return {
        "turn_attempts": num_rows,
        "turns_retried": int((attempts > 1).sum()),
        "retries_per_turn_mean": json_float((num_rows - num_turns) / num_turns),  # over every turn
        "retries_per_turn_max": int(attempts.max() - 1),
        "turns_failed": sum(failed_turns.values()),
        "turns_truncated": truncated,
        "failed_attempts_by_cause": dict(sorted(failed_attempts.items())),
        "failed_turns_by_cause": dict(sorted(failed_turns.items())),
    }
