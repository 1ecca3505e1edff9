"""``budgeter``: a KV-token budget on the resident demand of admitted sessions."""

from __future__ import annotations

from dataclasses import dataclass

from .base import GatewayView, Policy, require_positive


@dataclass
class KvBudgeter(Policy):
    """Admit while D + d_s <= admit_fraction C; park while D > park_fraction C.

    D is the demand of the admitted sessions (in-flight requests with their full context and
    output budget); the thresholds are fractions of the pool, not tuned per workload. The
    recorded limit is the admission budget in tokens.
    """

    name = "budgeter"
    admit_fraction: float = 0.75
    park_fraction: float = 0.95

    def __post_init__(self) -> None:
        require_positive("admit_fraction", self.admit_fraction)
        require_positive("park_fraction", self.park_fraction)
        if self.admit_fraction > self.park_fraction:
            raise ValueError(f"admit_fraction ({self.admit_fraction}) must be <= park_fraction ({self.park_fraction})")

    def admit(self, view: GatewayView, demand_tokens: int, is_new: bool) -> bool:
        return view.demand_tokens + demand_tokens <= self.admit_fraction * view.pool_tokens

    def park(self, view: GatewayView, demand_tokens: int) -> bool:
        return view.demand_tokens > self.park_fraction * view.pool_tokens

    def limit(self, view: GatewayView) -> float:
        return self.admit_fraction * view.pool_tokens
