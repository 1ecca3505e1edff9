"""A run that cannot start (a file it needs is missing) ends "failed" with the error, never "running"."""

import json

import pytest

from loadgen.core.runner import RunKey, run_simulated
from tests.conftest import make_spec


def test_a_missing_cost_model_file_ends_the_simulated_run_failed(tmp_path):
    spec = make_spec(engine={"kind": "sim", "pool_tokens": 160_000, "cost_model": "no-such-cost.json"})
    with pytest.raises(Exception):
        run_simulated(spec, RunKey("base", 1), tmp_path, spec_dir=tmp_path)
    info = json.loads((tmp_path / "runs" / "base-s1" / "run.json").read_text())
    assert info["status"] == "failed" and "no-such-cost.json" in info["error"]
