"""Which upstream a turn request goes to: ``sticky-hash`` or any router of ``routers/``.

Every router gets the view the gateway can give it, which is what the real router sees:
- ``outstanding``: the requests the gateway has sent to each upstream and not yet seen answered
  (vllm-router's and the SGLang model gateway's own load count);
- what it routed: the router's own ``routed``/``finished`` calls, its approximate history (no KV
  events: the gateway has none to give);
- for routers that read engine state (``Router.reads_engine``: ``llm_d``, ``cache_aware`` with
  the KV triggers on), each upstream's ``/metrics`` as last scraped: running, waiting, KV usage;
  an upstream not scraped yet or whose last scrape failed reads unknown (-1, NaN).
``sticky-hash`` (the default) pins a session to one upstream by rendezvous hash.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Sequence

from routers import ROUTERS, ReplicaView, RouteRequest, Router, make_router


def sticky_hash(session_key: str, num_upstreams: int) -> int:
    """Rendezvous (highest random weight) hashing: a session keeps its upstream, and removing one
    upstream moves only the sessions that were on it."""
    if num_upstreams == 1:
        return 0
    key = session_key.encode()
    return max(range(num_upstreams),
               key=lambda i: hashlib.blake2b(key, digest_size=8, salt=i.to_bytes(8, "little")).digest())


class StickyHash(Router):
    name = "sticky-hash"

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        return sticky_hash(request.session_key, len(replicas))


DEFAULT_ROUTER = StickyHash.name
ROUTER_NAMES = (DEFAULT_ROUTER, *ROUTERS)


def make_upstream_router(name: str, options: dict[str, Any]) -> Router:
    """A fresh router by name; a bad name or knob is a ValueError listing the valid ones."""
    if name == DEFAULT_ROUTER:
        if options:
            raise ValueError(f"router {name!r} takes no options, got {sorted(options)}")
        return StickyHash()
    if name not in ROUTERS:
        raise ValueError(f"unknown router {name!r}; valid routers: {list(ROUTER_NAMES)}")
    router = make_router(name, **options)
    if router.reads_kv_events:
        raise ValueError(f"router {name!r} reads the engines' KV events, which the gateway does not receive; "
                         f"set use_kv_events=false (its approximate mode, Dynamo's --no-kv-events)")
    return router


class UpstreamRouting:
    """One router over the gateway's upstreams, with the gateway's own count of requests in flight
    on each. ``signals(i)`` gives upstream i's last scrape (a dict; empty when none)."""

    def __init__(self, router: Router, num_upstreams: int, signals: Callable[[int], dict], seed: int = 0) -> None:
        self.router = router
        router.start(num_upstreams, seed)
        self.signals = signals
        self.outstanding = [0] * num_upstreams

    def views(self) -> list[ReplicaView]:
        if not self.router.reads_engine:
            return [ReplicaView(i, n) for i, n in enumerate(self.outstanding)]
        views = []
        for i, n in enumerate(self.outstanding):
            s = self.signals(i)
            if s.get("error") is None and "num_running" in s:
                kv = s.get("kv_usage")
                views.append(ReplicaView(i, n, s["num_running"], s["num_waiting"], math.nan if kv is None else kv))
            else:
                views.append(ReplicaView(i, n))
        return views

    def choose(self, request: RouteRequest, now_s: float) -> int:
        index = self.router.route(request, self.views(), now_s)
        self.router.routed(index, request, now_s)
        self.outstanding[index] += 1
        return index

    def finished(self, index: int, request: RouteRequest, now_s: float) -> None:
        self.outstanding[index] -= 1
        self.router.finished(index, request, now_s)
