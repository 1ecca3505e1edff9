"""Scenarios: the adaptive cap's estimate d_hat and the caps it derives from the pool."""

import pytest

from controllers import AdaptiveCap

from .harness import GatewayDriver


def test_estimate_starts_from_the_mean_active_demand_at_switch_on():
    policy = AdaptiveCap()
    driver = GatewayDriver(policy, pool_tokens=400_000, control_start_s=60.0)
    driver.arrive([20_000])
    driver.arrive([40_000])
    assert policy.demand_estimate_tokens is None  # before control the policy sees nothing
    driver.clock.advance(60.0)
    assert policy.demand_estimate_tokens == 30_000
    assert driver.gateway.limit() == 10.0  # floor(0.75 * 400K / 30K)


def test_caps_follow_the_ewma_and_park_when_the_estimate_grows():
    policy = AdaptiveCap(alpha=0.5)
    driver = GatewayDriver(policy, pool_tokens=100_000)
    sessions = [driver.arrive([10_000, 20_000]) for _ in range(8)]
    # d_hat = 10K from the first arrival on: admit while active < floor(75K / 10K) = 7
    assert [s.state for s in sessions] == ["in_flight"] * 7 + ["waiting"]
    driver.complete_turn(sessions[0], 1.0)
    driver.turn_boundary(sessions[0])
    # d_hat = 10K + 0.5 (20K - 10K) = 15K; park while active > floor(95K / 15K) = 6: 7 > 6
    assert policy.demand_estimate_tokens == pytest.approx(15_000)
    assert sessions[0].state == "parked"
    assert driver.gateway.limit() == 5.0  # floor(75K / 15K)
