"""The latency AIMD: K's updates per interval, against a replay of the rule, and parking at K."""

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from controllers import GatewayView, LatencyAimd

from .harness import GatewayDriver


def _view(now_s: float, num_active: int = 0) -> GatewayView:
    return GatewayView(now_s, num_active, 0, 400_000, 0, 0)


def test_halves_on_slow_turns_adds_on_fast_ones_and_holds_without_signal():
    policy = LatencyAimd(initial_k=8)
    policy.on_control_start(_view(100.0))
    for t, latency in [(101.0, 20.0), (105.0, 30.0), (109.0, 1.0)]:  # median 20 > 15
        policy.on_turn_completed(_view(t), latency)
    assert policy.current_k(109.9) == 8
    assert policy.current_k(110.0) == 4
    policy.on_turn_completed(_view(112.0), 3.0)
    assert policy.current_k(120.0) == 5
    assert policy.current_k(155.0) == 5  # no completions since: no signal, K stays
    policy.on_turn_completed(_view(156.0), 16.0)
    assert policy.current_k(160.0) == 2  # floor(5 / 2)
    for t in (161.0, 171.0, 181.0):
        policy.on_turn_completed(_view(t), 60.0)
    assert policy.current_k(190.0) == 1  # never below min_k


def test_increase_stops_at_max_k():
    policy = LatencyAimd(initial_k=3, max_k=4)
    policy.on_control_start(_view(0.0))
    for t in (1.0, 11.0, 21.0):
        policy.on_turn_completed(_view(t), 1.0)
    assert policy.current_k(30.0) == 4


def _replayed_k(policy: LatencyAimd, start_s: float, completions: list[tuple[float, float]], now_s: float) -> int:
    """The rule written out: bucket completions by interval, apply each closed interval in turn."""
    k = policy.initial_k
    num_closed = math.floor((now_s - start_s) / policy.update_interval_s)
    for i in range(num_closed):
        lo = start_s + i * policy.update_interval_s
        window = [lat for t, lat in completions if lo <= t < lo + policy.update_interval_s]
        if window:
            if statistics.median(window) > policy.latency_threshold_s:
                k = max(policy.min_k, math.floor(k * policy.decrease_factor))
            else:
                k += policy.increase_step
    return k


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 300), st.booleans()), max_size=60),
       initial_k=st.integers(1, 40), interval_s=st.sampled_from([1.0, 10.0, 25.0]))
def test_k_at_any_time_equals_the_replayed_rule(events, initial_k, interval_s):
    policy = LatencyAimd(initial_k=initial_k, update_interval_s=interval_s)
    start_s = 7.0
    policy.on_control_start(_view(start_s))
    t, completions = start_s, []
    for gap_cs, latency_ds, look in events:
        t += gap_cs / 100.0
        if look:  # asking must not change the answer, nor skipping the question
            assert policy.current_k(t) == _replayed_k(policy, start_s, completions, t)
        policy.on_turn_completed(_view(t), latency_ds / 10.0)
        completions.append((t, latency_ds / 10.0))
    assert policy.current_k(t + 100.0) == _replayed_k(policy, start_s, completions, t + 100.0)


def test_parks_above_k_and_admits_below_it():
    driver = GatewayDriver(LatencyAimd(initial_k=2), pool_tokens=10**6, control_start_s=5.0)
    sessions = [driver.arrive([100, 100, 100]) for _ in range(3)]
    driver.clock.advance(5.0)
    for s in sessions:
        driver.complete_turn(s, 1.0)
    driver.turn_boundary(sessions[0])
    assert sessions[0].state == "parked"  # 3 > K = 2
    driver.turn_boundary(sessions[1])
    assert sessions[1].state == "in_flight"  # 2 is not > 2
    driver.clock.advance(10.0)  # the interval's median latency was 1 s: K = 3
    assert driver.gateway.limit() == 3.0
    driver.complete_turn(sessions[1], 1.0)
    assert sessions[0].state == "in_flight"  # 2 active < 3: re-admitted at the completion
