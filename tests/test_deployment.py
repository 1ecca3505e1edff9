"""Deployments: N simulated engines behind a router (loadgen/core/deployment.py, docs/deployments.md)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from controllers import make_policy
from loadgen.analysis.replicas import replica_lines
from loadgen.analysis.summary import write_summary
from loadgen.core.clock import VirtualClock
from loadgen.core.deployment import MissLedger
from loadgen.core.engines import SimEngineClient, TurnRequest, TurnResult
from loadgen.core.gateway import Gateway
from loadgen.core.recording import RunRecorder
from loadgen.core.runner import RunKey, engine_config, run_simulated, simulate, _start_session
from loadgen.core.session import RunEnv
from loadgen.core.spec import SpecError, load_spec, parse_spec
from loadgen.core.workload import plan_sessions
from routers import ROUTERS
from tests.conftest import make_spec_dict


def deployment_spec(router, replicas=3, pool_tokens=48_000, seeds=(1,), flavor="vllm", **overrides):
    engine = {"kind": "sim", "flavor": flavor, "pool_tokens": pool_tokens, "replicas": replicas, "router": router}
    return parse_spec(make_spec_dict(engine=engine, seeds=list(seeds), **overrides))


def _digest(path, drop=()) -> str:
    table = pq.read_table(path)
    return hashlib.sha256(repr(table.drop_columns(list(drop)).to_pylist()).encode()).hexdigest()


# turn columns added after the digests below were taken (a row per attempt, issue 25); a run
# without retries writes attempt 1, submitted_s = admit_s, planned_output_tokens = output_tokens
LATER_TURN_COLUMNS = ("attempt", "submitted_s", "planned_output_tokens")


def test_one_replica_writes_what_one_engine_wrote_before_deployments(tmp_path):
    # digests of this run's tables written by the code before deployments existed (main at
    # 19d4dc8): a spec without replicas runs the same engine, bit for bit, with the same schema
    spec = parse_spec(make_spec_dict(engine={"kind": "sim", "pool_tokens": 48_000}, seeds=[1],
                                     controller={"name": "budgeter"}))
    run_simulated(spec, RunKey("burst", 1), tmp_path)
    run_dir = tmp_path / "runs" / "burst-s1"
    turns = pq.read_table(run_dir / "turns.parquet")
    assert turns.column("attempt").to_pylist() == [1] * turns.num_rows
    assert turns.column("submitted_s").to_pylist() == turns.column("admit_s").to_pylist()
    assert _digest(run_dir / "turns.parquet", LATER_TURN_COLUMNS) == "858cdd940a3bd09b2c64b4b836f4a1a2d37afc270294d5c70f6a749b078b764d"
    assert _digest(run_dir / "samples.parquet") == "6dd2f849e8d4afb4f3779271e1e9119a656663ba078278f60fbab5776cffbc46"
    assert not (run_dir / "replica_samples.parquet").exists()
    info = json.loads((run_dir / "run.json").read_text())
    assert "replicas" not in info and "replicas" not in info["spec"]["engine"] and "scope" not in info["spec"]["controller"]


def _single_engine_turns(spec, arm_name, seed, session_ids):
    """The turns of one engine serving only ``session_ids`` of the run's sessions."""
    arm = spec.arm(arm_name)
    engine_spec = spec.engine_for(arm).model_copy(update={"replicas": 1, "router": None})
    clock = VirtualClock()
    engine = SimEngineClient(clock, engine_config(engine_spec), engine_spec.load_cost_model())
    recorder = RunRecorder(None, "single", arm_name, seed, 1e9)
    env = RunEnv(clock, engine, Gateway(clock, make_policy("none"), engine.pool_tokens), recorder)
    for plan in plan_sessions(spec, arm, seed):
        if plan.session_id in session_ids:
            clock.call_at(plan.arrival_s, _start_session, clock, plan, env)
    # the run samples every replica's gauges as it samples one engine's (the simulated engine
    # is advanced lazily, to each moment something looks at it: the same moments, the same floats)
    interval = spec.recording.sample_interval_s
    for i in range(int(spec.duration_s // interval) + 1):
        clock.call_at(i * interval, engine.metrics)
    clock.run(until_s=spec.duration_s)
    recorder.close()
    return recorder.tables()["turns"]


TURN_OUTCOME = ("session_id", "turn_index", "ready_s", "first_token_s", "finish_s", "prompt_tokens",
                "cached_tokens", "output_tokens", "num_preemptions", "itl_mean_s", "itl_max_s")


def _rows(table):
    rows = sorted(zip(*(table.column(c).to_pylist() for c in TURN_OUTCOME)))
    return [tuple("nan" if isinstance(v, float) and v != v else v for v in row) for row in rows]


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])  # sglang: its overlap schedule, the default
def test_pinned_sessions_give_exactly_the_single_engine_runs_of_their_partition(flavor):
    spec = deployment_spec({"policy": "consistent_hash"}, replicas=3, pool_tokens=12_000, flavor=flavor,
                           workload={**make_spec_dict()["workload"], "arrival_rate_per_s": 0.1})
    recorder = RunRecorder(None, "dep", "burst", 1, 1e9, replica_columns=True)
    simulate(spec, RunKey("burst", 1), recorder)
    recorder.close()
    turns = recorder.tables()["turns"]
    replica = np.asarray(turns.column("replica").to_pylist())
    sessions = np.asarray(turns.column("session_id").to_pylist())
    assert sorted(set(replica)) == [0, 1, 2]
    for r in range(3):
        mine = set(sessions[replica == r].tolist())
        assert not mine & set(sessions[replica != r].tolist())  # pinned: a session never moves
        single = _single_engine_turns(spec, "burst", 1, mine)
        deployed = turns.filter(np.asarray(replica == r))
        assert _rows(deployed) == _rows(single)
    # the replicas were under pressure (evictions), so the equality is not one of idle engines
    assert sum(turns.column("miss_eviction_tokens").to_pylist()) > 0


