"""Replay arithmetic against hand-computed shapes: append-only prompts, truncation, gaps, sampling."""

import numpy as np
import pytest

from trace_shapes import (EmpiricalGaps, ExponentialGaps, RecordedSession, ReplayOptions, SessionShape,
                          build_replay, load_swebench)
from trace_shapes.replay import append_only_prompts, prepare, to_shape

# s-a of fixtures/shapes.jsonl: turn 2's prompt (1340) is 10 tokens short of 1300 + 50
S_A = RecordedSession("s-a", "m1", (1000, 1300, 1340, 1500), (100, 50, 20, 10), (0.5, None, 2.0))
S_B = RecordedSession("s-b", "m2", (2000, 2600, 3100), (500, 400, 300), (1.0, 1.5))
S_C = RecordedSession("s-c", "m1", (5000,), (10,), ())


class FixedGaps:
    def draw(self, rng, size):
        return np.full(size, 9.0)


def test_append_only_prompts_absorb_a_shortfall_without_drifting():
    # 1340 < 1300 + 50 -> 1350; 1500 >= 1350 + 20 -> back on the recording
    assert append_only_prompts(S_A.prompt_tokens, S_A.output_tokens) == [1000, 1300, 1350, 1500]
    # a shortfall larger than the next turn's growth carries on until the recording catches up
    assert append_only_prompts([100, 200, 195, 205, 300], [100, 10, 5, 5]) == [100, 200, 210, 215, 300]


def test_replayed_shape_by_hand():
    prepared = prepare(S_A, truncate_at_tokens=38_000)
    assert prepared.num_raised_turns == 1 and prepared.num_extra_tokens == 10
    shape = to_shape(prepared, ReplayOptions(38_000, shared_prefix_tokens=150, kind="trace"), FixedGaps(),
                     np.random.default_rng(0))
    assert shape == SessionShape(kind="trace", initial_tokens=1000, output_tokens=(100, 50, 20, 10),
                                 growth_tokens=(200, 0, 130), think_s=(0.5, 9.0, 2.0), shared_prefix_tokens=150)
    # the replayed prompts are the append-only ones, and each turn appends its output
    assert [shape.prompt_tokens(k) for k in range(4)] == [1000, 1300, 1350, 1500]


def test_truncation_stops_before_the_first_call_that_does_not_fit():
    # S_B needs 2500, 3000, 3400: a limit of 3000 keeps the call that lands exactly on it
    prepared = prepare(S_B, truncate_at_tokens=3000)
    assert prepared.prompt_tokens == (2000, 2600) and prepared.gaps_s == (1.0,) and prepared.is_truncated
    assert prepare(S_B, truncate_at_tokens=2999).prompt_tokens == (2000,)
    assert prepare(S_C, truncate_at_tokens=5009) is None  # the first call alone needs 5010
    shape = to_shape(prepare(S_B, 3000), ReplayOptions(3000, shared_prefix_tokens=5000), None, np.random.default_rng(0))
    assert shape.max_context_tokens() == 3000 and shape.shared_prefix_tokens == 2000  # capped at the initial context


def test_zero_token_outputs_become_one():
    session = RecordedSession("z", "m", (100, 150), (0, 0), (0.1,))
    prepared = prepare(session, 1000)
    assert prepared.output_tokens == (1, 1) and prepared.prompt_tokens == (100, 150)


def test_build_replay_stats_filters_and_errors():
    options = ReplayOptions(truncate_at_tokens=3000)
    replay = build_replay([S_A, S_B, S_C], options, FixedGaps())
    stats = replay.stats
    assert (stats.num_recorded_sessions, stats.num_dropped_sessions, stats.num_truncated_sessions) == (3, 1, 1)
    assert (stats.num_recorded_turns, stats.num_shrinking_turns, stats.num_kept_turns) == (5, 1, 4)
    assert (stats.num_raised_turns, stats.num_extra_tokens, stats.num_kept_gaps_missing) == (1, 10, 1)
    assert [p.session_id for p in build_replay([S_A, S_B, S_C], options, FixedGaps(), models=["m2"]).pool] == ["s-b"]
    with pytest.raises(ValueError, match=r"model\(s\) \['m9'\]; models in the trace: \['m1', 'm2'\]"):
        build_replay([S_A, S_B], options, FixedGaps(), models=["m9"])
    with pytest.raises(ValueError, match="no session fits truncate_at_tokens=1000: the smallest first call needs 1100"):
        build_replay([S_A, S_C], ReplayOptions(truncate_at_tokens=1000), FixedGaps())
    with pytest.raises(ValueError, match="gap fallback"):
        build_replay([S_A], options)


def test_draw_order_is_seeded_and_covers_the_pool_without_replacement():
    replay = build_replay([S_A, S_B] * 3, ReplayOptions(), FixedGaps())
    order = replay.draw_order(np.random.default_rng(5))
    first = [next(order) for _ in range(12)]
    assert sorted(first[:6]) == sorted(first[6:]) == list(range(6))  # one permutation after another
    again = replay.draw_order(np.random.default_rng(5))
    assert [next(again) for _ in range(12)] == first
    with_replacement = build_replay([S_A, S_B] * 3, ReplayOptions(), FixedGaps(), with_replacement=True)
    draws = with_replacement.draw_order(np.random.default_rng(5))
    values = [next(draws) for _ in range(600)]
    assert set(values) == set(range(6))
    assert any(len(set(values[k:k + 6])) < 6 for k in range(0, 600, 6))  # draws repeat inside a block


def test_gap_fallbacks():
    rng = np.random.default_rng(1)
    assert set(EmpiricalGaps((0.2, 0.3)).draw(rng, 100)) == {0.2, 0.3}
    assert abs(ExponentialGaps(2.0).draw(rng, 20_000).mean() - 2.0) < 0.1
    with pytest.raises(ValueError, match="no recorded gaps"):
        EmpiricalGaps(())


def test_shipped_shapes_replay_within_the_engine_limit():
    trace = load_swebench()
    replay = build_replay(trace.sessions, ReplayOptions(38_000, 150, "swebench"),
                          EmpiricalGaps(tuple(trace.recorded_gaps_s())))
    stats = replay.stats
    # the negative-growth turns of the shipped data (data/README.md), and what replay does with them
    assert (stats.num_shrinking_turns, stats.num_recorded_turns) == (974, 28133)
    assert stats.num_dropped_sessions == 0 and stats.num_truncated_sessions == 91
    rng = np.random.default_rng(3)
    for index in range(len(replay.pool)):
        shape = replay.make(index, rng)
        assert min(shape.growth_tokens, default=0) >= 0
        assert shape.max_context_tokens() <= 38_000 and shape.shared_prefix_tokens == 150
        assert all(g >= 0 for g in shape.think_s)
