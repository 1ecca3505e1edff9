"""Per-run results written as the run goes (docs/results-format.md).

Rows are buffered in columns and written every ``flush_interval_s`` of run time, appended as
one more record batch to an Arrow IPC stream per table under ``<run>/.parts/``
(``<table>-stream.arrows``: a third of the cost of a new file per flush, and only ever read to
recover a run); closing the run merges them into ``turns.parquet``, ``samples.parquet`` and
``sessions.parquet``. If the process dies mid-run, ``recover_runs`` merges the batches on disk
(a batch cut short by the crash is dropped), so a crash loses at most one flush interval (and the
rows of sessions still in the system, written only at close).
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from .arrow_numpy import array

TURN_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("arm", pa.string()), ("seed", pa.int64()),
    ("session_id", pa.int64()), ("turn_index", pa.int32()), ("is_trigger_session", pa.bool_()),
    ("session_kind", pa.string()), ("ready_s", pa.float64()), ("admit_s", pa.float64()),
    ("first_token_s", pa.float64()), ("finish_s", pa.float64()), ("prompt_tokens", pa.int64()),
    ("cached_tokens", pa.int64()), ("output_tokens", pa.int64()), ("gateway_wait_s", pa.float64()),
    ("num_preemptions", pa.int32()), ("error", pa.string()),
    ("itl_mean_s", pa.float64()), ("itl_max_s", pa.float64()),
    # added with chat prompts (docs/results-format.md#turnsparquet): the length the session planned
    # (prompt_tokens is what the engine reports, usage.prompt_tokens live) and, of the previous
    # turn's prompt + output, the tokens this prompt does not start with (-1: unknown)
    ("planned_prompt_tokens", pa.int64()), ("retokenization_drift_tokens", pa.int64()),
    # added with the ideal hit ratio (loadgen/analysis/ideal.py): the longest prefix of this prompt
    # an infinite cache would hold when it was sent; null in rows written without it
    ("cacheable_prefix_tokens", pa.int64()),
    # added with retried turns' latency: a row per attempt, all of a turn's rows with the turn's
    # ready_s and admit_s; attempt 1, 2, ...; when this attempt was sent; the output it asked for
    # (fewer output_tokens on a successful row: the server cut the output short)
    ("attempt", pa.int32()), ("submitted_s", pa.float64()), ("planned_output_tokens", pa.int64()),
])

# added with deployments (docs/deployments.md#records), only in the turns of runs on a deployment
# (one engine writes the table it wrote before): the replica that served the turn, and of its
# missed prompt tokens those the prefix of which was resident only on another replica (routing)
# or had been resident on this one (eviction); the rest of the miss is the workload's
DEPLOYMENT_TURN_FIELDS = [("replica", pa.int32()), ("miss_routing_tokens", pa.int64()),
                          ("miss_eviction_tokens", pa.int64())]
DEPLOYMENT_TURN_SCHEMA = pa.schema(list(TURN_SCHEMA) + [pa.field(n, t) for n, t in DEPLOYMENT_TURN_FIELDS])

# added with session trees (docs/results-format.md#session-trees), only in runs whose workload is
# trees (a run of linear sessions writes the tables it wrote before): the session that spawned or
# forked this one (null for a tree's root), the tree (its root's session id) and the depth (0: root)
# and the session's own id in a replayed trace (a tree file's conversation or agent name; null in
# a drawn tree), as the numeric ids say nothing of it
TREE_FIELDS = [("parent_session_id", pa.int64()), ("tree_id", pa.int64()), ("depth", pa.int32()),
               ("trace_session_id", pa.string())]
# and on a root's sessions.parquet row: the sessions its tree started, and when the last of them
# ended (null when some had not ended by the end of the run)
TREE_ROOT_FIELDS = [("tree_num_sessions", pa.int32()), ("tree_finish_s", pa.float64())]
# and on turns: the tokens this prompt appends from the children it waited for at a join (0: no join)
# after_join: the turn's prompt follows a join (its parent waited for children), whatever tokens
# the join appended (a recorded trace's next prompt already holds the children's results: 0)
TREE_TURN_FIELDS = [("joined_tokens", pa.int64()), ("after_join", pa.bool_())]

SAMPLE_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t_s", pa.float64()),
    ("sessions_in_system", pa.int64()), ("sessions_thinking", pa.int64()),
    ("sessions_gateway_waiting", pa.int64()), ("sessions_parked", pa.int64()),
    ("sessions_in_engine", pa.int64()), ("num_running", pa.int64()), ("num_waiting", pa.int64()),
    ("kv_usage", pa.float64()), ("resident_demand_tokens", pa.int64()), ("resident_demand_ratio", pa.float64()),
    ("pool_tokens", pa.int64()), ("prefix_cache_queries_total", pa.int64()),
    ("prefix_cache_hits_total", pa.int64()), ("num_preemptions_total", pa.int64()),
    ("turns_completed_total", pa.int64()), ("sessions_arrived_total", pa.int64()),
    ("sessions_completed_total", pa.int64()), ("gateway_limit", pa.float64()),
    ("sessions_admitted", pa.int64()),
])

SESSION_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("arm", pa.string()), ("seed", pa.int64()),
    ("session_id", pa.int64()), ("is_trigger_session", pa.bool_()), ("session_kind", pa.string()),
    ("num_turns", pa.int32()), ("arrival_s", pa.float64()), ("first_admit_s", pa.float64()),
    ("finish_s", pa.float64()), ("turns_completed", pa.int32()), ("num_parks", pa.int32()),
    ("status", pa.string()), ("error", pa.string()),
])

# one row per replica per sample, for live runs whose engine lists metrics_urls (loadgen/live/replicas.py)
REPLICA_SAMPLE_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("t_s", pa.float64()), ("replica_index", pa.int32()), ("replica_url", pa.string()),
    ("scraped", pa.bool_()), ("num_running", pa.int64()), ("num_waiting", pa.int64()), ("kv_usage", pa.float64()),
    ("pool_tokens", pa.int64()), ("prefix_cache_queries_total", pa.int64()), ("prefix_cache_hits_total", pa.int64()),
    ("num_preemptions_total", pa.int64()),
])

TABLES = {"turns": TURN_SCHEMA, "samples": SAMPLE_SCHEMA, "sessions": SESSION_SCHEMA}
# written only by the runs that have rows for them (no empty file in every other run)
OPTIONAL_TABLES = {"replica_samples": REPLICA_SAMPLE_SCHEMA}
PARTS_DIR = ".parts"
# a part file's suffixes: an Arrow IPC stream per table, and the parts of runs written by earlier
# versions: an Arrow IPC file or a Parquet file per table per flush (``<table>-NNNNN.arrow``)
STREAM_SUFFIX = ".arrows"
PART_SUFFIXES = (STREAM_SUFFIX, ".arrow", ".parquet")


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, allow_nan=False, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


class _Columns:
    """A table's rows as they come (one tuple a row: one append per row, not one per column),
    turned into columns when they are written."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.names = schema.names
        self.rows: list[tuple] = []
        # per column its Arrow type and how a typed copy takes it, looked up once (hashing an
        # Arrow type formats it as text)
        self._kinds = [(f.type, _TYPED_KINDS.get(f.type, _OTHER)) for f in schema]

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, row: tuple) -> None:
        self.rows.append(row)

    def take(self) -> pa.Table:
        rows = self.rows
        if _COMPILED and rows:
            arrays = []
            for j, (arrow_type, kind) in enumerate(self._kinds):
                dense = _typed_column(rows, j, kind) if kind != _OTHER else None
                if dense is None:
                    arrays.append(array([row[j] for row in rows], arrow_type))
                else:
                    arrays.append(_dense_array(dense, arrow_type, kind))
        else:
            columns = zip(*rows) if rows else [()] * len(self.names)
            arrays = [array(list(c), f.type) for c, f in zip(columns, self.schema)]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        self.rows = []
        return table


