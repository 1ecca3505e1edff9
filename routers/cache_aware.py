"""The SGLang model gateway's cache-aware policy (lightseekorg/smg, src/policies/cache_aware.rs;
vllm-router's is the same design), in its approximate-tree mode (no KV events).

Per request:
1. Imbalanced? Request counts: max - min > ``balance_abs_threshold`` AND max > min x
   ``balance_rel_threshold`` (the loads are the gateway's own in-flight counts). smg #1621's
   KV triggers, OR'd in when set below their disabled default 1.0: the hottest replica's KV
   usage above ``overload_token_usage_threshold``, or hottest minus coolest above
   ``balance_token_usage_threshold``. Imbalanced: the least-loaded replica (shortest queue;
   ties by fewest requests processed, then index), and the prompt still goes into its tree.
2. Balanced: the replica whose tree holds the longest prefix of the prompt; if that match is
   more than ``cache_threshold`` of the prompt, go there; otherwise to the replica with the
   smallest tree (the most cache room, as the gateway reckons it).
3. The prompt is inserted into the chosen replica's tree. Every ``eviction_interval_secs`` each
   tree is cut back by LRU to ``max_tree_size``.
Shipped defaults (smg's router args): 0.3, 64, 1.5, KV triggers 1.0 (off), 120 s, 2^26.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from .base import ReplicaView, RouteRequest, Router
from .prefix_index import StreamPrefixIndex, best_match


@dataclass
class CacheAware(Router):
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    balance_token_usage_threshold: float = 1.0
    overload_token_usage_threshold: float = 1.0
    eviction_interval_secs: float = 120.0
    max_tree_size: int = 2 ** 26

    name = "cache_aware"

    def __post_init__(self) -> None:
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError("cache_threshold must be in [0, 1]")
        if self.balance_abs_threshold < 0 or self.balance_rel_threshold < 1.0:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1")
        if self.max_tree_size < 1 or self.eviction_interval_secs < 0:
            raise ValueError("max_tree_size must be >= 1 and eviction_interval_secs >= 0")
        # the KV triggers need the engines' gauges (smg reads them from its worker monitor)
        self.reads_engine = self.balance_token_usage_threshold < 1.0 or self.overload_token_usage_threshold < 1.0

    def reset(self, num_replicas: int) -> None:
        self.tree = StreamPrefixIndex(num_replicas)
        self._processed = [0] * num_replicas
        self._last_eviction_s = 0.0

    def imbalanced(self, replicas: Sequence[ReplicaView]) -> bool:
        if self.reads_engine:
            usages = [r.kv_usage for r in replicas if not math.isnan(r.kv_usage)]
            if usages and (max(usages) > self.overload_token_usage_threshold
                           or max(usages) - min(usages) > self.balance_token_usage_threshold):
                return True
        loads = [r.outstanding for r in replicas]
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        if self.eviction_interval_secs and now_s - self._last_eviction_s >= self.eviction_interval_secs:
            for i in range(len(replicas)):
                self.tree.evict_to_size(i, self.max_tree_size)
            self._last_eviction_s = now_s
        if self.imbalanced(replicas):
            return min(range(len(replicas)), key=lambda i: (replicas[i].outstanding, self._processed[i], i))
        matched, tokens = best_match(self.tree, request, range(len(replicas)))
        if matched is not None and tokens / max(request.prompt_tokens, 1) > self.cache_threshold:
            return matched
        return min(range(len(replicas)), key=lambda i: (self.tree.sizes[i], i))

    def routed(self, index: int, request: RouteRequest, now_s: float) -> None:
        self.tree.insert(index, request, now_s)
        self._processed[index] += 1
