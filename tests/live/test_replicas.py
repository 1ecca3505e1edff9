"""Routers and replica sets at the transport seam: the affinity header, replicas' metrics summed,
pools summed, resets sent to every replica (loadgen/live/replicas.py)."""

from __future__ import annotations

import asyncio
import math

import orjson
import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient, PreflightError
from loadgen.live.transport import TransportError
from loadgen.live.replicas import ReplicaSetClient, make_client

ROUTER = "http://router:8000"
REPLICAS = ["http://replica-a:8000", "http://replica-b:8000"]


def vllm_metrics(running, queries, hits, preemptions, usage, num_blocks, block_size=16):
    return (f"vllm:num_requests_running{{model_name=\"m\"}} {running}\n"
            f"vllm:num_requests_waiting{{model_name=\"m\"}} 1\n"
            f"vllm:kv_cache_usage_perc{{model_name=\"m\"}} {usage}\n"
            f"vllm:prefix_cache_queries_total{{model_name=\"m\"}} {queries}\n"
            f"vllm:prefix_cache_hits_total{{model_name=\"m\"}} {hits}\n"
            f"vllm:num_preemptions_total{{model_name=\"m\"}} {preemptions}\n"
            f"vllm:cache_config_info{{block_size=\"{block_size}\",num_gpu_blocks=\"{num_blocks}\"}} 1.0\n")


class HostTransport:
    """A transport double that answers by (host, path) and records every call with its headers."""

    def __init__(self, answers: dict) -> None:
        self.answers = answers  # (base URL, path) -> (status, bytes) or a list of SSE lines for streams
        self.calls: list[tuple[str, str, str, dict]] = []  # (method, base URL, path, headers)

    def _split(self, url: str) -> tuple[str, str]:
        scheme, rest = url.split("://", 1)
        host, _, path = rest.partition("/")
        return f"{scheme}://{host}", "/" + path

    async def request(self, method, url, body, headers, timeout_s):
        base, path = self._split(url)
        self.calls.append((method, base, path, dict(headers)))
        answer = self.answers.get((base, path.split("?")[0]))
        if isinstance(answer, Exception):
            raise answer
        return answer if answer is not None else (404, b"not found")

    async def stream_lines(self, url, body, headers, timeout_s, response_headers=None):
        base, path = self._split(url)
        self.calls.append(("POST", base, path, dict(headers)))
        usage = {"prompt_tokens": len(orjson.loads(body)["prompt"]), "completion_tokens": 1,
                 "prompt_tokens_details": {"cached_tokens": 256}}
        for chunk in ({"choices": [{"index": 0, "text": "x", "token_ids": [7]}]}, {"choices": [], "usage": usage}):
            yield [b"data: " + orjson.dumps(chunk)]
        yield [b"data: [DONE]"]

    async def close(self) -> None:
        pass


def answers(metrics_b=None):
    models = orjson.dumps({"data": [{"id": "m", "max_model_len": 32768}]})
    return {
        (ROUTER, "/v1/models"): (200, models),
        (ROUTER, "/metrics"): (200, b"router_requests_total 5\n"),  # a router's own metrics: no pool in them
        (REPLICAS[0], "/metrics"): (200, vllm_metrics(3, 1000, 600, 2, 0.5, 100).encode()),
        (REPLICAS[1], "/metrics"): (metrics_b if metrics_b is not None
                                    else (200, vllm_metrics(1, 500, 100, 1, 0.25, 300).encode())),
        (REPLICAS[0], "/reset_prefix_cache"): (200, b""),
        (REPLICAS[1], "/reset_prefix_cache"): (200, b""),
    }


def test_the_affinity_header_names_the_session_on_every_turn_and_the_probes_share_one():
    transport = HostTransport(answers())
    options = EndpointOptions(url=ROUTER, model="m", session_header="X-Session-ID", session_label="burst-s7")

    async def go():
        client = OpenAIEngineClient(WallClock(), options, transport)
        await client.preflight(pool_tokens=1000)
        for session_id, turn in ((3, 0), (4, 0), (3, 1)):
            await client.generate(TurnRequest(session_id, turn, 512, 1, token_ids=list(range(1, 513))))

    asyncio.run(go())
    sent = [headers.get("X-Session-ID") for method, base, path, headers in transport.calls
            if path == "/v1/completions"]
    assert sent == ["burst-s7/preflight"] * 3 + ["burst-s7/3", "burst-s7/4", "burst-s7/3"]


def test_without_a_session_header_none_is_sent():
    transport = HostTransport(answers())

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=ROUTER, model="m"), transport)
        await client.generate(TurnRequest(3, 0, 4, 1, token_ids=[1, 2, 3, 4]))

    asyncio.run(go())
    headers = [h for _, _, path, h in transport.calls if path == "/v1/completions"][0]
    assert not any(name.lower() == "x-session-id" for name in headers)


