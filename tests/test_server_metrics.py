"""vLLM's and SGLang's /metrics text read into the sampled gauges and counters."""

from loadgen.live.server_metrics import parse_metrics
from tests.test_http_client import VLLM_METRICS


def test_vllm_metrics_are_parsed():
    scraped = parse_metrics(VLLM_METRICS)
    m = scraped.metrics
    assert (m.num_running, m.num_waiting, m.kv_usage) == (3, 1, 0.25)
    assert (m.prefix_cache_queries_total, m.prefix_cache_hits_total, m.num_preemptions_total) == (20000, 15000, 2)
    assert scraped.pool_tokens == 131072 and scraped.block_size == 128 and scraped.server == "vllm"


def test_sglang_metrics_are_parsed():
    text = ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 4\n"
            "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 2\n"
            "# TYPE sglang:token_usage gauge\nsglang:token_usage 0.5\n"
            "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens 400000\n")
    scraped = parse_metrics(text)
    assert scraped.server == "sglang" and scraped.pool_tokens == 400000
    assert (scraped.metrics.num_running, scraped.metrics.num_waiting) == (4, 2)


def test_sglang_retractions_are_read_only_from_a_counter():
    gauge = "# TYPE sglang:num_retracted_reqs gauge\nsglang:num_retracted_reqs 3\n"
    # 0.5.x: a gauge of the retractions since the last stats log, not a total: not recorded
    assert parse_metrics(gauge).metrics.num_preemptions_total == -1
    counter = "# TYPE sglang:num_retracted_requests counter\nsglang:num_retracted_requests_total 7\n"
    assert parse_metrics(gauge + counter).metrics.num_preemptions_total == 7
