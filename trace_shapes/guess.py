"""Which format a trace file's rows look like, from the field names of its first row: for the
error a file read in the wrong format gives (a Mooncake file read as ``shapes`` has no
``calls``), so it can say which ``--format`` to try. A hint, never a silent switch."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .rows import FileRows, TraceFormatError

# the fields that mark each format's rows (trace_shapes/loaders.py and the tree readers document
# them), most specific first: a row's own fields, then those of its first turn where formats share
# the row's (aiperf, copilot and dag_jsonl rows are all a session_id and turns)
SIGNATURES = (
    ("tree", {"tree_id", "branches"}, set()),
    ("guidellm", {"turns", "branches"}, set()),
    ("shapes", {"calls"}, set()),
    ("bailian", {"chat_id", "parent_chat_id", "input_length"}, set()),
    ("mooncake", {"hash_ids", "input_length", "output_length"}, set()),
    ("tracelab", {"session_id", "round_index"}, set()),
    ("copilot", {"session_id", "turns"}, {"llm_calls"}),
    ("dag_jsonl", {"session_id", "turns"}, {"messages"}),
    ("aiperf", {"session_id", "turns"}, {"text"}),
    ("calls", {"session_id", "input_tokens"}, set()),
    ("calls", {"session_id", "new_input_tokens"}, set()),
)


def guess_format(path: Union[str, Path]) -> Optional[str]:
    """The format whose marking fields the file's first row has; None when none matches or
    the file cannot be read."""
    try:
        row = next(iter(FileRows(path)), None)
    except TraceFormatError:
        return None
    if row is None or not isinstance(row.data, dict):
        return None
    keys = set(row.data)
    turns = row.data.get("turns")
    turn_keys = set(turns[0]) if isinstance(turns, list) and turns and isinstance(turns[0], dict) else set()
    return next((name for name, fields, in_turn in SIGNATURES if fields <= keys and in_turn <= turn_keys), None)
