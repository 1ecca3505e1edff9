"""A deployment: N simulated engines behind a router, behind the same engine seam as one engine.

Sessions, the gateway and the recorder do not change: ``generate`` routes the request (a pure
router from ``routers/``), awaits the chosen replica and returns its result with the
``replica`` it ran on and the attribution of its missed tokens (``MissLedger``). Every replica
is a whole engine (pool, cost model, flavour); the deployment's pool C is their sum, as a live
run with ``metrics_urls`` sums the replicas' pools.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from routers import ReplicaView, RouteRequest, Router

from .engines import EngineMetrics, SimEngineClient, TurnRequest, TurnResult


def sum_engine_metrics(metrics: Sequence[EngineMetrics], pools: Sequence[int]) -> EngineMetrics:
    """Replicas' gauges as one engine's: counts and counters summed, KV usage weighted by pool."""
    return EngineMetrics(sum(m.num_running for m in metrics), sum(m.num_waiting for m in metrics),
                         sum(m.kv_usage * p for m, p in zip(metrics, pools)) / sum(pools),
                         sum(m.prefix_cache_queries_total for m in metrics),
                         sum(m.prefix_cache_hits_total for m in metrics),
                         sum(m.num_preemptions_total for m in metrics))


class MissLedger:
    """Where each missed prompt token of a deployment's turn went (turns.parquet
    ``miss_routing_tokens``, ``miss_eviction_tokens``; the rest of the miss is the workload's).

    Per replica it keeps what an infinite cache on that replica would hold: of every session,
    the tokens that replica computed for it (prompt + output - 1 of each turn it served, as the
    session's own ideal counts them), and every shared prefix sent there. For a turn on replica
    r that hit h tokens, in whole blocks and capped at prompt - 1 as the ideal hit ratio is:
    - ideal_any: what an infinite cache anywhere in the deployment holds (the run's ideal);
    - ideal_here: what an infinite cache on r holds;
    - eviction = ideal_here - h: the prefix had been resident on this replica and is gone;
    - routing = ideal_any - max(h, ideal_here): it was resident only on another replica;
    - workload = prompt - ideal_any: no cache could have held it."""

    def __init__(self, num_replicas: int, block_size: int) -> None:
        self.block_size = block_size
        self._held: list[dict[int, int]] = [{} for _ in range(num_replicas)]
        self._prefixes: list[set] = [set() for _ in range(num_replicas)]

    def _ideal(self, replica: int, request: TurnRequest) -> int:
        held = self._held[replica].get(request.session_id, 0)
        if request.inherited_tokens:  # a tree's fork or parallel call: its parent's context, as far as it goes
            parent = self._held[replica].get(request.parent_session_id, 0)
            held = max(held, min(request.inherited_tokens, parent))
        if request.shared_prefix_tokens and (request.prefix_key, request.shared_prefix_tokens) in self._prefixes[replica]:
            held = max(held, request.shared_prefix_tokens)
        return held

    def submitted(self, replica: int, request: TurnRequest) -> tuple[int, int]:
        """(ideal_any, ideal_here) in raw tokens when ``request`` is sent to ``replica``."""
        here = self._ideal(replica, request)
        anywhere = max(self._ideal(r, request) for r in range(len(self._held)))
        if request.shared_prefix_tokens:
            self._prefixes[replica].add((request.prefix_key, request.shared_prefix_tokens))
        return anywhere, here

    def completed(self, replica: int, request: TurnRequest, ideal: tuple[int, int], result: TurnResult
                  ) -> tuple[Optional[int], Optional[int]]:
        """(routing, eviction) missed tokens of the finished turn; (None, None) if it failed."""
        if result.error is not None:
            return None, None
        held = self._held[replica]
        held[request.session_id] = max(held.get(request.session_id, 0), result.prompt_tokens + result.output_tokens - 1)
        bs = self.block_size
        cap = max(result.prompt_tokens - 1, 0) // bs * bs
        anywhere, here = (min(t // bs * bs, cap) for t in ideal)
        hit = result.cached_tokens
        return max(0, anywhere - max(hit, here)), max(0, here - hit)


class DeploymentClient:
    """The engine seam over ``replicas`` behind ``router``."""

    needs_token_ids = False

    def __init__(self, replicas: Sequence[SimEngineClient], router: Router, seed: int, block_size: int) -> None:
        self.replicas = list(replicas)
        self.router = router
        router.start(len(self.replicas), seed)
        self.pool_tokens = sum(r.pool_tokens for r in self.replicas)
        self.outstanding = [0] * len(self.replicas)
        self.ledger = MissLedger(len(self.replicas), block_size)
        self._pinned: dict[int, int] = {}  # session -> replica chosen ahead (controller scope replica)

    @staticmethod
    def route_request(request: TurnRequest) -> RouteRequest:
        return RouteRequest(str(request.session_id), request.prompt_tokens, request.prefix_key,
                            request.shared_prefix_tokens)

    def views(self, request: RouteRequest, session_id: Any) -> list[ReplicaView]:
        """What the router sees of each replica: its own outstanding count, the engines' gauges
        if it scrapes them, and what the replicas' KV events say of ``request`` (a turn of
        ``session_id``) if it reads them."""
        router = self.router
        if not router.reads_engine and not router.reads_kv_events:
            return [ReplicaView(i, n) for i, n in enumerate(self.outstanding)]
        views = []
        for i, (n, replica) in enumerate(zip(self.outstanding, self.replicas)):
            cached = replica.cached_tokens(session_id, request.prefix_key, request.shared_prefix_tokens,
                                           request.prompt_tokens) if router.reads_kv_events else -1
            if router.reads_engine:
                m = replica.metrics()
                views.append(ReplicaView(i, n, m.num_running, m.num_waiting, m.kv_usage, replica.pool_tokens, cached))
            else:
                views.append(ReplicaView(i, n, cached_tokens=cached))
        return views

    def choose(self, request: RouteRequest, session_id: Any) -> int:
        now = self.replicas[0].clock.now()
        index = self.router.route(request, self.views(request, session_id), now)
        if not 0 <= index < len(self.replicas):
            raise ValueError(f"router {self.router.name!r} chose replica {index} of {len(self.replicas)}")
        return index

    def pin(self, session_id: int, request: RouteRequest) -> int:
        """Route the session's next turn now (before its gate is asked); ``generate`` sends it there."""
        index = self._pinned[session_id] = self.choose(request, session_id)
        return index

    async def generate(self, request: TurnRequest) -> TurnResult:
        route = self.route_request(request)
        index = self._pinned.pop(request.session_id, None)
        if index is None:
            index = self.choose(route, request.session_id)
        clock = self.replicas[index].clock
        self.router.routed(index, route, clock.now())
        self.outstanding[index] += 1
        ideal = self.ledger.submitted(index, request)
        router = self.router
        on_first_token = ((lambda t_s: router.first_token(index, route, t_s)) if router.needs_first_token else None)
        try:
            result = await self.replicas[index].generate(request, on_first_token)
        finally:
            self.outstanding[index] -= 1
            self.router.finished(index, route, clock.now())
        routing, eviction = self.ledger.completed(index, request, ideal, result)
        return dataclasses.replace(result, replica=index, miss_routing_tokens=routing, miss_eviction_tokens=eviction)

    def metrics(self) -> EngineMetrics:
        return sum_engine_metrics([r.metrics() for r in self.replicas], [r.pool_tokens for r in self.replicas])

    def replica_rows(self, now_s: float) -> list[dict]:
        """replica_samples.parquet rows (the live schema; a simulated replica has no URL)."""
        rows = []
        for i, replica in enumerate(self.replicas):
            m = replica.metrics()
            rows.append({"t_s": now_s, "replica_index": i, "replica_url": None, "scraped": True,
                         "num_running": m.num_running, "num_waiting": m.num_waiting, "kv_usage": m.kv_usage,
                         "pool_tokens": replica.pool_tokens, "prefix_cache_queries_total": m.prefix_cache_queries_total,
                         "prefix_cache_hits_total": m.prefix_cache_hits_total,
                         "num_preemptions_total": m.num_preemptions_total})
        return rows

    def flush(self) -> None:
        for replica in self.replicas:
            replica.flush()

    # run.json counts, summed over the replicas
    @property
    def num_steps(self) -> int:
        return sum(r.engine.num_steps for r in self.replicas)

    @property
    def num_preemptions(self) -> int:
        return sum(r.engine.num_preemptions for r in self.replicas)

    @property
    def flush_times_s(self) -> list[float]:
        return list(self.replicas[0].engine.flush_times_s)
