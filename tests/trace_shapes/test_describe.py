"""``describe_sessions`` on hand-made sessions, and its text form."""

import pytest

from trace_shapes import RecordedSession, describe_sessions, format_description

S_A = RecordedSession("s-a", "m1", (1000, 1300, 1340, 1500), (100, 50, 20, 10), (0.5, None, 2.0))
S_B = RecordedSession("s-b", "m2", (2000, 2600, 3100), (500, 400, 300), (1.0, 1.5))
S_C = RecordedSession("s-c", "m1", (5000,), (10,), ())


def test_numbers_by_hand():
    description = describe_sessions([S_A, S_B, S_C], truncate_at_tokens=3000, over_tokens=(3000, 5000), name="fx")
    rec, rep = description["recorded"], description["replay"]
    assert rec["num_sessions"] == 3 and rec["models"] == {"m1": 2, "m2": 1}
    assert rec["calls_per_session"]["p50"] == 3 and rec["calls_per_session"]["mean"] == pytest.approx(8 / 3)
    assert rec["initial_context_tokens"]["max"] == 5000
    # prompt[k+1] - prompt[k]: 300, 40, 160, 600, 500
    assert rec["growth_per_turn_tokens"]["p50"] == 300 and rec["growth_per_turn_tokens"]["mean"] == 320
    assert rec["appended_per_turn_tokens"]["p50"] == 100  # 200, -10, 140, 100, 100
    assert rec["gap_s"]["n"] == 4 and rec["num_gaps_missing"] == 1 and rec["gap_s"]["max"] == 2.0
    # session max contexts 1510, 3400, 5010
    assert rec["share_of_sessions_over"] == {"3000": pytest.approx(2 / 3), "5000": pytest.approx(1 / 3)}
    assert (rep["num_dropped_sessions"], rep["num_truncated_sessions"], rep["num_shrinking_turns"]) == (1, 1, 1)
    assert rep["calls_per_session"]["max"] == 4 and rep["per_call_context_tokens"]["max"] == 2600


def test_text_names_every_section():
    text = format_description(describe_sessions([S_A, S_B], 38_000, name="fx"), notes=["read 2 rows"])
    for needle in ("fx: 2 sessions (m1 1, m2 1)", "note: read 2 rows", "calls per session", "per-call context",
                   "growth per turn", "gaps recorded: 4 of 5 (80.0%)", "sessions over 38,000 tokens: 0.0%",
                   "shrinking turns (next prompt < prompt + output): 1 of 5 (20.0%)",
                   "replay at truncate_at_tokens=38,000", "turns raised to stay append-only: 1 of 5"):
        assert needle in text, needle
