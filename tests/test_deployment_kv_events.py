"""What a deployment's replicas publish of their caches (KV events) and dynamo_kv reading them
(loadgen/core/deployment.py, routers/dynamo_kv.py, docs/deployments.md)."""

from __future__ import annotations

import pytest

from loadgen.core.clock import VirtualClock
from loadgen.core.deployment import DeploymentClient
from loadgen.core.engines import SimEngineClient, TurnRequest
from loadgen.core.recording import RunRecorder
from loadgen.core.runner import RunKey, simulate
from loadgen.core.spec import SpecError, parse_spec
from loadgen.gateway.upstream_choice import make_upstream_router
from loadgen.sim import EngineConfig, StepCostModel
from loadgen.sim.sglang_engine import SGLangConfig
from routers import make_router
from tests.conftest import make_spec_dict
from tests.test_deployment import deployment_spec

COST = StepCostModel(0.01, 1e-5, 0.0, 0.0, name="test")


def _run(clock, client, request):
    out = {}

    async def go():
        out["result"] = await client.generate(request)

    clock.spawn(go())
    clock.run()
    return out["result"]


def _turn(session, k, prompt, shared=0, output=100):
    return TurnRequest(session, k, prompt, output, shared, "system")


@pytest.mark.parametrize("config", [EngineConfig(num_blocks=200, block_size=16),
                                    SGLangConfig(pool_tokens=3200, page_size=1)], ids=["vllm", "sglang"])
def test_a_replica_reports_the_prompt_blocks_it_holds_and_forgets_what_it_evicted(config):
    clock = VirtualClock()
    engine = SimEngineClient(clock, config, COST)
    assert engine.cached_tokens(7, "system", 0, 1600) == 0  # a session it never saw
    first = _run(clock, engine, _turn(7, 0, 1600))
    bs = engine.engine.block_size
    # what it computed (prompt + output - 1) stays cached: its next prompt's hit is what it reports
    held = engine.cached_tokens(7, "system", 0, 1800)
    assert held == (1600 + 100 - 1) // bs * bs
    again = _run(clock, engine, _turn(7, 1, 1800))
    assert again.cached_tokens == held
    # reading does not touch the cache: the same answer twice, and the LRU order is unchanged
    assert engine.cached_tokens(7, "system", 0, 2000) == engine.cached_tokens(7, "system", 0, 2000)
    # another session fills the pool: session 7's blocks are evicted, and the report says so
    _run(clock, engine, _turn(8, 0, 3000))
    assert engine.cached_tokens(7, "system", 0, 2000) < held // 2
    assert first.cached_tokens == 0


def test_a_shared_prefix_is_reported_for_a_session_the_replica_never_saw():
    clock = VirtualClock()
    engine = SimEngineClient(clock, EngineConfig(num_blocks=400, block_size=16), COST)
    _run(clock, engine, _turn(1, 0, 3000, shared=2000))
    assert engine.cached_tokens(2, "system", 2000, 3000) == 2000
    assert engine.cached_tokens(2, "other", 2000, 3000) == 0


def _deployment(use_kv_events):
    clock = VirtualClock()
    replicas = [SimEngineClient(clock, EngineConfig(num_blocks=200, block_size=16), COST) for _ in range(2)]
    router = make_router("dynamo_kv", use_kv_events=use_kv_events)
    return clock, replicas, router, DeploymentClient(replicas, router, seed=3, block_size=16)


@pytest.mark.parametrize("use_kv_events", [True, False])
def test_dynamo_kv_sees_an_eviction_only_through_kv_events(use_kv_events):
    clock, replicas, router, deployment = _deployment(use_kv_events)
    first = _run(clock, deployment, _turn(7, 0, 1600))
    home = first.replica
    # traffic that reaches the replica without this router (another router's, a direct client)
    # takes every block of the pool there: session 7's blocks are evicted
    _run(clock, replicas[home], _turn(8, 0, 3000, output=184))
    nxt = _turn(7, 1, 1800)
    route = deployment.route_request(nxt)
    views = deployment.views(route, 7)
    costs = router.costs(route, views, clock.now())
    if use_kv_events:
        assert [v.cached_tokens for v in views] == [0, 0]
        assert costs[home] == costs[1 - home] == 112.5 + 112  # no longer preferred
    else:
        assert [v.cached_tokens for v in views] == [-1, -1]
        # it still believes the 106 blocks it sent there are cached: prefill (1800 - 1600) / 16
        assert costs[home] == 12.5 + 112 < costs[1 - home] == 112.5 + 112
        assert _run(clock, deployment, nxt).replica == home


def test_dynamo_kv_learns_the_first_token_from_the_replica():
    clock, replicas, router, deployment = _deployment(True)

    async def go():
        await deployment.generate(_turn(7, 0, 1600, output=400))

    clock.spawn(go())
    clock.run(until_s=1e-9)  # routed: 1600 prefill tokens in flight on its replica
    index = next(i for i, a in enumerate(router.active) if a.sessions)
    assert router.active[index].prefill_tokens == 1600
    for _ in range(1000):  # the prefill takes a few steps; 400 output tokens take longer
        clock.run(until_s=clock.now() + 0.01)
        if not router.active[index].prefill_tokens:
            break
    assert router.active[index].prefill_tokens == 0
    assert router.active[index].num_blocks == 100  # its blocks stay active until it finishes
    clock.run()
    assert router.active[index].num_blocks == 0 and not router.active[index].sessions


def test_deployment_runs_with_kv_events_are_reproducible_and_differ_from_approximate():
    tables = {}
    for events in (True, True, False):
        spec = deployment_spec({"policy": "dynamo_kv", "use_kv_events": events}, replicas=3, pool_tokens=24_000)
        recorder = RunRecorder(None, "dep", "burst", 1, 1e9, replica_columns=True)
        simulate(spec, RunKey("burst", 1), recorder)
        recorder.close()
        tables.setdefault(events, []).append(recorder.tables()["turns"])
    assert tables[True][0].equals(tables[True][1])
    assert tables[True][0].column("replica").to_pylist() != tables[False][0].column("replica").to_pylist()


def test_where_no_kv_events_reach_the_router_dynamo_kv_needs_its_approximate_mode():
    with pytest.raises(ValueError, match="gateway does not receive; set use_kv_events=false"):
        make_upstream_router("dynamo_kv", {})
    assert not make_upstream_router("dynamo_kv", {"use_kv_events": False}).reads_kv_events
    launched = {"kind": "serve_sim", "replicas": 2, "router": {"policy": "dynamo_kv"}}
    with pytest.raises(SpecError, match="set router.use_kv_events: false"):
        parse_spec(make_spec_dict(engine=launched))
    launched["router"]["use_kv_events"] = False
    assert parse_spec(make_spec_dict(engine=launched)).engine.router.knobs == {"use_kv_events": False}
