"""Every limit's invariants over random event sequences driven through the actuator.

Sessions arrive, send turns, complete them and come back to turn boundaries in a random order
with random demands, pools and constants (pools small enough that single sessions can exceed
the budget). At every admission and every turn boundary the harness checks the limit's own
condition; throughout, FIFO order, parked-before-new and "nobody waits while nobody is
admitted"; at the end, with no more arrivals, that every session finishes.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controllers import POLICIES, AdaptiveCap, LatencyAimd, make_policy
from loadgen.core.gateway import Gateway

from .harness import GatewayDriver, ScriptedSession, growing_demands

fraction_pairs = st.tuples(st.floats(0.3, 1.0), st.floats(0.0, 0.5)).map(
    lambda pair: {"admit_fraction": round(pair[0], 3), "park_fraction": round(pair[0] + pair[1], 3)})

PARAMS: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "none": st.just({}),
    "admission-only": st.builds(lambda k: {"k": k}, st.integers(1, 6)),
    "session-cap": st.integers(1, 6).flatmap(
        lambda k: st.integers(k, k + 2).map(lambda k_hi: {"k": k, "k_hi": k_hi})),
    "adaptive-cap": st.tuples(fraction_pairs, st.floats(0.01, 1.0)).map(
        lambda t: {**t[0], "alpha": round(t[1], 3)}),
    "aimd": st.builds(lambda k, dt, lat: {"initial_k": k, "update_interval_s": dt, "latency_threshold_s": lat},
                      st.integers(1, 8), st.sampled_from([1.0, 5.0, 10.0]), st.sampled_from([2.0, 15.0])),
    "budgeter": fraction_pairs,
}

# an event: (kind, which session, a value: demand seed, latency or time step)
events = st.lists(st.tuples(st.sampled_from(["arrive", "arrive", "complete", "complete", "boundary", "boundary",
                                             "advance"]),
                            st.integers(0, 10_000), st.integers(0, 10_000)), min_size=5, max_size=100)


def _admission_check(name: str, params: dict) -> Callable[[Gateway, ScriptedSession, bool], None]:
    def check(gw: Gateway, session: ScriptedSession, from_new: bool) -> None:
        if not gw.control_on:
            return
        num, demand, pool = gw.num_admitted, gw.demand_tokens, gw.pool_tokens
        if num == 1:
            return  # the liveness rule: an empty gate admits its head whatever the limit
        policy = gw.policy
        if name == "admission-only" and from_new:
            assert num <= params["k"]
        elif name == "session-cap":
            assert num <= params["k"]
        elif name == "adaptive-cap":
            assert isinstance(policy, AdaptiveCap) and policy.demand_estimate_tokens is not None
            assert num <= math.floor(params["admit_fraction"] * pool / policy.demand_estimate_tokens)
        elif name == "aimd":
            assert isinstance(policy, LatencyAimd)
            assert num <= policy.current_k(gw.clock.now())
        elif name == "budgeter":
            assert demand <= params["admit_fraction"] * pool, "the budgeter took D above its budget"
    return check


def _park_check(name: str, params: dict) -> Callable[[Gateway, int, int, bool], None]:
    def check(gw: Gateway, num_before: int, demand_before: int, parked: bool) -> None:
        if not gw.control_on:
            assert not parked
            return
        policy = gw.policy
        if name in ("none", "admission-only"):
            should_park = False
        elif name == "session-cap":
            should_park = num_before > params["k_hi"]
        elif name == "adaptive-cap":
            assert isinstance(policy, AdaptiveCap) and policy.demand_estimate_tokens is not None
            should_park = num_before > math.floor(params["park_fraction"] * gw.pool_tokens
                                                  / policy.demand_estimate_tokens)
        elif name == "aimd":
            assert isinstance(policy, LatencyAimd)
            should_park = num_before > policy.current_k(gw.clock.now())
        else:
            should_park = demand_before > params["park_fraction"] * gw.pool_tokens
        assert parked == should_park
    return check


def _play(driver: GatewayDriver, script: list[tuple[str, int, int]]) -> None:
    for kind, which, value in script:
        if kind == "arrive":
            driver.arrive(growing_demands(200 + value * 2, (value * 7) % 4000, 1 + which % 6))
        elif kind == "advance":
            driver.clock.advance(value / 2000.0)  # up to 5 s
        else:
            ready = driver.in_state("in_flight" if kind == "complete" else "thinking")
            if ready:
                session = ready[which % len(ready)]
                if kind == "complete":
                    driver.complete_turn(session, latency_s=value / 400.0)  # up to 25 s
                else:
                    driver.turn_boundary(session)


# thunderagent decides over its whole program table behind its own gate (tests/controllers/test_thunderagent.py)
@pytest.mark.parametrize("name", [n for n in POLICIES if not getattr(POLICIES[n], "needs_program_table", False)])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), pool_tokens=st.integers(2_000, 60_000), control_start_s=st.sampled_from([0.0, 10.0, 40.0]),
       num_early=st.integers(0, 12), script=events, drain_latency_s=st.sampled_from([0.5, 40.0]))
def test_limit_invariants_hold_and_everyone_finishes(name: str, data: st.DataObject, pool_tokens: int,
                                                     control_start_s: float, num_early: int, script: list,
                                                     drain_latency_s: float) -> None:
    params = data.draw(PARAMS[name], label="params")
    driver = GatewayDriver(make_policy(name, **params), pool_tokens, control_start_s,
                           check_admission=_admission_check(name, params), check_park=_park_check(name, params))
    # a crowd at time 0, before control when it starts later: switching on into overload
    _play(driver, [("arrive", i, i * 997) for i in range(num_early)] + script)
    driver.drain(latency_s=lambda event: drain_latency_s)
    assert all(s.state == "done" for s in driver.sessions)
    assert driver.gateway.demand_tokens == 0 and not driver.gateway.active
    assert driver.num_admissions == len(driver.sessions) + driver.num_parks
