"""Scenarios: the KV budgeter's admission and park thresholds and the liveness rule."""

from controllers import KvBudgeter

from .harness import GatewayDriver


def test_admits_up_to_exactly_the_budget():
    driver = GatewayDriver(KvBudgeter(), pool_tokens=1000)  # admit while D + d <= 750
    a = driver.arrive([500, 500])
    b = driver.arrive([250, 250])
    c = driver.arrive([1])
    assert (a.state, b.state, c.state) == ("in_flight", "in_flight", "waiting")
    assert driver.gateway.demand_tokens == 750 and driver.gateway.limit() == 750.0
    driver.complete_turn(b, 1.0)  # b thinks; its demand still counts: D + 1 > 750
    assert c.state == "waiting"
    driver.turn_boundary(b)
    driver.complete_turn(b, 1.0)  # b ends: 500 + 1 <= 750
    assert c.state == "in_flight"


def test_parks_only_above_the_park_threshold():
    driver = GatewayDriver(KvBudgeter(), pool_tokens=1000)  # park while D > 950
    a = driver.arrive([400, 550, 551])
    b = driver.arrive([300, 400, 400])
    driver.complete_turn(a, 1.0)
    driver.complete_turn(b, 1.0)
    driver.turn_boundary(a)  # D = 550 + 300: proceeds
    driver.turn_boundary(b)  # D = 550 + 400 = 950: not above, proceeds
    assert (a.state, b.state) == ("in_flight", "in_flight")
    driver.complete_turn(a, 1.0)
    driver.turn_boundary(a)  # D = 551 + 400 = 951 > 950: a parks
    assert a.state == "parked" and driver.gateway.demand_tokens == 400
    driver.complete_turn(b, 1.0)  # 400 + 551 > 750: a stays parked
    assert a.state == "parked"
    driver.turn_boundary(b)
    driver.complete_turn(b, 1.0)  # b ends: 0 + 551 <= 750
    assert a.state == "in_flight"


def test_a_session_larger_than_the_budget_runs_alone():
    driver = GatewayDriver(KvBudgeter(), pool_tokens=1000)
    small = driver.arrive([100, 100])
    big = driver.arrive([2000, 2100])
    assert big.state == "waiting"  # 100 + 2000 > 750
    driver.complete_turn(small, 1.0)
    driver.turn_boundary(small)
    driver.complete_turn(small, 1.0)  # small ends: big is admitted into the empty gate
    assert big.state == "in_flight" and driver.gateway.demand_tokens == 2000
    late = driver.arrive([10])
    assert late.state == "waiting"
    driver.complete_turn(big, 1.0)
    driver.turn_boundary(big)  # D = 2100 > 950: parked, but it is the only one, so it goes on
    assert big.state == "in_flight" and late.state == "waiting"