def test_replica_metrics_are_summed_and_kept_per_replica():
    transport = HostTransport(answers())

    async def go():
        client = make_client(WallClock(), EndpointOptions(url=ROUTER, model="m"), REPLICAS, transport)
        info = await client.preflight()
        return client, info, await client.metrics_async(), client.replica_rows(10.0)

    client, info, summed, rows = asyncio.run(go())
    assert isinstance(client, ReplicaSetClient)
    # pools: 100 and 300 blocks of 16 tokens
    assert info["pool_tokens"] == client.pool_tokens == 1600 + 4800 and info["block_size"] == 16
    assert info["replicas"] == [{"url": REPLICAS[0], "pool_tokens": 1600}, {"url": REPLICAS[1], "pool_tokens": 4800}]
    assert (summed.num_running, summed.num_waiting) == (4, 2)
    assert (summed.prefix_cache_queries_total, summed.prefix_cache_hits_total, summed.num_preemptions_total) == (
        1500, 700, 3)
    assert summed.kv_usage == pytest.approx((0.5 * 1600 + 0.25 * 4800) / 6400)  # weighted by pool
    assert [(r["replica_index"], r["replica_url"], r["pool_tokens"], r["prefix_cache_hits_total"], r["scraped"])
            for r in rows] == [(0, REPLICAS[0], 1600, 600, True), (1, REPLICAS[1], 4800, 100, True)]
    assert all(r["t_s"] == 10.0 for r in rows)


def test_a_replica_that_cannot_be_scraped_makes_the_sum_unknown_not_smaller():
    transport = HostTransport(answers())

    async def go():
        client = make_client(WallClock(), EndpointOptions(url=ROUTER, model="m"), REPLICAS, transport)
        await client.preflight()
        transport.answers[(REPLICAS[1], "/metrics")] = TransportError("ClientConnectorError: refused")
        return await client.metrics_async(), client.replica_rows(20.0)

    summed, rows = asyncio.run(go())
    assert summed.prefix_cache_hits_total == -1 and math.isnan(summed.kv_usage)
    assert [r["scraped"] for r in rows] == [True, False]
    assert rows[0]["prefix_cache_hits_total"] == 600 and rows[1]["prefix_cache_hits_total"] == -1


def test_preflight_names_the_replica_that_cannot_be_scraped_or_has_no_pool():
    async def go(metrics_b, pool_tokens=None):
        client = make_client(WallClock(), EndpointOptions(url=ROUTER, model="m"), REPLICAS,
                             HostTransport(answers(metrics_b)))
        return await client.preflight(pool_tokens=pool_tokens)

    with pytest.raises(PreflightError, match=r"engine.metrics_urls: http://replica-b:8000/metrics: HttpStatusError"):
        asyncio.run(go((404, b"not found")))
    no_pool = (200, b"vllm:num_requests_running 0\nvllm:prefix_cache_queries_total 0\n")
    with pytest.raises(PreflightError, match=r"KV pool size of http://replica-b:8000 is unknown.*engine.pool_tokens"):
        asyncio.run(go(no_pool))
    assert asyncio.run(go(no_pool, pool_tokens=5000))["pool_tokens"] == 5000  # the spec's total


def test_a_reset_goes_to_every_replica_not_the_router():
    transport = HostTransport(answers())

    async def go():
        client = make_client(WallClock(), EndpointOptions(url=ROUTER, model="m", server="vllm"), REPLICAS, transport)
        await client.flush_async()
        return client

    client = asyncio.run(go())
    resets = sorted(base for method, base, path, _ in transport.calls if path.startswith("/reset_prefix_cache"))
    assert resets == REPLICAS and len(client.flush_times_s) == 1


def test_a_replica_refusing_the_reset_is_named():
    transport = HostTransport(answers())
    transport.answers[(REPLICAS[1], "/reset_prefix_cache")] = (404, b"not found")

    async def go():
        client = make_client(WallClock(), EndpointOptions(url=ROUTER, model="m", server="vllm"), REPLICAS, transport)
        await client.flush_async()

    with pytest.raises(PreflightError, match=r"http://replica-b:8000/reset_prefix_cache refused"):
        asyncio.run(go())


def test_metrics_urls_take_base_urls_or_the_replicas_metrics_urls():
    from loadgen.core.spec import parse_spec
    from tests.conftest import make_spec_dict

    spec = parse_spec(make_spec_dict(engine={
        "kind": "openai", "url": "http://router:8000/v1", "session_header": "X-Session-ID",
        "metrics_urls": ["http://10.0.0.5:8000/metrics", "http://10.0.0.6:8000/v1/", "http://10.0.0.7:8000"]}))
    assert spec.engine.metrics_urls == ["http://10.0.0.5:8000", "http://10.0.0.6:8000", "http://10.0.0.7:8000"]
    assert spec.engine.session_header == "X-Session-ID"


def test_a_sub_agent_names_its_parent_in_dynamos_header():
    transport = HostTransport(answers())
    options = EndpointOptions(url=ROUTER, model="m", session_header="X-Session-ID", session_label="burst-s7")

    async def go():
        client = OpenAIEngineClient(WallClock(), options, transport)
        await client.generate(TurnRequest(3, 0, 4, 1, token_ids=[1, 2, 3, 4]))
        await client.generate(TurnRequest(9, 0, 4, 1, token_ids=[1, 2, 3, 5], parent_session_id=3))

    asyncio.run(go())
    sent = [(headers.get("X-Session-ID"), headers.get("x-dynamo-parent-session-id"))
            for method, base, path, headers in transport.calls if path == "/v1/completions"]
    assert sent == [("burst-s7/3", None), ("burst-s7/9", "burst-s7/3")]