# Compiled (setup.py), a column of exact floats, ints or bools is copied into its NumPy array by a
# typed loop, ~10x cheaper per value than NumPy's conversion of a Python list (most of a flush's
# cost); anything else, and every column when this module runs as Python (where that loop would be
# the slow one), goes through ``array`` as a list. Either way ``array`` builds the Arrow array from
# the same values, so the bytes are the same.
_COMPILED = not __file__.endswith(".py")
_FLOAT, _INT, _BOOL, _OTHER = 0, 1, 2, 3
_TYPED_KINDS = {pa.float64(): _FLOAT, pa.int64(): _INT, pa.int32(): _INT, pa.bool_(): _BOOL}


def _dense_array(dense: np.ndarray, arrow_type: pa.DataType, kind: int) -> pa.Array:
    """``array(dense, arrow_type)`` for a column ``_typed_column`` copied (no nulls, one dtype),
    straight from its buffer: the checks ``array`` makes of any NumPy array are settled here."""
    n = len(dense)
    if kind == _BOOL:
        return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(np.packbits(dense, bitorder="little"))],
                                     null_count=0)
    if arrow_type == _INT32:
        if n and (dense.min() < _INT32_MIN or dense.max() > _INT32_MAX):
            return array(dense, arrow_type)  # out of range: refused as array refuses it
        dense = dense.astype(np.int32)
    return pa.Array.from_buffers(arrow_type, n, [None, pa.py_buffer(dense)], null_count=0)


