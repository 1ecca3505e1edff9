"""An endpoint that is a router in front of several replicas (llm-d, SGLang router, Dynamo, ...).

Turns go to the router (``engine.url``), which picks a replica for each request; with
``engine.session_header`` it can keep a session on one replica, and so on one prefix cache.
What the router does not pass on is read from the replicas themselves (``engine.metrics_urls``):
- ``/metrics`` of every replica at every sample: samples.parquet gets their sum (counters and
  request counts summed, KV usage averaged weighted by pool size), replica_samples.parquet one
  row per replica; a sample at which some replica could not be scraped has the summed engine
  columns unknown (-1, NaN), since a sum over fewer replicas would read as counters going back;
- the pool C the gateway and the resident-demand ratio use: the sum of the replicas' pools;
- the prefix-cache reset (before each run and at a flush trigger): sent to every replica, since
  a router need not forward it and one replica's reset leaves the others' caches warm;
- serve-sim's lag histogram (``/loadgen/lag``): the replicas' merged.
"""

from __future__ import annotations

import asyncio
import math
from typing import Optional, Sequence

from ..core.clock import Clock
from ..core.engines import EngineMetrics
from ..core.lateness import LatenessHistogram
from .http_client import EndpointOptions, OpenAIEngineClient, PreflightError
from .server_metrics import ScrapedMetrics
from .transport import HttpStatusError, Transport, TransportError


class ReplicaSetClient(OpenAIEngineClient):
    """``OpenAIEngineClient`` whose metrics, pool and cache resets are the replicas'."""

    def __init__(self, clock: Clock, options: EndpointOptions, replica_urls: Sequence[str],
                 transport: Optional[Transport] = None, pool_tokens: int = 0) -> None:
        super().__init__(clock, options, transport, pool_tokens)
        if not replica_urls:
            raise ValueError("a replica set needs at least one replica URL")
        # one client per replica on the same connection pool, for its /metrics, server info and reset
        self.replicas = [OpenAIEngineClient(clock, EndpointOptions(url=url, api_key=options.api_key,
                                                                   server=options.server), self.transport)
                         for url in replica_urls]
        # each replica's metrics at the last scrape (None: it could not be scraped)
        self.replica_scrapes: list[Optional[ScrapedMetrics]] = [None] * len(self.replicas)
        self.replica_errors: list[Optional[str]] = [None] * len(self.replicas)

    # ---------------------------------------------------------------- metrics
    async def scrape(self) -> ScrapedMetrics:
        """Every replica's /metrics, summed; TransportError naming the first replica that failed."""
        results = await asyncio.gather(*(r.scrape() for r in self.replicas), return_exceptions=True)
        failed = None
        for i, (replica, result) in enumerate(zip(self.replicas, results)):
            if isinstance(result, ScrapedMetrics):
                self.replica_scrapes[i], self.replica_errors[i] = result, None
                continue
            if not isinstance(result, (TransportError, HttpStatusError, ValueError)):
                raise result
            self.replica_scrapes[i], self.replica_errors[i] = None, f"{type(result).__name__}: {result}"
            failed = failed or f"{replica.base}/metrics: {self.replica_errors[i]}"
        if failed is not None:
            raise TransportError(failed)
        summed = sum_scrapes(list(self.replica_scrapes))
        self.last_metrics = summed
        return summed

    def replica_rows(self, now_s: float) -> list[dict]:
        """replica_samples.parquet rows of the last scrape (``metrics_async`` at ``now_s``)."""
        rows = []
        for i, (replica, scraped) in enumerate(zip(self.replicas, self.replica_scrapes)):
            m = scraped.metrics if scraped is not None else EngineMetrics(-1, -1, math.nan, -1, -1, -1)
            pool = scraped.pool_tokens if scraped is not None and scraped.pool_tokens else -1
            rows.append({"t_s": now_s, "replica_index": i, "replica_url": replica.base, "scraped": scraped is not None,
                         "num_running": m.num_running, "num_waiting": m.num_waiting, "kv_usage": m.kv_usage,
                         "pool_tokens": pool, "prefix_cache_queries_total": m.prefix_cache_queries_total,
                         "prefix_cache_hits_total": m.prefix_cache_hits_total,
                         "num_preemptions_total": m.num_preemptions_total})
        return rows

    async def metrics_async(self) -> EngineMetrics:
        try:
            return (await self.scrape()).metrics
        except (TransportError, HttpStatusError, ValueError):
            return EngineMetrics(-1, -1, math.nan, -1, -1, -1)

    async def server_lateness(self) -> Optional[LatenessHistogram]:
        """The replicas' lateness histograms merged (serve-sim replicas; None when none measures it):
        through the router the snapshots before and after a run could come from different replicas."""
        found = [h for h in await asyncio.gather(*(r.server_lateness() for r in self.replicas)) if h is not None]
        if not found:
            return None
        return LatenessHistogram.merged(found)

    # ---------------------------------------------------------------- pool, block size
    async def preflight(self, needed_context_tokens: int = 0, pool_tokens: Optional[int] = None,
                        time_scale: Optional[float] = None) -> dict:
        """The router's preflight (model, probes, cached tokens: with the session header the probes
        stay on one replica), with the pool and flavour from every replica: PreflightError naming a
        replica that cannot be scraped or whose pool is unknown (unless the spec gives pool_tokens)."""
        try:
            scraped = await self.scrape()
        except TransportError as exc:
            raise PreflightError(f"engine.metrics_urls: {exc}") from None
        if self.server == "auto":
            self.server = scraped.server
        if not pool_tokens and self.server != "sglang":
            unknown = [r.base for r, s in zip(self.replicas, self.replica_scrapes) if not s.pool_tokens]
            if unknown:
                raise PreflightError(f"engine.metrics_urls: the KV pool size of {', '.join(unknown)} is unknown (no "
                                     "vllm:cache_config_info or sglang:max_total_num_tokens in /metrics): give "
                                     "engine.pool_tokens (the replicas' total) in the spec")
        info = await super().preflight(needed_context_tokens, pool_tokens, time_scale)
        info["replicas"] = [{"url": r.base, "pool_tokens": s.pool_tokens if s is not None else None}
                            for r, s in zip(self.replicas, self.replica_scrapes)]
        return info

    async def _sglang_pool_tokens(self) -> Optional[int]:
        pools = await asyncio.gather(*(r._sglang_pool_tokens() for r in self.replicas))
        return None if any(p is None for p in pools) else sum(pools)

    async def _sglang_page_size(self) -> Optional[int]:
        sizes = [s for s in await asyncio.gather(*(r._sglang_page_size() for r in self.replicas)) if s]
        return min(sizes) if sizes else None

    # ---------------------------------------------------------------- flush
    async def flush_async(self) -> float:
        """Reset every replica's prefix cache (each as ``OpenAIEngineClient.flush_async``); the
        flush time is when the last one answered. PreflightError naming the replica that refused."""
        for replica in self.replicas:
            replica.clock = self.clock  # the run's clock, set after the preflight
            replica.server = self.server
        await asyncio.gather(*(r.flush_async() for r in self.replicas))
        for replica in self.replicas:
            replica.flush_times_s.clear()
        self.flush_times_s.append(self.clock.now())
        return self.flush_times_s[-1]