def test_per_replica_records_sum_to_the_run_totals(tmp_path):
    spec = deployment_spec({"policy": "round_robin"}, replicas=3, seeds=(1, 2))
    for seed in (1, 2):
        for arm in ("base", "burst"):
            run_simulated(spec, RunKey(arm, seed), tmp_path)
    summary = write_summary(tmp_path)
    for entry in summary["runs"]:
        rep = entry["replicas"]
        turns = pq.read_table(tmp_path / "runs" / entry["run_id"] / "turns.parquet")
        ok = [e is None for e in turns.column("error").to_pylist()]
        prompt = sum(p for p, good in zip(turns.column("prompt_tokens").to_pylist(), ok) if good)
        cached = sum(c for c, good in zip(turns.column("cached_tokens").to_pylist(), ok) if good)
        total = rep["deployment"]
        for name in ("turns", "sessions", "prompt_tokens", "cached_tokens", "miss_workload_tokens",
                     "miss_routing_tokens", "miss_eviction_tokens"):
            assert total[name] == sum(r[name] for r in rep["per_replica"]), name
        assert total["turns"] == entry["turns_completed"] == sum(ok)
        assert total["sessions"] == len(set(turns.column("session_id").to_pylist()))
        assert (total["prompt_tokens"], total["cached_tokens"]) == (prompt, cached)
        assert total["hit_ratio"] == pytest.approx(entry["measured_hit_ratio"])
        assert total["miss_routing_tokens"] > 0  # round robin moves sessions every turn
        samples = pq.read_table(tmp_path / "runs" / entry["run_id"] / "replica_samples.parquet")
        merged = pq.read_table(tmp_path / "runs" / entry["run_id"] / "samples.parquet")
        by_time = {}
        for t, hits in zip(samples.column("t_s").to_pylist(), samples.column("prefix_cache_hits_total").to_pylist()):
            by_time[t] = by_time.get(t, 0) + hits
        assert [by_time[t] for t in merged.column("t_s").to_pylist()] == merged.column("prefix_cache_hits_total").to_pylist()
        assert 1.0 <= rep["load_imbalance_mean"] <= 3.0
    lines = replica_lines(summary, ["base", "burst"])
    assert len(lines) == 3 and lines[1].startswith("  base: round_robin; ")


