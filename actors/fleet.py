"""Session fleets: async actors that host many sessions of one or more runs as asyncio tasks.

A run's sessions are sharded over the sweep's fleets (session i goes to fleet i mod F). A
session is a coroutine, cheap; a process per session is not. Each session runs
the unchanged ``loadgen.core.session.run_session`` loop against the run's engine over HTTP, on a
wall clock that shares the run's time origin, with two stand-ins: ``RemoteGate`` for the
gateway (the run's controller actor answers) and ``RecorderProxy`` for the recorder (calls are
shipped in batches to the recorder actor, which writes the Parquet files). A session whose task
raises is handled as in a live run (``run_session_recording_crashes``): it gives its gateway
admission back, gets a sessions.parquet row with status ``error`` and the exception, and is
counted (``SessionCounts.crashed_total``), so the run's status can say how many crashed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Optional

import ray

from loadgen.core.clock import Clock, WallClock
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.live.runner import CONTEXT_LEAD_S, build_contexts_ahead
from loadgen.core.session import RetryPolicy, RunEnv, SessionCounts, run_session_recording_crashes
from loadgen.core.workload import SessionPlan

from .controller import FleetCounts

SHIP_INTERVAL_S = 1.0  # wall seconds between batches to the recorder: what a dead fleet can lose


class RemoteGate:
    """The run's gateway seen from a fleet: the controller actor answers.

    ``arrive``/``before_turn`` are coroutines (``answers_later``): the session awaits the answer,
    None to go or an awaitable that resolves when the gateway admits it again.

    Calls are batched per event-loop pass: every question and notification (``turn_completed``,
    ``session_ended``) the fleet's sessions make in one pass goes to the controller as one call
    (``gate_batch``), in the order they were made, when the pass ends; the controller applies
    them in that order and answers the questions. The gateway sees the same calls in the same
    order at the same run time (up to the loop pass) as one call each would give it; a fleet
    under load makes one controller call for many turns instead of two per turn
    (benchmarks/bench_gate.py: the gate's ceiling before and after).

    ``clock`` gives the futures, the end of the pass and the tasks: the fleet's wall clock, or a
    VirtualClock in tests (its "pass" is the current instant)."""

    answers_later = True

    def __init__(self, controller, clock: Optional[Clock] = None) -> None:
        self.controller = controller
        self._clock = clock
        self._ops: list[tuple] = []  # what the sessions asked and told this pass, in order
        self._answers: list[Any] = []  # a future per question in _ops
        self._scheduled = False

    async def arrive(self, session: Any, demand_tokens: int) -> Optional[Awaitable]:
        return await self._ask(("arrive", session, demand_tokens))

    async def before_turn(self, session: Any, demand_tokens: int) -> Optional[Awaitable]:
        return await self._ask(("before_turn", session, demand_tokens))

    async def _ask(self, question: tuple) -> Optional[Awaitable]:
        answer = self._clock.create_future() if self._clock is not None else \
            asyncio.get_running_loop().create_future()
        self._answers.append(answer)
        self._add(question)
        if await answer:
            return None
        return self.controller.admitted.remote(question[1])

    # nothing waits on these: the session goes on while the controller catches up
    def turn_completed(self, session: Any, latency_s: float) -> None:
        self._add(("turn_completed", session, latency_s))

    def session_ended(self, session: Any) -> None:
        self._add(("session_ended", session, None))

    def _add(self, op: tuple) -> None:
        self._ops.append(op)
        if not self._scheduled:
            self._scheduled = True
            if self._clock is None or not getattr(self._clock, "is_virtual", False):
                asyncio.get_running_loop().call_soon(self._send)
            else:
                self._clock.call_at(self._clock.now(), self._send)

    def _send(self) -> None:
        self._scheduled = False
        ops, answers = self._ops, self._answers
        self._ops, self._answers = [], []
        reply = self.controller.gate_batch.remote(ops)
        if answers:
            coro = self._deliver(reply, answers)
            if self._clock is not None:
                self._clock.spawn(coro)
            else:
                asyncio.get_running_loop().create_task(coro)

    @staticmethod
    async def _deliver(reply: Awaitable, answers: list) -> None:
        try:
            results = await reply
        except BaseException as exc:  # the controller failed (or the fleet is stopping): so do the askers
            for answer in answers:
                if not answer.done():
                    answer.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        for answer, go in zip(answers, results):
            answer.set_result(go)


class RecorderProxy:
    """``RunRecorder``'s session-side surface; the calls are replayed in order by the recorder actor."""

    _TURN_ERROR_ARG = 12  # position of ``error`` in RunRecorder.turn

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple]] = []
        self.turns_completed = 0

    def session_arrived(self, *args: Any) -> None:
        self.events.append(("session_arrived", args))

    def session_admitted(self, *args: Any) -> None:
        self.events.append(("session_admitted", args))

    def session_parked(self, *args: Any) -> None:
        self.events.append(("session_parked", args))

    def gateway_held(self, *args: Any) -> None:
        self.events.append(("gateway_held", args))

    def session_ended(self, *args: Any) -> None:
        self.events.append(("session_ended", args))

    def session_crashed(self, *args: Any) -> None:
        self.events.append(("session_crashed", args))

    def turn(self, *args: Any) -> None:
        self.events.append(("turn", args))
        if args[self._TURN_ERROR_ARG] is None:
            self.turns_completed += 1

    def take(self) -> list[tuple[str, tuple]]:
        events, self.events = self.events, []
        return events