def sum_scrapes(scrapes: Sequence[ScrapedMetrics]) -> ScrapedMetrics:
    """Replicas' metrics as one engine's: counts and counters summed (-1 when any replica's is
    unknown), KV usage averaged weighted by pool (plain mean when a pool is unknown); the pool is
    the sum (None when any is unknown), the block size the smallest, the server the common one
    (``unknown`` when they differ)."""
    ms = [s.metrics for s in scrapes]

    def total(values: Sequence[int]) -> int:
        return -1 if any(v < 0 for v in values) else sum(values)

    pools = [s.pool_tokens for s in scrapes]
    usages = [m.kv_usage for m in ms]
    if all(pools) and not any(math.isnan(u) for u in usages):
        kv_usage = sum(u * p for u, p in zip(usages, pools)) / sum(pools)
    else:
        kv_usage = math.fsum(usages) / len(usages)  # NaN when any is unknown
    metrics = EngineMetrics(total([m.num_running for m in ms]), total([m.num_waiting for m in ms]), kv_usage,
                            total([m.prefix_cache_queries_total for m in ms]),
                            total([m.prefix_cache_hits_total for m in ms]),
                            total([m.num_preemptions_total for m in ms]))
    blocks = [s.block_size for s in scrapes if s.block_size]
    servers = {s.server for s in scrapes}
    return ScrapedMetrics(metrics, sum(pools) if all(pools) else None, min(blocks) if blocks else None,
                          servers.pop() if len(servers) == 1 else "unknown")


def make_client(clock: Clock, options: EndpointOptions, replica_urls: Optional[Sequence[str]] = None,
                transport: Optional[Transport] = None) -> OpenAIEngineClient:
    """The client for an endpoint: a ``ReplicaSetClient`` when replicas are listed."""
    if replica_urls:
        return ReplicaSetClient(clock, options, replica_urls, transport)
    return OpenAIEngineClient(clock, options, transport)
