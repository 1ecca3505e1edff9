"""A recorded agent session as plain numbers: what each model call sent, got back, and waited."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class RecordedSession:
    """One session of a trace, call by call, exactly as recorded (before any replay treatment).

    ``prompt_tokens[k]`` is the whole context sent on call k, ``output_tokens[k]`` what it
    generated, ``gaps_s[k]`` the pause between the end of call k's response and the start of
    call k + 1 (tool and think time), or None where the trace does not record it.

    ``shared_prefix_tokens`` / ``prefix_key``: where the trace records which leading tokens of the
    first prompt other sessions send too (Mooncake's block hashes), their number and a name
    identical across exactly the sessions that share them; None where it does not (the replay's
    ``shared_prefix_tokens`` option applies then).
    """

    session_id: str
    model: str
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    gaps_s: tuple[Optional[float], ...]
    shared_prefix_tokens: Optional[int] = None
    prefix_key: Optional[str] = None

    def __post_init__(self) -> None:
        num_calls = len(self.prompt_tokens)
        if num_calls < 1:
            raise ValueError(f"session {self.session_id!r} has no calls")
        if len(self.output_tokens) != num_calls or len(self.gaps_s) != num_calls - 1:
            raise ValueError(f"session {self.session_id!r}: {num_calls} prompts need as many outputs and "
                             f"{num_calls - 1} gaps, got {len(self.output_tokens)} and {len(self.gaps_s)}")
        if self.shared_prefix_tokens is not None and not 0 <= self.shared_prefix_tokens <= self.prompt_tokens[0]:
            raise ValueError(f"session {self.session_id!r}: shared_prefix_tokens {self.shared_prefix_tokens} "
                             f"outside [0, first prompt {self.prompt_tokens[0]}]")

    @property
    def num_calls(self) -> int:
        return len(self.prompt_tokens)

    def max_context_tokens(self) -> int:
        """The largest context any call of the session needs: its prompt + its output."""
        return max(p + o for p, o in zip(self.prompt_tokens, self.output_tokens))

    def appended_tokens(self) -> list[int]:
        """Tokens appended between calls beyond the previous call's output (tool output, user
        text); negative where the next prompt is shorter than the previous context."""
        p, o = self.prompt_tokens, self.output_tokens
        return [p[k + 1] - p[k] - o[k] for k in range(self.num_calls - 1)]
