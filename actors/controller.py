"""The controller actor: one per engine, the gate every session of that engine asks before each turn.

It hosts the same ``loadgen.core.gateway.Gateway`` actuator with the same ``controllers/`` policy as
an in-process run, on a wall clock that shares the run's time origin with the session fleets.
Sessions reach it through ``actors.fleet.RemoteGate``: ``arrive``/``before_turn`` answer at
once whether the session may go; a session told to wait then awaits ``admitted``, which returns
when the gateway re-admits it. Being the one place that sees the gateway, it also does the
run-level work of a live run: the preflight, the flush triggers and the sampler (the sessions'
counts come from the fleets, the engine's gauges from its /metrics, the rows go to the recorder).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Optional

import ray

from controllers import make_policy
from loadgen.core.clock import WallClock
from loadgen.core.gateway import Gateway
from loadgen.core.lateness import LatenessHistogram
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient, PreflightError
from loadgen.live.replicas import ReplicaSetClient, make_client
from loadgen.live.runner import flush_before_run as live_flush_before_run, max_context_tokens
from loadgen.core.runner import sample_row
from loadgen.core.session import RunEnv, SessionCounts
from loadgen.core.spec import ControllerSpec, ExperimentSpec, FlushTrigger


@dataclasses.dataclass
class FleetCounts:
    """What one fleet reports for one run: its sessions by state and its completed turns; at the
    run's end, also its clock's timer lateness (a LatenessHistogram's JSON)."""

    sessions: SessionCounts
    turns_completed: int = 0
    lateness: Optional[dict] = None


def merge_counts(reports: list[FleetCounts]) -> FleetCounts:
    total = SessionCounts()
    for report in reports:
        for field in dataclasses.fields(SessionCounts):
            setattr(total, field.name, getattr(total, field.name) + getattr(report.sessions, field.name))
    latenesses = [LatenessHistogram.from_json(r.lateness) for r in reports if r.lateness is not None]
    return FleetCounts(total, sum(r.turns_completed for r in reports),
                       LatenessHistogram.merged(latenesses).to_json() if latenesses else None)


@dataclasses.dataclass
class TurnTally:
    """Stands in for the recorder in ``sample_row``: the rows themselves live in the recorder actor."""

    turns_completed: int


class GateHost:
    """The gateway as ``RemoteGate`` asks it: yes/no at once, and a wait for those told no."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.waiting: dict[Any, Any] = {}  # session -> the gateway's future it waits on

    def arrive(self, session: Any, demand_tokens: int) -> bool:
        return self._go(session, self.gateway.arrive(session, demand_tokens))

    def before_turn(self, session: Any, demand_tokens: int) -> bool:
        return self._go(session, self.gateway.before_turn(session, demand_tokens))

    def _go(self, session: Any, wait: Any) -> bool:
        if wait is None:
            return True
        self.waiting[session] = wait
        return False

    async def admitted(self, session: Any) -> None:
        await self.waiting.pop(session)

    def gate_batch(self, ops: list[tuple]) -> list[bool]:
        """A fleet's calls of one loop pass (``RemoteGate``), applied in order: ``(kind, session,
        value)`` with kind arrive / before_turn (value: demand tokens; answered, in order) or
        turn_completed (value: latency) / session_ended. Returns the questions' answers."""
        answers = []
        gateway = self.gateway
        for kind, session, value in ops:
            if kind == "before_turn":
                answers.append(self._go(session, gateway.before_turn(session, value)))
            elif kind == "turn_completed":
                gateway.turn_completed(session, value)
            elif kind == "arrive":
                answers.append(self._go(session, gateway.arrive(session, value)))
            elif kind == "session_ended":
                gateway.session_ended(session)
            else:
                raise ValueError(f"not a gate call: {kind!r}")
        return answers

    def turn_completed(self, session: Any, latency_s: float) -> None:
        self.gateway.turn_completed(session, latency_s)

    def session_ended(self, session: Any) -> None:
        self.gateway.session_ended(session)


