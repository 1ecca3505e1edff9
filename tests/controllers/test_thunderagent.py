"""thunderagent's schedule on hand-made program tables, at its shipped thresholds (0.95 / 0.80 /
0.10, 100 tokens a program, 1800 s forced resume), and its gate in a run."""

from __future__ import annotations


import pyarrow.parquet as pq
import pytest

from controllers import Program, make_policy
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import SpecError, parse_spec
from tests.conftest import make_spec_dict

CAP = 10_000  # one worker's KV capacity in tokens


def ta(**params):
    return make_policy("thunderagent", **params)


def test_an_overfull_worker_pauses_its_acting_programs_smallest_first_down_to_the_target():
    policy = ta()
    # usage: 3000 + 2000 + 1500 + 3200 (+100 each) = 10100 > 9500
    acting = [Program("a", 3000, 0, acting=True), Program("b", 2000, 0, acting=True),
              Program("c", 1500, 0, acting=True)]
    reasoning = Program("r", 3200, 0)
    d = policy.schedule(acting + [reasoning], [CAP], 0.0)
    # pause c (-> 8500), then b (-> 6400 <= 8000): smallest first, stop at the target
    assert [p.program_id for p in d.pause] == ["c", "b"] and d.mark == () and d.resume == ()


def test_without_enough_acting_programs_it_marks_reasoning_ones_smallest_first():
    policy = ta()
    table = [Program("a", 900, 0, acting=True), Program("r1", 5000, 0), Program("r2", 4000, 0)]
    d = policy.schedule(table, [CAP], 0.0)  # 10200 > 9500: pause a (-> 9200), mark r2 (-> 5100 <= 8000)
    assert [p.program_id for p in d.pause] == ["a"] and [p.program_id for p in d.mark] == ["r2"]


def test_a_paused_program_resumes_only_below_threshold_minus_hysteresis_waiting_requests_first():
    policy = ta()
    live = [Program("x", 7800, 0, acting=True)]  # 7900 used: room under 0.85 x 10000 = 600
    idle = Program("idle", 300, 0, acting=True, paused=True, paused_at_s=0.0, steps=3)
    waiting = Program("wait", 350, 0, paused=True, paused_at_s=0.0, pending=True, steps=3)
    d = policy.schedule(live + [idle, waiting], [CAP], 10.0)
    assert [p.program_id for p, _ in d.resume] == ["wait"]  # 450 fits the 600; then 400 more does not
    live[0].tokens = 8400  # 8500 used: no room below 8500
    assert policy.schedule(live + [idle, waiting], [CAP], 10.0).resume == ()
    # forced after resume_timeout_seconds whatever the usage
    forced = policy.schedule(live + [idle, waiting], [CAP], 1800.0).resume
    assert {p.program_id for p, _ in forced} == {"idle", "wait"}


def test_resumed_new_programs_are_placed_largest_first_on_the_roomiest_worker():
    policy = ta()
    live = [Program("x", 4400, 0, acting=True), Program("y", 6400, 1, acting=True)]
    # room: worker 0: 8500 - 4500 = 4000; worker 1: 8500 - 6500 = 2000
    new = [Program(n, t, None, paused=True, paused_at_s=0.0, pending=True) for n, t in
           (("n1", 1000), ("n2", 2900), ("n3", 1700))]
    placed = {p.program_id: w for p, w in policy.schedule(live + new, [CAP, CAP], 1.0).resume}
    # selection (smallest first, total room 6000): 1100 + 1800 + 3000 = 5900 fit; placement largest first:
    # n2 (3000) -> worker 0 (room 4000 -> 1000); n3 (1800) -> worker 1 (2000 -> 200); n1 (1100) fits nowhere
    assert placed == {"n2": 0, "n3": 1}


def test_new_programs_are_admitted_against_the_pool_and_only_when_nobody_waits():
    policy = ta()
    table = [Program("x", 9000, 0, acting=True)]
    assert policy.admit_new(table, [CAP, CAP], 9000)  # 9100 + 9100 <= 19000
    assert not policy.admit_new(table, [CAP, CAP], 10000)
    assert not policy.admit_new(table + [Program("p", 10, 1, paused=True)], [CAP, CAP], 10)
    with pytest.raises(ValueError, match="pause_target and resume_hysteresis must be <= pause_threshold"):
        ta(pause_threshold=0.5)


def test_thunderagent_runs_a_simulated_deployment_and_refuses_what_it_cannot_run(tmp_path):
    workload = {**make_spec_dict()["workload"], "arrival_rate_per_s": 0.2}
    spec = parse_spec(make_spec_dict(engine={"kind": "sim", "pool_tokens": 24_000, "replicas": 2,
                                             "router": {"policy": "consistent_hash"}},
                                     workload=workload, seeds=[1], controller={"name": "thunderagent"}))
    run_simulated(spec, RunKey("burst", 1), tmp_path)
    samples = pq.read_table(tmp_path / "runs" / "burst-s1" / "samples.parquet")
    sessions = pq.read_table(tmp_path / "runs" / "burst-s1" / "sessions.parquet")
    assert max(samples.column("sessions_parked").to_pylist()) > 0  # it paused programs in their tools
    assert set(samples.column("gateway_limit").to_pylist()) == {0.95 * 48_000}
    assert "completed" in sessions.column("status").to_pylist()
    with pytest.raises(SpecError, match="thunderagent runs on the simulated engine"):
        parse_spec(make_spec_dict(engine={"kind": "openai", "url": "http://127.0.0.1:1"},
                                  controller={"name": "thunderagent"}))