def _turn(session, k, prompt, shared=0):
    return TurnRequest(session, k, prompt, 100, shared, "system")


def _done(prompt, cached, output=100, error=None):
    return TurnResult(0.0, 0.0, 1.0, prompt, cached, output, error=error)


def test_a_session_moved_to_another_replica_misses_by_routing():
    ledger = MissLedger(2, block_size=16)
    first = _turn(7, 0, 1000)
    ideal = ledger.submitted(0, first)
    assert ledger.completed(0, first, ideal, _done(1000, 0)) == (0, 0)  # all workload: nothing was cached
    moved = _turn(7, 1, 1200)  # 1000 + 100 output + 100 tool tokens, sent to the other replica
    ideal = ledger.submitted(1, moved)
    # replica 0 computed 1099 tokens of it: 1088 in whole blocks; replica 1 none
    assert ledger.completed(1, moved, ideal, _done(1200, 0)) == (1088, 0)


def test_an_evicted_prefix_misses_by_eviction_and_a_partial_hit_splits():
    ledger = MissLedger(2, block_size=16)
    first = _turn(7, 0, 1000)
    ledger.completed(0, first, ledger.submitted(0, first), _done(1000, 0))
    again = _turn(7, 1, 1200)
    # on the same replica, 512 tokens still cached: 1088 - 512 evicted, nothing by routing
    assert ledger.completed(0, again, ledger.submitted(0, again), _done(1200, 512)) == (0, 576)
    # a new session over a shared prefix another replica was sent: routing; then on that replica: eviction
    a = _turn(8, 0, 3000, shared=2000)
    ledger.completed(1, a, ledger.submitted(1, a), _done(3000, 0))
    b = _turn(9, 0, 3000, shared=2000)
    assert ledger.completed(0, b, ledger.submitted(0, b), _done(3000, 0)) == (2000, 0)
    c = _turn(10, 0, 3000, shared=2000)
    assert ledger.completed(1, c, ledger.submitted(1, c), _done(3000, 0)) == (0, 2000)
    assert ledger.completed(1, c, ledger.submitted(1, c), _done(3000, 0, error="x")) == (None, None)


def test_deployment_runs_are_reproducible_and_routers_differ(tmp_path):
    spec = deployment_spec({"policy": "cache_aware"}, replicas=3, arms=[
        {"name": "ca"}, {"name": "p2", "engine": {"router": {"policy": "power_of_two"}}}])
    for arm in ("ca", "p2"):
        run_simulated(spec, RunKey(arm, 1), tmp_path / "a")
        run_simulated(spec, RunKey(arm, 1), tmp_path / "b")
        a, b = (pq.read_table(tmp_path / d / "runs" / f"{arm}-s1" / "turns.parquet") for d in ("a", "b"))
        assert a.equals(b)
    ca, p2 = (pq.read_table(tmp_path / "a" / "runs" / f"{arm}-s1" / "turns.parquet") for arm in ("ca", "p2"))
    assert ca.column("replica").to_pylist() != p2.column("replica").to_pylist()


def _max_in_flight(turns, replica):
    events = []
    for r, start, end in zip(turns.column("replica").to_pylist(), turns.column("admit_s").to_pylist(),
                             turns.column("finish_s").to_pylist()):
        if r == replica:
            events += [(start, 1), (end, -1)]
    level = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        level += step
        peak = max(peak, level)
    return peak


def test_controller_scope_replica_gates_each_replica_on_its_own_pool(tmp_path):
    workload = {**make_spec_dict()["workload"], "arrival_rate_per_s": 0.2}
    spec = deployment_spec({"policy": "round_robin"}, replicas=2, pool_tokens=40_000, workload=workload,
                           controller={"name": "session-cap", "params": {"k": 2, "k_hi": 2}, "scope": "replica"})
    run_simulated(spec, RunKey("burst", 1), tmp_path)
    samples = pq.read_table(tmp_path / "runs" / "burst-s1" / "samples.parquet")
    turns = pq.read_table(tmp_path / "runs" / "burst-s1" / "turns.parquet")
    # each replica's gate admits 2 of its own sessions: the deployment's limit is their sum
    assert set(samples.column("gateway_limit").to_pylist()) == {4.0}
    assert max(samples.column("sessions_admitted").to_pylist()) == 4
    assert [_max_in_flight(turns, r) for r in (0, 1)] == [2, 2]
    assert max(samples.column("sessions_gateway_waiting").to_pylist()) > 0


