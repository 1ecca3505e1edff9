"""llm-d's inference scheduler as composable pieces: scorers give each replica a score in
[0, 1] (higher is better), a profile sums them with weights, a picker takes the highest
(llm-d-inference-scheduler and the Gateway API inference extension's EPP: Filter -> Score ->
Pick). ``llm_d`` is the shipped default profile over them; other weights are knobs."""

from __future__ import annotations

import math
from typing import Sequence

from .base import ReplicaView, RouteRequest
from .prefix_index import StreamPrefixIndex


def queue_scores(replicas: Sequence[ReplicaView]) -> list[float]:
    """queue-scorer: (max - q) / (max - min) over the engines' waiting queues; 1 for all when equal."""
    queues = [max(r.num_waiting, 0) for r in replicas]
    high, low = max(queues), min(queues)
    if high == low:
        return [1.0] * len(replicas)
    return [(high - q) / (high - low) for q in queues]


def kv_utilization_scores(replicas: Sequence[ReplicaView]) -> list[float]:
    """kv-cache-utilization-scorer: 1 - the engine's KV usage."""
    return [1.0 - (0.0 if math.isnan(r.kv_usage) else min(max(r.kv_usage, 0.0), 1.0)) for r in replicas]


def prefix_scores(index: StreamPrefixIndex, request: RouteRequest, replicas: Sequence[ReplicaView],
                  block_size_tokens: int, max_prefix_blocks: int) -> list[float]:
    """prefix-cache-scorer: of the prompt's first ``max_prefix_blocks`` blocks, the share the
    scorer's index says each replica holds (whole blocks of a prefix)."""
    total = min(math.ceil(request.prompt_tokens / block_size_tokens), max_prefix_blocks)
    if total <= 0:
        return [0.0] * len(replicas)
    return [min(index.match(r.index, request) // block_size_tokens, max_prefix_blocks) / total for r in replicas]


def weighted_sum(weighted: Sequence[tuple[float, Sequence[float]]]) -> list[float]:
    n = len(weighted[0][1])
    return [sum(w * scores[i] for w, scores in weighted) for i in range(n)]


def max_score_pick(totals: Sequence[float], rng) -> int:
    """max-score-picker: the highest total, ties broken at random."""
    best = max(totals)
    return rng.choice([i for i, t in enumerate(totals) if t >= best - 1e-12])