_INT32 = pa.int32()
_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _typed_column(rows: list, j: int, kind: int) -> Optional[np.ndarray]:
    """Column ``j`` of ``rows`` as float64, int64 or bool when every value is exactly a float, an
    int (within int64) or a bool; else None."""
    n = len(rows)
    if kind == _FLOAT:
        out = np.empty(n, dtype=np.float64)
        float_buf = out
        for i in range(n):
            row = rows[i]
            value = row[j]
            if type(value) is not float:
                return None
            float_buf[i] = value
        return out
    if kind == _INT:
        out = np.empty(n, dtype=np.int64)
        int_buf = out
        try:
            for i in range(n):
                row = rows[i]
                value = row[j]
                if type(value) is not int:
                    return None
                int_buf[i] = value
        except OverflowError:
            return None
        return out
    out = np.empty(n, dtype=np.uint8)
    byte_buf = out
    for i in range(n):
        row = rows[i]
        value = row[j]
        if value is True:
            byte_buf[i] = 1
        elif value is False:
            byte_buf[i] = 0
        else:
            return None
    return out.view(np.bool_)


class RunRecorder:
    """Collects one run's turns and samples; writes them as the run goes."""

    def __init__(self, run_dir: Optional[Path], run_id: str, arm: str, seed: int, flush_interval_s: float,
                 writer: Optional[Executor] = None, replica_columns: bool = False, tree_columns: bool = False) -> None:
        # run_dir None keeps the rows in memory (``tables()``): `loadgen map` runs thousands of
        # runs and keeps only one outcome row each, so writing their Parquet would be waste.
        # ``writer``: writes the Parquet parts off the caller's thread (a live run's event loop,
        # where a write of thousands of rows would hold up the arrivals due meanwhile); one
        # worker, so they land in order. A failed write is raised by the next flush or close.
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_id = run_id
        self.arm = arm
        self.seed = seed
        self.flush_interval_s = flush_interval_s
        self._next_flush_s = flush_interval_s
        self._in_memory: Optional[dict[str, list[pa.Table]]] = None
        if self.run_dir is None:
            self._in_memory = {name: [] for name in (*TABLES, *OPTIONAL_TABLES)}
        else:
            self._parts = self.run_dir / PARTS_DIR
            self._parts.mkdir(parents=True, exist_ok=True)
        # the parts written so far, kept so that closing merges them without reading them back
        self._written: dict[str, list[pa.Table]] = {name: [] for name in (*TABLES, *OPTIONAL_TABLES)}
        self._writer = writer
        self._writes: list[Future] = []
        self._streams: dict[str, tuple] = {}  # table -> (file, IPC stream writer), from its first flush
        # ``replica_columns``: turns get DEPLOYMENT_TURN_FIELDS (a run on a deployment)
        self.replica_columns = replica_columns
        turn_schema = DEPLOYMENT_TURN_SCHEMA if replica_columns else TURN_SCHEMA
        session_schema = SESSION_SCHEMA
        # ``tree_columns``: turns and sessions get TREE_FIELDS (a run of session trees); a root's
        # sessions row waits for its tree to end (``tree_ended``) or for ``close``
        self.tree_columns = tree_columns
        self._tree_of: dict[int, tuple] = {}  # session id -> (parent, tree id, depth, trace session id)
        self._root_rows: dict[int, tuple] = {}  # tree id -> its root's row, until the tree ends
        self._trees_ended: dict[int, tuple] = {}  # tree id -> (sessions, finish_s), until the root's row
        self._joined: dict[tuple, int] = {}  # (session id, turn) -> tokens its joins append, until it succeeds
        if tree_columns:
            turn_schema = pa.schema(list(turn_schema) + [pa.field(n, t) for n, t in TREE_FIELDS + TREE_TURN_FIELDS])
            session_schema = pa.schema(list(SESSION_SCHEMA) + [pa.field(n, t) for n, t in TREE_FIELDS + TREE_ROOT_FIELDS])
        self._turns = _Columns(turn_schema)
        self._samples = _Columns(SAMPLE_SCHEMA)
        self._sessions = _Columns(session_schema)
        self._replica_samples = _Columns(REPLICA_SAMPLE_SCHEMA)
        self._open_sessions: dict[int, _OpenSession] = {}
        self.turns_completed = 0

    # A session's row is written when it ends; ``close`` writes the rows of the sessions still
    # in the system (status in_system), so a cohort's unfinished sessions are never missing.
    def session_arrived(self, session_id: int, is_trigger: bool, kind: str, num_turns: int,
                        arrival_s: float) -> None:
        self._open_sessions[session_id] = _OpenSession(is_trigger, kind, num_turns, arrival_s)

    def session_admitted(self, session_id: int, admit_s: float) -> None:
        self._open_sessions[session_id].first_admit_s = admit_s

    def session_parked(self, session_id: int) -> None:
        self._open_sessions[session_id].num_parks += 1

    def gateway_held(self, session_id: int, turn_index: int, admit_s: float) -> None:
        """A gateway between the client and the engine held the session's turn until ``admit_s``
        (live, through loadgen gateway): the first turn's is its admission, a later one a park."""
        session = self._open_sessions[session_id]
        if turn_index == 0:
            session.first_admit_s = admit_s
        else:
            session.num_parks += 1

    def session_ended(self, session_id: int, end_s: float) -> None:
        session = self._open_sessions.pop(session_id)
        status = "completed" if session.turns_completed == session.num_turns else "failed"
        self._session_row(session_id, session, end_s, status)

    def session_crashed(self, session_id: int, is_trigger: bool, kind: str, num_turns: int, arrival_s: float,
                        end_s: float, error: str) -> None:
        """The session's task raised (loadgen.core.session.session_crashed): status ``error``, with
        the exception text; a session that crashed before it arrived gets its row all the same."""
        session = self._open_sessions.pop(session_id, None)
        if session is None:
            session = _OpenSession(is_trigger, kind, num_turns, arrival_s)
        self._session_row(session_id, session, end_s, "error", error)

    def _session_row(self, session_id: int, session: "_OpenSession", finish_s: float, status: str,
                     error: Optional[str] = None) -> None:
        values = (self.run_id, self.arm, self.seed, session_id, session.is_trigger, session.kind,
                  session.num_turns, session.arrival_s, session.first_admit_s, finish_s,
                  session.turns_completed, session.num_parks, status, error)
        if self.tree_columns:
            tree_of = self._tree_of.get(session_id, (None, session_id, 0, None))
            values += tree_of
            if tree_of[2] == 0:  # a root: its row waits for its tree's completion
                tree_id = tree_of[1]
                ended = self._trees_ended.pop(tree_id, None)
                if ended is None:
                    self._root_rows[tree_id] = values
                    return
                values += ended
            else:
                values += (None, None)
        self._sessions.append(values)

    def tree_session(self, session_id: int, parent_session_id: Optional[int], tree_id: int, depth: int,
                     trace_session_id: Optional[str] = None) -> None:
        """Session ``session_id`` belongs to tree ``tree_id`` (tree columns: its rows say so)."""
        self._tree_of[session_id] = (parent_session_id, tree_id, depth, trace_session_id)

    def tree_joined(self, session_id: int, turn_index: int, joined_tokens: int) -> None:
        """Turn ``turn_index`` of ``session_id`` appends ``joined_tokens`` of its children's results."""
        self._joined[(session_id, turn_index)] = joined_tokens

    def tree_ended(self, tree_id: int, num_sessions: int, finish_s: float) -> None:
        """Every session of tree ``tree_id`` has ended, the last at ``finish_s``."""
        row = self._root_rows.pop(tree_id, None)
        if row is None:
            self._trees_ended[tree_id] = (num_sessions, finish_s)
        else:
            self._sessions.append(row + (num_sessions, finish_s))

    def turn(self, session_id: int, turn_index: int, is_trigger: bool, kind: str, ready_s: float,
             admit_s: float, first_token_s: float, finish_s: float, prompt_tokens: int, cached_tokens: int,
             output_tokens: int, num_preemptions: int, error: Optional[str],
             itl_mean_s: float = math.nan, itl_max_s: float = math.nan,
             planned_prompt_tokens: Optional[int] = None, retokenization_drift_tokens: int = 0,
             cacheable_prefix_tokens: Optional[int] = None, attempt: int = 1,
             submitted_s: Optional[float] = None, planned_output_tokens: Optional[int] = None,
             replica: Optional[int] = None, miss_routing_tokens: Optional[int] = None,
             miss_eviction_tokens: Optional[int] = None) -> None:
        if planned_prompt_tokens is None:
            planned_prompt_tokens = prompt_tokens
        values = (self.run_id, self.arm, self.seed, session_id, turn_index, is_trigger, kind, ready_s, admit_s,
                  first_token_s, finish_s, prompt_tokens, cached_tokens, output_tokens, admit_s - ready_s,
                  num_preemptions, error, itl_mean_s, itl_max_s, planned_prompt_tokens,
                  retokenization_drift_tokens, cacheable_prefix_tokens, attempt,
                  admit_s if submitted_s is None else submitted_s,
                  output_tokens if planned_output_tokens is None else planned_output_tokens)
        if self.replica_columns:
            values += (replica, miss_routing_tokens, miss_eviction_tokens)
        if self.tree_columns:
            key = (session_id, turn_index)
            after_join = key in self._joined
            joined = self._joined.get(key, 0) if error is not None else self._joined.pop(key, 0)
            values += self._tree_of.get(session_id, (None, session_id, 0, None)) + (joined, after_join)
        self._turns.append(values)
        if error is None:
            self.turns_completed += 1
            session = self._open_sessions.get(session_id)
            if session is not None:
                session.turns_completed += 1

    def sample(self, row: dict) -> None:
        row = {"run_id": self.run_id, **row}
        self._samples.append(tuple([row[name] for name in self._samples.names]))

    def replica_sample(self, row: dict) -> None:
        """One replica's metrics at a sample (replica_samples.parquet)."""
        row = {"run_id": self.run_id, **row}
        self._replica_samples.append(tuple([row[name] for name in self._replica_samples.names]))

    def maybe_flush(self, now_s: float) -> None:
        if now_s >= self._next_flush_s:
            self.flush()
            self._next_flush_s = now_s + self.flush_interval_s

    def flush(self) -> None:
        self._raise_failed_writes(wait=False)
        for name, columns in (("turns", self._turns), ("samples", self._samples), ("sessions", self._sessions),
                              ("replica_samples", self._replica_samples)):
            if len(columns) and self._in_memory is not None:
                self._in_memory[name].append(columns.take())
            elif len(columns):
                table = columns.take()
                self._written[name].append(table)
                if self._writer is None:
                    _append_part(self._streams, self._parts, name, table)
                else:
                    self._writes.append(self._writer.submit(_append_part, self._streams, self._parts, name, table))

    def _raise_failed_writes(self, wait: bool) -> None:
        pending = []
        for write in self._writes:
            if wait or write.done():
                write.result()  # raises what the write raised
            else:
                pending.append(write)
        self._writes = pending

    def close(self) -> None:
        for session_id, session in self._open_sessions.items():
            self._session_row(session_id, session, math.nan, "in_system")
        self._open_sessions.clear()
        for row in self._root_rows.values():  # trees that had not ended: their root's row, no finish
            self._sessions.append(row + (None, None))
        self._root_rows.clear()
        self.stop()
        if self.run_dir is not None:
            merge_parts(self.run_dir, self._written)

    def stop(self) -> None:
        """Write what is buffered and close the part files, without merging them: what a run
        that failed or was interrupted leaves for recovery (``close`` also merges)."""
        self.flush()
        try:
            self._raise_failed_writes(wait=True)
        finally:
            streams, self._streams = self._streams, {}
            for sink, writer in streams.values():
                try:
                    writer.close()
                finally:
                    sink.close()

    def tables(self) -> dict[str, pa.Table]:
        """An in-memory recorder's rows so far: turns, samples and sessions as written to disk."""
        if self._in_memory is None:
            raise ValueError("tables(): this recorder writes to its run directory")
        empty = {**TABLES, "turns": self._turns.schema, "sessions": self._sessions.schema}
        return {name: pa.concat_tables(parts) if parts else empty[name].empty_table()
                for name, parts in self._in_memory.items() if name in TABLES or parts}


