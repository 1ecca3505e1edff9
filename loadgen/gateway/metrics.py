"""What the gateway tells about itself: Prometheus ``/metrics`` and the JSON ``/status``.

Names are prefixed ``loadgen_gateway_``. Gauges (sessions, queue lengths, the limit, the
upstreams' own gauges from their last scrape) are read when scraped, from the live state;
counters and histograms are counted as requests go.
"""

from __future__ import annotations

import math
from typing import Optional

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

PARK_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class GatewayMetrics:
    def __init__(self, proxy) -> None:
        self.proxy = proxy
        self.registry = registry = CollectorRegistry()
        p = "loadgen_gateway_"
        self.admissions = Counter(p + "admissions", "Requests let through, by how: immediately (went), after "
                                  "waiting (admitted), at the maximum park time (forced)", ["how"], registry=registry)
        self.parks = Counter(p + "parks", "Requests held at a turn boundary (parked) or as new sessions (waiting)",
                             ["queue"], registry=registry)
        self.rejected = Counter(p + "rejected", "Requests refused, by reason", ["reason"], registry=registry)
        self.abandoned = Counter(p + "abandoned", "Requests whose client hung up while they waited",
                                 registry=registry)
        self.park_time = Histogram(p + "park_seconds", "Time a request was held before it went upstream "
                                   "(gateway clock)", buckets=PARK_BUCKETS_S, registry=registry)
        self.requests = Counter(p + "upstream_requests", "Requests sent upstream", ["upstream"], registry=registry)
        self.errors = Counter(p + "upstream_errors", "Upstream requests that failed (unreachable, cut short, "
                              "HTTP >= 500)", ["upstream"], registry=registry)
        self.latency = Histogram(p + "upstream_latency_seconds", "From sending a request upstream to its last byte "
                                 "(wall)", ["upstream"], buckets=LATENCY_BUCKETS_S, registry=registry)
        self.sessions_ended = Counter(p + "sessions_ended", "Sessions that ended, by how", ["how"], registry=registry)
        self.client_requests = Counter(
            p + "client_requests", "Every request a client sent, once it ended, by outcome: answered (a whole "
            "response), refused (the gateway's own 4xx/5xx), failed (the upstream's failure: 502, or its response "
            "cut short), cut (a stream cut at the drain deadline), client_gone (the client hung up first); and the "
            "status sent (none: no head)", ["outcome", "status"], registry=registry)
        gate = lambda: proxy.gate  # noqa: E731 (the gate is replaced by a reset)
        Gauge(p + "active_sessions", "Admitted sessions", registry=registry).set_function(
            lambda: gate().num_admitted)
        Gauge(p + "parked_sessions", "Sessions parked at a turn boundary", registry=registry).set_function(
            lambda: len(gate().parked))
        Gauge(p + "waiting_sessions", "New sessions waiting for admission", registry=registry).set_function(
            lambda: len(gate().waiting_new))
        Gauge(p + "demand_tokens", "D: the admitted sessions' demand", registry=registry).set_function(
            lambda: gate().demand_tokens)
        Gauge(p + "pool_tokens", "C: the KV pool the limit is computed from", registry=registry).set_function(
            lambda: gate().pool_tokens)
        Gauge(p + "controller_limit", "The controller's current limit (NaN: none)", registry=registry).set_function(
            lambda: gate().limit())
        Gauge(p + "in_flight_requests", "Requests being answered upstream", registry=registry).set_function(
            lambda: proxy.num_in_flight)
        routed = Gauge(p + "upstream_outstanding", "Turn requests the router sent to an upstream and has not seen "
                       "answered (its view of the upstream's load)", ["upstream"], registry=registry)
        for i, url in enumerate(proxy.config.upstreams):  # the routing is replaced by a reset
            routed.labels(url).set_function(lambda i=i: proxy.routing.outstanding[i])
        self.engine = Gauge(p + "upstream_engine", "An upstream's own gauges at its last scrape (-1/NaN unknown)",
                            ["upstream", "gauge"], registry=registry)

    def counts(self) -> dict:
        """The counters a run reports (run.json ``gateway``): admissions by how, parks by queue,
        sessions ended by how, as they stand now."""
        def count(metric, label) -> int:
            return int(metric.labels(label)._value.get())

        return {"admissions": {how: count(self.admissions, how) for how in ("went", "admitted", "forced")},
                "parks": {queue: count(self.parks, queue) for queue in ("parked", "waiting")},
                "sessions_ended": {how: count(self.sessions_ended, how) for how in
                                   ("final", "idle", "failed", "client_gone", "abandoned", "rejected", "drained")}}

    def engine_scraped(self, url: str, num_running: int, num_waiting: int, kv_usage: float) -> None:
        self.engine.labels(url, "num_running").set(num_running)
        self.engine.labels(url, "num_waiting").set(num_waiting)
        self.engine.labels(url, "kv_usage").set(kv_usage)

    def text(self) -> bytes:
        """The exposition without prometheus_client's ``*_created`` series (a timestamp per counter
        that no dashboard of this gateway reads, and twice the lines)."""
        return b"\n".join(line for line in generate_latest(self.registry).split(b"\n")
                          if not _metric_name(line).endswith(b"_created"))


