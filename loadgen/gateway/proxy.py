"""The gateway proxy: OpenAI-compatible requests through ``core/gateway.py`` on the wall clock.

Every ``POST /v1/chat/completions`` or ``/v1/completions`` is a turn boundary of its session
(loadgen/gateway/sessions.py): a new session ``arrive``s, a known one is at ``before_turn``,
with the demand its body states. The gate's answer is the in-process one, from the same
``controllers/`` policy: go, or wait; a waiting request is held here and nothing goes upstream
until the gate admits it. Its response is relayed byte for byte (streamed or not) and, once
complete, is the turn's completion (``turn_completed``, its latency from admission on the gate's
clock). A session ends after ``idle_timeout_s`` without a request, after a request marked
``x-dynamo-session-final``, or when its request fails (upstream error, client hung up, refused
at the maximum park time): the gate then has its admission or its place in a queue back.

Any other path goes to an upstream as it is; ``/health``, ``/metrics`` and ``/status`` are the
gateway's own. Prompts and keys are never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from typing import Optional

import orjson

from controllers import make_policy
from routers import RouteRequest

from ..core.clock import WallClock
from ..core.gateway import Gateway
from ..live.http_client import GATEWAY_RUN_START_PATH, GATEWAY_WAIT_HEADER, LAG_PATH
from .config import SESSION_FINAL_HEADER, GatewayConfig
from .http_server import ClientConnection, Request, error_body
from .metrics import GatewayMetrics, engine_exposition, status
from .sessions import DemandEstimator, GatewaySession, SessionIdentifier
from .upstream import UpstreamPool
from .upstream_choice import UpstreamRouting, make_upstream_router, sticky_hash
from .upstream_gates import UpstreamGates

log = logging.getLogger("loadgen.gateway")

TURN_PATHS = ("/v1/chat/completions", "/v1/completions")
# the prefix-cache resets of vLLM and SGLang: done on every upstream, as a client means the whole cache
CACHE_RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")
# SGLang's server info, where its clients read the KV pool (max_total_num_tokens): the gate's pool
SERVER_INFO_PATHS = ("/get_server_info", "/server_info")
# not forwarded: per connection (RFC 9110 7.6.1), or replaced by the gateway
DROPPED_REQUEST_HEADERS = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "te",
                                     "trailer", "upgrade", "host", "content-length", "authorization",
                                     "proxy-authorization", "expect"))
DROPPED_RESPONSE_HEADERS = frozenset(("connection", "keep-alive", "transfer-encoding", "content-length", "trailer",
                                      "upgrade", "proxy-connection"))
# what an upstream's scrape says of its present state: unknown (None) after a failed scrape
SCRAPED_GAUGES = ("num_running", "num_waiting", "kv_usage", "prefix_cache_queries_total", "prefix_cache_hits_total",
                  "num_preemptions_total")
USAGE_TAIL_BYTES = 64 * 1024  # a response's end, where usage is (vLLM, SGLang: the last event or field)
# names the upstream that answered a turn request, as serve-sim deployments name their replica, so a
# live run with engine.replica_header records turns.parquet replica
REPLICA_HEADER = "X-Loadgen-Replica"
PREFIX_HINT_HEADER = "x-loadgen-prefix-tokens"  # the shared-prefix length loadgen's live client sends
PARENT_HEADER = "x-dynamo-parent-session-id"  # a session tree's child names its parent (Dynamo's header)


def request_outcome(conn: ClientConnection) -> str:
    """How a client's request ended (GatewayMetrics.client_requests)."""
    if conn.failure == "upstream":
        return "failed"
    if conn.failure == "cut":
        return "cut"
    if conn.complete:
        return "refused" if conn.own_response and conn.sent_status >= 400 else "answered"
    if conn.closed or conn.failure == "client_gone":
        return "client_gone"
    return "unanswered"  # never: every path answers or fails the request


def usage_from_tail(tail: bytes) -> Optional[dict]:
    """The last ``"usage": {...}`` object in a response's end (a streamed or a whole response)."""
    at = tail.rfind(b'"usage"')
    while at >= 0:
        text = tail[at + 7:].decode("utf-8", errors="replace").lstrip()
        if text.startswith(":"):
            try:
                usage, _ = json.JSONDecoder().raw_decode(text[1:].lstrip())
            except ValueError:
                usage = None
            if isinstance(usage, dict):
                return usage
        at = tail.rfind(b'"usage"', 0, at)
    return None


