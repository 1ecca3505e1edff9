"""``scope: replica`` in the proxy: a gate per upstream, each over that upstream's own pool.

With scope deployment (the default) one gate stands in front of the router and its pool C is the
upstreams' pools summed, so a router that piles sessions on one upstream is not stopped while the
sum stays under the budget. With scope replica the router is asked first, at the turn boundary,
and the session waits at the gate of the upstream it was routed to, whose policy sees only that
upstream's sessions and pool (as ``controller.scope: replica`` in the simulator,
loadgen/core/replica_gates.py). A session the router moves to another upstream leaves its old
gate and arrives at the new one as a new session.

``UpstreamGates`` answers the proxy's calls by session (the gates and their bookkeeping are
``core.replica_gates.GatePerReplica``'s) and reads as one gate to the metrics and ``/status``
(sums over the upstreams' gates; the limit is the limits summed).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from controllers import Policy

from ..core.clock import Clock
from ..core.gateway import Gateway
from ..core.replica_gates import GatePerReplica


class _EveryGate:
    """``admit_on_arrival`` of every gate at once (a tree's child may arrive at any of them)."""

    def __init__(self, gates: Sequence[Gateway]) -> None:
        self.gates = gates

    def add(self, session: Any) -> None:
        for gate in self.gates:
            gate.admit_on_arrival.add(session)

    def discard(self, session: Any) -> None:
        for gate in self.gates:
            gate.admit_on_arrival.discard(session)


class _Admitted:
    """``key in gates.active``: admitted at any upstream's gate."""

    def __init__(self, gates: Sequence[Gateway]) -> None:
        self.gates = gates

    def __contains__(self, session: Any) -> bool:
        return any(session in gate.active for gate in self.gates)


class UpstreamGates(GatePerReplica):
    def __init__(self, clock: Clock, make_policy: Callable[[], Policy], pools: Sequence[int],
                 control_start_s: float) -> None:
        super().__init__(clock, [make_policy() for _ in pools], pools, control_start_s)
        self.clock = clock
        self.admit_on_arrival = _EveryGate(self.gates)
        self.active = _Admitted(self.gates)

    # ---------------------------------------------------------------- by session
    def arrive(self, session: Any, demand_tokens: int, index: int) -> Optional[Any]:
        return self.arrive_at(index, session, demand_tokens)

    def before_turn(self, session: Any, demand_tokens: int, index: int) -> Optional[Any]:
        return self.turn_at(index, session, demand_tokens)

    def admit_now(self, session: Any) -> bool:
        return self.gates[self.gate_of[session]].admit_now(session)

    def join_started(self, session: Any) -> None:
        self.gates[self.gate_of[session]].join_started(session)

    def join_ended(self, session: Any) -> None:
        index = self.gate_of.get(session)
        if index is not None:
            self.gates[index].join_ended(session)

    # ---------------------------------------------------------------- as one gate (num_admitted, limit: inherited)
    @property
    def demand_tokens(self) -> int:
        return sum(gate.demand_tokens for gate in self.gates)

    @property
    def pool_tokens(self) -> int:
        return sum(gate.pool_tokens for gate in self.gates)

    @property
    def parked(self) -> list:
        return [entry for gate in self.gates for entry in gate.parked]

    @property
    def waiting_new(self) -> list:
        return [entry for gate in self.gates for entry in gate.waiting_new]

    @property
    def joining(self) -> set:
        return set().union(*(gate.joining for gate in self.gates))

    @property
    def control_on(self) -> bool:
        return all(gate.control_on for gate in self.gates)
