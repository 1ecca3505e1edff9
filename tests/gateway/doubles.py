"""An engine double for gateway tests, and the gateway in the test's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Optional

import orjson
from aiohttp import web

from loadgen.gateway.config import GatewayConfig
from loadgen.gateway.proxy import GatewayProxy


class Upstream:
    """A vLLM-like engine on loopback (aiohttp: streamed responses go chunked). Every request is
    recorded; ``hold`` keeps each completion's response back until ``release()`` (or its session's
    ``held_by[...].set()``); ``die_after``
    closes the connection after that many streamed chunks. ``gauges`` are what its /metrics says
    (running, waiting, KV usage); ``replica``, when set, is sent as X-Loadgen-Replica (a deployment
    behind one URL)."""

    def __init__(self, gauges: tuple[int, int, float] = (3, 1, 0.25), replica: Optional[str] = None) -> None:
        self.gauges = gauges
        self.replica = replica
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.hold = False
        self.die_after: Optional[int] = None
        self.chunk_delay_s = 0.0
        self.held: list[asyncio.Event] = []
        self.held_by: dict[str, asyncio.Event] = {}  # the last held response of each session
        self.num_cut = 0  # responses whose client (the gateway) went away before their end
        self.num_scrapes = 0
        self.metrics_fault: Optional[str] = None  # "hang": /metrics never answers; "500": it fails
        self.runner: Optional[web.AppRunner] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "Upstream":
        app = web.Application(client_max_size=2**30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.metrics_fault = None
        await self.runner.cleanup()

    def release(self) -> None:
        held, self.held = self.held, []
        for event in held:
            event.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.path == "/metrics":  # the gateway's scrapes, kept apart from the requests it relays
            self.num_scrapes += 1
            while self.metrics_fault == "hang":  # until told otherwise (stop() does)
                await asyncio.sleep(0.02)
            if self.metrics_fault == "500":
                return web.Response(status=500, text="scrape failed")
            running, waiting, kv_usage = self.gauges
            return web.Response(text='vllm:cache_config_info{block_size="16",num_gpu_blocks="1000"} 1.0\n'
                                     f'vllm:num_requests_running {running}\nvllm:num_requests_waiting {waiting}\n'
                                     f'vllm:kv_cache_usage_perc {kv_usage}\n')
        self.requests.append((request.method, request.path_qs, dict(request.headers), body))
        if request.path == "/big":  # MiB after MiB, as fast as the gateway takes them
            resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            await resp.prepare(request)
            for _ in range(int(request.query.get("mib", "64"))):
                await resp.write(b"x" * 2**20)
            await resp.write_eof()
            return resp
        if request.path == "/get_server_info":  # SGLang's, where its clients read the pool
            return web.json_response({"max_total_num_tokens": 16_000, "page_size": 1, "model_path": "m"})
        if request.path not in ("/v1/completions", "/v1/chat/completions"):
            return web.json_response({"path": request.path_qs, "method": request.method})
        payload = orjson.loads(body)
        if self.hold:
            event = asyncio.Event()
            self.held.append(event)
            self.held_by[request.headers.get("X-Session-ID")] = event
            await event.wait()
        n = payload.get("max_tokens") or 4
        prompt = payload.get("prompt")
        usage = {"prompt_tokens": len(prompt) if isinstance(prompt, list) else len(body) // 4,
                 "completion_tokens": n}
        tag = {"X-Loadgen-Replica": self.replica} if self.replica is not None else {}
        if not payload.get("stream"):
            return web.json_response({"choices": [{"text": "t" * n}], "usage": usage}, headers=tag)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **tag})
        await resp.prepare(request)
        try:
            for i in range(n):
                if self.die_after is not None and i == self.die_after:
                    request.transport.close()
                    return resp
                await resp.write(b'data: {"choices":[{"text":"t","token_ids":[%d]}]}\n\n' % (100 + i))
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            await resp.write(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.num_cut += 1
            raise
        return resp


@contextlib.asynccontextmanager
async def running_gateway(upstreams: list[str], pool_tokens: int = 100_000, client_keys=None, upstream_key=None,
                          **settings):
    config = GatewayConfig(upstreams=upstreams, listen="127.0.0.1:0", **settings)
    proxy = GatewayProxy(config, pool_tokens, client_keys=client_keys, upstream_key=upstream_key)
    await proxy.serve()
    try:
        yield proxy
    finally:
        await proxy.close()


def client_request_counts(proxy: GatewayProxy) -> dict:
    """{(outcome, status): n} of the gateway's loadgen_gateway_client_requests_total."""
    counts = {}
    for metric in proxy.metrics.registry.collect():
        if metric.name == "loadgen_gateway_client_requests":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    counts[(sample.labels["outcome"], sample.labels["status"])] = int(sample.value)
    return counts


def gateway_url(proxy: GatewayProxy) -> str:
    return f"http://127.0.0.1:{proxy.port}"


async def wait_until(predicate, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)
