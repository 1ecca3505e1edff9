"""``loadgen map --routers``: the router of a deployment spec as a map dimension."""

from __future__ import annotations

import pytest

from loadgen.core.spec import parse_spec
from loadgen.map.bounds import spec_bounds
from loadgen.map.grid import GridError, MapGrid, MapPoint, map_job, point_spec, with_routers
from tests.conftest import make_spec, make_spec_dict


def deployment(**router):
    engine = {"kind": "sim", "pool_tokens": 160_000, "replicas": 4,
              "router": {"policy": "cache_aware", "cache_threshold": 0.5, **router}}
    return parse_spec(make_spec_dict(engine=engine))


def test_each_controller_meets_each_router_and_a_point_runs_that_router():
    spec = deployment()
    labels = with_routers(("none", "budgeter"), ("consistent_hash", "cache_aware"), spec)
    assert labels == ("none+consistent_hash", "none+cache_aware", "budgeter+consistent_hash", "budgeter+cache_aware")
    MapGrid((0.05,), (0.0,), (1,), labels)
    job = map_job(spec, None, [0.0])
    point = point_spec(job, MapPoint("budgeter+consistent_hash", 0.05, 0.0, 1, 600.0))
    assert point.controller.name == "budgeter" and point.engine.router.policy == "consistent_hash"
    assert point.engine.router.knobs == {} and point.engine.replicas == 4
    # the spec's own router keeps its knobs
    assert point_spec(job, MapPoint("none+cache_aware", 0.05, 0.0, 1, 600.0)).engine.router.knobs == {
        "cache_threshold": 0.5}


def test_routers_need_a_deployment_and_known_names():
    with pytest.raises(GridError, match="a router needs engine.replicas > 1"):
        with_routers(("none",), ("round_robin",), make_spec())
    with pytest.raises(GridError, match=r"--routers: unknown \['fastest'\]; valid routers"):
        MapGrid((0.05,), (0.0,), (1,), with_routers(("none",), ("fastest",), deployment()))


def test_a_deployments_bounds_are_its_replicas_together():
    one = spec_bounds(make_spec(), make_spec().engine.load_cost_model())
    four = spec_bounds(deployment(), deployment().engine.load_cost_model())
    assert four.replicas == 4 and four.pool_tokens == 4 * one.pool_tokens
    assert four.healthy_rate_per_s == pytest.approx(4 * one.healthy_rate_per_s)
    assert four.warm_response_s(4 * 0.01) == pytest.approx(one.warm_response_s(0.01))
    assert "replicas" not in one.to_json()
