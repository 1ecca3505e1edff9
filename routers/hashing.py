"""Session-key hashing: a consistent-hash ring, and consistent hashing with bounded loads.

``consistent_hash`` is the SGLang model gateway's and vllm-router's policy of that name: the
session key (X-SMG-Routing-Key, a session header) is hashed onto a ring of virtual nodes
(smg's default: 160 per worker) and the request goes to the first worker clockwise. It pins a
session to one replica whatever that replica's load. ``bounded_hash`` is consistent hashing
with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018), as vLLM production-stack #59
proposes for session routing: a replica takes a request only while its outstanding requests
stay under ceil(load_factor x (all outstanding + 1) / replicas); otherwise the walk goes on
clockwise to the next replica. The hash function is ours (blake2b), so which replica a given
session lands on differs from the real router's; the distribution does not.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

from .base import ReplicaView, RouteRequest, Router


def hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


class HashRing:
    def __init__(self, num_replicas: int, virtual_nodes: int) -> None:
        points = sorted((hash64(f"replica-{i}#{v}"), i) for i in range(num_replicas) for v in range(virtual_nodes))
        self._hashes = [h for h, _ in points]
        self._owners = [i for _, i in points]

    def walk(self, key: str):
        """Replicas clockwise from ``key``'s point, each once."""
        start = bisect.bisect_left(self._hashes, hash64(key))
        seen: set[int] = set()
        n = len(self._owners)
        for k in range(n):
            owner = self._owners[(start + k) % n]
            if owner not in seen:
                seen.add(owner)
                yield owner


@dataclass
class ConsistentHash(Router):
    virtual_nodes: int = 160

    name = "consistent_hash"

    def __post_init__(self) -> None:
        if self.virtual_nodes < 1:
            raise ValueError("virtual_nodes must be >= 1")

    def reset(self, num_replicas: int) -> None:
        self._ring = HashRing(num_replicas, self.virtual_nodes)

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return next(self._ring.walk(request.session_key))


@dataclass
class BoundedHash(ConsistentHash):
    load_factor: float = 1.25

    name = "bounded_hash"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.load_factor >= 1.0:
            raise ValueError("load_factor must be >= 1 (1: perfectly balanced loads)")

    def capacity(self, replicas: Sequence[ReplicaView]) -> int:
        total = sum(r.outstanding for r in replicas)
        return math.ceil(self.load_factor * (total + 1) / len(replicas))

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        cap = self.capacity(replicas)
        for index in self._ring.walk(request.session_key):
            if replicas[index].outstanding < cap:
                return index
        raise AssertionError("a bounded-load ring always has a replica under capacity")
