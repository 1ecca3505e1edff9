"""``adaptive-cap``: a session cap derived from the KV pool and an estimate of one session's demand."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .base import GatewayView, Policy, require_positive


@dataclass
class AdaptiveCap(Policy):
    """Admit while active < floor(admit_fraction C / d_hat); park while active > floor(park_fraction C / d_hat).

    d_hat is an EWMA (weight ``alpha`` per observation) of d_s over every turn boundary the
    gateway sees, first turns included. At switch-on it starts from the mean demand of the
    sessions already active, so the cap is meaningful from the first decision; with nobody
    active it starts from the first session's own demand.
    """

    name = "adaptive-cap"
    admit_fraction: float = 0.75
    park_fraction: float = 0.95
    alpha: float = 0.02
    _demand_estimate_tokens: Optional[float] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        require_positive("admit_fraction", self.admit_fraction)
        require_positive("park_fraction", self.park_fraction)
        require_positive("alpha", self.alpha)
        if self.admit_fraction > self.park_fraction:
            raise ValueError(f"admit_fraction ({self.admit_fraction}) must be <= park_fraction ({self.park_fraction})")
        if self.alpha > 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    @property
    def demand_estimate_tokens(self) -> Optional[float]:
        """d_hat (None until the first observation)."""
        return self._demand_estimate_tokens

    def on_control_start(self, view: GatewayView) -> None:
        if view.num_active:
            self._demand_estimate_tokens = view.demand_tokens / view.num_active

    def on_turn_boundary(self, view: GatewayView, demand_tokens: int) -> None:
        d_hat = self._demand_estimate_tokens
        self._demand_estimate_tokens = (
            float(demand_tokens) if d_hat is None else d_hat + self.alpha * (demand_tokens - d_hat))

    def _cap(self, view: GatewayView, fraction: float, demand_tokens: int) -> int:
        d_hat = self._demand_estimate_tokens if self._demand_estimate_tokens is not None else demand_tokens
        return math.floor(fraction * view.pool_tokens / max(d_hat, 1.0))

    def admit(self, view: GatewayView, demand_tokens: int, is_new: bool) -> bool:
        return view.num_active < self._cap(view, self.admit_fraction, demand_tokens)

    def park(self, view: GatewayView, demand_tokens: int) -> bool:
        return view.num_active > self._cap(view, self.park_fraction, demand_tokens)

    def limit(self, view: GatewayView) -> float:
        if self._demand_estimate_tokens is None:
            return math.nan
        return float(self._cap(view, self.admit_fraction, 0))