@ray.remote(num_cpus=0)
class ControllerActor:
    def __init__(self, spec: ExperimentSpec, arm: str, run_id: str, endpoint: EndpointOptions,
                 replica_urls: Optional[list[str]] = None) -> None:
        self.spec = spec
        self.arm = spec.arm(arm)
        self.run_id = run_id
        self.endpoint = endpoint
        # engine.replicas > 1: every replica's /metrics, pool and cache reset (loadgen/live/replicas.py)
        self.replica_urls = replica_urls
        self.client: Optional[OpenAIEngineClient] = None
        self.clock: Optional[WallClock] = None
        self.gateway: Optional[Gateway] = None
        self.gate: Optional[GateHost] = None
        self.stopped: Optional[asyncio.Event] = None
        # a loadgen gateway in front of the engine(s): the limit (engine.gateway), the routing (replicas)
        self.proxy = None
        self.proxy_info: Optional[dict] = None

    async def start_proxy(self, engine_urls: list[str], pool_tokens: int, router: str = "sticky-hash",
                          replica_header: Optional[str] = None, router_options: Optional[dict] = None) -> str:
        """The proxy on the (first) engine's host (the fleets may be on other nodes): with
        engine.gateway it enforces the run's limit; in front of replicas it routes between them
        by ``router``. Returns the URL the fleets send their turns to."""
        from urllib.parse import urlsplit

        from loadgen.core.spec.engines import ViaGatewaySpec
        from loadgen.gateway.in_run import start_run_gateway

        engine = self.spec.engine
        host = urlsplit(engine_urls[0]).hostname
        # without engine.gateway the proxy only routes: the arm's limit stays with this actor's gate
        via = engine.gateway or ViaGatewaySpec(controller={"name": "none"})
        self.proxy = await start_run_gateway(via, engine_urls, self.spec.controller_for(self.arm),
                                             self.spec.time_scale, engine.request_timeout_s, pool_tokens, host=host,
                                             router=router, replica_header=replica_header,
                                             router_options=router_options)
        return f"http://{host}:{self.proxy.port}"

    async def preflight(self, pool_tokens: int, flush_before_run: bool) -> dict:
        """The live path's preflight against the run's engine; then a fresh prefix cache."""
        self.client = make_client(WallClock(), self.endpoint, self.replica_urls)
        # its clock is unscaled until the run starts: serve-sim's scale is checked against the run's
        result = await self.client.preflight(max_context_tokens(self.spec), pool_tokens, time_scale=self.spec.time_scale)
        if flush_before_run:
            await live_flush_before_run(self.client)  # a failed reset fails the run, naming the flag
        result["flushed_before_run"] = flush_before_run
        return result

    async def begin(self, origin_epoch_s: float) -> None:
        """The gateway on a clock whose run time 0 is ``origin_epoch_s``: ready before any session asks."""
        self.clock = WallClock(self.spec.time_scale, origin_epoch_s=origin_epoch_s)
        self.client.clock = self.clock
        ctl = self.spec.controller_for(self.arm)
        if self.proxy is not None:
            self.proxy.reset(self.clock)
        if self.spec.engine.gateway is not None:  # the proxy's gate decides on the run's clock; this one admits all
            ctl = ControllerSpec()
        self.gateway = Gateway(self.clock, make_policy(ctl.name, **ctl.params), self.client.pool_tokens, ctl.start_s)
        self.gate = GateHost(self.gateway)
        self.stopped = asyncio.Event()

    async def run(self, fleets: list, recorder) -> dict:
        """Flush and sample until the run's end or ``stop``; returns what the flushes did."""
        clock = self.clock
        flush_errors: list[str] = []
        flushes: set[asyncio.Task] = set()

        async def flush() -> None:
            try:
                await self.client.flush_async()
            except PreflightError as exc:
                flush_errors.append(str(exc))

        for trig in self.arm.triggers:
            if isinstance(trig, FlushTrigger):
                clock.call_at(trig.at_s, lambda: flushes.add(asyncio.ensure_future(flush())))
        sampler = asyncio.ensure_future(self._sample_until_end(clock, fleets, recorder))
        stop = asyncio.ensure_future(self.stopped.wait())
        try:
            await asyncio.wait([sampler, stop], return_when=asyncio.FIRST_COMPLETED)
            if sampler.done():
                sampler.result()  # a fleet that died fails the run here
        finally:
            sampler.cancel()
            stop.cancel()
            await asyncio.gather(sampler, stop, *flushes, return_exceptions=True)
            await self.client.close()
            if self.proxy is not None:
                from loadgen.gateway.in_run import run_gateway_info

                self.proxy_info = run_gateway_info(self.proxy)
                await self.proxy.close()
        return {"flush_times_s": self.client.flush_times_s, "flush_errors": flush_errors}

    async def _sample_until_end(self, clock: WallClock, fleets: list, recorder) -> None:
        interval = self.spec.recording.sample_interval_s
        i = 0
        while i * interval <= self.spec.duration_s + 1e-9:
            await clock.sleep(i * interval - clock.now())
            now = clock.now()
            metrics, reports = await asyncio.gather(
                self.client.metrics_async(), asyncio.gather(*(f.counts.remote(self.run_id) for f in fleets)))
            counts = merge_counts(list(reports))
            env = RunEnv(clock, self.client, self.gateway, TurnTally(counts.turns_completed), counts.sessions)
            row = sample_row(env, metrics, now)
            if self.spec.engine.gateway is not None:
                from loadgen.gateway.in_run import proxy_sample

                row.update(proxy_sample(self.proxy))
            replica_rows = self.client.replica_rows(now) if isinstance(self.client, ReplicaSetClient) else []
            # awaited: the run's recorder is closed only after its last sample is in
            await recorder.sample.remote(self.run_id, row, now, replica_rows)
            i += 1
        # the last sample is at duration_s: wait for the run's end itself
        await clock.sleep(self.spec.duration_s - clock.now())

    def gateway_info(self) -> Optional[dict]:
        """run.json's ``gateway`` (engine.gateway): the proxy's limit and counts over the run."""
        return self.proxy_info

    def stop(self) -> None:
        if self.stopped is not None:
            self.stopped.set()

    # ------------------------------------------------------------ the gate (RemoteGate's other end)
    def arrive(self, session: Any, demand_tokens: int) -> bool:
        return self.gate.arrive(session, demand_tokens)

    def before_turn(self, session: Any, demand_tokens: int) -> bool:
        return self.gate.before_turn(session, demand_tokens)

    async def admitted(self, session: Any) -> None:
        await self.gate.admitted(session)

    def gate_batch(self, ops: list[tuple]) -> list[bool]:
        return self.gate.gate_batch(ops)

    def turn_completed(self, session: Any, latency_s: float) -> None:
        self.gate.turn_completed(session, latency_s)

    def session_ended(self, session: Any) -> None:
        self.gate.session_ended(session)