@dataclass
class LiveRunSettings:
    """How a fleet drives its share of one run (the same for every fleet of the run)."""

    run_id: str
    endpoint: EndpointOptions
    prompt_mode: str
    retry: RetryPolicy
    time_scale: float
    origin_epoch_s: float
    duration_s: float


@dataclass
class _FleetRun:
    env: RunEnv
    recorder_proxy: RecorderProxy
    stop: asyncio.Event
    tasks: set = field(default_factory=set)


class SessionFleetHost:
    """The fleet itself; ``SessionFleet`` is it as a Ray actor."""

    def __init__(self) -> None:
        self.runs: dict[str, _FleetRun] = {}

    async def run(self, settings: LiveRunSettings, plans: list[SessionPlan], controller, recorder) -> FleetCounts:
        """Run these sessions from run time 0 to the end (or ``stop``); returns the final counts."""
        clock = WallClock(settings.time_scale, origin_epoch_s=settings.origin_epoch_s)
        client = self.engine_client(clock, settings)
        await client.prepare_prompts()
        proxy = RecorderProxy()
        env = RunEnv(clock, client, RemoteGate(controller, clock), proxy, retry=settings.retry)
        state = _FleetRun(env, proxy, asyncio.Event())
        self.runs[settings.run_id] = state

        def start(plan: SessionPlan) -> None:
            task = clock.spawn(run_session_recording_crashes(plan, env))
            state.tasks.add(task)
            task.add_done_callback(state.tasks.discard)

        for plan in plans:
            clock.call_at(plan.arrival_s, start, plan)
        if client.prompts is not None:  # text prompts: built ahead of arrival, as a local run does
            state.tasks.add(clock.spawn(build_contexts_ahead(plans, client, env, CONTEXT_LEAD_S * settings.time_scale)))
        shipper = asyncio.ensure_future(self._ship_until_stopped(settings.run_id, proxy, recorder))
        ends = [asyncio.ensure_future(state.stop.wait()),
                asyncio.ensure_future(clock.sleep(settings.duration_s - clock.now()))]
        try:
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in [shipper, *ends, *state.tasks]:
                task.cancel()
            await asyncio.gather(shipper, *ends, *state.tasks, return_exceptions=True)
            await client.close()
        await recorder.record.remote(settings.run_id, proxy.take())
        counts = self.counts(settings.run_id)
        counts.lateness = clock.lateness.to_json()  # arrivals and think times on this fleet's clock
        return counts

    def engine_client(self, clock: WallClock, settings: LiveRunSettings) -> OpenAIEngineClient:
        """The sessions' client of the run's engine (the seam a test double replaces)."""
        client = OpenAIEngineClient(clock, settings.endpoint)
        client.prompt_mode = settings.prompt_mode  # settled by the controller's preflight
        return client

    async def _ship_until_stopped(self, run_id: str, proxy: RecorderProxy, recorder) -> None:
        clock = WallClock()
        while True:
            await clock.sleep(SHIP_INTERVAL_S)
            events = proxy.take()
            if events:
                await recorder.record.remote(run_id, events)

    def counts(self, run_id: str) -> FleetCounts:
        """This fleet's sessions of the run by state (zeros before its first session arrives)."""
        state = self.runs.get(run_id)
        if state is None:
            return FleetCounts(SessionCounts())
        return FleetCounts(state.env.counts, state.recorder_proxy.turns_completed)

    def stop(self, run_id: str) -> None:
        state = self.runs.get(run_id)
        if state is not None:
            state.stop.set()


SessionFleet = ray.remote(num_cpus=0)(SessionFleetHost)
