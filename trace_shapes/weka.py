"""The WEKA agentic-coding traces (callanjfox/agentic-coding-analysis at commit 15e88f7: its trace format
specification, ``TRACE_FORMAT`` in its docs, and ``examples/sample_trace_with_subagent.json``): one
conversation a JSON document (a file holds one, a list, or one a line), field names as there:

``id``, ``models``, ``block_size`` (64), ``tool_tokens`` + ``system_tokens`` (the tools and system
prompt every request starts with), ``hash_id_scope`` (``local``: ids numbered per trace; ``global``:
across traces) and ``requests[]``, each ``t`` (s from the conversation's start), ``type`` (``s``
streaming, ``n`` non-streaming, ``subagent``), ``model``, ``in`` (the whole prompt), ``out``,
``hash_ids`` (chained 64-token block hashes: equal ids mean an equal prefix), ``api_time`` (response
time, s), ``think_time`` (the client's pause since the previous response). A ``subagent`` record is
a nested conversation with its own ``requests`` (``t`` from its own start), ``tool_tokens``,
``system_tokens``, ``duration_ms`` and ``status``; it runs in a fresh context.

Read as a tree: the parent's requests in order; the sub-agent records between request k and
k + 1 are spawned after request k and joined by request k + 1 (the parent's next request comes
after they complete, as Claude Code's Task tool waits), except ``status: async_launched`` ones,
which nobody waits for. A sub-agent starts at its ``t`` minus the end of request k (``t`` +
``api_time``; unknown without ``api_time``). The gap before a joining request is measured from the
last awaited sub-agent's end (its ``t`` + ``duration_ms``), since its recorded ``think_time`` spans
the sub-agents' whole run; other gaps are ``think_time``, else the interval from the previous
request's end. A session's shared prefix is its first request's ``tool_tokens + system_tokens``,
in full blocks, named by the hash of its last block (with the trace id under ``local`` scope), so
sessions share it exactly when their hashes say they send the same tools and system prompt.
"""

from __future__ import annotations

from typing import Optional

from .records import RecordedSession
from .rows import LoaderOptions, Row, RowSource
from .tree import SPAWN, Branch, Child, RecordedTree, Tree

BACKGROUND_STATUS = "async_launched"


