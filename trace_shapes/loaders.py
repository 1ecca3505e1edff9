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
``mooncake``
    One request a row (kvcache-ai/Mooncake): ``timestamp`` (ms), ``input_length``,
    ``output_length``, ``hash_ids`` (512-token block hashes), optional ``session_id`` and
    ``delay``; sessions by session_id or by block-hash continuation, cross-session prefixes from
    shared hashes (``trace_shapes/mooncake.py``).
``aiperf``
    AIPerf's multi-turn inputs: ``multi_turn`` rows (``session_id``, ``turns[]``) and session
    rows of its ``mooncake_trace`` type; turn inputs accumulate with the responses
    (``trace_shapes/aiperf.py``).
``calls``
    One call a row, generic (``session_id``, ``input_tokens`` or ``new_input_tokens``,
    ``output_tokens``, optional ``turn_index``, ``gap_s``, ``timestamp_s``, ``model``): for any
    table, e.g. a Hugging Face dataset with its columns renamed (``trace_shapes/calls.py``).

A Hugging Face dataset is read through the same formats (``trace_shapes/hf.py``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Optional, Union

from .aiperf import read_aiperf
from .calls import read_calls
from .mooncake import read_mooncake
from .records import RecordedSession
from .rows import FileRows, LoaderOptions, Row, RowSource, TraceFormatError
from .tree_loaders import TREE_FORMATS

SWEBENCH_FILE = "swebench_agent_shapes.jsonl"
INPUT_EVENT_TYPES = frozenset({"tool_result", "user_message"})


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


# ---------------------------------------------------------------- formats
def _read_shapes(rows: RowSource, options: "LoaderOptions") -> tuple[list[RecordedSession], int, list[str]]:
    sessions, num_rows = [], 0
    for row in rows:
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
        session_id = row.text(row.data.get("source", f"{Path(rows.name).name}:{row.row_number}"), "source")
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


def _tracelab_round(row: Row) -> tuple[str, _Round]:
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


def _read_tracelab(rows: RowSource, options: "LoaderOptions") -> tuple[list[RecordedSession], int, list[str]]:
    rounds: dict[str, list[_Round]] = defaultdict(list)
    num_rows = 0
    for row in rows:
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


def _read_copilot(rows: RowSource, options: "LoaderOptions") -> tuple[list[RecordedSession], int, list[str]]:
    sessions, num_rows, num_empty, num_overlaps = [], 0, 0, 0
    for row in rows:
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


def _read_bailian(rows: RowSource, options: "LoaderOptions") -> tuple[list[RecordedSession], int, list[str]]:
    requests: dict[int, tuple[int, float, int, int, int]] = {}  # chat_id -> (parent, t, input, output, row)
    num_rows = 0
    for row in rows:
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
    roots, num_orphans = _bailian_roots(rows.name, requests)
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


def _bailian_roots(path: str, requests: dict[int, tuple]) -> tuple[dict[int, int], int]:
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


Reader = Callable[[RowSource, LoaderOptions], tuple[list[RecordedSession], int, list[str]]]

FORMATS: dict[str, Reader] = {
    "shapes": _read_shapes,
    "tracelab": _read_tracelab,
    "copilot": _read_copilot,
    "bailian": _read_bailian,
    "mooncake": read_mooncake,
    "aiperf": read_aiperf,
    "calls": read_calls,
}


def load_rows(rows: RowSource, format: str, options: Optional[LoaderOptions] = None) -> LoadedTrace:
    """Every session of a row source read as ``format`` (one of :data:`FORMATS`)."""
    try:
        reader = FORMATS[format]
    except KeyError:
        hint = " (a session-tree format: load_trees reads it)" if format in TREE_FORMATS else ""
        raise ValueError(f"unknown trace format {format!r}{hint}; formats: {sorted(FORMATS)}") from None
    sessions, num_rows, notes = reader(rows, options or LoaderOptions())
    if not sessions:
        raise TraceFormatError(rows.name, f"no sessions in {num_rows} rows")
    return LoadedTrace(rows.name, format, tuple(sessions), num_rows, tuple(notes))


def load_trace(path: Union[str, Path], format: str, options: Optional[LoaderOptions] = None) -> LoadedTrace:
    """Every session of the file ``path`` read as ``format`` (one of :data:`FORMATS`)."""
    return load_rows(FileRows(path), format, options)


def swebench_shapes_path() -> Path:
    """The shipped SWE-bench agent shapes (package data; see data/README.md for provenance)."""
    return Path(str(resources.files(__package__).joinpath("data", SWEBENCH_FILE)))


def load_swebench() -> LoadedTrace:
    return load_trace(swebench_shapes_path(), "shapes")

