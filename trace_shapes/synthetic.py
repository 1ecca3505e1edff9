"""The synthetic reference sessions of docs/experiments.md#synthetic-agent-sessions and the session-mix shift of docs/experiments.md#session-mix-shift."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shape import SessionShape


@dataclass(frozen=True)
class SyntheticSessions:
    """Fixed-size turns with exponential think time (docs/experiments.md#synthetic-agent-sessions defaults)."""

    system_prompt_tokens: int = 2000
    task_tokens: int = 4000
    num_turns: int = 25
    output_tokens: int = 300
    tool_tokens: int = 1000
    think_time_mean_s: float = 5.0
    kind: str = "synthetic"
    prefix_key: str = "system"

    def make(self, rng: np.random.Generator) -> SessionShape:
        n = self.num_turns
        think = rng.exponential(self.think_time_mean_s, size=n - 1) if self.think_time_mean_s > 0 else np.zeros(n - 1)
        return SessionShape(
            kind=self.kind,
            initial_tokens=self.system_prompt_tokens + self.task_tokens,
            output_tokens=(self.output_tokens,) * n,
            growth_tokens=(self.tool_tokens,) * (n - 1),
            think_s=tuple(float(x) for x in think),
            shared_prefix_tokens=self.system_prompt_tokens,
            prefix_key=self.prefix_key,
        )


# docs/experiments.md#session-mix-shift: short interactive vs long autonomous sessions (same turn structure otherwise).
SHORT_INTERACTIVE = SyntheticSessions(task_tokens=1000, num_turns=12, think_time_mean_s=15.0, kind="short")
LONG_AUTONOMOUS = SyntheticSessions(task_tokens=20000, num_turns=12, think_time_mean_s=5.0, kind="long")


@dataclass(frozen=True)
class MixShiftSessions:
    """Sessions arriving before ``shift_s`` take the ``before`` shape, later ones ``after``."""

    before: SyntheticSessions = SHORT_INTERACTIVE
    after: SyntheticSessions = LONG_AUTONOMOUS
    shift_s: float = 1800.0

    def make_at(self, arrival_s: float, rng: np.random.Generator) -> SessionShape:
        return (self.before if arrival_s < self.shift_s else self.after).make(rng)