class Relay:
    """An upstream response on its way to the client (the upstream connection's ``Sink``)."""

    __slots__ = ("client", "conn", "done", "status", "started", "event_stream", "tail", "added", "replaced",
                 "client_left", "shut_down")

    def __init__(self, client: ClientConnection, added: tuple = ()) -> None:
        self.client = client
        # (name, value) headers the gateway adds to the response, in place of any the upstream sent
        # under those names: the upstream's index, the time the request was held
        self.added = added
        self.replaced = frozenset(name.lower() for name, _ in added)
        self.conn = None
        self.done = asyncio.get_running_loop().create_future()
        self.status = 0
        self.started = False
        self.event_stream = False
        self.tail = b""
        # the response ended because its client hung up (else a failure is the upstream's, even
        # when the gateway then closes the client's connection to show it the response was cut)
        self.client_left = False
        self.shut_down = False  # the gateway's drain deadline came before the upstream's answer began

    def head(self, status: int, headers: list, length: Optional[int]) -> None:
        self.status = status
        out = []
        for name, value in headers:
            lower = name.lower()
            if lower not in DROPPED_RESPONSE_HEADERS and lower not in self.replaced:
                out.append((name, value))
                if lower == "content-type" and "event-stream" in value:
                    self.event_stream = True
        out.extend(self.added)
        self.client.start(status, out, length)
        self.started = True

    def body(self, data: bytes) -> None:
        self.client.write(data)
        tail = self.tail + data if self.tail else data
        self.tail = tail if len(tail) <= USAGE_TAIL_BYTES else tail[-USAGE_TAIL_BYTES:]

    def end(self) -> None:
        self.client.finish()
        if not self.done.done():
            self.done.set_result(None)

    def error(self, message: str) -> None:
        """``done`` gets the message (None: the response was complete)."""
        if self.done.done():
            return
        self.done.set_result(message)
        if self.started and not self.client.closed:
            # the client's stream ends with the error: an SSE error event, then the connection closes
            # before the response's end (no last chunk), so every HTTP client sees it cut short
            if self.event_stream:
                self.client.write(b"data: " + error_body(502, f"upstream failed mid-response: {message}") + b"\n\n")
            self.client.transport.close()
            self.client.closed = True

    def client_gone(self) -> None:
        if self.conn is not None and self.conn.sink is self:
            self.conn.abort()
        if not self.done.done():
            self.client_left = True
            self.done.set_result("the client hung up")

    def shut_down_unanswered(self) -> None:
        """The drain deadline, before the upstream's answer began: dropped upstream, and the client
        is told so (503, from ``_forward``) rather than cut without a status."""
        if self.started or self.done.done():
            return
        if self.conn is not None and self.conn.sink is self:
            self.conn.abort()
        self.shut_down = True
        self.done.set_result("the gateway is shutting down")

    def pause(self) -> None:
        if self.conn is not None:
            self.conn.pause()

    def resume(self) -> None:
        if self.conn is not None:
            self.conn.resume()


def proxy_clock(time_scale: float) -> WallClock:
    """The proxy's clock, on time.monotonic rather than the loop's clock: uvloop's is read once a
    loop turn in whole milliseconds, so a request held until another's answer ended in the same
    turn was held 0 s by it (counted as held, its wait header saying 0)."""
    return WallClock(time_scale, time_source=time.monotonic)


