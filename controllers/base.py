"""The policy interface and the trivial limit."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayView:
    """What a policy may look at when it decides (SPEC.md section 5)."""

    now_s: float
    num_active: int  # admitted sessions (thinking, in flight, or at a turn boundary)
    demand_tokens: int  # D: sum of d_s = context + output budget over admitted sessions
    pool_tokens: int  # C
    num_parked: int
    num_waiting_new: int


class Policy:
    """A gateway limit. Subclasses override what they limit; the defaults are 'no limit'."""

    name = "base"

    def admit(self, view: GatewayView, demand_tokens: int, is_new: bool) -> bool:
        """May a waiting session with demand ``demand_tokens`` become active now?"""
        return True

    def park(self, view: GatewayView, demand_tokens: int) -> bool:
        """Should this active session, at a turn boundary, be parked instead of proceeding?"""
        return False

    def on_turn_boundary(self, view: GatewayView, demand_tokens: int) -> None:
        """A session is about to send a turn (demand updated); e.g. for an EWMA of d_s."""

    def on_turn_completed(self, view: GatewayView, latency_s: float) -> None:
        """A turn completed after ``latency_s`` in the engine; e.g. for latency-driven limits."""

    def limit(self, view: GatewayView) -> float:
        """The current limit, for the records (NaN when there is none)."""
        return math.nan


class NoLimit(Policy):
    """``none``: every session proceeds, nobody is parked."""

    name = "none"
