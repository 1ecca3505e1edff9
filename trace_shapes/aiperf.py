"""AIPerf's multi-turn inputs (ai-dynamo/aiperf custom datasets), field names as in its loaders.

Two row shapes, told apart by whether the row has ``turns``:

* ``multi_turn``: ``{"session_id": ..., "turns": [{"text": ... | "texts": [...], "delay": ms |
  "timestamp": ms, "output_length": ..., "role": ...}, ...]}``; rows with the same session_id
  are one session, their turns in file order. A leading text-only ``role: "system"`` turn is, as
  in AIPerf, not a request but a system prompt sent before every turn.
* ``mooncake_trace`` session rows: ``{"session_id": ..., "input_length" | "text_input": ...,
  "output_length": ..., "delay": ms | "timestamp": ms, "hash_ids": [...]}``, one turn a row.

AIPerf replays both the same way (its ``deltas_without_responses`` context mode): a turn's
input is what the turn *adds*, and each request sends the history (the system prompt, every
earlier input and the model's response to it) followed by the new input. So turn k's prompt is
system + sum of inputs 0..k + sum of outputs 0..k-1; the chat template's few tokens per message
are not counted. ``delay`` is the think time AIPerf waits after the previous turn before sending
this one (the gap); ``timestamp`` is a send time, so gaps between timestamps include the model's
latency. A row without session_id is a session of its own.

Text is counted with a local tokenizer (``LoaderOptions.tokenizer``, the ``tokenizers``
library); without one, a text turn is an error naming it. A turn without ``output_length`` takes
``LoaderOptions.default_output_tokens`` (AIPerf's ``--osl``). Sessions whose system prompts
are the same text share it as a cross-session prefix in replay.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .records import RecordedSession
from .rows import LoaderOptions, Row, RowSource, TraceFormatError, gap_between


@dataclass
class _Turn:
    input_tokens: int
    output_tokens: int
    delay_s: Optional[float]
    timestamp_s: Optional[float]


@dataclass
class _Session:
    first_row: int
    system_text: Optional[str] = None
    system_tokens: int = 0

    def __post_init__(self) -> None:
        self.turns: list[_Turn] = []


WORDS_NOTE = ("no tokenizer given: text is counted one token per whitespace-separated word, as serve-sim counts it "
              "without --tokenizer; a model's tokenizer counts more (give its tokenizer.json: spec field tokenizer, "
              "shapes describe --tokenizer)")


def count_words(text: str) -> int:
    """The default token count of a text: serve-sim's without a tokenizer, one token per word."""
    return len(text.split())


def token_counter(tokenizer: Optional[str], source: str) -> Optional[Callable[[str], int]]:
    """Tokens of a text by a local Hugging Face tokenizer (a tokenizer.json or a directory with one)."""
    if tokenizer is None:
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TraceFormatError(source, "counting text tokens needs the `tokenizers` library: "
                                       "pip install 'agent-loadgen[traces]'") from None
    path = Path(tokenizer).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise TraceFormatError(source, f"tokenizer: no such file: {path} (a tokenizer.json, or a directory with one)")
    try:
        loaded = Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a file it cannot parse
        raise TraceFormatError(source, f"tokenizer: cannot read {path} as a Hugging Face tokenizer ({exc})") from None
    return lambda text: len(loaded.encode(text, add_special_tokens=False).ids)


