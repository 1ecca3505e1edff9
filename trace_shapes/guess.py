"""Which format a trace file's rows look like, from the field names of its first row: for the
error a file read in the wrong format gives (a Mooncake file read as ``shapes`` has no
``calls``), so it can say which ``--format`` to try. A hint, never a silent switch."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

from .rows import FileRows, TraceFormatError

# the fields that mark each format's rows (trace_shapes/loaders.py documents them), most specific first
SIGNATURES = (
    ("shapes", {"calls"}),
    ("mooncake", {"hash_ids", "input_length", "output_length"}),
    ("bailian", {"chat_id", "parent_chat_id", "input_length"}),
    ("tracelab", {"session_id", "round_index"}),
    ("calls", {"session_id", "input_tokens"}),
    ("calls", {"session_id", "new_input_tokens"}),
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
    return next((name for name, fields in SIGNATURES if fields <= keys), None)
