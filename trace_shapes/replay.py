"""Replaying recorded sessions as :class:`SessionShape` objects.

What a replayed session keeps of its recording: the initial context, every call's output, the
growth between calls, the gaps, the number of calls. Token contents are random; every session's
context is unique to it except its first ``shared_prefix_tokens`` tokens (the shared system
prompt), so the only cross-session prefix reuse is that system prompt.

Three treatments make a recording replayable on an engine whose token streams are append-only:

* **Append-only prompts.** A recorded prompt can be shorter than the previous prompt + output
  (about 3.5% of the shipped SWE-bench turns: reasoning tokens billed as output but not sent
  back, trimmed tool output). Replay sends ``max(recorded prompt, previous replayed prompt +
  previous output)``: the turn appends nothing new, and the shortfall is absorbed by the next
  turns' growth, so the replayed context tracks the recorded one instead of drifting above it
  (clamping each turn at zero would add every shortfall to all later prompts). The raised turns
  and extra tokens are counted (:class:`ReplayStats`). A compaction that drops most of the
  context is kept as a long plateau rather than a restart of the stream.
* **Truncation.** A session stops before the first call whose prompt + output would exceed
  ``truncate_at_tokens`` (38K of a 40K engine in the reference runs). A session whose first call
  already exceeds it cannot be replayed and leaves the pool (counted).
* **Outputs of at least one token**, since an engine call generates at least one.

Gaps the recording does not have come from a :class:`GapFallback`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Protocol, Sequence

import numpy as np

from .records import RecordedSession
from .shape import SessionShape


class GapFallback(Protocol):
    """Where gaps come from when the recording has none."""

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray: ...


@dataclass(frozen=True)
class EmpiricalGaps:
    """Draw uniformly, with replacement, from recorded gaps (of the rows that have them)."""

    gaps_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.gaps_s:
            raise ValueError("no recorded gaps to draw from; name another gap fallback")

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.choice(np.asarray(self.gaps_s, dtype=float), size=size)


@dataclass(frozen=True)
class ExponentialGaps:
    """Exponential gaps of a given mean."""

    mean_s: float

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.exponential(self.mean_s, size=size)


@dataclass(frozen=True)
class ReplayOptions:
    truncate_at_tokens: int = 38_000
    shared_prefix_tokens: int = 0  # capped at each session's initial context
    kind: str = "trace"
    prefix_key: str = "system"


@dataclass(frozen=True)
class PreparedSession:
    """A recording after the append-only and truncation treatments, gaps not yet filled."""

    session_id: str
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    gaps_s: tuple[Optional[float], ...]
    num_recorded_calls: int
    num_raised_turns: int  # kept turns whose prompt was raised above the recorded one
    num_extra_tokens: int  # sum over kept turns of (replayed - recorded prompt)
    shared_prefix_tokens: Optional[int] = None  # the recording's own cross-session prefix, if it has one
    prefix_key: Optional[str] = None

    @property
    def num_calls(self) -> int:
        return len(self.prompt_tokens)

    @property
    def is_truncated(self) -> bool:
        return self.num_calls < self.num_recorded_calls


def append_only_prompts(prompt_tokens: Sequence[int], output_tokens: Sequence[int]) -> list[int]:
    """Each prompt raised, where needed, to the previous replayed prompt + its output."""
    replayed = [int(prompt_tokens[0])]
    for k in range(1, len(prompt_tokens)):
        replayed.append(max(int(prompt_tokens[k]), replayed[-1] + int(output_tokens[k - 1])))
    return replayed


def prepare(session: RecordedSession, truncate_at_tokens: int) -> Optional[PreparedSession]:
    """The replayable part of ``session``, or None when its first call alone does not fit."""
    outputs = [max(1, o) for o in session.output_tokens]
    prompts = append_only_prompts(session.prompt_tokens, outputs)
    num_calls = 0
    while num_calls < len(prompts) and prompts[num_calls] + outputs[num_calls] <= truncate_at_tokens:
        num_calls += 1
    if num_calls == 0:
        return None
    extra = [p - r for p, r in zip(prompts[:num_calls], session.prompt_tokens)]
    return PreparedSession(
        session_id=session.session_id,
        prompt_tokens=tuple(prompts[:num_calls]),
        output_tokens=tuple(outputs[:num_calls]),
        gaps_s=session.gaps_s[:num_calls - 1],
        num_recorded_calls=session.num_calls,
        num_raised_turns=sum(e > 0 for e in extra),
        num_extra_tokens=sum(extra),
        shared_prefix_tokens=session.shared_prefix_tokens,
        prefix_key=session.prefix_key,
    )


def to_shape(prepared: PreparedSession, options: ReplayOptions, fallback: Optional[GapFallback],
             rng: np.random.Generator) -> SessionShape:
    """The session shape; missing gaps are drawn from ``fallback`` with ``rng``."""
    prompts, outputs = prepared.prompt_tokens, prepared.output_tokens
    growth = tuple(prompts[k + 1] - prompts[k] - outputs[k] for k in range(prepared.num_calls - 1))
    gaps = list(prepared.gaps_s)
    missing = [k for k, g in enumerate(gaps) if g is None]
    if missing:
        if fallback is None:
            raise ValueError(f"session {prepared.session_id!r} has unrecorded gaps and no gap fallback")
        for k, g in zip(missing, fallback.draw(rng, len(missing))):
            gaps[k] = float(g)
    # a prefix the recording names (Mooncake's shared block hashes) replaces the one-for-all
    # system prompt: sessions share exactly what they shared in the trace
    if prepared.shared_prefix_tokens is not None:
        shared, prefix_key = prepared.shared_prefix_tokens, f"{options.prefix_key}:{prepared.prefix_key}"
    else:
        shared, prefix_key = options.shared_prefix_tokens, options.prefix_key
    return SessionShape(
        kind=options.kind,
        initial_tokens=prompts[0],
        output_tokens=outputs,
        growth_tokens=growth,
        think_s=tuple(float(g) for g in gaps),
        shared_prefix_tokens=min(shared, prompts[0]),
        prefix_key=prefix_key,
        name=prepared.session_id,
    )


@dataclass(frozen=True)
class ReplayStats:
    """What the replay treatments did to a pool of recordings."""

    num_recorded_sessions: int
    num_dropped_sessions: int  # first call alone over truncate_at_tokens
    num_truncated_sessions: int
    num_recorded_turns: int  # transitions between calls, over the recorded sessions
    num_shrinking_turns: int  # recorded next prompt < previous prompt + output
    num_kept_turns: int  # transitions kept after truncation
    num_raised_turns: int
    num_extra_tokens: int
    num_kept_gaps_missing: int  # kept gaps the fallback fills


@dataclass(frozen=True)
class TraceReplay:
    """A pool of prepared recordings, sampled by a seeded draw order.

    ``draw_order(rng)`` is an endless sequence of pool indices: with replacement, independent
    uniform draws; without, one fresh permutation of the pool after another (no session
    repeats until all have been used). Its i-th element depends only on ``rng``'s seed and i,
    never on how many sessions are drawn, so session i of an arrival stream replays the same
    recording whatever happens later in the stream."""

    pool: tuple[PreparedSession, ...]
    options: ReplayOptions
    gap_fallback: Optional[GapFallback]
    with_replacement: bool
    stats: ReplayStats

    def draw_order(self, rng: np.random.Generator) -> Iterator[int]:
        n = len(self.pool)
        while True:
            block = rng.integers(n, size=n) if self.with_replacement else rng.permutation(n)
            yield from block.tolist()

    def make(self, pool_index: int, rng: np.random.Generator) -> SessionShape:
        return to_shape(self.pool[pool_index], self.options, self.gap_fallback, rng)


def build_replay(sessions: Sequence[RecordedSession], options: ReplayOptions,
                 gap_fallback: Optional[GapFallback] = None, models: Optional[Sequence[str]] = None,
                 with_replacement: bool = False) -> TraceReplay:
    """Filter ``sessions`` by model, prepare each, and check that something can be replayed."""
    chosen = select_models(sessions, models)
    prepared = [prepare(s, options.truncate_at_tokens) for s in chosen]
    pool = tuple(p for p in prepared if p is not None)
    if not pool:
        smallest = min(s.prompt_tokens[0] + max(1, s.output_tokens[0]) for s in chosen)
        raise ValueError(f"no session fits truncate_at_tokens={options.truncate_at_tokens}: the smallest first "
                         f"call needs {smallest} tokens")
    if gap_fallback is None and any(g is None for p in pool for g in p.gaps_s):
        raise ValueError("some sessions have unrecorded gaps; a gap fallback is needed")
    return TraceReplay(pool, options, gap_fallback, with_replacement, replay_stats(chosen, pool))


def replay_stats(recorded: Sequence[RecordedSession], pool: Sequence[PreparedSession]) -> ReplayStats:
    """What preparing ``recorded`` into ``pool`` changed (``pool`` holds the ones that fit)."""
    return ReplayStats(
        num_recorded_sessions=len(recorded),
        num_dropped_sessions=len(recorded) - len(pool),
        num_truncated_sessions=sum(p.is_truncated for p in pool),
        num_recorded_turns=sum(s.num_calls - 1 for s in recorded),
        num_shrinking_turns=sum(a < 0 for s in recorded for a in s.appended_tokens()),
        num_kept_turns=sum(p.num_calls - 1 for p in pool),
        num_raised_turns=sum(p.num_raised_turns for p in pool),
        num_extra_tokens=sum(p.num_extra_tokens for p in pool),
        num_kept_gaps_missing=sum(g is None for p in pool for g in p.gaps_s),
    )


def select_models(sessions: Sequence[RecordedSession], models: Optional[Sequence[str]]) -> list[RecordedSession]:
    """The sessions of the named models (all when ``models`` is None); unknown names are errors."""
    if models is None:
        return list(sessions)
    available = sorted({s.model for s in sessions})
    unknown = sorted(set(models) - set(available))
    if unknown:
        raise ValueError(f"no sessions of model(s) {unknown}; models in the trace: {available}")
    wanted = set(models)
    return [s for s in sessions if s.model in wanted]