class _Reader:
    def __init__(self) -> None:
        self.counts = {"negative": 0, "no_start": 0, "repeated": 0}

    def conversation(self, row: Row, obj: dict, where: str, name: str, trace: dict) -> RecordedTree:
        """The tree of a conversation (the trace itself, or a sub-agent record) at field ``where``."""
        requests = row.listing(row.require(obj, "requests", f"{where}requests"), f"{where}requests")
        models = obj.get("models") or trace.get("models") or []
        default_model = row.text(models[0], f"{where}models[0]") if models else "unknown"
        calls: list[tuple[float, Optional[float], int, int, Optional[float], str, list]] = []
        pending: list[tuple[int, dict, str]] = []  # sub-agent records since the last call
        groups: list[tuple[int, list[tuple[int, dict, str]]]] = []  # (after call, records)
        for k, request in enumerate(requests):
            at = f"{where}requests[{k}]"
            request = row.mapping(request, at)
            kind = row.require(request, "type", f"{at}.type")
            if kind == "subagent":
                if not calls:
                    raise row.error(f"{at}.type", "a sub-agent before the conversation's first request (it is "
                                                  "spawned by a response)")
                pending.append((k, request, at))
                continue
            if kind not in ("s", "n"):
                raise row.error(f"{at}.type", f"expected 's', 'n' or 'subagent', got {kind!r}")
            if pending:
                groups.append((len(calls) - 1, pending))
                pending = []
            t = row.number(row.require(request, "t", f"{at}.t"), f"{at}.t", minimum=0.0)
            api = request.get("api_time")
            think = request.get("think_time")
            calls.append((t, None if api is None else row.number(api, f"{at}.api_time", minimum=0.0),
                          row.integer(row.require(request, "in", f"{at}.in"), f"{at}.in", minimum=1),
                          row.integer(row.require(request, "out", f"{at}.out"), f"{at}.out"),
                          None if think is None else row.number(think, f"{at}.think_time", minimum=0.0),
                          row.text(request.get("model") or default_model, f"{at}.model"),
                          row.listing(request.get("hash_ids") or [], f"{at}.hash_ids")))
        if not calls:
            raise row.error(f"{where}requests", "a conversation needs at least one request")
        if pending:
            groups.append((len(calls) - 1, pending))
        branches, join_gaps = [], {}
        for after, records in groups:
            call_end = None if calls[after][1] is None else calls[after][0] + calls[after][1]
            waited, background, awaited_ends = [], [], []
            for index, record, at in records:
                child = self.conversation(row, record, f"{at}.", f"{name}/{record.get('agent_id', index)}", trace)
                t = row.number(row.require(record, "t", f"{at}.t"), f"{at}.t", minimum=0.0)
                start = None if call_end is None else t - call_end
                if start is None:
                    self.counts["no_start"] += 1
                elif start < 0:
                    self.counts["negative"] += 1
                    start = 0.0
                is_background = record.get("status") == BACKGROUND_STATUS
                (background if is_background else waited).append(Child(child, start))
                if not is_background:
                    duration = record.get("duration_ms")
                    awaited_ends.append(None if duration is None
                                        else t + row.number(duration, f"{at}.duration_ms", minimum=0.0) / 1000.0)
            joins = after + 1 < len(calls)
            if waited:
                branches.append(Branch(after, SPAWN, tuple(waited), join_turn=after + 1 if joins else None))
                if joins and None not in awaited_ends:
                    join_gaps[after + 1] = calls[after + 1][0] - max(awaited_ends)
            if background:
                branches.append(Branch(after, SPAWN, tuple(background)))
        gaps = []
        for k in range(1, len(calls)):
            if k in join_gaps:
                gap: Optional[float] = join_gaps[k]
            elif any(b.join_turn == k for b in branches):
                gap = None  # a sub-agent without duration_ms: when the parent went on after it is unknown
            elif calls[k][4] is not None:
                gap = calls[k][4]
            else:
                gap = None if calls[k - 1][1] is None else calls[k][0] - (calls[k - 1][0] + calls[k - 1][1])
            if gap is not None and gap < 0:
                self.counts["negative"] += 1
                gap = 0.0
            gaps.append(gap)
            self.counts["repeated"] += calls[k][2] == calls[k - 1][2] and calls[k][6] == calls[k - 1][6]
        shared, key = self.shared_prefix(row, obj, where, calls[0], trace)
        node = row.checked(f"{where}requests", lambda: RecordedSession(
            name, calls[0][5], tuple(c[2] for c in calls), tuple(c[3] for c in calls), tuple(gaps),
            shared_prefix_tokens=shared if key else None, prefix_key=key))
        return row.checked(f"{where}requests", lambda: Tree(node, tuple(branches)))

    def shared_prefix(self, row: Row, obj: dict, where: str, first_call: tuple, trace: dict) -> tuple[int, Optional[str]]:
        block = row.integer(trace.get("block_size") or 64, "block_size", minimum=1)
        prefix = (row.integer(obj.get("tool_tokens") or 0, f"{where}tool_tokens")
                  + row.integer(obj.get("system_tokens") or 0, f"{where}system_tokens"))
        num_blocks = min(prefix, first_call[2]) // block
        hashes = first_call[6]
        if num_blocks < 1 or len(hashes) < num_blocks:
            return 0, None
        scope = "" if trace.get("hash_id_scope") == "global" else f"{trace.get('id')}:"
        return num_blocks * block, f"weka:{scope}{hashes[num_blocks - 1]}"

    def notes(self, num_rows: int, trees: list[RecordedTree]) -> list[str]:
        notes = ["sub-agents between two requests are spawned by the first and joined by the second "
                 "(async_launched ones are not waited for)"]
        if self.counts["no_start"]:
            notes.append(f"{self.counts['no_start']} sub-agents start at an unknown time (the spawning request has "
                         f"no api_time)")
        if self.counts["negative"]:
            notes.append(f"{self.counts['negative']} gaps or sub-agent starts were negative; set to 0")
        if self.counts["repeated"]:
            notes.append(f"{self.counts['repeated']} requests repeat the previous one's prompt (a streaming / "
                         f"non-streaming pair)")
        return notes


def read_weka(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedTree], int, list[str]]:
    reader, trees, num_rows = _Reader(), [], 0
    for row in rows:
        num_rows += 1
        trace_id = row.text(row.require(row.data, "id", "id"), "id")
        trees.append(reader.conversation(row, row.data, "", trace_id, row.data))
    return trees, num_rows, reader.notes(num_rows, trees)
