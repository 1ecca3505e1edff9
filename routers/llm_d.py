"""llm-d's inference scheduler with its documented default profile: queue-scorer weight 2,
kv-cache-utilization-scorer weight 2, prefix-cache-scorer weight 3, max-score-picker
(llm-d/llm-d-inference-scheduler, the default EndpointPickerConfig). The prefix-cache scorer
(approximate mode) indexes what it scheduled: ``block_size_tokens`` per block, at most
``max_prefix_blocks_to_match`` blocks, an LRU of ``lru_capacity_per_server`` blocks per replica.
The queue and KV scores read the engines' gauges (the EPP scrapes each pod's /metrics)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .base import ReplicaView, RouteRequest, Router
from .prefix_index import StreamPrefixIndex
from .scorers import kv_utilization_scores, max_score_pick, prefix_scores, queue_scores, weighted_sum


@dataclass
class LlmD(Router):
    queue_weight: float = 2.0
    kv_utilization_weight: float = 2.0
    prefix_cache_weight: float = 3.0
    block_size_tokens: int = 16
    max_prefix_blocks_to_match: int = 256
    lru_capacity_per_server: int = 31250

    name = "llm_d"
    reads_engine = True

    def __post_init__(self) -> None:
        if min(self.queue_weight, self.kv_utilization_weight, self.prefix_cache_weight) < 0:
            raise ValueError("scorer weights must be >= 0")
        if min(self.block_size_tokens, self.max_prefix_blocks_to_match, self.lru_capacity_per_server) < 1:
            raise ValueError("block_size_tokens, max_prefix_blocks_to_match and lru_capacity_per_server must be >= 1")

    def reset(self, num_replicas: int) -> None:
        self.index = StreamPrefixIndex(num_replicas)

    def scores(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> list[float]:
        return weighted_sum([
            (self.queue_weight, queue_scores(replicas)),
            (self.kv_utilization_weight, kv_utilization_scores(replicas)),
            (self.prefix_cache_weight, prefix_scores(self.index, request, replicas, self.block_size_tokens,
                                                     self.max_prefix_blocks_to_match)),
        ])

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return max_score_pick(self.scores(request, replicas), self.rng)

    def routed(self, index: int, request: RouteRequest, now_s: float) -> None:
        self.index.insert(index, request, now_s)
        self.index.evict_to_size(index, self.lru_capacity_per_server * self.block_size_tokens)
