"""Fixed session-count limits: the admission-only cap and the session cap with parking."""

from __future__ import annotations

from dataclasses import dataclass

from .base import GatewayView, Policy, require_int


@dataclass
class AdmissionOnlyCap(Policy):
    """``admission-only``: new sessions wait while ``k`` are active; nobody is ever parked."""

    name = "admission-only"
    k: int = 16

    def __post_init__(self) -> None:
        require_int("k", self.k, 1)

    def admit(self, view: GatewayView, demand_tokens: int, is_new: bool) -> bool:
        # It never parks, so only new sessions are ever asked about.
        return view.num_active < self.k

    def limit(self, view: GatewayView) -> float:
        return float(self.k)


@dataclass
class SessionCap(Policy):
    """``session-cap``: admit while fewer than ``k`` are active; park while more than ``k_hi`` are.

    The band between k and k_hi is hysteresis: parking only starts well above the admission
    limit, so a session is not parked the moment it was let in.
    """

    name = "session-cap"
    k: int = 14
    k_hi: int = 17

    def __post_init__(self) -> None:
        require_int("k", self.k, 1)
        require_int("k_hi", self.k_hi, 1)
        if self.k_hi < self.k:
            raise ValueError(f"k_hi ({self.k_hi}) must be >= k ({self.k})")

    def admit(self, view: GatewayView, demand_tokens: int, is_new: bool) -> bool:
        return view.num_active < self.k

    def park(self, view: GatewayView, demand_tokens: int) -> bool:
        return view.num_active > self.k_hi

    def limit(self, view: GatewayView) -> float:
        return float(self.k)
