"""The HTTP engine client against a test double at the transport seam."""

import asyncio
import math

import orjson
import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import FLUSH_RETRY_INTERVAL_S, EndpointOptions, OpenAIEngineClient, PreflightError
from loadgen.live.transport import MockResponse, MockTransport, TransportError

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


def test_a_gateway_whose_clock_runs_at_another_scale_is_refused():
    base = _server()

    def handler(method, path, body):
        if path == "/loadgen/lag":  # loadgen gateway in front of a real engine: its own clock's scale only
            return MockResponse(json={"gateway_time_scale": 1.0})
        return base(method, path, body)

    async def go(run_scale):
        client = OpenAIEngineClient(WallClock(run_scale), EndpointOptions(url="http://engine:8000"),
                                    MockTransport(handler))
        return await client.preflight()

    assert run(go(1.0))["warnings"] == []
    with pytest.raises(PreflightError, match=r"loadgen gateway whose clock runs at time_scale 1, and this run's "
                                             r"time scale is 30.*start the gateway with --time-scale 30"):
        run(go(30.0))


def test_a_specs_simulated_pool_is_used_or_refused_never_dropped():
    """loadgen run SPEC --endpoint: the pool the spec's simulated engine had is the pool of an
    endpoint that reports none, and an endpoint that reports another is refused, naming both and
    the flag; --pool-tokens (pool_tokens) chooses."""
    def preflight(metrics, **options):
        async def go():
            client = await make_client(_server(metrics=metrics), **options)()
            return await client.preflight()
        return run(go())

    assert preflight("", simulated_pool_tokens=160_000)["pool_tokens"] == 160_000
    assert preflight(VLLM_METRICS, simulated_pool_tokens=1024 * 128)["pool_tokens"] == 1024 * 128
    with pytest.raises(PreflightError, match=r"engine.pool_tokens: .* 160000-token KV pool, but .* has 131072 "
                                             r"tokens.*--pool-tokens 131072"):
        preflight(VLLM_METRICS, simulated_pool_tokens=160_000)
    with pytest.raises(PreflightError, match="give --pool-tokens N"):
        preflight("")


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
        # run time 10x the wall clock: the two refusals' waits take 100 ms
        client = OpenAIEngineClient(WallClock(10.0), EndpointOptions(url="http://engine:8000", server="sglang"),
                                    MockTransport(handler))
        return client, await client.flush_async()

    client, flushed_at_s = run(go())
    # refused twice, FLUSH_RETRY_INTERVAL_S of run time apart, then done: the flush is when it happened
    assert state["n"] == 3 and client.flush_times_s == [flushed_at_s]
    # (under a third wait: 50 ms of wall time to spare on a busy machine)
    assert 2 * FLUSH_RETRY_INTERVAL_S <= flushed_at_s < 3 * FLUSH_RETRY_INTERVAL_S


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


class ScriptedStream:
    """A transport double that hands over SSE lines in the given batches (one batch per network
    read), each at its own time on a virtual clock: how reads coalesce under a busy driver."""

    def __init__(self, clock, batches) -> None:
        self.clock = clock
        self.batches = batches  # [(at_s, [line, ...]), ...]

    async def stream_lines(self, url, body, headers, timeout_s, response_headers=None):
        for at_s, lines in self.batches:
            await self.clock.sleep(at_s - self.clock.now())
            yield lines

    async def close(self):
        pass


def generate_on_virtual_clock(batches, api="completions", max_tokens=12):
    from loadgen.core.clock import VirtualClock

    clock = VirtualClock()
    client = OpenAIEngineClient(clock, EndpointOptions(url="http://engine:8000", model="m", api=api),
                                ScriptedStream(clock, batches))
    task = clock.spawn(client.generate(TurnRequest(1, 0, 3, max_tokens, token_ids=[1, 2, 3])))
    clock.run()
    return task.result()


