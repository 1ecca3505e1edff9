"""Drive the gateway actuator with scripted sessions and check it at every admission and park.

``StepClock`` is the part of the clock seam the actuator uses, with time moved by the test and
futures that call back the moment the actuator resolves them, so a check sees the gateway's
state exactly at each admission (not after a whole readmission loop).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from controllers import NoLimit, Policy
from loadgen.core.gateway import Gateway


class _Future:
    def __init__(self, on_resolve: Callable[[], None]) -> None:
        self._on_resolve = on_resolve
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, value: Any) -> None:
        assert not self._done, "a gateway future was resolved twice"
        self._done = True
        self._on_resolve()


class StepClock:
    def __init__(self) -> None:
        self.now_s = 0.0
        self._timers: list[tuple[float, Callable[[], None]]] = []
        self._next_on_resolve: Optional[Callable[[], None]] = None

    def now(self) -> float:
        return self.now_s

    def call_at(self, when_s: float, callback: Callable[..., Any], *args: Any) -> None:
        self._timers.append((when_s, lambda: callback(*args)))

    def create_future(self) -> _Future:
        on_resolve, self._next_on_resolve = self._next_on_resolve, None
        assert on_resolve is not None, "the harness did not expect the gateway to create a future here"
        return _Future(on_resolve)

    def expect_future(self, on_resolve: Optional[Callable[[], None]]) -> None:
        """The next future the gateway creates belongs to ``on_resolve``'s session."""
        self._next_on_resolve = on_resolve

    def advance(self, delay_s: float) -> None:
        self.now_s += delay_s
        due = [t for t in self._timers if t[0] <= self.now_s]
        self._timers = [t for t in self._timers if t[0] > self.now_s]
        for _, fire in sorted(due, key=lambda t: t[0]):
            fire()


@dataclass
class ScriptedSession:
    sid: int
    demands_tokens: list[int]  # d_s before each turn
    state: str = "new"  # waiting | parked | in_flight | thinking | done
    next_turn: int = 0

    @property
    def demand_tokens(self) -> int:
        return self.demands_tokens[self.next_turn]


# A check gets (gateway, the admitted session, whether it came from the new-session queue).
AdmissionCheck = Callable[[Gateway, ScriptedSession, bool], None]
# A park check gets (gateway, number admitted and D just before the boundary, whether it parked).
ParkCheck = Callable[[Gateway, int, int, bool], None]


