"""Requests on a recorded clock: the rows a replay sends at their recorded times (loadgen's
``workload.replay``; docs/replay.md).

Three formats, one request a row:

* ``llmservingsim``: LLMServingSim's workload JSONL: ``arrival_time_ns`` (ns from the trace's
  start), ``input_toks``, ``output_toks``, optional ``input_tok_ids`` (the prompt's token ids).
* ``mooncake``: ``timestamp`` (ms), ``input_length`` (the whole prompt), ``output_length``,
  optional ``hash_ids`` (one id per ``block_tokens`` tokens of the prompt, the last block maybe
  partial: two requests share exactly the prefix whose ids they share) and ``session_id``.
* ``aiperf``: AIPerf's fixed-schedule rows (its ``mooncake_trace`` dataset): the same fields as
  ``mooncake``, but a row of a session (``session_id``) records what the turn *adds*: AIPerf sends
  the history (every earlier input and its answer) before it, so turn k's prompt is the sum of
  inputs 0..k and outputs 0..k-1.

Rows of one ``session_id`` are one session in time order: a later turn is sent at its recorded
time, or when the earlier turn's answer arrives if that is later (a closed loop inside a session,
an open loop across sessions, as AIPerf replays). A row without one is a session of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Union

from .rows import FileRows, Row, RowSource, TraceFormatError

TIMED_FORMATS = ("llmservingsim", "mooncake", "aiperf")


@dataclass(frozen=True)
class TimedRequest:
    row: int  # the row's 1-based number in its file
    t_s: float  # recorded send time, seconds from the trace's start (as recorded, not shifted)
    input_tokens: int  # the whole prompt
    output_tokens: int
    session_id: Optional[str] = None
    token_ids: Optional[tuple[int, ...]] = None  # the prompt's ids (llmservingsim input_tok_ids)
    hash_ids: Optional[tuple[int, ...]] = None  # one per block_tokens tokens of the prompt
    added_tokens: int = 0  # aiperf session rows: the tokens this turn adds (its prompt has the history)


@dataclass(frozen=True)
class TimedTrace:
    path: str
    format: str
    requests: tuple[TimedRequest, ...]  # in send order (time, then file order)
    block_tokens: int  # what a hash id stands for
    notes: tuple[str, ...] = ()

    def sessions(self) -> list[tuple[TimedRequest, ...]]:
        """The requests grouped into sessions, ordered by their first request; a request without
        a session id is a session of its own."""
        groups: dict[object, list[TimedRequest]] = {}
        for k, req in enumerate(self.requests):
            key = ("s", req.session_id) if req.session_id is not None else ("r", k)
            groups.setdefault(key, []).append(req)
        return [tuple(g) for g in groups.values()]

    @property
    def span_s(self) -> float:
        return self.requests[-1].t_s if self.requests else 0.0


def guess_timed_format(path: Union[str, Path]) -> Optional[str]:
    """The timed format whose fields the file's first row has (``arrival_time_ns``: llmservingsim;
    ``timestamp`` with ``input_length``: mooncake), else None."""
    try:
        row = next(iter(FileRows(path)), None)
    except TraceFormatError:
        return None
    if row is None:
        return None
    keys = set(row.data)
    if {"arrival_time_ns", "input_toks"} <= keys:
        return "llmservingsim"
    if {"timestamp", "input_length"} <= keys:
        return "mooncake"
    return None


def load_timed(path: Union[str, Path], format: Optional[str] = None, block_tokens: int = 512) -> TimedTrace:
    """The timed requests of ``path`` (``format`` guessed from the first row when None). A row that
    cannot be read raises TraceFormatError naming its line and field; rows out of time order are
    sorted (stably) with a note."""
    if format is None:
        format = guess_timed_format(path)
        if format is None:
            raise TraceFormatError(path, "cannot tell the format from the first row (expected arrival_time_ns "
                                         "and input_toks: llmservingsim; timestamp and input_length: mooncake); "
                                         f"name it: replay.format: one of {', '.join(TIMED_FORMATS)}")
    if format not in TIMED_FORMATS:
        raise ValueError(f"unknown replay format {format!r}; expected one of {', '.join(TIMED_FORMATS)}")
    return timed_from_rows(FileRows(path), format, block_tokens)


def timed_from_rows(rows: RowSource, format: str, block_tokens: int = 512) -> TimedTrace:
    read = _llmservingsim_row if format == "llmservingsim" else _mooncake_row
    requests = [read(row, block_tokens) for row in rows]
    if not requests:
        raise TraceFormatError(rows.name, "no requests (the file has no rows)")
    notes = []
    silent = sum(1 for r in requests if r.output_tokens == 0)
    if silent:  # an engine generates at least one token
        notes.append(f"{silent} row{'s' if silent != 1 else ''} with 0 output tokens: replayed with 1")
        requests = [r if r.output_tokens else replace(r, output_tokens=1) for r in requests]
    times = [r.t_s for r in requests]
    if times != sorted(times):
        moved = sum(1 for a, b in zip(times, times[1:]) if b < a)
        notes.append(f"{moved} row{'s' if moved != 1 else ''} earlier than the row before: sorted by time "
                     "(file order breaks ties)")
        requests.sort(key=lambda r: r.t_s)  # stable: file order breaks ties
    if format == "aiperf":
        requests = _with_history(requests)
    return TimedTrace(str(rows.name), format, tuple(requests), block_tokens, tuple(notes))


def _llmservingsim_row(row: Row, block_tokens: int) -> TimedRequest:
    data = row.data
    t_ns = row.number(row.require(data, "arrival_time_ns", "arrival_time_ns"), "arrival_time_ns", minimum=0)
    prompt = row.integer(row.require(data, "input_toks", "input_toks"), "input_toks", minimum=1)
    output = row.integer(row.require(data, "output_toks", "output_toks"), "output_toks", minimum=1)
    ids = None
    if data.get("input_tok_ids") is not None:
        raw = row.listing(data["input_tok_ids"], "input_tok_ids")
        if len(raw) != prompt:
            raise row.error("input_tok_ids", f"holds {len(raw)} ids, but input_toks is {prompt}")
        ids = tuple(row.integer(t, f"input_tok_ids[{k}]") for k, t in enumerate(raw))
    session = data.get("session_id")
    return TimedRequest(row.row_number, t_ns / 1e9, prompt, output,
                        row.text(session, "session_id") if session is not None else None, ids)


def _mooncake_row(row: Row, block_tokens: int) -> TimedRequest:
    data = row.data
    t_ms = row.number(row.require(data, "timestamp", "timestamp"), "timestamp", minimum=0)
    prompt = row.integer(row.require(data, "input_length", "input_length"), "input_length", minimum=1)
    output = row.integer(row.require(data, "output_length", "output_length"), "output_length")
    hashes = None
    if data.get("hash_ids") is not None:
        raw = row.listing(data["hash_ids"], "hash_ids")
        hashes = tuple(row.integer(h, f"hash_ids[{k}]") for k, h in enumerate(raw))
        most = -(-prompt // block_tokens)  # fewer: the tokens after the last id are the request's own
        if len(hashes) > most:
            raise row.error("hash_ids", f"holds {len(hashes)} ids, but input_length {prompt} fills at most {most} "
                                        f"blocks of {block_tokens} tokens (replay.block_tokens)")
    session = data.get("session_id")
    return TimedRequest(row.row_number, t_ms / 1e3, prompt, output,
                        row.text(session, "session_id") if session is not None else None, None, hashes, prompt)


def _with_history(requests: list[TimedRequest]) -> list[TimedRequest]:
    """AIPerf's session rows record what a turn adds; its prompt is the history before it."""
    history: dict[str, int] = {}
    out = []
    for r in requests:
        if r.session_id is None:
            out.append(r)
            continue
        before = history.get(r.session_id, 0)
        history[r.session_id] = before + r.input_tokens + r.output_tokens
        out.append(replace(r, input_tokens=before + r.input_tokens))
    return out
