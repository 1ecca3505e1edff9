"""Replicas that differ: ``engine.replicas`` as a list of the fields each replica sets
(loadgen/core/spec/engines.py, docs/deployments.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

LIST = [{"pool_tokens": 48_000}, {"pool_tokens": 16_000, "max_num_seqs": 8}]


def test_each_replica_gets_its_own_fields_and_the_deployment_their_sum(tmp_path):
    spec = parse_spec(make_spec_dict(engine={"kind": "sim", "pool_tokens": 32_000, "replicas": LIST,
                                             "router": {"policy": "round_robin"}}, seeds=[1]))
    assert spec.engine.replicas == 2
    engines = spec.engine.replica_engines()
    assert [(e.pool_tokens, e.max_num_seqs) for e in engines] == [(48_000, spec.engine.max_num_seqs), (16_000, 8)]
    assert all(e.replicas == 1 and e.router is None for e in engines)
    # the spec a run records gives the list back, and reads as the same spec
    dumped = spec.model_dump(mode="json")["engine"]
    assert dumped["replicas"] == [{"pool_tokens": 48_000}, {"pool_tokens": 16_000, "max_num_seqs": 8}]
    assert "replica_specs" not in dumped
    assert parse_spec({**spec.model_dump(mode="json")}) == spec
    info = run_simulated(spec, RunKey("burst", 1), tmp_path)
    assert info["status"] == "completed" and info["replicas"] == 2
    run_dir = tmp_path / "runs" / "burst-s1"
    samples = pq.read_table(run_dir / "replica_samples.parquet")
    pools = dict(zip(samples.column("replica_index").to_pylist(), samples.column("pool_tokens").to_pylist()))
    assert pools == {0: 48_000, 1: 16_000}
    assert set(pq.read_table(run_dir / "samples.parquet").column("pool_tokens").to_pylist()) == {64_000}
    assert json.loads((run_dir / "run.json").read_text())["pool_tokens"] == 64_000


@pytest.mark.parametrize("replicas,expected", [
    ([{"pool_tokens": 16_000}, {"block_size": 32}],
     "replicas[1]: unknown field(s) ['block_size']; a replica may set ['max_num_batched_tokens', 'max_num_seqs', "
     "'pool_tokens']"),
    ([{"pool_tokens": 16_000}, {"pool_tokens": 10_001}],
     "replicas[1].pool_tokens (10001) must be a multiple of block_size (16)"),
    ([{"pool_tokens": 16_000}, 5], "replicas[1]: expected a mapping of the fields this replica sets"),
    ([], "replicas: an empty list"),
])
def test_a_bad_replica_list_exits_2_naming_the_field(tmp_path, replicas, expected):
    data = make_spec_dict(engine={"kind": "sim", "pool_tokens": 32_000, "replicas": replicas,
                                  "router": {"policy": "round_robin"}})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(path), "--out", str(tmp_path / "res")],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "engine" in proc.stderr and expected in proc.stderr, proc.stderr


def test_the_map_refuses_replicas_that_differ():
    from loadgen.map.bounds import spec_bounds

    spec = parse_spec(make_spec_dict(engine={"kind": "sim", "pool_tokens": 32_000, "replicas": LIST,
                                             "router": {"policy": "round_robin"}}))
    with pytest.raises(ValueError, match="engine.replicas: the map's bounds take identical replicas"):
        spec_bounds(spec, spec.engine.load_cost_model())
