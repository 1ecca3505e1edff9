"""What a router sees of a request and of the replicas, and the shape every router has."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import ClassVar, Sequence


@dataclass(frozen=True)
class RouteRequest:
    """One request as a router sees it.

    ``session_key`` is what a session-affinity header carries (X-Session-ID, SGLang's
    X-SMG-Routing-Key); a prompt is ``shared_prefix_tokens`` of the prefix ``prefix_key`` (a
    system prompt shared by sessions) followed by the session's own context, which only grows
    from turn to turn (an agent resends its history), so two prompts of one session share the
    shorter one as a prefix."""

    session_key: str
    prompt_tokens: int
    prefix_key: str = "system"
    shared_prefix_tokens: int = 0


@dataclass(frozen=True)
class ReplicaView:
    """One replica at the moment of a decision.

    ``outstanding`` is the router's own count of requests it sent there and has not seen
    finish (what vllm-router and the SGLang model gateway call a worker's load). The engine's
    gauges (``num_running``, ``num_waiting``, ``kv_usage`` as vLLM's kv_cache_usage_perc) are
    filled only for routers that scrape them (``Router.reads_engine``); NaN/-1 otherwise.
    ``cached_tokens`` is what the replica's KV events say of this request: the tokens of its
    prompt, in whole blocks from the start, that the replica's pool holds now (stored and not
    yet removed); filled only for routers that read KV events (``Router.reads_kv_events``),
    -1 otherwise."""

    index: int
    outstanding: int
    num_running: int = -1
    num_waiting: int = -1
    kv_usage: float = math.nan
    pool_tokens: int = 0
    cached_tokens: int = -1


class Router:
    """The base of every router. ``route`` picks; ``routed`` and ``finished`` tell the router
    what became of its decision (the deployment calls them), so stateful routers learn only
    from their own routing, as the real ones do without KV events."""

    name: ClassVar[str] = ""
    reads_engine: bool = False  # needs the engines' gauges in the views
    reads_kv_events: bool = False  # needs the engines' KV events (``ReplicaView.cached_tokens``)
    needs_first_token: bool = False  # is told when a request's first token comes back
    rng: random.Random = random.Random(0)

    def start(self, num_replicas: int, seed: int) -> None:
        """Before the first request: the replica count and the router's own seed (its ties and
        random picks are reproducible per run)."""
        self.num_replicas = num_replicas
        self.rng = random.Random(seed)
        self.reset(num_replicas)

    def reset(self, num_replicas: int) -> None:
        """A stateful router's fresh state for ``num_replicas`` replicas."""

    def route(self, request: RouteRequest, replicas: Sequence[ReplicaView], now_s: float) -> int:
        raise NotImplementedError

    def routed(self, index: int, request: RouteRequest, now_s: float) -> None:
        """The request was sent to replica ``index``."""

    def first_token(self, index: int, request: RouteRequest, now_s: float) -> None:
        """The request sent to ``index`` returned its first token: its prefill is done (called
        only for routers with ``needs_first_token``)."""

    def finished(self, index: int, request: RouteRequest, now_s: float) -> None:
        """The request sent to ``index`` completed (or failed)."""


def least_outstanding(replicas: Sequence[ReplicaView], rng: random.Random) -> int:
    """The replica with the fewest outstanding requests; ties broken at random."""
    low = min(r.outstanding for r in replicas)
    return rng.choice([r.index for r in replicas if r.outstanding == low])
