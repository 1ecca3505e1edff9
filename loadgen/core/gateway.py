"""The gateway actuator: one set of queues, any limit (docs/experiments.md#gateway-controllers).

Before each turn a session asks the gateway; the gateway asks its policy and either lets the
turn through (returns None: no await, no cost) or hands back a future the session awaits.

* New sessions wait in their own FIFO until admitted.
* An admitted session may be parked only at a turn boundary (nothing in flight is
  interrupted); it joins the parked FIFO and is later re-admitted as a whole.
* Whenever a turn completes or a session ends, waiting sessions are re-admitted from the heads
  of the queues, parked before new, while the policy's admission condition holds.
* Demand d_s = current context + output budget; in-flight requests count in full.
* Before ``control_start_s`` the gate behaves as ``none`` and the policy sees nothing; a timer
  at ``control_start_s`` switches it on, so the policy's state (an AIMD interval, an estimate)
  starts exactly then rather than at whichever session event happens to come next.

Liveness rule (ours, an addition to the published limits): whenever no session is admitted, the head of the queues
(parked first) is admitted whatever the limit says. So a session whose demand alone exceeds the
budget still runs (alone), a limit that falls to 0 still lets one session through, and once
arrivals stop every session finishes: each admission sends at least one turn before its
session can be parked again, and while anyone is admitted its turns end in completions or
parks that re-open the queues. Besides turn completions and session ends, a park that leaves
nobody admitted is the one other moment the queues are re-opened.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Optional

from controllers import GatewayView, NoLimit, Policy

from .clock import Clock


class Gateway:
    def __init__(self, clock: Clock, policy: Policy, pool_tokens: int, control_start_s: float = 0.0) -> None:
        self.clock = clock
        self.policy = policy
        self.pool_tokens = pool_tokens
        self.control_start_s = control_start_s
        self._uncontrolled = isinstance(policy, NoLimit)
        self._off = NoLimit()
        self._control_on = False
        self.active: dict[Any, int] = {}  # session -> its demand d_s
        self.demand_tokens = 0  # D over active sessions
        self.parked: deque = deque()  # (session, demand, future)
        self.waiting_new: deque = deque()
        # session trees (docs/trace-shapes.md#trees-and-the-gateway): admitted parents waiting at a
        # join, and children admitted on arrival without asking the policy (tree_policy trees)
        self.joining: set = set()
        self.admit_on_arrival: set = set()
        if not self._uncontrolled:
            if control_start_s <= clock.now():
                self._switch_on()
            else:
                clock.call_at(control_start_s, self._switch_on)

    @property
    def num_admitted(self) -> int:
        return len(self.active)

    @property
    def control_on(self) -> bool:
        """The policy decides (from ``control_start_s`` on); before that the gate is ``none``."""
        return self._control_on

    def _switch_on(self) -> None:
        self._control_on = True
        self.policy.on_control_start(self.view())

    def _policy(self) -> Policy:
        return self.policy if self._control_on else self._off

    def view(self) -> GatewayView:
        return GatewayView(self.clock.now(), len(self.active), self.demand_tokens, self.pool_tokens,
                           len(self.parked), len(self.waiting_new))

    def limit(self) -> float:
        if not self._control_on:
            return math.nan
        return self.policy.limit(self.view())

    # ---------------------------------------------------------------- session events
    def arrive(self, session: Any, demand_tokens: int) -> Optional[Any]:
        """A new session wants its first turn. None: go; else await the returned future."""
        if self._uncontrolled or session in self.admit_on_arrival:
            self.admit_on_arrival.discard(session)
            self._activate(session, demand_tokens)
            return None
        policy = self._policy()
        view = self.view()
        policy.on_turn_boundary(view, demand_tokens)
        # FIFO: nobody overtakes a queued session; the liveness rule admits into an empty gate.
        if not self.parked and not self.waiting_new and (
                not self._progressing() or policy.admit(view, demand_tokens, True)):
            self._activate(session, demand_tokens)
            return None
        fut = self.clock.create_future()
        self.waiting_new.append((session, demand_tokens, fut))
        return fut

    def before_turn(self, session: Any, demand_tokens: int) -> Optional[Any]:
        """An active session is at a turn boundary with demand ``demand_tokens``."""
        self.demand_tokens += demand_tokens - self.active[session]
        self.active[session] = demand_tokens
        if self._uncontrolled:
            return None
        policy = self._policy()
        view = self.view()
        policy.on_turn_boundary(view, demand_tokens)
        if not policy.park(view, demand_tokens):
            return None
        self._deactivate(session)
        fut = self.clock.create_future()
        self.parked.append((session, demand_tokens, fut))
        if not self._progressing():
            self._readmit()  # liveness: nobody left to complete a turn and re-open the queues
        return fut

    def turn_completed(self, session: Any, latency_s: float) -> None:
        if self._uncontrolled:
            return
        self._policy().on_turn_completed(self.view(), latency_s)
        self._readmit()

    def session_ended(self, session: Any) -> None:
        """The session left: normally after its last turn (admitted); a session that crashed
        may also be waiting in a queue, and gives up its place there."""
        if session in self.active:
            self._deactivate(session)
        else:
            for queue in (self.parked, self.waiting_new):
                for entry in queue:
                    if entry[0] == session:
                        queue.remove(entry)
                        break
        if not self._uncontrolled:
            self._readmit()

    def admit_now(self, session: Any) -> bool:
        """Admit a waiting session whatever the policy says (the HTTP gateway's maximum park
        time, like ThunderAgent's forced resume); False when it is not in a queue."""
        for queue in (self.parked, self.waiting_new):
            for entry in queue:
                if entry[0] == session:
                    queue.remove(entry)
                    self._activate(session, entry[1])
                    entry[2].set_result(None)
                    return True
        return False

    def join_started(self, session: Any) -> None:
        """Admitted ``session`` waits for its children at a join: it ends no turn until they run.
        Liveness (trees): when every admitted session waits at a join, the head of the queues is
        admitted whatever the limit says, as when nobody is admitted."""
        self.joining.add(session)
        if not self._uncontrolled and not self._progressing():
            self._readmit()

    def join_ended(self, session: Any) -> None:
        self.joining.discard(session)

    # ---------------------------------------------------------------- internals
    def _progressing(self) -> bool:
        """Some admitted session can end a turn (and so re-open the queues)."""
        return len(self.active) > len(self.joining)

    def _activate(self, session: Any, demand_tokens: int) -> None:
        self.active[session] = demand_tokens
        self.demand_tokens += demand_tokens

    def _deactivate(self, session: Any) -> None:
        self.demand_tokens -= self.active.pop(session)

    def _readmit(self) -> None:
        policy = self._policy()
        while self.parked or self.waiting_new:
            queue = self.parked if self.parked else self.waiting_new
            session, demand, fut = queue[0]
            if self._progressing() and not policy.admit(self.view(), demand, queue is self.waiting_new):
                return
            queue.popleft()
            self._activate(session, demand)
            fut.set_result(None)