def engine_exposition(proxy) -> bytes:
    """What an engine's /metrics says, for the upstreams together, in their flavour's names, so a
    client that reads an engine (loadgen's preflight and samples, a dashboard) reads the gateway as
    one engine: the KV pool the gate computes with (vLLM's ``cache_config_info``, SGLang's
    ``max_total_num_tokens``), requests running and waiting, KV usage (their mean) and the
    prefix-cache and preemption counters, summed, as of each upstream's last scrape (every
    ``scrape_interval_s``). Nothing before the first scrape; a sum or mean over an upstream whose
    last scrape failed is unknown and left out."""
    from ..live.server_metrics import SGLANG_METRICS, VLLM_METRICS

    scraped = [s for s in (proxy.engine_signals.get(url) for url in proxy.config.upstreams) if s and "server" in s]
    if not scraped:
        return b""
    flavors = {s["server"] for s in scraped}
    sglang = flavors == {"sglang"}
    names = SGLANG_METRICS if sglang else VLLM_METRICS
    pool = int(proxy.gate.pool_tokens)
    lines = []
    if sglang:
        lines += ["# TYPE sglang:max_total_num_tokens gauge", f"sglang:max_total_num_tokens {pool}"]
    else:
        blocks = {s.get("block_size") for s in scraped} - {None}
        if len(blocks) == 1:  # one block size over the upstreams: the pool in its blocks
            block = blocks.pop()
            lines += ["# TYPE vllm:cache_config_info gauge",
                      f'vllm:cache_config_info{{block_size="{block}",enable_prefix_caching="True",'
                      f'num_gpu_blocks="{pool // block}"}} 1.0']

    def total(key: str) -> Optional[int]:
        values = [s.get(key) for s in scraped]
        return None if any(v is None or v < 0 for v in values) else sum(values)

    for key, kind in (("num_running", "gauge"), ("num_waiting", "gauge"), ("prefix_cache_queries_total", "counter"),
                      ("prefix_cache_hits_total", "counter"), ("num_preemptions_total", "counter")):
        value = total(key)
        if value is not None:
            name = names[key] + ("_total" if kind == "counter" else "")
            lines += [f"# TYPE {names[key]} {kind}", f"{name} {value}"]
    usage = [s.get("kv_usage") for s in scraped]
    if None not in usage:  # an upstream whose last scrape failed: the mean is unknown
        lines += [f"# TYPE {names['kv_usage']} gauge", f"{names['kv_usage']} {sum(usage) / len(usage)}"]
    return ("\n".join(lines) + "\n").encode()


def _metric_name(line: bytes) -> bytes:
    """The metric a line of the text exposition is about: ``# HELP NAME ...``, ``# TYPE NAME ...``
    or ``NAME{labels} value``."""
    if line.startswith(b"#"):
        parts = line.split(b" ", 3)
        return parts[2] if len(parts) > 2 else b""
    return line.split(b"{", 1)[0].split(b" ", 1)[0]


def status(proxy) -> dict:
    """The JSON ``/status``: the gate's state, the limit, the upstreams and their last scrape."""
    gate = proxy.gate
    limit = gate.limit()
    return {
        "controller": proxy.config.controller,
        "controller_options": proxy.config.controller_options,
        "control_on": gate.control_on,
        "limit": None if math.isnan(limit) else limit,
        "pool_tokens": gate.pool_tokens,
        "demand_tokens": gate.demand_tokens,
        "active_sessions": gate.num_admitted,
        "parked_sessions": len(gate.parked),
        "waiting_sessions": len(gate.waiting_new),
        "known_sessions": len(proxy.sessions),
        "in_flight_requests": proxy.num_in_flight,
        "draining": proxy.draining,
        "clock_s": gate.clock.now(),
        "router": proxy.config.router,
        "upstreams": [{"url": url, "outstanding": proxy.routing.outstanding[i], **proxy.engine_signals.get(url, {})}
                      for i, url in enumerate(proxy.config.upstreams)],
    }
