"""Read recorded agent sessions from local files: the shipped shape format and public trace formats.

Files are JSONL (one JSON object a line), gzip-compressed JSONL (``.gz``) or Parquet
(``.parquet``, read with pyarrow in record batches). Every format becomes a list of
:class:`RecordedSession`; a malformed file or row raises :class:`TraceFormatError` naming the
file, the row (1-based line or record number) and the field.

Formats (field names as in the data sets' own documentation):

``shapes``
    One session a row: ``calls`` = ``[[prompt_tokens, completion_tokens, gap_s], ...]`` where
    ``gap_s`` of call k >= 1 is the pause before it (null where not recorded; the first call's
    entry is ignored); optional ``model`` and ``source`` (used as the session id).
``tracelab``
    One LLM round a row (uw-syfi/TraceLab): ``session_id``, ``round_index``,
    ``input_tokens_total`` (or ``prefix_tokens`` + ``newly_append_tokens``), ``output_tokens``,
    optional ``model`` and ``timing_events[]`` (``event_type``, ``timestamp``). Rounds are ordered
    by ``round_index`` (file order breaks ties; a repeated index is dropped and counted). The gap
    after round k is the time from its last timing event (its response end) to the latest
    ``tool_result`` / ``user_message`` event of round k + 1 (the moment its input was ready: the
    last parallel tool result, or the user's next message, so human waits are replayed too).
``copilot``
    One session a row (GitHub Copilot coding agent 2026, Azure/AzurePublicDataset):
    ``session_id``, ``turns[].llm_calls[]`` with ``timestamp``, ``duration_ms``,
    ``tokens.prompt``, ``tokens.completion``, optional ``model``. Calls of all turns are one
    stream in start-time order; the gap is the next call's start minus this call's end, clamped
    at 0 where calls overlap (counted).
``bailian``
    One request a row (alibaba-edu/qwen-bailian-usagetraces-anon): ``chat_id``,
    ``parent_chat_id`` (-1 for a root), ``timestamp`` (s), ``input_length``, ``output_length``.
    A session is a root and every request that chains back to it (a parent missing from the
    file starts a session of its own, counted), in timestamp order. The trace has no response
    end times, so the gap is the interval between request starts: it includes the model's own
    latency and overstates the tool/think time.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from .records import RecordedSession

SWEBENCH_FILE = "swebench_agent_shapes.jsonl"
INPUT_EVENT_TYPES = frozenset({"tool_result", "user_message"})


class TraceFormatError(ValueError):
    """A trace file that cannot be read; the message names the file, row and field."""

    def __init__(self, path: Union[str, Path], problem: str, row: Optional[int] = None,
                 field: Optional[str] = None) -> None:
        where = str(path)
        if row is not None:
            where += f": row {row}"
        if field is not None:
            where += f": field {field!r}"
        super().__init__(f"{where}: {problem}")
        self.path, self.row, self.field = str(path), row, field


@dataclass(frozen=True)
class LoadedTrace:
    """The sessions of one file, and what the loader had to do to read them."""

    path: str
    format: str
    sessions: tuple[RecordedSession, ...]
    num_rows: int
    notes: tuple[str, ...] = ()

    def recorded_gaps_s(self) -> list[float]:
        """Every gap the file records (the pool the empirical gap fallback draws from)."""
        return [g for s in self.sessions for g in s.gaps_s if g is not None]


# ---------------------------------------------------------------- rows and fields
class _Row:
    """One row of a file, for reading fields with errors that say where they are."""

    def __init__(self, path: Path, number: int, data: Any) -> None:
        self.path, self.row_number, self.data = path, number, data
        if not isinstance(data, dict):
            raise self.error(None, f"expected an object, got {type(data).__name__}")

    def error(self, field: Optional[str], problem: str) -> TraceFormatError:
        return TraceFormatError(self.path, problem, self.row_number, field)

    def require(self, obj: dict, key: str, field: str) -> Any:
        value = obj.get(key)
        if value is None:
            raise self.error(field, "missing")
        return value

    def integer(self, value: Any, field: str, minimum: int = 0) -> int:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value) or value != int(value) or value < minimum:
            raise self.error(field, f"expected an integer >= {minimum}, got {value!r}")
        return int(value)

    def number(self, value: Any, field: str, minimum: Optional[float] = None) -> float:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not math.isfinite(value) or (minimum is not None and value < minimum):
            bound = "" if minimum is None else f" >= {minimum:g}"
            raise self.error(field, f"expected a number{bound}, got {value!r}")
        return float(value)

    def listing(self, value: Any, field: str) -> list:
        if not isinstance(value, list):
            raise self.error(field, f"expected a list, got {type(value).__name__}")
        return value

    def mapping(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.error(field, f"expected an object, got {type(value).__name__}")
        return value

    def text(self, value: Any, field: str) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise self.error(field, f"expected a string, got {value!r}")
        return str(value)

    def timestamp_s(self, value: Any, field: str) -> float:
        """An ISO-8601 time (naive means UTC) or a number of seconds, as seconds."""
        if isinstance(value, str):
            seconds = _parse_iso_s(value)
            if seconds is None:
                raise self.error(field, f"expected an ISO-8601 time, got {value!r}")
            return seconds
        return self.number(value, field)


_ISO_FRACTION = re.compile(r"(\.\d+)")


def _parse_iso_s(text: str) -> Optional[float]:
    # Python 3.10's fromisoformat takes neither "Z" nor 7-digit (.NET) fractions; normalise both.
    text = text.strip().replace("Z", "+00:00").replace("z", "+00:00")
    text = _ISO_FRACTION.sub(lambda m: m.group(1)[:7].ljust(7, "0"), text, count=1)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def _iter_rows(path: Union[str, Path]) -> Iterator[_Row]:
    """The rows of a JSONL, gzip JSONL or Parquet file, numbered from 1."""
    path = Path(path)
    if not path.is_file():
        raise TraceFormatError(path, "no such file")
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise TraceFormatError(path, f"not valid JSON ({exc.msg} at column {exc.colno})", number) from None
                yield _Row(path, number, data)
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise TraceFormatError(path, f"cannot read as {'gzip ' if opener is gzip.open else ''}JSONL ({exc})") from None


def _parquet_rows(path: Path) -> Iterator[_Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches()
        number = 0
        for batch in batches:
            for data in batch.to_pylist():
                number += 1
                yield _Row(path, number, data)
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(path, f"cannot read as Parquet ({exc})") from None


# ---------------------------------------------------------------- formats
def _read_shapes(path: Path) -> tuple[list[RecordedSession], int, list[str]]:
    sessions, num_rows = [], 0
    for row in _iter_rows(path):
        num_rows += 1
        calls = row.listing(row.require(row.data, "calls", "calls"), "calls")
        if not calls:
            raise row.error("calls", "a session needs at least one call")
        prompts, outputs, gaps = [], [], []
        for k, call in enumerate(calls):
            where = f"calls[{k}]"
            call = row.listing(call, where)
            if len(call) != 3:
                raise row.error(where, f"expected [prompt_tokens, completion_tokens, gap_s], got {call!r}")
            prompts.append(row.integer(call[0], f"{where}[0]", minimum=1))
            outputs.append(row.integer(call[1], f"{where}[1]"))
            if k:
                gaps.append(None if call[2] is None else row.number(call[2], f"{where}[2]", minimum=0.0))
        model = row.text(row.data.get("model", "unknown"), "model")
        session_id = row.text(row.data.get("source", f"{path.name}:{row.row_number}"), "source")
        sessions.append(RecordedSession(session_id, model, tuple(prompts), tuple(outputs), tuple(gaps)))
    return sessions, num_rows, []


@dataclass
class _Round:
    index: int
    prompt_tokens: int
    output_tokens: int
    model: str
    end_s: Optional[float]  # the round's last timing event: its response end
    input_ready_s: Optional[float]  # its latest tool_result / user_message event


def _tracelab_round(row: _Row) -> tuple[str, _Round]:
    data = row.data
    session_id = row.text(row.require(data, "session_id", "session_id"), "session_id")
    index = row.integer(row.require(data, "round_index", "round_index"), "round_index")
    if data.get("input_tokens_total") is not None:
        prompt = row.integer(data["input_tokens_total"], "input_tokens_total", minimum=1)
    else:
        prefix = row.integer(row.require(data, "prefix_tokens", "input_tokens_total"), "prefix_tokens")
        appended = row.integer(row.require(data, "newly_append_tokens", "newly_append_tokens"), "newly_append_tokens")
        prompt = prefix + appended
        if prompt < 1:
            raise row.error("input_tokens_total", "prefix_tokens + newly_append_tokens must be >= 1")
    output = row.integer(row.require(data, "output_tokens", "output_tokens"), "output_tokens")
    model = row.text(data.get("model") or "unknown", "model")
    end_s = ready_s = None
    for j, event in enumerate(row.listing(data.get("timing_events") or [], "timing_events")):
        event = row.mapping(event, f"timing_events[{j}]")
        t = row.timestamp_s(row.require(event, "timestamp", f"timing_events[{j}].timestamp"),
                            f"timing_events[{j}].timestamp")
        end_s = t if end_s is None else max(end_s, t)
        if event.get("event_type") in INPUT_EVENT_TYPES:
            ready_s = t if ready_s is None else max(ready_s, t)
    return session_id, _Round(index, prompt, output, model, end_s, ready_s)


def _read_tracelab(path: Path) -> tuple[list[RecordedSession], int, list[str]]:
    rounds: dict[str, list[_Round]] = defaultdict(list)
    num_rows = 0
    for row in _iter_rows(path):
        num_rows += 1
        session_id, rnd = _tracelab_round(row)
        rounds[session_id].append(rnd)
    sessions, num_duplicates, num_negative = [], 0, 0
    for session_id, session_rounds in rounds.items():
        session_rounds.sort(key=lambda r: r.index)  # stable: file order breaks ties
        unique = [r for k, r in enumerate(session_rounds) if k == 0 or r.index != session_rounds[k - 1].index]
        num_duplicates += len(session_rounds) - len(unique)
        gaps: list[Optional[float]] = []
        for before, after in zip(unique, unique[1:]):
            if before.end_s is None or after.input_ready_s is None:
                gaps.append(None)
                continue
            gap = after.input_ready_s - before.end_s
            num_negative += gap < 0
            gaps.append(max(gap, 0.0))
        sessions.append(RecordedSession(session_id, unique[0].model, tuple(r.prompt_tokens for r in unique),
                                        tuple(r.output_tokens for r in unique), tuple(gaps)))
    notes = []
    if num_duplicates:
        notes.append(f"{num_duplicates} rounds repeat a (session_id, round_index) already read; the first was kept")
    if num_negative:
        notes.append(f"{num_negative} gaps were negative (input event before the previous round's end); set to 0")
    return sessions, num_rows, notes


def _read_copilot(path: Path) -> tuple[list[RecordedSession], int, list[str]]:
    sessions, num_rows, num_empty, num_overlaps = [], 0, 0, 0
    for row in _iter_rows(path):
        num_rows += 1
        session_id = row.text(row.require(row.data, "session_id", "session_id"), "session_id")
        calls = []  # (start_s, end_s, prompt, output, model)
        for t, turn in enumerate(row.listing(row.require(row.data, "turns", "turns"), "turns")):
            turn = row.mapping(turn, f"turns[{t}]")
            for c, call in enumerate(row.listing(turn.get("llm_calls") or [], f"turns[{t}].llm_calls")):
                where = f"turns[{t}].llm_calls[{c}]"
                call = row.mapping(call, where)
                start_s = row.timestamp_s(row.require(call, "timestamp", f"{where}.timestamp"), f"{where}.timestamp")
                duration_ms = row.number(row.require(call, "duration_ms", f"{where}.duration_ms"),
                                         f"{where}.duration_ms", minimum=0.0)
                tokens = row.mapping(row.require(call, "tokens", f"{where}.tokens"), f"{where}.tokens")
                prompt = row.integer(row.require(tokens, "prompt", f"{where}.tokens.prompt"),
                                     f"{where}.tokens.prompt", minimum=1)
                output = row.integer(row.require(tokens, "completion", f"{where}.tokens.completion"),
                                     f"{where}.tokens.completion")
                model = row.text(call.get("model") or "unknown", f"{where}.model")
                calls.append((start_s, start_s + duration_ms / 1000.0, prompt, output, model))
        if not calls:
            num_empty += 1
            continue
        calls.sort(key=lambda call: call[0])
        gaps = []
        for before, after in zip(calls, calls[1:]):
            gap = after[0] - before[1]
            num_overlaps += gap < 0
            gaps.append(max(gap, 0.0))
        sessions.append(RecordedSession(session_id, calls[0][4], tuple(c[2] for c in calls),
                                        tuple(c[3] for c in calls), tuple(gaps)))
    notes = []
    if num_empty:
        notes.append(f"{num_empty} sessions without LLM calls were skipped")
    if num_overlaps:
        notes.append(f"{num_overlaps} calls started before the previous one ended (parallel calls); gaps set to 0")
    return sessions, num_rows, notes


def _read_bailian(path: Path) -> tuple[list[RecordedSession], int, list[str]]:
    requests: dict[int, tuple[int, float, int, int, int]] = {}  # chat_id -> (parent, t, input, output, row)
    num_rows = 0
    for row in _iter_rows(path):
        num_rows += 1
        data = row.data
        chat_id = row.integer(row.require(data, "chat_id", "chat_id"), "chat_id")
        parent = row.integer(row.require(data, "parent_chat_id", "parent_chat_id"), "parent_chat_id", minimum=-1)
        if chat_id in requests:
            raise row.error("chat_id", f"{chat_id} already appeared on row {requests[chat_id][4]}")
        requests[chat_id] = (
            parent,
            row.number(row.require(data, "timestamp", "timestamp"), "timestamp"),
            row.integer(row.require(data, "input_length", "input_length"), "input_length", minimum=1),
            row.integer(row.require(data, "output_length", "output_length"), "output_length"),
            row.row_number,
        )
    roots, num_orphans = _bailian_roots(path, requests)
    by_root: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for chat_id, (_parent, t, prompt, output, _row) in requests.items():
        by_root[roots[chat_id]].append((t, prompt, output))
    sessions = []
    for root, calls in by_root.items():
        calls.sort(key=lambda call: call[0])
        gaps = tuple(after[0] - before[0] for before, after in zip(calls, calls[1:]))
        sessions.append(RecordedSession(str(root), "unknown", tuple(c[1] for c in calls),
                                        tuple(c[2] for c in calls), gaps))
    notes = ["gaps are intervals between request starts (the trace has no response end times): "
             "they include the model's own latency"]
    if num_orphans:
        notes.append(f"{num_orphans} requests name a parent_chat_id missing from the file; each starts a session")
    return sessions, num_rows, notes


def _bailian_roots(path: Path, requests: dict[int, tuple]) -> tuple[dict[int, int], int]:
    """chat_id -> the root its parent chain leads to, and how many chains end at a missing parent."""
    roots: dict[int, int] = {}
    num_orphans = 0
    for chat_id in requests:
        chain = []
        node = chat_id
        while node not in roots:
            chain.append(node)
            parent = requests[node][0]
            if parent == -1:
                roots[node] = node
                break
            if parent not in requests:
                num_orphans += 1
                roots[node] = node
                break
            if parent in chain:
                raise TraceFormatError(path, f"parent_chat_id chain of chat {chat_id} loops back to {parent}",
                                       requests[chat_id][4], "parent_chat_id")
            node = parent
        for member in chain:
            roots[member] = roots[node]
    return roots, num_orphans


FORMATS: dict[str, Callable[[Path], tuple[list[RecordedSession], int, list[str]]]] = {
    "shapes": _read_shapes,
    "tracelab": _read_tracelab,
    "copilot": _read_copilot,
    "bailian": _read_bailian,
}


def load_trace(path: Union[str, Path], format: str) -> LoadedTrace:
    """Every session of ``path`` read as ``format`` (one of :data:`FORMATS`)."""
    try:
        reader = FORMATS[format]
    except KeyError:
        raise ValueError(f"unknown trace format {format!r}; formats: {sorted(FORMATS)}") from None
    path = Path(path)
    sessions, num_rows, notes = reader(path)
    if not sessions:
        raise TraceFormatError(path, f"no sessions in {num_rows} rows")
    return LoadedTrace(str(path), format, tuple(sessions), num_rows, tuple(notes))


def swebench_shapes_path() -> Path:
    """The shipped SWE-bench agent shapes (package data; see data/README.md for provenance)."""
    return Path(str(resources.files(__package__).joinpath("data", SWEBENCH_FILE)))


def load_swebench() -> LoadedTrace:
    return load_trace(swebench_shapes_path(), "shapes")

