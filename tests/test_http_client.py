"""The HTTP engine client against a test double at the transport seam."""

import asyncio
import math

import orjson
import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import (EndpointOptions, MockResponse, MockTransport, OpenAIEngineClient, PreflightError,
                                 TransportError, parse_metrics)

VLLM_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 20000.0
vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 15000.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",enable_prefix_caching="True",num_gpu_blocks="1024"} 1.0
"""


def sse(*chunks):
    return [b"data: " + orjson.dumps(c) + b"\n" for c in chunks] + [b"data: [DONE]\n"]


def completion_stream(ids, prompt_tokens, cached=None):
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids)}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    chunks = [{"choices": [{"index": 0, "text": "x", "token_ids": [t]}]} for t in ids]
    return sse(*chunks, {"choices": [], "usage": usage})


def run(coro):
    return asyncio.run(coro)


def make_client(handler, **options):
    async def build():
        return OpenAIEngineClient(WallClock(), EndpointOptions(url="http://engine:8000", **options),
                                  MockTransport(handler))
    return build


def test_a_turn_reads_ttft_cached_tokens_and_generated_ids():
    def handler(method, path, body):
        assert path == "/v1/completions" and body["prompt"] == [5, 6, 7]
        assert body["ignore_eos"] and body["max_tokens"] == 3 and body["stream_options"]["include_usage"]
        return MockResponse(lines=completion_stream([11, 12, 13], 3, cached=2))

    async def go():
        client = await make_client(handler, model="m")()
        return await client.generate(TurnRequest(1, 0, 3, 3, token_ids=[5, 6, 7]))

    result = run(go())
    assert result.error is None and result.cached_tokens == 2 and result.output_tokens == 3
    assert result.output_token_ids == [11, 12, 13]
    assert result.submitted_s <= result.first_token_s <= result.finish_s
    assert len(result.inter_token_gaps_s) == 2


def test_missing_prompt_tokens_details_means_zero_cached():
    handler = lambda m, p, b: MockResponse(lines=completion_stream([1], 3))

    async def go():
        client = await make_client(handler, model="m")()
        return await client.generate(TurnRequest(1, 0, 3, 1, token_ids=[1, 2, 3]))

    assert run(go()).cached_tokens == 0


@pytest.mark.parametrize("failure,expect", [
    (MockResponse(status=500, text="boom"), "HTTP 500"),
    (TransportError("ClientConnectorError: refused"), "refused"),
])
def test_failures_become_errors_not_exceptions(failure, expect):
    async def go():
        client = await make_client(lambda m, p, b: failure, model="m")()
        result = await client.generate(TurnRequest(1, 0, 3, 1, token_ids=[1, 2, 3]))
        return client, result

    client, result = run(go())
    assert expect in result.error and math.isnan(result.first_token_s)
    assert client.consecutive_failures == 1


def test_hanging_server_times_out():
    async def hang(m, p, b):
        await asyncio.sleep(10)

    async def go():
        client = await make_client(hang, model="m", request_timeout_s=0.2)()
        return await client.generate(TurnRequest(1, 0, 3, 1, token_ids=[1, 2, 3]))

    result = run(go())
    assert result.error is not None and "timeout after 0.2 s" in result.error


def test_api_key_is_sent_but_never_recorded(monkeypatch):
    handler = lambda m, p, b: MockResponse(lines=completion_stream([1], 3))
    transport = MockTransport(handler)

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url="http://e", model="m", api_key="sk-secret"),
                                    transport)
        return await client.generate(TurnRequest(1, 0, 3, 1, token_ids=[1, 2, 3]))

    result = run(go())
    assert transport.calls[0][3]["Authorization"] == "Bearer sk-secret"
    assert "sk-secret" not in repr(result)


def _server(models=("tiny",), cached=256, metrics=VLLM_METRICS, reject_ids=False):
    seen = {"n": 0}

    def handler(method, path, body):
        if path == "/v1/models":
            return MockResponse(json={"data": [{"id": m, "max_model_len": 16384} for m in models]})
        if path == "/metrics":
            return MockResponse(text=metrics)
        if path.startswith("/reset_prefix_cache"):
            return MockResponse(status=404, text="Not Found")
        if path == "/v1/completions":
            if reject_ids and isinstance(body["prompt"], list):
                return MockResponse(status=400, text="prompt must be a string")
            seen["n"] += 1
            return MockResponse(lines=completion_stream([1, 2], 512, cached if seen["n"] > 1 else 0))
        return MockResponse(status=404)
    return handler


def test_preflight_reads_model_pool_and_checks_cache_reports():
    async def go():
        client = await make_client(_server())()
        return client, await client.preflight(needed_context_tokens=9000)

    client, info = run(go())
    assert info["model"] == "tiny" and info["pool_tokens"] == 1024 * 128 and info["server"] == "vllm"
    assert info["prompt_mode"] == "token_ids"


def test_preflight_names_the_server_flag_when_cached_tokens_are_not_reported():
    async def go():
        client = await make_client(_server(cached=0))()
        await client.preflight()

    with pytest.raises(PreflightError, match="--enable-prompt-tokens-details"):
        run(go())


def test_preflight_errors_for_unknown_model_and_too_long_sessions():
    async def unknown():
        await (await make_client(_server(), model="llama")()).preflight()

    with pytest.raises(PreflightError, match="'llama' is not served.*'tiny'"):
        run(unknown())

    async def too_long():
        await (await make_client(_server())()).preflight(needed_context_tokens=40000)

    with pytest.raises(PreflightError, match="40000 tokens.*16384"):
        run(too_long())


def test_preflight_falls_back_to_text_prompts():
    async def go():
        client = await make_client(_server(reject_ids=True))()
        return await client.preflight()

    assert run(go())["prompt_mode"] == "text"


def test_unreachable_endpoint_is_a_clear_preflight_error():
    async def go():
        await (await make_client(lambda m, p, b: TransportError("ClientConnectorError: refused"))()).preflight()

    with pytest.raises(PreflightError, match="not reachable"):
        run(go())


def test_flush_without_dev_mode_says_how_to_enable_it():
    async def go():
        client = await make_client(_server(), server="vllm")()
        await client.flush_async()

    with pytest.raises(PreflightError, match="VLLM_SERVER_DEV_MODE=1"):
        run(go())


def test_sglang_flush_is_retried_until_idle():
    state = {"n": 0}

    def handler(method, path, body):
        if path == "/flush_cache":
            state["n"] += 1
            return MockResponse(status=400 if state["n"] < 3 else 200, text="busy")
        return MockResponse(status=404)

    async def go():
        client = await make_client(handler, server="sglang")()
        return await client.flush_async()

    assert run(go()) >= 0 and state["n"] == 3


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


def test_cached_tokens_come_from_prompt_tokens_details_then_from_meta_info():
    # SGLang's OpenAI endpoint reports usage.prompt_tokens_details (omitted when 0); a stream whose
    # chunks carry SGLang's native meta_info instead is read from there
    answers = iter([completion_stream([1, 2], 100, cached=64),
                    sse({"choices": [{"index": 0, "text": "x", "token_ids": [1]}],
                         "meta_info": {"cached_tokens": 32}},
                        {"choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 1}}),
                    completion_stream([1], 100)])

    def handler(method, path, body):
        return MockResponse(lines=next(answers))

    async def go():
        client = await make_client(handler, model="m")()
        return [await client.generate(TurnRequest(1, k, 100, 2, token_ids=[1] * 100)) for k in range(3)]

    assert [r.cached_tokens for r in run(go())] == [64, 32, 0]


def test_sglang_retractions_are_read_only_from_a_counter():
    gauge = "# TYPE sglang:num_retracted_reqs gauge\nsglang:num_retracted_reqs 3\n"
    # 0.5.x: a gauge of the retractions since the last stats log, not a total: not recorded
    assert parse_metrics(gauge).metrics.num_preemptions_total == -1
    counter = "# TYPE sglang:num_retracted_requests counter\nsglang:num_retracted_requests_total 7\n"
    assert parse_metrics(gauge + counter).metrics.num_preemptions_total == 7


def test_sglang_pool_comes_from_get_server_info_when_metrics_lack_it():
    metrics = ("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"
               "# TYPE sglang:token_usage gauge\nsglang:token_usage 0.0\n")
    probes = iter([0, 511, 511])

    def handler(method, path, body):
        if path == "/v1/models":
            return MockResponse(json={"data": [{"id": "m", "max_model_len": 40960}]})
        if path == "/v1/completions":
            return MockResponse(lines=completion_stream([1, 2], 512, cached=next(probes)))
        if path == "/metrics":
            return MockResponse(text=metrics)
        if path == "/get_server_info":
            return MockResponse(json={"max_total_num_tokens": 123456, "page_size": 1})
        return MockResponse(status=404)

    async def go():
        client = await make_client(handler)()
        return await client.preflight()

    info = run(go())
    assert info["server"] == "sglang" and info["pool_tokens"] == 123456
