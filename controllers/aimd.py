"""``aimd``: a session cap steered by turn latency (additive increase, multiplicative decrease)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Optional

from .base import GatewayView, Policy, require_int, require_positive


@dataclass
class LatencyAimd(Policy):
    """Admit while active < K; park while active > K.

    K starts at ``initial_k`` when control switches on and is updated every
    ``update_interval_s`` from the turns that completed in that interval: times
    ``decrease_factor`` (floored, never below ``min_k``) when their median engine latency
    exceeds ``latency_threshold_s``, else + ``increase_step`` (up to ``max_k`` if given). An
    interval in which no turn completed carries no latency signal and leaves K unchanged.

    Updates are applied lazily at the next call, which gives the same K as a timer would: each
    interval's latencies are closed before a later completion is added.
    """

    name = "aimd"
    initial_k: int = 32
    update_interval_s: float = 10.0
    latency_threshold_s: float = 15.0
    decrease_factor: float = 0.5
    increase_step: int = 1
    min_k: int = 1
    max_k: Optional[int] = None
    _k: int = field(default=0, init=False, repr=False)
    _next_update_s: Optional[float] = field(default=None, init=False, repr=False)
    _interval_latencies_s: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        require_int("initial_k", self.initial_k, 1)
        require_positive("update_interval_s", self.update_interval_s)
        require_positive("latency_threshold_s", self.latency_threshold_s)
        require_positive("decrease_factor", self.decrease_factor)
        require_int("increase_step", self.increase_step, 0)
        require_int("min_k", self.min_k, 1)
        if self.decrease_factor >= 1:
            raise ValueError(f"decrease_factor must be < 1, got {self.decrease_factor}")
        if self.max_k is not None:
            require_int("max_k", self.max_k, self.min_k)
        if self.initial_k < self.min_k or (self.max_k is not None and self.initial_k > self.max_k):
            raise ValueError(f"initial_k ({self.initial_k}) must lie in [min_k, max_k]")
        self._k = self.initial_k

    def on_control_start(self, view: GatewayView) -> None:
        self._next_update_s = view.now_s + self.update_interval_s

    def current_k(self, now_s: float) -> int:
        self._advance(now_s)
        return self._k

    def _advance(self, now_s: float) -> None:
        if self._next_update_s is None:
            self._next_update_s = now_s + self.update_interval_s
        if now_s < self._next_update_s:
            return
        if self._interval_latencies_s:
            if statistics.median(self._interval_latencies_s) > self.latency_threshold_s:
                self._k = max(self.min_k, math.floor(self._k * self.decrease_factor))
            else:
                self._k += self.increase_step
                if self.max_k is not None:
                    self._k = min(self._k, self.max_k)
            self._interval_latencies_s = []
        # Later intervals up to now saw no completion: K stays, jump over them at once.
        num_elapsed = math.floor((now_s - self._next_update_s) / self.update_interval_s) + 1
        self._next_update_s += num_elapsed * self.update_interval_s

    def on_turn_completed(self, view: GatewayView, latency_s: float) -> None:
        self._advance(view.now_s)
        self._interval_latencies_s.append(latency_s)

    def admit(self, view: GatewayView, demand_tokens: int, is_new: bool) -> bool:
        return view.num_active < self.current_k(view.now_s)

    def park(self, view: GatewayView, demand_tokens: int) -> bool:
        return view.num_active > self.current_k(view.now_s)

    def limit(self, view: GatewayView) -> float:
        return float(self.current_k(view.now_s))
