"""``loadgen serve-sim --replicas N --router NAME``: a simulated deployment behind one URL.

N serve-sim engines (``SimServer``), each a whole engine, behind a router from ``routers/``:
``/v1/completions`` and ``/v1/chat/completions`` at the root are routed, and each replica is
also served whole under ``/replica/<i>`` (its /metrics, its cache reset, its API), so a live
run lists ``engine.metrics_urls: [http://HOST:PORT/replica/0, ...]`` and gets per-replica
samples, the summed pool and resets to every replica, as against a real router. Every routed
response carries ``X-Loadgen-Replica: <i>``.

What the router sees: the session key from the request's session header (default X-Session-ID,
what ``engine.session_header`` sends; without one every request has the same key), the prompt's
length in the serving tokenizer's tokens, the shared-prefix hint serve-sim reads
(X-Loadgen-Prefix-Tokens), the requests it has in flight on each replica and, for routers that
read them, each engine's gauges.
"""

from __future__ import annotations

from typing import Sequence

import orjson

from routers import ReplicaView, RouteRequest, Router

from .serve_sim import SimServer
from .serve_sim_wire import error_response, messages_of

REPLICA_HEADER = "X-Loadgen-Replica"
_REPLICA_KEY = "loadgen_replica"


class DeploymentServer:
    def __init__(self, servers: Sequence[SimServer], router: Router, seed: int = 0,
                 session_header: str = "X-Session-ID") -> None:
        self.servers = list(servers)
        self.router = router
        router.start(len(self.servers), seed)
        self.session_header = session_header
        self.outstanding = [0] * len(self.servers)

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 * 2**20)
        first = self.servers[0]
        app.add_routes([web.get("/health", first.health), web.get("/v1/models", first.models),
                        web.post("/v1/chat/completions", self._chat)])
        if not first.chat_only:
            app.add_routes([web.post("/v1/completions", self._completions)])
        for i, server in enumerate(self.servers):
            app.add_subapp(f"/replica/{i}/", server.app())
        app.on_response_prepare.append(_tag_replica)
        return app

    async def _completions(self, request):
        return await self._route(request, chat=False)

    async def _chat(self, request):
        return await self._route(request, chat=True)

    def _route_request(self, request, body: dict, chat: bool) -> RouteRequest:
        tokenizer = self.servers[0].tokenizer
        if chat:
            num_tokens = len(tokenizer.encode_chat(messages_of(body["messages"])))
        else:
            prompt = body["prompt"]
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
                prompt = prompt[0]
            num_tokens = len(tokenizer.encode_text(prompt)) if isinstance(prompt, str) else len(prompt)
        try:
            shared = int(request.headers.get("X-Loadgen-Prefix-Tokens", "0"))
        except ValueError:
            shared = 0
        return RouteRequest(request.headers.get(self.session_header, ""), num_tokens, "prefix", min(shared, num_tokens))

    def views(self) -> list[ReplicaView]:
        if not self.router.reads_engine:
            return [ReplicaView(i, n) for i, n in enumerate(self.outstanding)]
        views = []
        for i, (n, server) in enumerate(zip(self.outstanding, self.servers)):
            m = server._engine().metrics()
            views.append(ReplicaView(i, n, m.num_running, m.num_waiting, m.kv_usage, server.config.pool_tokens))
        return views

    async def _route(self, request, chat: bool):
        try:
            route = self._route_request(request, orjson.loads(await request.read()), chat)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return error_response(400, f"bad request: {exc}")
        now = self.servers[0]._engine().clock.now()
        index = self.router.route(route, self.views(), now)
        request[_REPLICA_KEY] = index
        self.router.routed(index, route, now)
        self.outstanding[index] += 1
        server = self.servers[index]
        try:
            return await (server.chat_completions(request) if chat else server.completions(request))
        finally:
            self.outstanding[index] -= 1
            self.router.finished(index, route, self.servers[0]._engine().clock.now())


async def _tag_replica(request, response) -> None:
    index = request.get(_REPLICA_KEY)
    if index is not None:
        response.headers[REPLICA_HEADER] = str(index)


async def serve_deployment(server: DeploymentServer, host: str, port: int):
    from aiohttp import web

    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


__all__ = ["DeploymentServer", "REPLICA_HEADER", "serve_deployment"]