def test_inter_token_gaps_are_per_token_when_reads_carry_several_events():
    """12 single-token events, two per network read, 92 ms apart (a token every 46 ms): the
    per-token gaps are 46 ms, not one 92 ms gap per read."""
    lines = completion_stream(list(range(100, 112)), 3)  # 12 token events, the usage event, [DONE]
    batches = [(0.5 + 0.092 * k, lines[2 * k:2 * k + 2]) for k in range(6)] + [(1.0, lines[12:])]
    result = generate_on_virtual_clock(batches)
    assert result.error is None and result.output_tokens == 12 and result.first_token_s == pytest.approx(0.5)
    assert len(result.inter_token_gaps_s) == 10  # the tokens after the first read
    assert sum(result.inter_token_gaps_s) / 10 == pytest.approx(0.046)


def test_an_event_of_several_tokens_counts_each_of_them():
    """An event's token count is its token ids, else the growth of a streamed usage's
    completion_tokens (chat deltas without ids), else one."""
    with_ids = sse(*[{"choices": [{"index": 0, "text": "xyz", "token_ids": [3 * k, 3 * k + 1, 3 * k + 2]}]}
                     for k in range(4)], {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 12}})
    by_usage = sse(*[{"choices": [{"index": 0, "delta": {"content": "xyz"}}],
                      "usage": {"prompt_tokens": 3, "completion_tokens": 3 * (k + 1)}} for k in range(4)],
                   {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 12}})
    for lines, api in ((with_ids, "completions"), (by_usage, "chat")):
        batches = [(0.1 * (k + 1), [line]) for k, line in enumerate(lines)]
        result = generate_on_virtual_clock(batches, api=api)
        assert result.error is None and result.output_tokens == 12
        # 3 events after the first, 3 tokens each, 0.1 s apart
        assert result.inter_token_gaps_s == pytest.approx((0.1 / 3,) * 9)


@pytest.mark.parametrize("event", [{"error": "engine overloaded"}, {"error": {"message": "boom", "code": 503}},
                                   ["not", "an", "object"]])
def test_an_error_event_in_the_stream_is_a_failed_turn_that_is_retried(event):
    """Some servers stream ``{"error": "..."}`` (a string) rather than an error object: either
    ends the turn as a recorded failure the session retries, never an exception out of it."""
    from loadgen.core.session import RetryPolicy

    handler = lambda m, p, b: MockResponse(lines=completion_stream([7], 3)[:1] + sse(event))

    async def go():
        client = await make_client(handler, model="m")()
        return await client.generate(TurnRequest(1, 0, 3, 2, token_ids=[1, 2, 3]))

    result = run(go())
    assert result.error is not None and result.output_tokens == 0
    assert ("engine overloaded" in result.error or "boom" in result.error or "not a JSON object" in result.error)
    assert RetryPolicy(max_attempts=3).should_retry(1, result.error)


@pytest.mark.parametrize("server_scale,run_scale,outcome", [
    (None, 1.0, []), (None, 20.0, "warning"), (20.0, 20.0, []), (1.0, 20.0, "refused")])
def test_a_time_scale_the_server_does_not_run_at_is_refused_or_warned_of(server_scale, run_scale, outcome):
    base = _server()

    def handler(method, path, body):
        if path == "/loadgen/lag" and server_scale is not None:  # serve-sim says its scale
            return MockResponse(json={"time_scale": server_scale, "lateness": {}})
        return base(method, path, body)

    async def go():
        client = OpenAIEngineClient(WallClock(run_scale), EndpointOptions(url="http://engine:8000"),
                                    MockTransport(handler))
        return await client.preflight()

    if outcome == "refused":
        with pytest.raises(PreflightError, match=r"serve-sim at --time-scale 1, and this run's time scale is 20.*"
                                                 r"start serve-sim with --time-scale 20, or run with --time-scale 1"):
            run(go())
        return
    warnings = run(go())["warnings"]
    if outcome == "warning":
        (warning,) = warnings
        assert warning.startswith("--time-scale 20 against http://engine:8000") and "20x as long" in warning
    else:
        assert warnings == []
