"""``controller.scope: replica``: a gate per replica, each over its own pool, asked after routing.

With scope deployment (the default) one gateway stands in front of the router and its pool C is
the sum of the replicas' (as a live run with metrics_urls reckons it). With scope replica the
router is asked first, at the turn boundary, and the session then waits at the gate of the
replica it was routed to, whose policy sees only that replica's sessions and pool. The turn
goes to that replica when the gate lets it through (``DeploymentClient.pin``). A session the
router moves to another replica leaves its old gate and arrives at the new one as a new session.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from controllers import Policy
from routers import RouteRequest

from .clock import Clock
from .deployment import DeploymentClient
from .gateway import Gateway


class GatePerReplica:
    """A gate per replica, each over its own pool, and the gate each session is at. A turn goes to
    the gate of the replica it was routed to; a session routed to another replica than its last
    leaves its old gate and arrives at the new one as a new session. The router is the caller's:
    ``ReplicaGates`` in the simulator, the proxy's (loadgen/gateway/upstream_gates.py) live."""

    def __init__(self, clock: Clock, policies: Sequence[Policy], pools: Sequence[int], control_start_s: float) -> None:
        self.gates = [Gateway(clock, policy, pool, control_start_s) for policy, pool in zip(policies, pools)]
        self.gate_of: dict[Any, int] = {}

    def arrive_at(self, index: int, session: Any, demand_tokens: int) -> Optional[Any]:
        self.gate_of[session] = index
        return self.gates[index].arrive(session, demand_tokens)

    def turn_at(self, index: int, session: Any, demand_tokens: int) -> Optional[Any]:
        old = self.gate_of[session]
        if index == old:
            return self.gates[index].before_turn(session, demand_tokens)
        self.gates[old].session_ended(session)
        return self.arrive_at(index, session, demand_tokens)

    def turn_completed(self, session: Any, latency_s: float) -> None:
        self.gates[self.gate_of[session]].turn_completed(session, latency_s)

    def session_ended(self, session: Any) -> None:
        index = self.gate_of.pop(session, None)
        if index is not None:
            self.gates[index].session_ended(session)

    def limit(self) -> float:
        """The replicas' limits summed (NaN before control starts)."""
        limits = [gate.limit() for gate in self.gates]
        return math.nan if any(math.isnan(x) for x in limits) else math.fsum(limits)

    @property
    def num_admitted(self) -> int:
        return sum(gate.num_admitted for gate in self.gates)


class ReplicaGates(GatePerReplica):
    """The gateway interface sessions use (loadgen.core.gateway.Gateway), over one gate per replica,
    each turn routed by the deployment's router before its gate is asked."""

    def __init__(self, clock: Clock, deployment: DeploymentClient, policies: Sequence[Policy],
                 control_start_s: float, plans: Sequence[Any]) -> None:
        super().__init__(clock, policies, [replica.pool_tokens for replica in deployment.replicas], control_start_s)
        self.deployment = deployment
        self._shapes = {plan.session_id: plan.shape for plan in plans}
        self._next_turn: dict[Any, int] = {}

    def _route(self, session: Any, demand_tokens: int) -> int:
        shape = self._shapes[session]
        k = self._next_turn[session]
        # a session's demand is its next prompt plus that turn's output budget (loadgen.core.session)
        request = RouteRequest(str(session), demand_tokens - shape.output_tokens[k], shape.prefix_key,
                               shape.shared_prefix_tokens)
        return self.deployment.pin(session, request)

    def arrive(self, session: Any, demand_tokens: int) -> Optional[Any]:
        self._next_turn[session] = 0
        return self.arrive_at(self._route(session, demand_tokens), session, demand_tokens)

    def before_turn(self, session: Any, demand_tokens: int) -> Optional[Any]:
        self._next_turn[session] += 1
        return self.turn_at(self._route(session, demand_tokens), session, demand_tokens)

    def session_ended(self, session: Any) -> None:
        self._next_turn.pop(session, None)
        super().session_ended(session)