@dataclass
class GatewayDriver:
    """Sessions as closed loops around one gateway, one event at a time."""

    policy: Policy
    pool_tokens: int
    control_start_s: float = 0.0
    check_admission: Optional[AdmissionCheck] = None
    check_park: Optional[ParkCheck] = None
    clock: StepClock = field(default_factory=StepClock)
    sessions: list[ScriptedSession] = field(default_factory=list)
    expected_new: deque = field(default_factory=deque)
    expected_parked: deque = field(default_factory=deque)
    num_admissions: int = 0
    num_parks: int = 0

    def __post_init__(self) -> None:
        self.gateway = Gateway(self.clock, self.policy, self.pool_tokens, self.control_start_s)

    # ------------------------------------------------------------------ events
    def arrive(self, demands_tokens: list[int]) -> ScriptedSession:
        session = ScriptedSession(len(self.sessions), list(demands_tokens))
        self.sessions.append(session)
        self.clock.expect_future(lambda: self._admitted(session, from_new=True))
        waits = self.gateway.arrive(session.sid, session.demand_tokens) is not None
        self.clock.expect_future(None)
        if waits:
            session.state = "waiting"
            self.expected_new.append(session.sid)
        else:
            self._admitted(session, from_new=True, queued=False)
        self.check_always()
        return session

    def complete_turn(self, session: ScriptedSession, latency_s: float) -> None:
        assert session.state == "in_flight"
        session.next_turn += 1
        session.state = "thinking"
        self.gateway.turn_completed(session.sid, latency_s)
        if session.next_turn == len(session.demands_tokens):
            session.state = "done"
            self.gateway.session_ended(session.sid)
        self.check_always()
        self.check_no_lost_wakeup()

    def turn_boundary(self, session: ScriptedSession) -> None:
        assert session.state == "thinking"
        gw = self.gateway
        num_before = gw.num_admitted
        demand_before = gw.demand_tokens - gw.active[session.sid] + session.demand_tokens
        session.state = "boundary"
        self.clock.expect_future(lambda: self._admitted(session, from_new=False))
        parked = gw.before_turn(session.sid, session.demand_tokens) is not None
        self.clock.expect_future(None)
        if parked:
            self.num_parks += 1
        if self.check_park is not None:
            self.check_park(gw, num_before, demand_before, parked)
        if not parked:
            session.state = "in_flight"
        elif session.state == "boundary":
            session.state = "parked"
            self.expected_parked.append(session.sid)
        else:  # parked and re-admitted at once by the liveness rule: it was the queue's only entry
            assert not self.expected_parked and session.state == "in_flight"
        self.check_always()

    # ------------------------------------------------------------------ checks
    def _admitted(self, session: ScriptedSession, from_new: bool, queued: bool = True) -> None:
        gw = self.gateway
        if not queued:  # admitted on arrival: only into an empty gate, nobody may be overtaken
            assert not gw.parked and not self.expected_new, "a new session overtook waiting ones"
        else:
            expected = self.expected_new if from_new else self.expected_parked
            if session.state in ("waiting", "parked"):
                assert expected and expected[0] == session.sid, "FIFO order broken"
                expected.popleft()
            if from_new:
                assert not gw.parked, "a new session was admitted while a parked one waited"
        assert session.sid in gw.active
        self.num_admissions += 1
        if self.check_admission is not None:
            self.check_admission(gw, session, from_new)
        session.state = "in_flight"

    def check_always(self) -> None:
        gw = self.gateway
        if not isinstance(self.policy, NoLimit):  # 'none' has nothing to switch on
            assert gw.control_on == (self.clock.now_s >= self.control_start_s)
        assert gw.demand_tokens == sum(gw.active.values())
        if gw.parked or gw.waiting_new:
            assert gw.active, "sessions wait while nobody is admitted: they would wait forever"
        assert [s for s, _, _ in gw.waiting_new] == list(self.expected_new)
        assert [s for s, _, _ in gw.parked] == list(self.expected_parked)

    def check_no_lost_wakeup(self) -> None:
        """After a completion or a session end the head of the queues may not be admissible.

        (Queues are only ever non-empty once control is on, so ``gw.policy`` is the one deciding.)
        """
        gw = self.gateway
        queue = gw.parked or gw.waiting_new
        if queue:
            _, demand, _ = queue[0]
            assert not gw.policy.admit(gw.view(), demand, queue is gw.waiting_new)

    # ------------------------------------------------------------------ helpers
    def in_state(self, state: str) -> list[ScriptedSession]:
        return [s for s in self.sessions if s.state == state]

    def drain(self, latency_s: Callable[[int], float], step_s: float = 1.0) -> int:
        """No more arrivals: run every session to its end; returns the number of events it took."""
        total_turns = sum(len(s.demands_tokens) for s in self.sessions)
        max_events = 4 * total_turns + 10
        for event in range(max_events):
            in_flight, thinking = self.in_state("in_flight"), self.in_state("thinking")
            self.clock.advance(step_s)
            if in_flight:
                self.complete_turn(in_flight[0], latency_s(event))
            elif thinking:
                self.turn_boundary(thinking[0])
            else:
                stuck = [s.sid for s in self.sessions if s.state != "done"]
                assert not stuck, f"sessions {stuck} wait forever after arrivals stopped"
                return event
        raise AssertionError(f"sessions not done after {max_events} events")


def growing_demands(first_tokens: int, growth_tokens: int, num_turns: int) -> list[int]:
    return [first_tokens + k * growth_tokens for k in range(num_turns)]

