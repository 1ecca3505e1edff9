"""Mooncake's trace format (kvcache-ai/Mooncake, FAST'25 release): requests with block hashes.

A row is one request: ``timestamp`` (ms since the trace start), ``input_length`` (the whole
prompt, tokens), ``output_length`` and ``hash_ids``: one id per ``block_tokens`` (512) tokens of
the prompt, the last block possibly partial; an id stands for its block *and everything before
it*, so two requests share exactly the prompt prefix whose ids they share. Optional
``session_id`` (the multi-turn variant AIPerf and Dynamo write) and ``delay`` (ms the client
waits before sending the request after the previous one of its session ends).

Sessions. With ``session_id``, rows of one id are one session in timestamp order. Without it
(the FAST'25 conversation, tool-agent and synthetic traces), requests are chained by their block
hashes: in timestamp order, a request continues the session whose latest request's full blocks
are a prefix of its own and hold a block only that session has used so far (its own context, not
a prefix every session sends); otherwise it starts a session. A request that extends an earlier
request that was already continued (a fork or a retry) starts a session of its own.

Cross-session prefixes. The leading full blocks of a session's first request that other sessions
use too become its shared prefix, named by the hash of the last shared block: sessions share in
replay exactly the prefix they share in the trace. What a replayed session cannot hold is counted
in the notes: a prefix nested in a longer one (sessions A, B share blocks 0-3 and A, C block 0
only: A's and C's block 0 are one prefix, B's blocks 0-3 another, so replay duplicates block 0),
and blocks of later turns that other sessions also send (a document two conversations both
quote), which replay makes unique to the session.

Gaps. Without ``delay`` the trace has no response end times, so a gap is the interval between
request starts and includes the model's own latency (as in the Bailian trace).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from .records import RecordedSession
from .rows import LoaderOptions, Row, RowSource


BOUNDARY_SLACK_TOKENS = 32


@dataclass
class _Request:
    row: int
    order: int  # file order, breaks timestamp ties
    timestamp_s: Optional[float]
    prompt_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]
    num_full_blocks: int
    session_id: Optional[str]
    delay_s: Optional[float]


def _request(row: Row, order: int, block_tokens: int) -> _Request:
    data = row.data
    prompt = row.integer(row.require(data, "input_length", "input_length"), "input_length", minimum=1)
    output = row.integer(row.require(data, "output_length", "output_length"), "output_length")
    hashes = tuple(row.integer(h, f"hash_ids[{k}]")
                   for k, h in enumerate(row.listing(data.get("hash_ids") or [], "hash_ids")))
    if len(hashes) > -(-prompt // block_tokens):
        raise row.error("hash_ids", f"{len(hashes)} block hashes for {prompt} tokens: at most "
                                    f"{-(-prompt // block_tokens)} blocks of {block_tokens} tokens")
    timestamp = data.get("timestamp")
    delay = data.get("delay")
    session = data.get("session_id")
    return _Request(
        row=row.row_number, order=order,
        timestamp_s=None if timestamp is None else row.number(timestamp, "timestamp", minimum=0.0) / 1000.0,
        prompt_tokens=prompt, output_tokens=output, hash_ids=hashes,
        num_full_blocks=min(len(hashes), prompt // block_tokens),
        session_id=None if session is None else row.text(session, "session_id"),
        delay_s=None if delay is None else row.number(delay, "delay", minimum=0.0) / 1000.0,
    )


def read_mooncake(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedSession], int, list[str]]:
    requests = [_request(row, order, options.block_tokens) for order, row in enumerate(rows)]
    # a missing timestamp sorts by file order alone (AIPerf's session rows may have only delays)
    requests.sort(key=lambda r: (r.timestamp_s if r.timestamp_s is not None else 0.0, r.order))
    by_id: dict[str, list[_Request]] = defaultdict(list)
    unnamed = []
    for r in requests:
        (by_id[r.session_id] if r.session_id is not None else unnamed).append(r)
    chains, num_forks = _chain_by_hashes(unnamed)
    groups = [(f"row{chain[0].row}", chain) for chain in chains] + list(by_id.items())
    groups.sort(key=lambda group: (group[1][0].timestamp_s or 0.0, group[1][0].order))

    prefixes, notes = _shared_prefixes([g for _, g in groups], options.block_tokens)
    sessions = []
    num_rewritten = 0
    for (session_id, group), (shared_tokens, key) in zip(groups, prefixes):
        gaps: list[Optional[float]] = []
        for before, after in zip(group, group[1:]):
            if after.delay_s is not None:
                gaps.append(after.delay_s)
            elif before.timestamp_s is not None and after.timestamp_s is not None:
                gaps.append(after.timestamp_s - before.timestamp_s)
            else:
                gaps.append(None)
            full = before.hash_ids[:before.num_full_blocks]
            num_rewritten += bool(full) and after.hash_ids[:len(full)] != full
        sessions.append(RecordedSession(session_id, "unknown", tuple(r.prompt_tokens for r in group),
                                        tuple(r.output_tokens for r in group), tuple(gaps),
                                        shared_prefix_tokens=shared_tokens, prefix_key=key))
    if unnamed:
        notes.insert(0, f"{len(unnamed)} requests without session_id chained by block hashes into "
                        f"{len(chains)} sessions")
    if num_forks:
        notes.append(f"{num_forks} requests extend an earlier request that was already continued (forks, retries); "
                     f"each starts a session, its shared context with the other is not shared in replay")
    if num_rewritten:
        notes.append(f"{num_rewritten} turns of session_id sessions do not extend the previous turn's blocks "
                     f"(context rewritten); replay appends to the previous context")
    if any(r.delay_s is None for _, g in groups for r in g[1:]):
        notes.append("gaps without a delay are intervals between request starts (the trace has no response "
                     "end times): they include the model's own latency")
    return sessions, len(requests), notes


def _chain_by_hashes(requests: list[_Request]) -> tuple[list[list[_Request]], int]:
    """Requests (in time order) grouped into sessions by block-hash continuation; and the forks."""
    chains: list[list[_Request]] = []
    owner: dict[int, int] = {}  # block hash -> the chain that used it first
    shared: set[int] = set()  # hashes used by more than one chain
    # (last full block hash, number of full blocks) of every request so far -> (chain, index in it)
    earlier: dict[tuple[int, int], tuple[int, int]] = {}
    num_forks = 0
    for r in requests:
        chain = None
        for j in range(len(r.hash_ids), 0, -1):
            match = earlier.get((r.hash_ids[j - 1], j))
            if match is None:
                continue
            c, index = match
            q = chains[c][index]
            # the longest earlier context this request extends; it must hold a block of its own
            # session's (not only a prefix that several sessions send)
            if r.prompt_tokens >= q.prompt_tokens + q.output_tokens - min(BOUNDARY_SLACK_TOKENS, q.output_tokens // 2) and any(
                    owner.get(h) == c and h not in shared for h in q.hash_ids[:j]):
                if index == len(chains[c]) - 1:
                    chain = c
                else:
                    num_forks += 1
            break
        if chain is None:
            chain = len(chains)
            chains.append([])
        for h in r.hash_ids:
            if owner.setdefault(h, chain) != chain:
                shared.add(h)
        chains[chain].append(r)
        if r.num_full_blocks:
            earlier[(r.hash_ids[r.num_full_blocks - 1], r.num_full_blocks)] = (chain, len(chains[chain]) - 1)
    return chains, num_forks


def _shared_prefixes(groups: list[list[_Request]], block_tokens: int
                     ) -> tuple[list[tuple[Optional[int], Optional[str]]], list[str]]:
    """Per session: (tokens, name) of its first prompt's leading blocks other sessions use too;
    and notes on the sharing replay cannot keep."""
    if not any(r.hash_ids for g in groups for r in g):
        return [(None, None)] * len(groups), []
    sessions_of: dict[int, set[int]] = defaultdict(set)
    for s, group in enumerate(groups):
        for r in group:
            for h in r.hash_ids:
                sessions_of[h].add(s)
    prefixes: list[tuple[Optional[int], Optional[str]]] = []
    chains: dict[str, tuple[int, ...]] = {}
    num_later_blocks = 0
    for s, group in enumerate(groups):
        first = group[0]
        num_shared = 0
        for k in range(first.num_full_blocks):
            if len(sessions_of[first.hash_ids[k]]) > 1:
                num_shared = k + 1  # ids name prefixes: a shared id means all before it are shared too
        if num_shared:
            key = str(first.hash_ids[num_shared - 1])
            chains[key] = first.hash_ids[:num_shared]
            prefixes.append((num_shared * block_tokens, key))
        else:
            prefixes.append((0, None))
        # blocks of later turns (beyond the first prompt) that other sessions send too
        seen = set(first.hash_ids)
        for r in group[1:]:
            for h in r.hash_ids:
                if h not in seen:
                    seen.add(h)
                    num_later_blocks += len(sessions_of[h]) > 1
    notes = []
    if chains:
        num_sessions = sum(1 for tokens, _ in prefixes if tokens)
        notes.append(f"{num_sessions} of {len(groups)} sessions start with a prefix other sessions send too: "
                     f"{len(chains)} distinct shared prefixes, kept in replay")
        keys_of: dict[int, set[str]] = defaultdict(set)
        for key, chain in chains.items():
            for h in chain:
                keys_of[h].add(key)
        nested = {h for h, keys in keys_of.items() if len(keys) > 1}
        if nested:
            num_copies = sum(len(keys_of[h]) - 1 for h in nested)
            notes.append(f"{len(nested)} prefix blocks are shared by several distinct prefixes (nested sharing): "
                         f"replay sends {num_copies} extra copies of them")
    if num_later_blocks:
        notes.append(f"{num_later_blocks} blocks of later turns are also sent by other sessions; replay makes "
                     f"them unique to their session")
    return prefixes, notes
