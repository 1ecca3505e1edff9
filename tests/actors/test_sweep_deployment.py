"""A sweep of a deployment: engine.replicas serve-sim engine actors per run, each on its own fake
GPU of the local Ray cluster, behind the gateway proxy in the run's controller actor."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from actors.sweep import run_sweep
from loadgen.analysis.summary import write_summary
from loadgen.core.runner import RunKey
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

pytestmark = pytest.mark.ray


def test_two_replicas_per_run_each_on_its_gpu_behind_the_gateway_record_their_replica(ray_local, tmp_path):
    data = make_spec_dict(engine={"kind": "serve_sim", "replicas": 2, "router": {"policy": "consistent_hash"},
                                  "simulator": {"pool_tokens": 160_000}}, time_scale=60.0, seeds=[1])
    (info,) = run_sweep(parse_spec(data), tmp_path, [RunKey("base", 1)], num_fleets=2)
    assert info["status"] == "completed", info.get("error")
    assert info["replicas"] == 2
    # the gateway routes by the spec's policy
    assert info["router_spec"] == {"policy": "consistent_hash"} and info["router"] == "consistent_hash"
    assert info["router_note"] is None
    replicas = info["placement"]["replicas"]
    assert len({(r["node_id"], tuple(r["gpu_ids"])) for r in replicas}) == 2
    assert all(len(r["gpu_ids"]) == 1 and r["visible_devices"] == {"CUDA_VISIBLE_DEVICES": r["gpu_ids"][0]}
               for r in replicas)
    assert len({r["url"] for r in replicas}) == 2 and info["pool_tokens"] == 2 * 160_000

    run_dir = tmp_path / "runs" / "base-s1"
    turns = pq.read_table(run_dir / "turns.parquet").to_pydict()
    done = [i for i, e in enumerate(turns["error"]) if e is None]
    assert len(done) > 20
    assert {turns["replica"][i] for i in done} == {0, 1}
    by_session: dict[int, set] = {}
    for i in done:
        by_session.setdefault(turns["session_id"][i], set()).add(turns["replica"][i])
    assert all(len(seen) == 1 for seen in by_session.values())  # consistent_hash keeps a session on one replica

    rep = pq.read_table(run_dir / "replica_samples.parquet").to_pydict()
    assert set(rep["replica_index"]) == {0, 1} and all(rep["scraped"])
    assert {rep["replica_url"][i] for i in range(len(rep["t_s"]))} == {r["url"] for r in replicas}
    samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
    last_t = samples["t_s"][-1]
    last = {rep["replica_index"][i]: rep["prefix_cache_queries_total"][i]
            for i in range(len(rep["t_s"])) if rep["t_s"][i] == last_t}
    # each replica served prompts, and the run's engine columns are the replicas' sum
    assert min(last.values()) > 0 and sum(last.values()) == samples["prefix_cache_queries_total"][-1]

    # the summary's per-replica outcomes: turns by replica, and no miss attribution (live: unknown, not 0)
    (entry,) = write_summary(tmp_path)["runs"]
    per_replica = entry["replicas"]["per_replica"]
    assert [r["turns"] for r in per_replica] == [sum(turns["replica"][i] == r for i in done) for r in (0, 1)]
    assert sum(r["turns"] for r in per_replica) == entry["turns_completed"] == len(done)
    assert entry["replicas"]["router"] == "consistent_hash"
    assert entry["replicas"]["deployment"]["miss_routing_tokens"] is None
    assert all(r["miss_eviction_tokens"] is None for r in per_replica)


def test_with_engine_gateway_the_proxy_in_front_of_the_replicas_also_enforces_the_limit(ray_local, tmp_path):
    data = make_spec_dict(engine={"kind": "serve_sim", "replicas": 2, "gateway": {},
                                  "simulator": {"pool_tokens": 160_000}}, time_scale=60.0, seeds=[1])
    data["arms"][1]["controller"] = {"name": "session-cap", "params": {"k": 2, "k_hi": 2}, "start_s": 150}
    (info,) = run_sweep(parse_spec(data), tmp_path, [RunKey("burst", 1)], num_fleets=2)
    assert info["status"] == "completed", info.get("error")
    assert info["router"] == "sticky-hash" and info["router_spec"] is None and info["router_note"] is None
    assert info["gateway"]["controller"] == "session-cap" and info["gateway"]["pool_tokens"] == 2 * 160_000
    run_dir = tmp_path / "runs" / "burst-s1"
    samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
    assert all(limit == 2 for t, limit in zip(samples["t_s"], samples["gateway_limit"]) if t >= 150)
    turns = pq.read_table(run_dir / "turns.parquet").to_pydict()
    assert {r for r, e in zip(turns["replica"], turns["error"]) if e is None} == {0, 1}


def _sweep(tmp_path, engine: dict):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(make_spec_dict(engine=engine)))
    return subprocess.run([sys.executable, "-m", "loadgen.cli", "sweep", str(path), "--out", str(tmp_path / "res")],
                          capture_output=True, text=True)


@pytest.mark.parametrize("engine,expected", [
    ({"kind": "serve_sim", "replicas": 0}, "engine.replicas: Input should be greater than or equal to 1"),
    ({"kind": "serve_sim", "replicas": 2}, "2 replicas need a router in front, e.g. router: {policy: consistent_hash}"),
    ({"kind": "serve_sim", "router": {"policy": "round_robin"}}, "a router needs replicas > 1"),
    ({"kind": "vllm", "replicas": 2, "router": {"policy": "nosuch"}}, "unknown router 'nosuch'; valid routers:"),
])
def test_a_bad_deployment_of_launched_engines_exits_2_naming_the_field(tmp_path, engine, expected):
    proc = _sweep(tmp_path, engine)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert expected in proc.stderr, proc.stderr
    assert not (tmp_path / "res").exists()