class GatewayProxy:
    """The gate, the sessions and the upstreams of one gateway; ``serve`` listens, ``drain`` stops."""

    def __init__(self, config: GatewayConfig, pool_tokens: int, clock: Optional[WallClock] = None,
                 client_keys: Optional[list[str]] = None, upstream_key: Optional[str] = None,
                 upstream_pools: Optional[list[int]] = None) -> None:
        self.config = config
        self.pool_tokens = pool_tokens
        # scope replica: each upstream's pool (read from each, or the pool given split evenly)
        self.per_upstream = config.scope == "replica"
        n = len(config.upstreams)
        self.upstream_pools = list(upstream_pools) if upstream_pools else [pool_tokens // n] * n
        self.identify = SessionIdentifier(config.session_headers, config.fingerprint_tokens)
        self.demand = DemandEstimator(config.default_output_tokens)
        self.client_keys = [k.encode() for k in client_keys] if client_keys else None
        self.upstream_headers = [("Authorization", f"Bearer {upstream_key}")] if upstream_key else []
        self.final_header = SESSION_FINAL_HEADER.lower()
        self.engine_signals: dict[str, dict] = {}
        self.connections: set[ClientConnection] = set()
        self.num_in_flight = 0  # requests sent upstream and not yet answered
        self.num_open = 0  # requests being handled (parked ones included)
        self.drain_started: Optional[asyncio.Future] = None  # set when the drain starts: parked requests are answered
        self.relays: set[Relay] = set()  # responses on their way
        # what the drain did: waiting or parked requests refused (503), requests answered 503 at
        # the deadline before their answer began, responses cut mid-stream at the deadline
        self.drain_counts = {"refused_held": 0, "refused_unanswered": 0, "cut_streaming": 0}
        self.pool: Optional[UpstreamPool] = None
        self.server: Optional[asyncio.AbstractServer] = None
        self._tasks: set = set()
        self.reset(clock or proxy_clock(config.time_scale))
        self.metrics = GatewayMetrics(self)

    def reset(self, clock: WallClock) -> None:
        """A fresh gate and session table on ``clock`` (an experiment's run starts at its t=0); the
        counters as they stand, so that a run reports what happened in it (not the preflight's probes)."""
        self.clock = clock
        metrics = getattr(self, "metrics", None)  # (none yet on the first reset, from __init__)
        self.counts_at_reset = metrics.counts() if metrics is not None else None
        ctl = self.config
        if self.per_upstream:  # scope replica: a gate per upstream over its own pool
            self.gate = UpstreamGates(clock, lambda: make_policy(ctl.controller, **ctl.controller_options),
                                      self.upstream_pools, ctl.control_start_s)
        else:
            self.gate = Gateway(clock, make_policy(ctl.controller, **ctl.controller_options), self.pool_tokens,
                                ctl.control_start_s)
        self.sessions: dict[str, GatewaySession] = {}
        urls = ctl.upstreams
        self.routing = UpstreamRouting(make_upstream_router(ctl.router, ctl.router_options), len(urls),
                                       lambda i: self.engine_signals.get(urls[i], {}))

    @property
    def draining(self) -> bool:
        return self.drain_started is not None and self.drain_started.done()

    def start_run(self) -> None:
        """A loadgen run starts through this gateway (GATEWAY_RUN_START_PATH): a fresh gate and
        session table with the clock at 0, so a limit's start_s counts from the run's start and the
        sessions before it hold nothing. A request still held for an earlier session is let go."""
        for session in self.sessions.values():
            if session.admission is not None and not session.admission.done():
                session.admission.set_result(None)
        self.reset(proxy_clock(self.config.time_scale))
        log.info("a run starts: a fresh gate and session table, the clock at 0")

    # ---------------------------------------------------------------- serving
    async def serve(self, host: Optional[str] = None, port: Optional[int] = None) -> asyncio.AbstractServer:
        loop = asyncio.get_running_loop()
        self.drain_started = loop.create_future()
        self.pool = UpstreamPool(self.config.upstreams)
        self.server = await loop.create_server(
            lambda: ClientConnection(self.handle, self.config.max_body_bytes, self.connections,
                                     lambda status: self.metrics.client_requests.labels("refused", str(status)).inc()),
            host or self.config.host, self.config.port if port is None else port, backlog=4096)
        self._spawn(self._end_idle_sessions())
        self._spawn(self._scrape_upstreams())
        return self.server

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: Optional[float] = None) -> bool:
        """Stop accepting; answer every parked or waiting request 503 with Retry-After at once (they
        would wait for admissions a stopping gateway will not make); let the requests sent upstream
        finish up to ``timeout_s`` (wall). At the deadline, a request whose answer has not begun is
        answered 503, a response still streaming is cut. True when everything finished in time;
        ``drain_counts`` says what was refused and cut."""
        loop = asyncio.get_running_loop()
        if self.drain_started is None:
            self.drain_started = loop.create_future()
        if not self.drain_started.done():
            self.drain_started.set_result(None)
        if self.server is not None:
            self.server.close()
        timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
        deadline = loop.time() + timeout_s
        while self.num_open and loop.time() < deadline:
            await asyncio.sleep(0.02)
        clean = not self.num_open
        if not clean:
            for relay in list(self.relays):
                if relay.started:
                    relay.client.failure = "cut"
                    self.drain_counts["cut_streaming"] += 1
                else:
                    relay.shut_down_unanswered()
            # the 503s written before the connections close (a little longer for requests whose
            # headers were still arriving)
            settle = loop.time() + 0.5
            while self.num_open > self.drain_counts["cut_streaming"] and loop.time() < settle:
                await asyncio.sleep(0.01)
        await self.close()
        return clean

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in list(self.connections):
            # what was answered is flushed first; a response still streaming is cut
            if conn.on_lost is None:
                conn.transport.close()
            else:
                conn.transport.abort()
        if self.pool is not None:
            self.pool.close()
        if self.server is not None:
            self.server.close()

    # ---------------------------------------------------------------- requests
    async def handle(self, req: Request, conn: ClientConnection) -> None:
        self.num_open += 1
        try:
            path = req.path
            # the gateway's own introspection: for its operators' scrapers, readable while it drains
            # and without the clients' API key (it carries no model output)
            if path == "/health":
                conn.respond(503 if self.draining else 200,
                             b'{"status":"draining"}' if self.draining else b'{"status":"ok"}')
            elif path == "/metrics":
                conn.respond(200, self.metrics.text() + engine_exposition(self),
                             "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/status":
                conn.respond(200, orjson.dumps(status(self), option=orjson.OPT_SERIALIZE_NUMPY))
            elif self.client_keys is not None and not self._authorized(req):
                conn.respond(401, error_body(401, "missing or wrong API key (Authorization: Bearer KEY)"))
            elif self.draining:
                # a session's next turn: it will not be served here, so it gives its admission back
                key = self.identify.from_headers(req.headers) if path in TURN_PATHS else None
                session = self.sessions.get(key) if key else None
                if session is not None and not session.in_flight and session.admission is None:
                    self._end_session(session, "drained")
                self._refuse_draining(conn)
            elif req.method == "POST" and path in TURN_PATHS:
                await self._turn(req, conn)
            elif req.method == "POST" and path in CACHE_RESET_PATHS:
                await self._reset_every_upstream(req, conn)
            elif req.method == "POST" and path == GATEWAY_RUN_START_PATH:
                self.start_run()
                conn.respond(200, orjson.dumps({"clock_s": self.clock.now(), "controller": self.config.controller}))
            elif req.method == "GET" and path in SERVER_INFO_PATHS:
                await self._server_info(req, conn)
            elif req.method == "GET" and path == LAG_PATH:
                await self._lag(req, conn)
            else:
                key = self.identify.from_headers(req.headers)
                index = sticky_hash(key, len(self.config.upstreams)) if key else 0
                await self._forward(req, conn, index)
        finally:
            self.num_open -= 1
            self.metrics.client_requests.labels(request_outcome(conn), str(conn.sent_status or "none")).inc()

    def _refuse_draining(self, conn: ClientConnection) -> None:
        conn._keep_alive = False
        conn.respond(503, error_body(503, "the gateway is shutting down"),
                     headers=(("Retry-After", str(self.config.retry_after_s)),))

    def _authorized(self, req: Request) -> bool:
        given = req.headers.get("authorization", "")
        token = given[7:].strip().encode() if given[:7].lower() == "bearer " else b""
        ok = False
        for key in self.client_keys:  # every key compared, each in constant time
            ok |= hmac.compare_digest(token, key)
        return ok

    async def _turn(self, req: Request, conn: ClientConnection) -> None:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            conn.respond(400, error_body(400, f"the request body is not JSON ({exc})"))
            return
        if not isinstance(body, dict):
            conn.respond(400, error_body(400, f"the request body must be a JSON object, got {type(body).__name__}"))
            return
        gate, clock = self.gate, self.clock
        arrived_s = clock.now()
        key = self.identify.from_headers(req.headers) or self.identify.fingerprint(body, self.sessions)
        session = self.sessions.get(key)
        body_bytes = len(req.body)
        event = "in-session"
        routing = self.routing
        # scope replica: a turn boundary is routed first, and waits at its upstream's gate
        pinned: tuple = ()
        if session is None:
            session = self.sessions[key] = GatewaySession(key, clock.now())
            demand = self.demand.demand_tokens(body, body_bytes, session)
            self._child_arrives(session, req.headers.get(PARENT_HEADER))
            route = self._route_request(key, body, body_bytes, req, session)
            if self.per_upstream:
                pinned = (routing.choose(route, clock.now()),)
            event, wait = "arrive", gate.arrive(key, demand, *pinned)
        elif session.admission is not None:  # the session waits already: this request waits with it
            demand, wait = -1, session.admission
        elif session.in_flight:  # a second request while one is out: not a turn boundary
            demand, wait = -1, None
        else:
            if session.joining:  # its next turn: whatever it waited for, it waits no more
                session.joining = False
                gate.join_ended(key)
            demand = self.demand.demand_tokens(body, body_bytes, session)
            route = self._route_request(key, body, body_bytes, req, session)
            if self.per_upstream:
                pinned = (routing.choose(route, clock.now()),)
            event, wait = "turn", gate.before_turn(key, demand, *pinned)
        if event == "in-session":
            route = self._route_request(key, body, body_bytes, req, session)
        if req.headers.get(self.final_header, "").lower() in ("1", "true", "yes"):
            session.final = True
        if log.isEnabledFor(logging.DEBUG):
            log.debug("decision t=%.3f session=%s event=%s demand=%d -> %s active=%d D=%d parked=%d waiting=%d "
                      "limit=%s", clock.now(), key[:14], event, demand, "go" if wait is None else "wait",
                      gate.num_admitted, gate.demand_tokens, len(gate.parked), len(gate.waiting_new), gate.limit())
        if wait is not None:
            if not await self._park(session, wait, conn, "waiting" if event == "arrive" else "parked"):
                if pinned:
                    routing.finished(pinned[0], route, clock.now())
                return
        else:
            self.metrics.admissions.labels("went").inc()
        admitted_s = clock.now()
        held_s = admitted_s - arrived_s if wait is not None else 0.0
        session.in_flight += 1
        # routed per request, after admission (the router sits behind the gate): a router may move a session
        index = pinned[0] if pinned else routing.choose(route, admitted_s)
        try:
            failure, relay = await self._forward(req, conn, index, turn=True, held_s=held_s)
        finally:
            routing.finished(index, route, clock.now())
            session.in_flight -= 1
            session.last_seen_s = clock.now()
        if session.ended:
            return
        if failure is not None or relay.status >= 400:
            # the turn did not happen: the session gives its admission back (a retry arrives anew)
            self._end_session(session, "client_gone" if relay.client_left
                              else "drained" if relay.shut_down else "failed")
            return
        usage = usage_from_tail(relay.tail)
        if usage is not None:
            self.demand.observe(session, body_bytes, usage, text=not isinstance(body.get("prompt"), list))
        if event != "in-session":  # the turn's own request: a parallel call is not a turn (as in process)
            gate.turn_completed(key, clock.now() - admitted_s)
        if session.final and not session.in_flight:
            self._end_session(session, "final")
        elif session.children and not session.in_flight:
            self._join_started(session)

    def _route_request(self, key: str, body: dict, body_bytes: int, req: Request,
                       session: GatewaySession) -> RouteRequest:
        """The request as a router sees it: the session key, the prompt's tokens (exact for token
        ids, else the demand estimator's estimate) and loadgen's shared-prefix hint if sent."""
        prompt_tokens = self.demand.prompt_tokens(body, body_bytes, session)
        try:
            shared = int(req.headers.get(PREFIX_HINT_HEADER, "0"))
        except ValueError:
            shared = 0
        return RouteRequest(key, prompt_tokens, "prefix", min(max(shared, 0), prompt_tokens))

    async def _park(self, session: GatewaySession, wait, conn: ClientConnection, queue: str) -> bool:
        """Hold a request until the gate admits its session. False when it will not be sent
        (the client hung up, or the maximum park time refused it; answered here)."""
        cfg, clock = self.config, self.clock
        session.admission = wait
        self.metrics.parks.labels(queue).inc()
        parked_s = clock.now()
        timeout = cfg.max_park_s / cfg.time_scale if cfg.max_park_s is not None else None
        await asyncio.wait((wait, conn.lost, self.drain_started), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if session.ended:  # an earlier request of the session failed meanwhile
            conn.respond(502, error_body(502, "the session's earlier request failed while this one waited"))
            return False
        if not wait.done() and self.draining and not conn.closed:
            self.drain_counts["refused_held"] += 1
            self.metrics.rejected.labels("draining").inc()
            self._end_session(session, "drained")
            self._refuse_draining(conn)
            return False
        if not wait.done():
            if conn.closed:
                self.metrics.abandoned.inc()
                self._end_session(session, "abandoned")
                return False
            if cfg.on_max_park == "reject":
                self.metrics.rejected.labels("max_park").inc()
                self._end_session(session, "rejected")
                conn.respond(429, error_body(429, f"parked for {cfg.max_park_s:g} s without admission"),
                             headers=(("Retry-After", str(cfg.retry_after_s)),))
                return False
            self.gate.admit_now(session.key)
            self.metrics.admissions.labels("forced").inc()
        else:
            self.metrics.admissions.labels("admitted").inc()
        session.admission = None
        self.metrics.park_time.observe(clock.now() - parked_s)
        if conn.closed:
            self.metrics.abandoned.inc()
            self._end_session(session, "abandoned")
            return False
        return True

    async def _forward(self, req: Request, conn: ClientConnection, index: int, turn: bool = False,
                       held_s: float = 0.0) -> tuple[Optional[str], Relay]:
        """Send ``req`` to upstream ``index`` and relay its response; (failure or None, the relay).
        A turn request's response says how long the gateway held it (GATEWAY_WAIT_HEADER, ``held_s``) and
        names its upstream (REPLICA_HEADER) when there are several: with one, whatever the upstream
        says of its replicas (a serve-sim deployment) passes through."""
        url = self.config.upstreams[index]
        headers = [(n, v) for n, v in req.header_list if n.lower() not in DROPPED_REQUEST_HEADERS]
        headers += self.upstream_headers
        data = self.pool.request_bytes(index, req.method, req.target, headers, req.body)
        # named when there are several upstreams, or when the config asks (a sweep's deployment)
        named = turn and (len(self.config.upstreams) > 1 or self.config.replica_header is not None)
        added = ((GATEWAY_WAIT_HEADER, f"{held_s:.6f}"),) if turn else ()
        if named:
            added += ((self.config.replica_header or REPLICA_HEADER, str(index)),)
        relay = Relay(conn, added)
        self.relays.add(relay)
        conn.on_pause, conn.on_resume, conn.on_lost = relay.pause, relay.resume, relay.client_gone
        loop = asyncio.get_running_loop()
        sent = loop.time()
        self.num_in_flight += 1
        self.metrics.requests.labels(url).inc()
        try:
            await self.pool.send(index, data, self.config.request_timeout_s, sink=relay)
            failure = await relay.done
        finally:
            self.num_in_flight -= 1
            self.relays.discard(relay)
            conn.on_pause = conn.on_resume = conn.on_lost = None
        self.metrics.latency.labels(url).observe(loop.time() - sent)
        if (failure is not None and not relay.client_left and not relay.shut_down) or relay.status >= 500:
            self.metrics.errors.labels(url).inc()
        if failure is not None and conn.failure is None:  # (a drain's cut is named already)
            conn.failure = "client_gone" if relay.client_left else "drain" if relay.shut_down else "upstream"
        if relay.shut_down and not conn.closed:
            self.drain_counts["refused_unanswered"] += 1
            self._refuse_draining(conn)
        elif failure is not None and not relay.started and not conn.closed:
            conn.respond(502, error_body(502, f"upstream {url}: {failure}"))
        return failure, relay

    async def _ask_upstreams(self, req: Request, urls: list[str]) -> list[tuple[int, bytes]]:
        """``req`` sent to each of ``urls`` at once, outside the turn path; each answer (status,
        body), 502 and the error for an upstream that could not be reached."""
        from ..live.raw_http import RawHttpTransport

        headers = {n: v for n, v in req.header_list if n.lower() not in DROPPED_REQUEST_HEADERS}
        headers.update(dict(self.upstream_headers))
        transport = RawHttpTransport()

        async def one(url: str) -> tuple[int, bytes]:
            try:
                return await transport.request(req.method, url + req.target, req.body or None, headers,
                                               self.config.request_timeout_s)
            except Exception as exc:  # an upstream down is its answer here, not the gateway's failure
                return 502, f"{type(exc).__name__}: {exc}".encode()

        try:
            return await asyncio.gather(*(one(url) for url in urls))
        finally:
            await transport.close()

    async def _first_upstream_json(self, req: Request) -> tuple[int, bytes, Optional[dict]]:
        """``req`` asked of the first upstream: its status, body, and the body as a JSON object
        (None when it failed or is not one)."""
        ((code, data),) = await self._ask_upstreams(req, self.config.upstreams[:1])
        try:
            info = orjson.loads(data) if code < 300 else None
        except orjson.JSONDecodeError:
            info = None
        return code, data, info if isinstance(info, dict) else None

    async def _server_info(self, req: Request, conn: ClientConnection) -> None:
        """SGLang's server info, from the first upstream, with the pool the gate computes with as
        its ``max_total_num_tokens`` (the upstreams' pools summed, or --pool-tokens)."""
        code, data, info = await self._first_upstream_json(req)
        if info is not None and "max_total_num_tokens" in info:
            info["max_total_num_tokens"] = int(self.gate.pool_tokens)
            data = orjson.dumps(info)
        conn.respond(code, data)

    async def _lag(self, req: Request, conn: ClientConnection) -> None:
        """serve-sim's time scale and lateness from the first upstream (a real engine has none),
        with the gateway's own clock's scale beside them, which a run checks against its own."""
        _, _, info = await self._first_upstream_json(req)
        conn.respond(200, orjson.dumps({**(info or {}), "gateway_time_scale": self.config.time_scale}))

    async def _reset_every_upstream(self, req: Request, conn: ClientConnection) -> None:
        """A prefix-cache reset sent on to every upstream at once; 200 when every one did it, else
        the first failing upstream's status (502 when one could not be reached), the body saying
        how many of how many did it."""
        answers = await self._ask_upstreams(req, self.config.upstreams)
        failed = [{"upstream": url, "status": code, "body": data.decode(errors="replace")[:200]}
                  for url, (code, data) in zip(self.config.upstreams, answers) if code >= 300]
        body = {"upstreams": len(answers), "done": len(answers) - len(failed), "failed": failed}
        conn.respond(failed[0]["status"] if failed else 200, orjson.dumps(body))

    def _child_arrives(self, session: GatewaySession, parent_value: Optional[str]) -> None:
        """A new session that names its parent: the parent's child while it runs, admitted on
        arrival with ``tree_policy: trees`` when the parent is admitted; the parent, between turns,
        now waits for it as far as the gate can tell."""
        parent = self.sessions.get("h:" + parent_value) if parent_value else None
        if parent is None:
            return
        session.parent = parent.key
        parent.children = (parent.children or set()) | {session.key}
        if self.config.tree_policy == "trees" and parent.key in self.gate.active:
            self.gate.admit_on_arrival.add(session.key)
        if not parent.in_flight and parent.admission is None:
            self._join_started(parent)

    def _join_started(self, session: GatewaySession) -> None:
        """An admitted session between turns with children running: for the liveness rule it waits
        at a join (Gateway.join_started), until its next request or its last child's end."""
        if not session.joining and session.key in self.gate.active:
            session.joining = True
            self.gate.join_started(session.key)

    def _end_session(self, session: GatewaySession, how: str) -> None:
        if session.ended:
            return
        session.ended = True
        if self.sessions.get(session.key) is session:
            del self.sessions[session.key]
        if session.joining:
            self.gate.join_ended(session.key)
        parent = self.sessions.get(session.parent) if session.parent else None
        if parent is not None and parent.children:
            parent.children.discard(session.key)
            if not parent.children and parent.joining:  # the last child is back: the join is over
                parent.joining = False
                self.gate.join_ended(parent.key)
        self.gate.admit_on_arrival.discard(session.key)
        self.gate.session_ended(session.key)
        self.metrics.sessions_ended.labels(how).inc()
        log.debug("session end t=%.3f session=%s how=%s", self.clock.now(), session.key[:14], how)

    # ---------------------------------------------------------------- background
    async def _end_idle_sessions(self) -> None:
        cfg = self.config
        interval_s = min(cfg.idle_timeout_s / 4, 1.0 * cfg.time_scale) / cfg.time_scale
        while True:
            await asyncio.sleep(interval_s)
            now = self.clock.now()
            for session in [s for s in self.sessions.values()
                            if not s.in_flight and s.admission is None and now - s.last_seen_s > cfg.idle_timeout_s]:
                self._end_session(session, "idle")

    async def _scrape_upstreams(self) -> None:
        """Each upstream's /metrics every ``scrape_interval_s``, each on its own schedule: one that
        hangs or fails delays no other's gauges (what the load-aware routers read)."""
        from ..live.raw_http import RawHttpTransport

        transport = RawHttpTransport()
        try:
            await asyncio.gather(*(self._scrape_upstream(url, transport) for url in self.config.upstreams))
        finally:
            await transport.close()

    async def _scrape_upstream(self, url: str, transport) -> None:
        from ..live.server_metrics import parse_metrics

        interval_s = self.config.scrape_interval_s
        timeout_s = min(10.0, max(interval_s, 1.0))
        signals = self.engine_signals.setdefault(url, {})
        while True:
            try:
                code, data = await transport.request("GET", url + "/metrics", None, {}, timeout_s)
                if code >= 400:
                    raise ValueError(f"HTTP {code}")
                scraped = parse_metrics(data.decode(errors="replace"))
            except Exception as exc:  # an upstream that cannot be scraped is a signal, not a failure
                # its gauges are unknown now, not what they were (its pool and flavour stay known)
                signals.update({key: None for key in SCRAPED_GAUGES})
                signals.update(error=f"{type(exc).__name__}: {exc}"[:200])
                self.metrics.engine_scraped(url, math.nan, math.nan, math.nan)
            else:
                m = scraped.metrics
                kv = None if math.isnan(m.kv_usage) else m.kv_usage
                signals.update(num_running=m.num_running, num_waiting=m.num_waiting, kv_usage=kv,
                               scraped_s=self.clock.now(), error=None, server=scraped.server,
                               block_size=scraped.block_size, pool_tokens=scraped.pool_tokens,
                               prefix_cache_queries_total=m.prefix_cache_queries_total,
                               prefix_cache_hits_total=m.prefix_cache_hits_total,
                               num_preemptions_total=m.num_preemptions_total)
                self.metrics.engine_scraped(url, m.num_running, m.num_waiting, m.kv_usage)
            await asyncio.sleep(interval_s)


async def read_pool_tokens(urls: list[str]) -> int:
    """``pool_tokens: auto``: the upstreams' KV pools summed, read as the live preflight reads
    them (/metrics, or SGLang's server info). ValueError naming what could not be read."""
    from ..live.http_client import EndpointOptions
    from ..live.replicas import ReplicaSetClient
    from ..live.transport import TransportError

    client = ReplicaSetClient(WallClock(), EndpointOptions(url=urls[0]), urls)
    try:
        try:
            scraped = await client.scrape()
        except TransportError as exc:
            raise ValueError(f"pool_tokens: auto could not read the upstreams' /metrics ({exc}); give "
                             "--pool-tokens N") from None
        pool = scraped.pool_tokens
        if not pool and scraped.server == "sglang":
            pool = await client._sglang_pool_tokens()
        if not pool:
            raise ValueError("pool_tokens: auto found no KV pool size in the upstreams' /metrics (no "
                             "vllm:cache_config_info or sglang:max_total_num_tokens): give --pool-tokens N")
        return int(pool)
    finally:
        await client.close()