@pytest.mark.parametrize("engine,controller,expected", [
    ({"replicas": 4, "router": {"policy": "fastest"}}, None,
     "engine.router.policy: unknown router 'fastest'; valid routers: ['round_robin', 'random', 'least_outstanding', "
     "'power_of_two', 'consistent_hash', 'bounded_hash', 'cache_aware', 'llm_d', 'dynamo_kv']"),
    ({"replicas": 0}, None, "engine.replicas: Input should be greater than or equal to 1"),
    ({"replicas": 4, "router": {"policy": "consistent_hash", "cache_threshold": 0.5}}, None,
     "engine.router: router 'consistent_hash': unknown knob(s) ['cache_threshold']; valid knobs: ['virtual_nodes']"),
    ({"replicas": 4}, None, "engine.router: 4 replicas need a router, e.g. router: {policy: round_robin}"),
    ({}, {"name": "budgeter", "scope": "replica"},
     "controller.scope: replica needs a deployment (engine.replicas > 1)"),
])
def test_bad_deployment_specs_are_refused_naming_the_field(tmp_path, engine, controller, expected):
    data = make_spec_dict(engine={"kind": "sim", "pool_tokens": 160_000, **engine})
    if controller is not None:
        data["controller"] = controller
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(path), "--out", str(tmp_path / "res")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert not (tmp_path / "res").exists()


def test_the_deployment_examples_cover_every_router_and_run(tmp_path):
    examples = Path(__file__).resolve().parents[1] / "examples"
    paired = load_spec(examples / "deployment-paired.yaml")
    assert paired.engine.replicas == 4 and paired.workload.arrival_rate_per_s == pytest.approx(4 * 0.035)
    arms = {(paired.engine_for(a).router.policy, bool(a.triggers)) for a in paired.arms}
    assert arms == {(r, burst) for r in ROUTERS for burst in (False, True)} and len(paired.arms) == 20
    routers = load_spec(examples / "deployment-routers.yaml")
    assert {routers.engine_for(a).router.policy for a in routers.arms} == set(ROUTERS)
    assert {(routers.controller_for(a).name, routers.controller_for(a).scope) for a in routers.arms} == {
        ("none", "deployment"), ("budgeter", "deployment"), ("budgeter", "replica")}
    short = routers.model_copy(update={"duration_s": 1500.0})
    for arm in ("cache-aware-budgeter-per-replica", "llm-d"):
        info = run_simulated(short, RunKey(arm, 501), tmp_path)
        assert info["status"] == "completed" and info["replicas"] == 4


def test_a_sweep_refuses_a_serve_sim_deployment_rather_than_launching_one_engine():
    data = make_spec_dict(engine={"kind": "serve_sim", "num_gpus": 0,
                                  "simulator": {"replicas": 2, "router": {"policy": "random"}}})
    with pytest.raises(SpecError, match="engine.simulator.replicas: a launched serve-sim serves one simulated "
                                        "engine; for N of them per run give engine.replicas"):
        parse_spec(data)


def test_a_replica_the_router_leaves_idle_for_a_while_is_not_degraded(tmp_path):
    # light load on two consistent-hash replicas: replica 0 serves no turn in some 5-minute
    # windows (an idle window is neither healthy nor degraded); every window it served hit ~0.95
    spec = deployment_spec({"policy": "consistent_hash"}, replicas=2, pool_tokens=400_000, seeds=(4,),
                           duration_s=3600, workload={"arrival_rate_per_s": 0.01}, arms=[{"name": "base"}])
    run_simulated(spec, RunKey("base", 4), tmp_path)
    (entry,) = write_summary(tmp_path)["runs"]
    per_replica = entry["replicas"]["per_replica"]
    assert all(r["hit_ratio"] > 0.9 for r in per_replica)
    assert [r["persistently_degraded"] for r in per_replica] == [False, False]


