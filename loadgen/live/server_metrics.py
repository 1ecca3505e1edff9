"""vLLM's and SGLang's /metrics (Prometheus text) read into the gauges and counters a run samples."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..core.engines import EngineMetrics

VLLM_METRICS = {
    "num_running": "vllm:num_requests_running",
    "num_waiting": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "prefix_cache_queries_total": "vllm:prefix_cache_queries",
    "prefix_cache_hits_total": "vllm:prefix_cache_hits",
    "num_preemptions_total": "vllm:num_preemptions",
}
SGLANG_METRICS = {
    "num_running": "sglang:num_running_reqs",
    "num_waiting": "sglang:num_queue_reqs",
    "kv_usage": "sglang:token_usage",
    "prefix_cache_queries_total": "sglang:prompt_tokens",
    "prefix_cache_hits_total": "sglang:cached_tokens",
    # a counter only in SGLang after 0.5.x; 0.5.x's sglang:num_retracted_reqs is a gauge of the
    # retractions since its last stats log, not a total, so it is not read (the column is -1)
    "num_preemptions_total": "sglang:num_retracted_requests",
}


@dataclass(frozen=True)
class ScrapedMetrics:
    metrics: EngineMetrics
    pool_tokens: Optional[int]
    block_size: Optional[int]
    server: str  # "vllm" | "sglang" | "unknown"
    # a loadgen gateway's /metrics (its own series beside the engine's): a run tells it when it starts
    loadgen_gateway: bool = False


def parse_metrics(text: str) -> ScrapedMetrics:
    """vLLM's or SGLang's /metrics (Prometheus text) into the sampled gauges and counters."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    pool_tokens = block_size = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.endswith("_created"):
                continue
            base = name[:-6] if name.endswith("_total") else name
            values[base] = values.get(base, 0.0) + sample.value  # sums over labels (e.g. engine index)
            if family.name == "vllm:cache_config_info":
                labels = sample.labels
                if "num_gpu_blocks" in labels and labels["num_gpu_blocks"] not in ("", "None"):
                    block_size = int(labels.get("block_size", 16))
                    pool_tokens = int(labels["num_gpu_blocks"]) * block_size
    server = "vllm" if any(k.startswith("vllm:") for k in values) else (
        "sglang" if any(k.startswith("sglang:") for k in values) else "unknown")
    names = SGLANG_METRICS if server == "sglang" else VLLM_METRICS

    def get(key: str) -> float:
        return values.get(names[key], math.nan)

    def count(key: str) -> int:
        v = get(key)
        return -1 if math.isnan(v) else int(v)

    if server == "sglang" and "sglang:max_total_num_tokens" in values:
        pool_tokens = int(values["sglang:max_total_num_tokens"])
    metrics = EngineMetrics(count("num_running"), count("num_waiting"), get("kv_usage"),
                            count("prefix_cache_queries_total"), count("prefix_cache_hits_total"),
                            count("num_preemptions_total"))
    return ScrapedMetrics(metrics, pool_tokens, block_size, server, "loadgen_gateway_active_sessions" in values)
