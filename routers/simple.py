"""Routers that look at no prompt: round robin, random, least outstanding, power of two.

vllm-router and the SGLang model gateway (lightseekorg/smg, src/policies/) ship round_robin,
random and power_of_two; power_of_two samples two workers and takes the one with the smaller
load, the load being the gateway's own count of requests in flight on each worker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .base import ReplicaView, RouteRequest, Router, least_outstanding


@dataclass
class RoundRobin(Router):
    name = "round_robin"

    def reset(self, num_replicas: int) -> None:
        self._next = 0

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        index = self._next % len(replicas)
        self._next += 1
        return index


@dataclass
class RandomRouter(Router):
    name = "random"

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return self.rng.randrange(len(replicas))


@dataclass
class LeastOutstanding(Router):
    """The replica with the fewest requests this router has in flight there (ties at random)."""

    name = "least_outstanding"

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return least_outstanding(replicas, self.rng)


@dataclass
class PowerOfTwo(Router):
    """Two distinct replicas drawn at random; the one with fewer outstanding requests (the
    first drawn on a tie, as smg's power_of_two keeps its first pick unless the second is lighter)."""

    name = "power_of_two"

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        if len(replicas) == 1:
            return 0
        a, b = self.rng.sample(range(len(replicas)), 2)
        return b if replicas[b].outstanding < replicas[a].outstanding else a
