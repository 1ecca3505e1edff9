"""The policy interface, the trivial limit, and checks for policy constants."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, init=False)
class GatewayView:
    """What a policy may look at when it decides (docs/experiments.md#gateway-controllers)."""

    now_s: float
    num_active: int  # admitted sessions (thinking, in flight, or at a turn boundary)
    demand_tokens: int  # D: sum of d_s = context + output budget over admitted sessions
    pool_tokens: int  # C
    num_parked: int
    num_waiting_new: int

    # made at every gate decision of a controlled run (a turn boundary, a completed turn): its
    # __dict__ filled in one assignment, not a frozen dataclass's setattr per field; the same
    # parameters as the fields (tests/controllers/test_base.py)
    def __init__(self, now_s, num_active, demand_tokens, pool_tokens, num_parked, num_waiting_new):
        object.__setattr__(self, "__dict__", {
            "now_s": now_s, "num_active": num_active, "demand_tokens": demand_tokens, "pool_tokens": pool_tokens,
            "num_parked": num_parked, "num_waiting_new": num_waiting_new})


class Policy:
    """A gateway limit. Subclasses override what they limit; the defaults are 'no limit'.

    A policy is pure: the gateway's state and the time come in through ``GatewayView`` and the
    arguments, a decision comes out. It may keep state of its own (an estimate, a limit that
    moves), updated only from what it is told; it never reads a clock and does no I/O.
    """

    name = "base"

    def on_control_start(self, view: GatewayView) -> None:
        """Control switches on at ``view.now_s``; the policy has seen nothing before this."""

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


def require_int(name: str, value: object, minimum: int) -> None:
    # bool is an int in Python; `k: true` in a YAML file is a mistake, not a 1.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def require_positive(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
