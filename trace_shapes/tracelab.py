"""TraceLab-like coding-agent sessions generated from published statistics, for users without the file.

Published (docs/experiments.md#replayed-trace-shapes; uw-syfi/TraceLab README): median starting context ~19K tokens, median
per-call context ~136K, tool gaps with a median of 0.1-0.2 s and a heavy tail; 357,161 rounds
in 4,265 sessions (84 calls per session on average). Everything else is an assumption, chosen
so that the generated sessions reproduce those numbers (tests/trace_shapes/test_tracelab.py
checks them):

* initial context: lognormal, median 19K, sigma 0.6;
* calls per session: lognormal, median 50, sigma 1.0 (mean 50 e^0.5 = 82, near the published
  84);
* output per call: lognormal, median 250 tokens, sigma 1.0;
* tokens appended per call beyond the output (tool results, user text): lognormal, median
  700, sigma 1.3 (most appends are small, most appended tokens come from the few large ones,
  as TraceLab reports); with the above this puts the median per-call context at ~136K;
* no compaction and no agent context window: a session grows until replay truncates it at the
  engine limit (the long tail reaches several hundred K tokens, which real agents would have
  compacted: a long session on a large engine is an upper bound);
* gaps: lognormal, median 0.15 s, sigma 1.5 (p90 1.0 s, p99 4.9 s).

A generated session is a :class:`RecordedSession` with every gap recorded; replay it like a
real one (truncation at the engine limit) with :class:`GeneratedReplay`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .records import RecordedSession
from .replay import ReplayOptions, prepare, to_shape
from .shape import SessionShape

MAX_DRAWS = 1000  # redraws of a session whose first call does not fit, before giving up


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return rng.lognormal(np.log(median), sigma, size=size)


@dataclass(frozen=True)
class TraceLabLikeSessions:
    initial_context_median_tokens: float = 19_000
    initial_context_sigma: float = 0.6
    num_calls_median: float = 50
    num_calls_sigma: float = 1.0
    output_median_tokens: float = 250
    output_sigma: float = 1.0
    appended_median_tokens: float = 700
    appended_sigma: float = 1.3
    gap_median_s: float = 0.15
    gap_sigma: float = 1.5

    def record(self, rng: np.random.Generator, session_id: str = "tracelab-like") -> RecordedSession:
        """One generated session."""
        num_calls = max(1, int(round(_lognormal(rng, self.num_calls_median, self.num_calls_sigma, 1)[0])))
        initial = max(1, int(_lognormal(rng, self.initial_context_median_tokens, self.initial_context_sigma, 1)[0]))
        outputs = np.maximum(1, _lognormal(rng, self.output_median_tokens, self.output_sigma, num_calls)).astype(int)
        appended = _lognormal(rng, self.appended_median_tokens, self.appended_sigma, num_calls - 1).astype(int)
        gaps = _lognormal(rng, self.gap_median_s, self.gap_sigma, num_calls - 1)
        prompts = np.concatenate(([initial], initial + np.cumsum(outputs[:-1] + appended)))
        return RecordedSession(session_id, "tracelab-like", tuple(int(p) for p in prompts),
                               tuple(int(o) for o in outputs), tuple(float(g) for g in gaps))


@dataclass(frozen=True)
class GeneratedReplay:
    """Generated sessions replayed with the same treatments as recorded ones.

    A session whose first call does not fit ``truncate_at_tokens`` is redrawn (as replay drops
    such recordings from its pool), so every shape fits the engine."""

    source: TraceLabLikeSessions
    options: ReplayOptions

    def make(self, rng: np.random.Generator) -> SessionShape:
        for _ in range(MAX_DRAWS):
            prepared = prepare(self.source.record(rng), self.options.truncate_at_tokens)
            if prepared is not None:
                return to_shape(prepared, self.options, None, rng)
        raise ValueError(f"no generated session fits truncate_at_tokens={self.options.truncate_at_tokens} "
                         f"in {MAX_DRAWS} draws; raise it or lower initial_context_median_tokens")