@dataclass
class _OpenSession:
    is_trigger: bool
    kind: str
    num_turns: int
    arrival_s: float
    first_admit_s: float = math.nan
    turns_completed: int = 0
    num_parks: int = 0


def warm_up() -> None:
    """Do now what a conversion the recorder leaves to pyarrow would do once (loadgen/core/arrow_numpy.py):
    pyarrow imports pandas the first time it converts Python values, a third of a second that a
    live run must not spend on its clock."""
    pa.array([0])


def stream_name(table: str) -> str:
    """The file of ``.parts/`` that table ``table``'s flushes append to."""
    return f"{table}-stream{STREAM_SUFFIX}"


def _append_part(streams: dict, parts_dir: Path, name: str, table: pa.Table) -> None:
    """One flush of table ``name``: a record batch more on its stream (opened at its first).
    The file is unbuffered: each batch is in the file once this returns."""
    stream = streams.get(name)
    if stream is None:
        sink = pa.OSFile(str(parts_dir / stream_name(name)), "wb")
        stream = streams[name] = (sink, ipc.new_stream(sink, table.schema))
    stream[1].write_table(table)


def part_files(parts_dir: Path, name: Optional[str] = None) -> list[Path]:
    """The part files of table ``name`` (every table's when None) in ``parts_dir``, in the order
    they were written."""
    paths = [p for suffix in PART_SUFFIXES for p in parts_dir.glob(f"{name or '*'}-*{suffix}")]
    return sorted(paths, key=_part_order)