class _Reader:
    def __init__(self, rows: RowSource, options: LoaderOptions) -> None:
        self.rows, self.options = rows, options
        self.count: Optional[Callable[[str], int]] = None
        self.counter_loaded = False
        self.counted_words = False

    def tokens_of(self, row: Row, text: str, field: str) -> int:
        if not self.counter_loaded:
            self.count, self.counter_loaded = token_counter(self.options.tokenizer, self.rows.name), True
        if self.count is None:
            self.count, self.counted_words = count_words, True
        return self.count(text)

    def output(self, row: Row, obj: dict, field: str) -> int:
        if obj.get("output_length") is None:
            if self.options.default_output_tokens is None:
                raise row.error(field, "missing (AIPerf takes it from --osl: give it per turn, or set "
                                       "default_output_tokens)")
            return self.options.default_output_tokens
        return row.integer(obj["output_length"], field, minimum=1)

    def timing(self, row: Row, obj: dict, where: str) -> tuple[Optional[float], Optional[float]]:
        delay, timestamp = obj.get("delay"), obj.get("timestamp")
        if delay and timestamp:  # AIPerf refuses both (a zero counts as unset there too)
            raise row.error(f"{where}delay", "timestamp and delay cannot be set together")
        return (None if delay is None else row.number(delay, f"{where}delay", minimum=0.0) / 1000.0,
                None if timestamp is None else row.number(timestamp, f"{where}timestamp", minimum=0.0) / 1000.0)

    def turn_text(self, row: Row, turn: dict, where: str) -> Optional[tuple[str, str]]:
        if turn.get("text") is not None:
            return row.text(turn["text"], f"{where}text"), f"{where}text"
        if turn.get("texts") is None:
            return None
        contents = []
        for k, entry in enumerate(row.listing(turn["texts"], f"{where}texts")):
            if isinstance(entry, dict):  # {"name": ..., "contents": [...]}
                contents += row.listing(row.require(entry, "contents", f"{where}texts[{k}].contents"),
                                        f"{where}texts[{k}].contents")
            else:
                contents.append(entry)
        if len(contents) != 1:
            raise row.error(f"{where}texts", f"{len(contents)} texts in one turn are a client-side batch "
                                             f"(several requests in AIPerf), not one session turn")
        return row.text(contents[0], f"{where}texts"), f"{where}texts"

    def read(self) -> tuple[list[RecordedSession], int, list[str]]:
        sessions: dict[str, _Session] = {}
        num_rows = num_hoisted = 0
        for row in self.rows:
            num_rows += 1
            data = row.data
            session_id = (row.text(data["session_id"], "session_id") if data.get("session_id") is not None
                          else f"row{row.row_number}")
            session = sessions.setdefault(session_id, _Session(row.row_number))
            if data.get("turns") is not None:
                num_hoisted += self._multi_turn(row, session)
            else:
                self._trace_row(row, session)
        result = []
        num_timestamp_gaps = 0
        for session_id, session in sessions.items():
            if not session.turns:
                raise TraceFormatError(self.rows.name, f"session {session_id!r} has no turn besides its system prompt",
                                       session.first_row, "turns")
            prompts, context, gaps = [], session.system_tokens, []
            for k, turn in enumerate(session.turns):
                context += turn.input_tokens
                prompts.append(context)
                context += turn.output_tokens
                if k:
                    gap, from_timestamps = gap_between(turn.delay_s, session.turns[k - 1].timestamp_s,
                                                       turn.timestamp_s)
                    gaps.append(gap)
                    num_timestamp_gaps += from_timestamps
            key = (hashlib.sha256(session.system_text.encode()).hexdigest()[:16]
                   if session.system_text is not None else None)
            result.append(RecordedSession(session_id, "unknown", tuple(prompts),
                                          tuple(t.output_tokens for t in session.turns), tuple(gaps),
                                          shared_prefix_tokens=session.system_tokens if key else None,
                                          prefix_key=key))
        notes = ["turn inputs are appended to the history with the previous responses (AIPerf's "
                 "deltas_without_responses); chat template tokens are not counted"]
        if num_hoisted:
            notes.append(f"{num_hoisted} leading system turns are system prompts sent before every turn; "
                         f"sessions with the same system text share it as a prefix")
        if num_timestamp_gaps:
            notes.append(f"{num_timestamp_gaps} gaps are intervals between timestamps: they include the model's latency")
        if self.counted_words:
            notes.append(WORDS_NOTE)
        return result, num_rows, notes

    def _multi_turn(self, row: Row, session: _Session) -> int:
        num_hoisted = 0
        for k, turn in enumerate(row.listing(row.data["turns"], "turns")):
            where = f"turns[{k}]."
            turn = row.mapping(turn, f"turns[{k}]")
            text = self.turn_text(row, turn, where)
            if text is None:
                raise row.error(f"turns[{k}]", "expected text or texts (other modalities are not token counts)")
            leading_system = (turn.get("role") == "system" and not session.turns and session.system_text is None
                              and all(turn.get(f) is None for f in ("timestamp", "delay", "output_length")))
            if leading_system:
                session.system_text = text[0]
                session.system_tokens = self.tokens_of(row, *text)
                num_hoisted += 1
                continue
            delay, timestamp = self.timing(row, turn, where)
            session.turns.append(_Turn(self.tokens_of(row, *text), self.output(row, turn, f"{where}output_length"),
                                       delay, timestamp))
        return num_hoisted

    def _trace_row(self, row: Row, session: _Session) -> None:
        data = row.data
        if data.get("input_length") is not None:
            tokens = row.integer(data["input_length"], "input_length", minimum=1)
        elif data.get("text_input") is not None:
            tokens = self.tokens_of(row, row.text(data["text_input"], "text_input"), "text_input")
        elif data.get("messages") is not None or data.get("payload") is not None:
            raise row.error("messages" if data.get("messages") is not None else "payload",
                            "pre-built messages and payloads carry their own context; not replayable as token "
                            "counts (give input_length)")
        else:
            raise row.error("input_length", "missing (expected input_length, text_input or turns)")
        delay, timestamp = self.timing(row, data, "")
        session.turns.append(_Turn(tokens, self.output(row, data, "output_length"), delay, timestamp))


def read_aiperf(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedSession], int, list[str]]:
    return _Reader(rows, options).read()
