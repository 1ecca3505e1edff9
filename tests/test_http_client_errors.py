"""The HTTP client's failures that stop a run: each says what failed and what to change."""

import asyncio

import pytest

from loadgen.core.clock import WallClock
from loadgen.live.http_client import FLUSH_MAX_ATTEMPTS, EndpointOptions, OpenAIEngineClient, PreflightError
from loadgen.live.transport import MockResponse, MockTransport, TransportError


def run_client(handler, coro_of, url="http://engine:8000", time_scale=1.0, **options):
    transport = MockTransport(handler)

    async def go():
        client = OpenAIEngineClient(WallClock(time_scale), EndpointOptions(url=url, **options), transport)
        return await coro_of(client)

    return asyncio.run(go()), transport


def test_sglang_flush_retries_are_bounded_and_waited_on_the_runs_clock():
    refuse = lambda m, p, b: MockResponse(status=400, text="requests are running")
    # a 1e6-fold run clock: the bounded retries take their run-time waits in microseconds
    with pytest.raises(PreflightError, match=f"/flush_cache refused {FLUSH_MAX_ATTEMPTS} times.*HTTP 400") as err:
        run_client(refuse, lambda c: c.flush_async(), server="sglang", time_scale=1e6)
    assert "0.5 s of run time apart" in str(err.value)


@pytest.mark.parametrize("server,path", [("sglang", "/flush_cache"), ("vllm", "/reset_prefix_cache")])
def test_a_flush_transport_error_is_a_clear_error(server, path):
    refused = lambda m, p, b: TransportError("ClientConnectorError: connection refused")
    with pytest.raises(PreflightError, match=f"http://engine:8000{path}: transport error: .*connection refused"):
        run_client(refused, lambda c: c.flush_async(), server=server)


def test_a_url_path_that_404s_names_the_path_and_suggests_the_base_url():
    def handler(method, path, body):
        return MockResponse(status=404, text="Not Found")

    with pytest.raises(PreflightError) as err:
        run_client(handler, lambda c: c.preflight(), url="http://engine:8000/api/llm")
    assert str(err.value) == ("http://engine:8000/api/llm/v1/models answered HTTP 404 (no such path); "
                              "is http://engine:8000 the server's base URL?")