def _part_order(path: Path) -> tuple:
    table, _, index = path.stem.rpartition("-")
    return (table, int(index) if index.isdigit() else -1, path.suffix)


def _read_part(path: Path) -> Optional[pa.Table]:
    """A part's rows; None for an empty stream (its run died as it opened it)."""
    if path.suffix == ".parquet":
        return pq.read_table(path)
    if path.suffix == STREAM_SUFFIX:
        return _read_stream(path)
    with pa.OSFile(str(path), "rb") as source:
        return ipc.open_file(source).read_all()


def _read_stream(path: Path) -> Optional[pa.Table]:
    """The whole record batches of a stream part: the one a crash cut short is dropped (a stream
    whose run died has no end-of-stream marker either). A schema that cannot be read is an error,
    unless the file is empty (the run died as it opened it)."""
    if path.stat().st_size == 0:
        return None
    with pa.OSFile(str(path), "rb") as source:
        reader = ipc.open_stream(source)
        batches = []
        while True:
            try:
                batches.append(reader.read_next_batch())
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError, EOFError):
                break  # the batch being written when the process died
        return pa.Table.from_batches(batches, reader.schema)


def merge_parts(run_dir: Path, written: Optional[dict[str, list[pa.Table]]] = None) -> bool:
    """Merge ``.parts/*`` into the run's Parquet files; True if anything was merged.

    ``written``: the tables of the parts as the recorder wrote them, in order; used instead of
    reading the parts back when they are exactly the parts on disk and nothing was merged before."""
    run_dir = Path(run_dir)
    parts_dir = run_dir / PARTS_DIR
    if not parts_dir.is_dir():
        return False
    for name, schema in {**TABLES, **OPTIONAL_TABLES}.items():
        parts = part_files(parts_dir, name)
        tables = []
        final = run_dir / f"{name}.parquet"
        if name in OPTIONAL_TABLES and not parts:
            continue
        ours = [stream_name(name)] if written is not None and written.get(name) else []
        if written is not None and not final.exists() and [p.name for p in parts] == ours:
            tables = list(written[name])
        else:
            if final.exists() and parts:
                tables.append(pq.read_table(final))
            tables += [t for t in (_read_part(p) for p in parts) if t is not None]
        if tables or not final.exists():
            table = pa.concat_tables(tables) if tables else schema.empty_table()
            tmp = final.with_name(final.name + ".tmp")
            _write_parquet(table, tmp)
            os.replace(tmp, final)
        for p in parts:
            p.unlink()
    for leftover in parts_dir.glob("*.tmp"):
        leftover.unlink()
    parts_dir.rmdir()
    return True


