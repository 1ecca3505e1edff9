"""Dynamo's KV router (ai-dynamo/dynamo, lib/llm/src/kv_router; docs/router): for each worker

    cost = overlap_score_weight x prefill_blocks + decode_blocks

prefill_blocks: the prompt's blocks the worker does not hold (``block_size`` tokens a block);
decode_blocks: the blocks of the requests active on the worker, this one included, as the
router tracks them itself. The lowest cost wins (``router_temperature`` 0: deterministic; ties
at random); above 0, a softmax over the negated costs normalized by their spread. Shipped
defaults: overlap weight 1.0, temperature 0.0.

What it knows of the workers' caches: Dynamo's default reads the engines' KV events (exact
stored/removed blocks). This simulator does not expose the engines' caches to routers, so
``dynamo_kv`` runs as Dynamo's ``--no-kv-events`` mode: an approximate index of what it routed,
entries expiring after ``ttl_secs`` (120 s as shipped; pruned once a second). It believes a prefix is cached where it
sent it until the TTL, even where the engine evicted it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .base import ReplicaView, RouteRequest, Router
from .prefix_index import StreamPrefixIndex


PRUNE_INTERVAL_S = 1.0  # expired entries are dropped at most this often (an entry lives ttl to ttl + 1 s)


@dataclass
class DynamoKv(Router):
    overlap_score_weight: float = 1.0
    router_temperature: float = 0.0
    block_size: int = 16
    ttl_secs: float = 120.0

    name = "dynamo_kv"

    def __post_init__(self) -> None:
        if self.overlap_score_weight < 0 or self.router_temperature < 0:
            raise ValueError("overlap_score_weight and router_temperature must be >= 0")
        if self.block_size < 1 or self.ttl_secs <= 0:
            raise ValueError("block_size must be >= 1 and ttl_secs > 0")

    def reset(self, num_replicas: int) -> None:
        self.index = StreamPrefixIndex(num_replicas)
        self._active_blocks = [0] * num_replicas
        self._pruned_s = -math.inf

    def blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def costs(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> list[float]:
        if now_s - self._pruned_s >= PRUNE_INTERVAL_S:  # as Dynamo's indexer, pruned on a timer
            self.index.expire(now_s - self.ttl_secs)
            self._pruned_s = now_s
        request_blocks = self.blocks(request.prompt_tokens)
        costs = []
        for r in replicas:
            overlap = self.index.match(r.index, request) // self.block_size
            prefill = request_blocks - overlap
            decode = self._active_blocks[r.index] + request_blocks
            costs.append(self.overlap_score_weight * prefill + decode)
        return costs

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        costs = self.costs(request, replicas, now_s)
        if self.router_temperature == 0:
            low = min(costs)
            return self.rng.choice([i for i, c in enumerate(costs) if c == low])
        spread = (max(costs) - min(costs)) or 1.0
        weights = [math.exp(-(c - min(costs)) / spread / self.router_temperature) for c in costs]
        return self.rng.choices(range(len(costs)), weights=weights)[0]

    def routed(self, index: int, request: RouteRequest, now_s: float) -> None:
        self.index.insert(index, request, now_s)
        self._active_blocks[index] += self.blocks(request.prompt_tokens)

    def finished(self, index: int, request: RouteRequest, now_s: float) -> None:
        self._active_blocks[index] -= self.blocks(request.prompt_tokens)
