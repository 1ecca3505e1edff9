import numpy as np

from loadgen.core.workload import TRIGGER_SESSION_ID_BASE, Stream, piecewise_poisson_arrivals, plan_sessions, rng_for
from tests.conftest import make_spec, make_spec_dict
from loadgen.core.spec import parse_spec


def test_arms_share_every_base_session_exactly():
    spec = make_spec()
    base = plan_sessions(spec, spec.arm("base"), seed=7)
    burst = plan_sessions(spec, spec.arm("burst"), seed=7)
    burst_base = [p for p in burst if not p.is_trigger]
    assert base == burst_base  # same ids, arrival times and shapes (think times included)
    extra = [p for p in burst if p.is_trigger]
    assert extra, "the burst added sessions"
    assert all(120 <= p.arrival_s < 240 for p in extra)
    assert all(p.session_id >= TRIGGER_SESSION_ID_BASE for p in extra)


def test_different_seeds_give_different_streams():
    spec = make_spec()
    a = plan_sessions(spec, spec.arm("base"), seed=1)
    b = plan_sessions(spec, spec.arm("base"), seed=2)
    assert [p.arrival_s for p in a] != [p.arrival_s for p in b]


def test_burst_stream_has_its_own_seed():
    data = make_spec_dict()
    data["arms"].append({"name": "burst2", "triggers": [{**data["arms"][1]["triggers"][0], "seed_offset": 9}]})
    spec = parse_spec(data)
    one = [p.arrival_s for p in plan_sessions(spec, spec.arm("burst"), 3) if p.is_trigger]
    two = [p.arrival_s for p in plan_sessions(spec, spec.arm("burst2"), 3) if p.is_trigger]
    assert one != two


def test_rate_change_keeps_earlier_arrivals():
    slow = piecewise_poisson_arrivals([(0.0, 0.05), (1000.0, 0.001)], 3000.0, rng_for(Stream.BASE_ARRIVALS, 5))
    fast = piecewise_poisson_arrivals([(0.0, 0.05), (1000.0, 0.2)], 3000.0, rng_for(Stream.BASE_ARRIVALS, 5))
    assert [t for t in slow if t < 1000] == [t for t in fast if t < 1000]
    assert sum(t >= 1000 for t in fast) > 10 * sum(t >= 1000 for t in slow)


def test_poisson_rate_is_right_on_average():
    times = piecewise_poisson_arrivals([(0.0, 0.5)], 20_000.0, rng_for(Stream.BASE_ARRIVALS, 1))
    assert abs(len(times) / 20_000.0 - 0.5) < 0.02
    gaps = np.diff(times)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: CV = 1


def test_synthetic_sessions_follow_spec_2_1():
    spec = make_spec()
    plan = plan_sessions(spec, spec.arm("base"), seed=1)[0]
    shape = plan.shape
    assert shape.num_turns == 6 and shape.initial_tokens == 4000 and shape.shared_prefix_tokens == 2000
    assert shape.prompt_tokens(1) == 4000 + 100 + 500
    assert shape.max_context_tokens() == 4000 + 6 * 100 + 5 * 500


def test_extra_sessions_are_evenly_spread_and_mix_shift_changes_shapes():
    data = make_spec_dict()
    data["arms"] = [{"name": "x", "triggers": [
        {"kind": "extra_sessions", "num_sessions": 4, "start_s": 100, "duration_s": 40},
        {"kind": "mix_shift", "at_s": 300, "sessions": {"kind": "synthetic", "num_turns": 3, "label": "long",
                                                         "task_tokens": 9000, "output_tokens": 50}},
    ]}]
    spec = parse_spec(data)
    plans = plan_sessions(spec, spec.arm("x"), seed=4)
    extra = [p.arrival_s for p in plans if p.is_trigger]
    assert extra == [105.0, 115.0, 125.0, 135.0]
    assert {p.shape.kind for p in plans if p.arrival_s >= 300} == {"long"}
    assert {p.shape.kind for p in plans if p.arrival_s < 300} == {"synthetic"}
