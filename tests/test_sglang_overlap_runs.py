"""Whole runs of the sglang flavour with its overlap schedule (the default): the same spec and
seed give the same run, and the overlap is what moves the run (a deployment's replica is the
single engine of its sessions: tests/test_deployment.py, both flavours)."""

from __future__ import annotations

import pyarrow.parquet as pq

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict


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
