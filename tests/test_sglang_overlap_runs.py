"""Whole runs of the sglang flavour with its overlap schedule (the default): the same spec and
seed give the same run, a deployment's replica is the single engine of its sessions, and the
overlap is what moves the run."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from loadgen.core.recording import RunRecorder
from loadgen.core.runner import RunKey, run_simulated, simulate
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict
from tests.test_deployment import _rows, _single_engine_turns


def sglang_spec(**engine):
    return parse_spec(make_spec_dict(engine={"kind": "sim", "flavor": "sglang", "pool_tokens": 48_000, **engine},
                                     seeds=[1]))


def _turns(out):
    return pq.read_table(out / "runs" / "burst-s1" / "turns.parquet").to_pydict()


def test_the_overlap_is_on_by_default_and_runs_deterministically(tmp_path):
    spec = sglang_spec()
    engine = spec.engine_for(spec.arm("burst"))
    assert engine.sglang.overlap_schedule and engine.cost_model == "sglang-qwen3-8b-mi300x"
    for name in ("a", "b"):
        run_simulated(spec, RunKey("burst", 1), tmp_path / name)
    run_simulated(sglang_spec(sglang={"overlap_schedule": False}), RunKey("burst", 1), tmp_path / "off")
    a, b, off = (_turns(tmp_path / n) for n in ("a", "b", "off"))
    assert a == b  # bit for bit
    assert a["finish_s"] != off["finish_s"]  # and the overlap is what the run models
    assert len(a["finish_s"]) > 50


def test_each_replica_of_an_sglang_deployment_is_the_single_engine_of_its_sessions():
    spec = parse_spec(make_spec_dict(
        engine={"kind": "sim", "flavor": "sglang", "pool_tokens": 12_000, "replicas": 3,
                "router": {"policy": "consistent_hash"}},
        seeds=[1], workload={**make_spec_dict()["workload"], "arrival_rate_per_s": 0.1}))
    recorder = RunRecorder(None, "dep", "burst", 1, 1e9, replica_columns=True)
    simulate(spec, RunKey("burst", 1), recorder)
    recorder.close()
    turns = recorder.tables()["turns"]
    replica = np.asarray(turns.column("replica").to_pylist())
    sessions = np.asarray(turns.column("session_id").to_pylist())
    assert sorted(set(replica)) == [0, 1, 2]
    for r in range(3):
        mine = set(sessions[replica == r].tolist())
        assert _rows(turns.filter(np.asarray(replica == r))) == _rows(_single_engine_turns(spec, "burst", 1, mine))
    assert sum(turns.column("num_preemptions").to_pylist()) + sum(turns.column("miss_eviction_tokens").to_pylist()) > 0
