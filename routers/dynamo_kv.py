"""Dynamo's KV router (ai-dynamo/dynamo: the worker selector in lib/llm/src/kv_router/scheduler.rs,
its active-sequence accounting in lib/llm/src/kv_router/sequence.rs; since refactored into
lib/kv-router/src/scheduling/selector/default.rs, the same cost at the shipped weights). For each
worker, if the request were sent there:

    cost = overlap_score_weight x prefill_tokens / block_size + decode_blocks

- prefill_tokens: the prompt tokens of the requests the router sent there whose first token has
  not come back yet (ActiveSequences ``active_tokens``, cleared by mark_prefill_completed), plus
  this prompt's tokens the worker does not hold (isl - overlap blocks x block_size);
- decode_blocks: the distinct blocks of the requests active there (ActiveSequences
  ``unique_blocks``: a shared system prompt counts once however many requests hold it) plus
  this prompt's blocks not among them (``new_blocks``). Output blocks are not added: the shipped
  ``router_track_output_blocks`` is false.

The lowest cost wins (``router_temperature`` 0); ties go to the worker whose index holds the
fewest blocks (``tree_sizes``), then at random. Above 0, a softmax over the costs normalized by
their spread. Shipped defaults: overlap weight 1.0, temperature 0.0, KV events on.

The overlap (blocks of the prompt the worker holds, from the start) comes from one of two indexes,
as in Dynamo:
- ``use_kv_events`` true (the default): the engines' KV events, blocks stored and removed per
  worker (``KvIndexer``). The deployment gives the router what those events say of the request
  (``ReplicaView.cached_tokens``); a prefix the engine evicted is no longer there.
- false (``--no-kv-events``): an approximate index of what the router itself sent where
  (``ApproxKvIndexer``), entries expiring ``ttl_secs`` (120 s) after they were last routed; it
  believes a prefix is cached where it sent it until then, evicted or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .base import ReplicaView, RouteRequest, Router
from .prefix_index import StreamPrefixIndex


PRUNE_INTERVAL_S = 1.0  # expired entries are dropped at most this often (an entry lives ttl to ttl + 1 s)


class ActiveBlocks:
    """One worker's ActiveSequences: the requests the router sent there and has not seen finish,
    as blocks (a prompt's full blocks: its shared prefix's, then its session's own) and the
    prefill tokens still to compute."""

    def __init__(self) -> None:
        self.prefixes: dict[tuple, int] = {}  # (prefix key, blocks) -> requests holding it
        self.sessions: dict[str, list[int]] = {}  # session -> own blocks of each of its active requests
        self.num_blocks = 0  # distinct blocks held
        self.prefill: dict[int, int] = {}  # request -> its prefill tokens, until its first token
        self.prefill_tokens = 0

    def new_blocks(self, prefix: tuple, own: int, session_key: str) -> int:
        """Blocks of a prompt not yet held: a session's prompts extend each other, so its own
        blocks are shared up to the shortest."""
        held_own = max(self.sessions.get(session_key, (0,)))
        return (0 if prefix[1] == 0 or prefix in self.prefixes else prefix[1]) + max(0, own - held_own)

    def add(self, key: int, prefix: tuple, own: int, session_key: str, prefill_tokens: int) -> None:
        self.num_blocks += self.new_blocks(prefix, own, session_key)
        if prefix[1]:
            self.prefixes[prefix] = self.prefixes.get(prefix, 0) + 1
        self.sessions.setdefault(session_key, []).append(own)
        self.prefill[key] = prefill_tokens
        self.prefill_tokens += prefill_tokens

    def prefill_done(self, key: int) -> None:
        self.prefill_tokens -= self.prefill.pop(key, 0)

    def free(self, key: int, prefix: tuple, own: int, session_key: str) -> None:
        self.prefill_done(key)
        owns = self.sessions[session_key]
        before = max(owns)
        owns.remove(own)
        self.num_blocks -= before - max(owns, default=0)
        if not owns:
            del self.sessions[session_key]
        if prefix[1]:
            self.prefixes[prefix] -= 1
            if not self.prefixes[prefix]:
                del self.prefixes[prefix]
                self.num_blocks -= prefix[1]


@dataclass
class DynamoKv(Router):
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    use_kv_events: bool = True
    block_size: int = 16
    ttl_secs: float = 120.0

    name = "dynamo_kv"
    needs_first_token = True

    def __post_init__(self) -> None:
        if self.overlap_score_weight < 0 or self.router_temperature < 0:
            raise ValueError("overlap_score_weight and router_temperature must be >= 0")
        if self.block_size < 1 or self.ttl_secs <= 0:
            raise ValueError("block_size must be >= 1 and ttl_secs > 0")
        if not isinstance(self.use_kv_events, bool):
            raise ValueError(f"use_kv_events must be true or false, got {self.use_kv_events!r}")
        self.reads_kv_events = self.use_kv_events

    def reset(self, num_replicas: int) -> None:
        self.index = StreamPrefixIndex(num_replicas)  # the approximate index (use_kv_events false)
        self.active = [ActiveBlocks() for _ in range(num_replicas)]
        self._requests: dict[int, tuple] = {}  # id(request) -> (its key, prefix, own blocks), while active
        self._pruned_s = -math.inf
        self._decided: tuple = (None, {})  # the last request costed, and the overlap it had on each worker

    def _blocks(self, request: RouteRequest) -> tuple[tuple, int]:
        """(shared prefix (key, full blocks), own full blocks) of a prompt: Dynamo hashes full blocks only."""
        full = request.prompt_tokens // self.block_size
        shared = min(request.shared_prefix_tokens // self.block_size, full)
        return (request.prefix_key, shared), full - shared

    def overlaps(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> list[int]:
        """Blocks of the prompt each worker holds from its start, by the index in use."""
        if self.use_kv_events:
            if any(r.cached_tokens < 0 for r in replicas):
                raise ValueError("dynamo_kv with use_kv_events needs the engines' KV events, which this view lacks")
            return [min(r.cached_tokens, request.prompt_tokens) // self.block_size for r in replicas]
        if now_s - self._pruned_s >= PRUNE_INTERVAL_S:  # as Dynamo's approximate indexer, pruned on a timer
            self.index.expire(now_s - self.ttl_secs)
            self._pruned_s = now_s
        return [self.index.match(r.index, request) // self.block_size for r in replicas]

    def costs(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> list[float]:
        prefix, own = self._blocks(request)
        overlaps = self.overlaps(request, replicas, now_s)
        self._decided = (request, {r.index: o for r, o in zip(replicas, overlaps)})
        costs = []
        for r, overlap in zip(replicas, overlaps):
            active = self.active[r.index]
            prefill_tokens = active.prefill_tokens + max(0, request.prompt_tokens - overlap * self.block_size)
            decode_blocks = active.num_blocks + active.new_blocks(prefix, own, request.session_key)
            costs.append(self.overlap_score_weight * prefill_tokens / self.block_size + decode_blocks)
        return costs

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        costs = self.costs(request, replicas, now_s)
        if self.router_temperature == 0:
            low = min(costs)
            tied = [i for i, c in enumerate(costs) if c == low]
        else:
            spread = (max(costs) - min(costs)) or 1.0
            weights = [math.exp(-(c - min(costs)) / spread / self.router_temperature) for c in costs]
            tied = [self.rng.choices(range(len(costs)), weights=weights)[0]]
        if len(tied) > 1 and not self.use_kv_events:  # the smallest tree, then at random
            smallest = min(self.index.sizes[i] for i in tied)
            tied = [i for i in tied if self.index.sizes[i] == smallest]
        return replicas[self.rng.choice(tied) if len(tied) > 1 else tied[0]].index

    def routed(self, index: int, request: RouteRequest, now_s: float) -> None:
        prefix, own = self._blocks(request)
        overlap = self._overlap_at(index, request)
        key = id(request)
        self._requests[key] = (request, prefix, own)
        self.active[index].add(key, prefix, own, request.session_key,
                               max(0, request.prompt_tokens - overlap * self.block_size))
        if not self.use_kv_events:
            self.index.insert(index, request, now_s)

    def _overlap_at(self, index: int, request: RouteRequest) -> int:
        """The overlap the request had on ``index`` when it was costed (Dynamo's add_request
        takes the chosen worker's); 0 for a request routed without being costed."""
        decided, overlaps = self._decided
        return overlaps.get(index, 0) if decided == request else 0

    def first_token(self, index: int, request: RouteRequest, now_s: float) -> None:
        self.active[index].prefill_done(id(request))

    def finished(self, index: int, request: RouteRequest, now_s: float) -> None:
        _, prefix, own = self._requests.pop(id(request))
        self.active[index].free(id(request), prefix, own, request.session_key)
