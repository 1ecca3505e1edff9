"""The plain-data description of one agent session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class SessionShape:
    """One session, turn by turn.

    Turn k sends the whole context; its prompt is ``initial_tokens`` for k = 0 and, after that,
    the previous prompt + the previous turn's output + ``growth_tokens[k-1]`` tool tokens. The
    first ``shared_prefix_tokens`` tokens of every prompt are identical across all sessions with
    the same ``prefix_key`` (a shared system prompt); the rest is unique to the session.
    """

    kind: str
    initial_tokens: int
    output_tokens: tuple[int, ...]
    growth_tokens: tuple[int, ...]  # appended after turn k, for k < num_turns - 1
    think_s: tuple[float, ...]  # pause after turn k before the next one
    shared_prefix_tokens: int = 0
    prefix_key: str = "system"
    # the session's id in the trace it was replayed from, for the results (None: a drawn session);
    # not compared: two sessions of the same shape are the same workload whatever their names
    name: Optional[str] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        n = len(self.output_tokens)
        if n < 1:
            raise ValueError("a session needs at least one turn")
        if len(self.growth_tokens) != n - 1 or len(self.think_s) != n - 1:
            raise ValueError(f"growth_tokens and think_s need {n - 1} entries for {n} turns, "
                             f"got {len(self.growth_tokens)} and {len(self.think_s)}")
        if not 0 <= self.shared_prefix_tokens <= self.initial_tokens:
            raise ValueError("shared_prefix_tokens must lie in [0, initial_tokens]")

    @property
    def num_turns(self) -> int:
        return len(self.output_tokens)

    def prompt_tokens(self, turn: int) -> int:
        """Prompt length of ``turn`` (0-based)."""
        return self.initial_tokens + sum(self.output_tokens[:turn]) + sum(self.growth_tokens[:turn])

    def max_context_tokens(self) -> int:
        """The largest context the session reaches: last prompt + its output."""
        return self.prompt_tokens(self.num_turns - 1) + self.output_tokens[-1]
