"""Scenarios: the admission-only cap and the session cap with parking, through the actuator."""

from controllers import AdmissionOnlyCap, SessionCap

from .harness import GatewayDriver


def test_admission_only_cap_holds_new_sessions_and_never_parks():
    driver = GatewayDriver(AdmissionOnlyCap(k=2), pool_tokens=10**6, control_start_s=10.0)
    early = [driver.arrive([100, 100]) for _ in range(4)]  # before control: the gate is 'none'
    assert driver.gateway.num_admitted == 4 and driver.gateway.limit() != driver.gateway.limit()  # NaN
    driver.clock.advance(10.0)
    assert driver.gateway.limit() == 2.0
    for s in early:
        driver.complete_turn(s, 1.0)
        driver.turn_boundary(s)  # 4 active, K = 2: still nobody is parked
    assert [s.state for s in early] == ["in_flight"] * 4
    late = driver.arrive([100])
    assert late.state == "waiting"
    for s in early[:2]:
        driver.complete_turn(s, 1.0)  # last turn: the session ends
    assert late.state == "waiting"  # 2 active: not < 2
    driver.complete_turn(early[2], 1.0)
    assert late.state == "in_flight"


def test_session_cap_parks_above_k_hi_and_readmits_parked_before_new():
    driver = GatewayDriver(SessionCap(k=2, k_hi=3), pool_tokens=10**6, control_start_s=10.0)
    sessions = [driver.arrive([100, 200]) for _ in range(5)]
    driver.clock.advance(10.0)
    for s in sessions:
        driver.complete_turn(s, 1.0)
    for s in sessions:
        driver.turn_boundary(s)  # 5 > 3: park, 4 > 3: park, then 3 is not > 3
    assert [s.state for s in sessions] == ["parked", "parked", "in_flight", "in_flight", "in_flight"]
    assert driver.gateway.demand_tokens == 3 * 200
    newcomer = driver.arrive([100])
    assert newcomer.state == "waiting"
    driver.complete_turn(sessions[2], 1.0)  # ends: 2 active, not < 2
    assert sessions[0].state == "parked"
    driver.complete_turn(sessions[3], 1.0)  # ends: 1 active: the parked head goes first
    assert (sessions[0].state, sessions[1].state, newcomer.state) == ("in_flight", "parked", "waiting")
    assert driver.gateway.active[sessions[0].sid] == 200  # re-admitted with its demand at parking
    driver.complete_turn(sessions[4], 1.0)
    assert (sessions[1].state, newcomer.state) == ("in_flight", "waiting")
    driver.complete_turn(sessions[0], 1.0)
    assert newcomer.state == "in_flight"