def test_a_routers_burst_arm_is_paired_with_its_own_no_burst_twin_and_the_report_says_which_is_safe(tmp_path):
    from loadgen.analysis.tables import format_outcome_table

    burst = [{"kind": "burst", "extra_rate_factor": 1.5, "start_min": 5, "duration_min": 5}]
    arms = [{"name": f"{name}-{side}", "engine": {"router": {"policy": policy}},
             **({"triggers": burst} if side == "burst" else {})}
            for name, policy in (("rr", "round_robin"), ("ch", "consistent_hash")) for side in ("no-burst", "burst")]
    spec = deployment_spec({"policy": "round_robin"}, replicas=2, pool_tokens=400_000, seeds=(1,), duration_s=1200,
                           arms=arms)
    for arm in arms:
        run_simulated(spec, RunKey(arm["name"], 1), tmp_path)
    summary = write_summary(tmp_path)
    pairs = summary["pairs"]
    assert pairs["baseline_arm"] == "rr-no-burst"
    assert [(c["arm"], c["baseline_arm"], c["n_pairs"]) for c in pairs["comparisons"]] == [
        ("rr-burst", "rr-no-burst", 1), ("ch-burst", "ch-no-burst", 1)]
    text = format_outcome_table(summary)
    assert "ch-burst vs ch-no-burst: 1 pairs" in text and "ch-burst vs rr-no-burst" not in text
    verdicts = text.split("routers at this load")[1].splitlines()[1:3]
    assert verdicts[0].startswith("  round_robin: rr-burst ") and verdicts[1].startswith("  consistent_hash: ch-burst ")
    assert all(("not safe (" in v or "safe in 1 runs" in v) for v in verdicts)
    # the first arm left out: the other router's pair stands, no line of 0 pairs
    (tmp_path / "runs" / "rr-no-burst-s1" / "run.json").unlink()
    import shutil
    shutil.rmtree(tmp_path / "runs" / "rr-no-burst-s1")
    assert [c["arm"] for c in write_summary(tmp_path)["pairs"]["comparisons"]] == ["ch-burst"]


def test_the_paired_table_shows_replicas_degraded_in_a_deployment_that_is_not():
    from loadgen.analysis.tables import format_outcome_table

    def run(arm, degraded, replicas):
        per = [{"persistently_degraded": d} for d in replicas]
        return {"arm": arm, "seed": 501, "run_id": f"{arm}-s501", "hit_ratio_last10min": 0.6,
                "sessions_in_system_last5min": 10.0, "persistently_degraded": degraded, "ends_degraded": False,
                "degraded_windows_after_trigger": 0.3, "degraded_only_in_final_window": False,
                "replicas": {"router": "consistent_hash", "num_replicas": 4, "per_replica": per,
                             "deployment": {"prompt_tokens": 100, "cached_tokens": 60, "miss_routing_tokens": 0,
                                            "miss_eviction_tokens": 40},
                             "load_imbalance_mean": 1.5, "hottest_replica_share": 0.5}}

    runs = [run("ch-no-burst", False, [False] * 4), run("ch-burst", False, [True, True, False, False])]
    summary = {"experiment": "x", "runs": runs, "pairs": {"baseline_arm": "ch-no-burst", "comparisons": [
        {"arm": "ch-burst", "baseline_arm": "ch-no-burst", "n_pairs": 1, "degraded_baseline": 0, "degraded_arm": 0,
         "discordant_arm_only": 0, "discordant_baseline_only": 0, "sign_test_p": 1.0,
         "per_seed": [{"seed": 501, "baseline": runs[0], "arm": runs[1]}]}]}}
    text = format_outcome_table(summary)
    row = next(line for line in text.splitlines() if line.lstrip().startswith("501"))
    assert row.split("|")[2].split()[2] == "2/4rep" and row.split("|")[1].split()[2] == "no"
    assert "replicas persistently degraded 2/4 (ch-burst) vs 0/4 (ch-no-burst)" in text
    assert "ch-burst not safe (0/1 runs, 2/4 replica-runs persistently degraded)" in text
