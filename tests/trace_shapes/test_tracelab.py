"""The TraceLab-like generator reproduces the statistics it was built from (docs/experiments.md#replayed-trace-shapes, TraceLab README)."""

import numpy as np
import pytest

from trace_shapes import GeneratedReplay, ReplayOptions, TraceLabLikeSessions


@pytest.fixture(scope="module")
def generated():
    rng = np.random.default_rng(11)
    return [TraceLabLikeSessions().record(rng) for _ in range(4000)]


def test_published_statistics(generated):
    initial = np.median([s.prompt_tokens[0] for s in generated])
    per_call = np.median([p for s in generated for p in s.prompt_tokens])
    gaps = np.array([g for s in generated for g in s.gaps_s])
    calls = np.mean([s.num_calls for s in generated])
    assert initial == pytest.approx(19_000, rel=0.05)  # median starting context ~19K
    assert per_call == pytest.approx(136_000, rel=0.1)  # median per-call context ~136K
    assert 0.1 <= np.median(gaps) <= 0.2  # tool gaps: median 0.1-0.2 s ...
    assert np.percentile(gaps, 99) > 20 * np.median(gaps)  # ... with a heavy tail
    assert calls == pytest.approx(357_161 / 4_265, rel=0.1)  # rounds per session


def test_generated_sessions_are_append_only_and_seeded(generated):
    assert all(a >= 0 for s in generated[:200] for a in s.appended_tokens())
    one = TraceLabLikeSessions().record(np.random.default_rng(4))
    assert TraceLabLikeSessions().record(np.random.default_rng(4)) == one
    assert TraceLabLikeSessions().record(np.random.default_rng(5)) != one


def test_replay_truncates_and_redraws_what_does_not_fit():
    replay = GeneratedReplay(TraceLabLikeSessions(), ReplayOptions(38_000, shared_prefix_tokens=2_000,
                                                                   kind="tracelab-synthetic"))
    rng = np.random.default_rng(2)
    shapes = [replay.make(rng) for _ in range(300)]
    assert max(s.max_context_tokens() for s in shapes) <= 38_000
    assert all(s.kind == "tracelab-synthetic" and s.shared_prefix_tokens == min(2_000, s.initial_tokens)
               for s in shapes)
    with pytest.raises(ValueError, match="no generated session fits truncate_at_tokens=100"):
        GeneratedReplay(TraceLabLikeSessions(), ReplayOptions(100)).make(rng)