# integer columns null by design (a root has no parent; a tree not ended has no size): pandas
# reads them as its nullable integers (0, <NA>) instead of floats (0.0, NaN), through the pandas
# metadata Arrow keeps for a table that came from pandas
NULLABLE_INT_COLUMNS = ("parent_session_id", "tree_num_sessions")


def _pandas_metadata(schema: pa.Schema) -> Optional[bytes]:
    columns = [{"name": f.name, "field_name": f.name, "pandas_type": str(f.type),
                "numpy_type": "Int64" if f.type == pa.int64() else "Int32", "metadata": None}
               for f in schema if f.name in NULLABLE_INT_COLUMNS]
    if not columns:
        return None
    return json.dumps({"index_columns": [], "column_indexes": [], "columns": columns}).encode()


def _write_parquet(table: pa.Table, path: Path) -> None:
    # dictionary-encoded: the columns whose values repeat (strings, ints, bools); a run's float
    # columns (times) are nearly all distinct, and a dictionary of them took 40% of the write and
    # made turns.parquet 15% larger
    dictionary = [f.name for f in table.schema if not pa.types.is_floating(f.type)]
    metadata = _pandas_metadata(table.schema)
    if metadata is not None:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"pandas": metadata})
    pq.write_table(table, path, use_dictionary=dictionary)


def nan_to_none(value: float) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value
