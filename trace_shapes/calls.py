"""The generic one-call-a-row format, for any table (a Hugging Face dataset, a JSONL or Parquet file)
whose columns are renamed to these fields (``columns: {field: column}`` in the spec):

``session_id``
    The session the call belongs to (required).
``input_tokens`` or ``new_input_tokens``
    The whole context the call sent; or only what the call adds, in which case the context
    accumulates as an agent framework sends it (every earlier input and output, then the new
    input). One of the two is required.
``output_tokens``
    Tokens the call generated (required).
``turn_index``
    Order of the call in its session (optional; else ``timestamp_s``, then row order).
``gap_s``
    The pause between the previous call's response and this call (tool or think time).
``timestamp_s``
    When the call started (seconds, or an ISO-8601 time); where ``gap_s`` is missing the gap is
    the interval between starts, which includes the model's latency (counted in the notes).
``model``
    The model that served the session (optional).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from .records import RecordedSession
from .rows import LoaderOptions, RowSource, gap_between


@dataclass
class _Call:
    row: int
    turn_index: Optional[int]
    timestamp_s: Optional[float]
    gap_s: Optional[float]
    input_tokens: int
    is_whole_context: bool
    output_tokens: int
    model: str


def read_calls(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedSession], int, list[str]]:
    calls: dict[str, list[_Call]] = defaultdict(list)
    num_rows = 0
    for row in rows:
        num_rows += 1
        data = row.data
        session_id = row.text(row.require(data, "session_id", "session_id"), "session_id")
        if data.get("input_tokens") is not None:
            tokens, whole = row.integer(data["input_tokens"], "input_tokens", minimum=1), True
        elif data.get("new_input_tokens") is not None:
            tokens, whole = row.integer(data["new_input_tokens"], "new_input_tokens"), False
        else:
            raise row.error("input_tokens", "missing (expected input_tokens or new_input_tokens)")
        index = data.get("turn_index")
        timestamp = data.get("timestamp_s")
        gap = data.get("gap_s")
        calls[session_id].append(_Call(
            row=row.row_number,
            turn_index=None if index is None else row.integer(index, "turn_index"),
            timestamp_s=None if timestamp is None else row.timestamp_s(timestamp, "timestamp_s"),
            gap_s=None if gap is None else row.number(gap, "gap_s", minimum=0.0),
            input_tokens=tokens, is_whole_context=whole,
            output_tokens=row.integer(row.require(data, "output_tokens", "output_tokens"), "output_tokens"),
            model=row.text(data.get("model") or "unknown", "model"),
        ))
    sessions = []
    num_start_gaps = num_empty_first = 0
    for session_id, session_calls in calls.items():
        session_calls.sort(key=lambda c: (c.turn_index if c.turn_index is not None else -1,
                                          c.timestamp_s if c.timestamp_s is not None else 0.0, c.row))
        prompts, context = [], 0
        for call in session_calls:
            context = call.input_tokens if call.is_whole_context else context + call.input_tokens
            prompts.append(context)
            context += call.output_tokens
        if prompts[0] < 1:
            num_empty_first += 1
            continue
        gaps: list[Optional[float]] = []
        for before, after in zip(session_calls, session_calls[1:]):
            gap, from_timestamps = gap_between(after.gap_s, before.timestamp_s, after.timestamp_s)
            gaps.append(gap)
            num_start_gaps += from_timestamps
        sessions.append(RecordedSession(session_id, session_calls[0].model, tuple(prompts),
                                        tuple(c.output_tokens for c in session_calls), tuple(gaps)))
    notes = []
    if num_start_gaps:
        notes.append(f"{num_start_gaps} gaps are intervals between call starts (no gap_s): they include the "
                     f"model's latency")
    if num_empty_first:
        notes.append(f"{num_empty_first} sessions whose first call sends no tokens were skipped")
    return sessions, num_rows, notes
