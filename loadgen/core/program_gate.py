"""The actuator of ``thunderagent`` (controllers/thunderagent.py): its program table, kept from the
run's events, and its periodic schedule.

The plain gateway asks a policy about one session at a time; ThunderAgent decides over all the
programs on a worker at once, every scheduler interval, and may pause a program while it is in
its tool (its next request then waits). This gate keeps one ``Program`` per session: its size
from the engine's usage of its last request (``UsageTap`` reports each result: prompt +
completion tokens and the replica it ran on), whether it is acting or reasoning, paused or
marked. A paused session's next turn waits until the schedule resumes it. Before
``control_start_s`` the gate lets everything through and only keeps the table.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from controllers import GatewayView, Program, ThunderAgent

from .clock import Clock


class ProgramGate:
    """The gateway interface sessions use (loadgen.core.gateway.Gateway), for ThunderAgent."""

    def __init__(self, clock: Clock, policy: ThunderAgent, capacities: Sequence[int], control_start_s: float = 0.0
                 ) -> None:
        self.clock = clock
        self.policy = policy
        self.capacities = list(capacities)
        self.pool_tokens = sum(self.capacities)
        self.control_start_s = control_start_s
        self.programs: dict[Any, Program] = {}
        self._waiters: dict[Any, Any] = {}
        clock.call_at(max(control_start_s, clock.now()) + policy.scheduler_interval_seconds, self._tick)

    @property
    def control_on(self) -> bool:
        return self.clock.now() >= self.control_start_s

    # ---------------------------------------------------------------- session events
    def arrive(self, session: Any, demand_tokens: int) -> Optional[Any]:
        # before its first usage a program is sized by its first prompt and output budget
        program = self.programs[session] = Program(session, demand_tokens)
        table = list(self.programs.values())[:-1]
        if not self.control_on or self.policy.admit_new(table, self.capacities, demand_tokens):
            return None
        return self._wait(program)

    def before_turn(self, session: Any, demand_tokens: int) -> Optional[Any]:
        program = self.programs[session]
        program.acting = False
        return self._wait(program) if program.paused else None

    def request_done(self, session: Any, replica: Optional[int], usage_tokens: int) -> None:
        """A request of ``session`` completed on ``replica`` with ``usage_tokens`` (UsageTap)."""
        program = self.programs.get(session)
        if program is None:
            return
        program.tokens, program.worker, program.acting = usage_tokens, replica or 0, True
        program.steps += 1
        if program.marked:  # marked while reasoning: paused now that its request is done
            program.marked = False
            self._pause(program)

    def turn_completed(self, session: Any, latency_s: float) -> None:
        pass

    def session_ended(self, session: Any) -> None:
        self.programs.pop(session, None)
        self._waiters.pop(session, None)

    # ---------------------------------------------------------------- the schedule
    def _tick(self) -> None:
        decisions = self.policy.schedule(list(self.programs.values()), self.capacities, self.clock.now())
        for program, worker in decisions.resume:
            program.paused, program.pending = False, False
            if program.worker is None:
                program.worker = worker  # accounting only: the router places its request
            waiter = self._waiters.pop(program.program_id, None)
            if waiter is not None:
                waiter.set_result(None)
        for program in decisions.pause:
            self._pause(program)
        for program in decisions.mark:
            program.marked = True
        self.clock.call_at(self.clock.now() + self.policy.scheduler_interval_seconds, self._tick)

    def _pause(self, program: Program) -> None:
        program.paused, program.paused_at_s = True, self.clock.now()

    def _wait(self, program: Program):
        if not program.paused:
            self._pause(program)
        program.pending = True
        fut = self._waiters[program.program_id] = self.clock.create_future()
        return fut

    # ---------------------------------------------------------------- records
    def limit(self) -> float:
        if not self.control_on:
            return math.nan
        return self.policy.limit(GatewayView(self.clock.now(), self.num_admitted, 0, self.pool_tokens, 0, 0))

    @property
    def num_admitted(self) -> int:
        return sum(1 for p in self.programs.values() if not p.paused)


class UsageTap:
    """The run's engine, telling the program gate each request's usage and replica."""

    def __init__(self, engine: Any, gate: ProgramGate) -> None:
        self._engine = engine
        self._gate = gate

    async def generate(self, request):
        result = await self._engine.generate(request)
        if result.error is None:
            self._gate.request_done(request.session_id, result.replica, result.prompt_tokens + result.output_tokens)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
