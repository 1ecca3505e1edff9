"""A session that crashes inside a Ray session fleet (local cluster with fake GPUs, conftest.py).

The sweep's fleets get an engine client whose calls raise for one session (an error no engine
adapter expects). With one admission at a time and that session the first to arrive, a crash
that kept its admission would hold every other session at the gate for the whole run."""

from __future__ import annotations

import sys

import pyarrow.parquet as pq
import pytest

import actors.sweep
from actors.fleet import SessionFleetHost
from actors.sweep import run_sweep
from loadgen import run_keys
from loadgen.core.spec import parse_spec
from loadgen.core.workload import plan_sessions
from tests.conftest import make_spec_dict

pytestmark = pytest.mark.ray

CRASHING_SESSION = 0  # session ids go in arrival order: 0 arrives first
INJECTED = "injected engine failure"


class _CrashingClient:
    """The fleet's engine client, except that the crashing session's calls raise."""

    def __init__(self, client) -> None:
        self._client = client

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    async def generate(self, request):
        if request.session_id == CRASHING_SESSION:
            raise RuntimeError(INJECTED)
        return await self._client.generate(request)


class CrashingFleet(SessionFleetHost):
    def engine_client(self, clock, settings):
        return _CrashingClient(super().engine_client(clock, settings))


def test_a_session_crashing_in_a_fleet_is_recorded_releases_its_admission_and_marks_the_run(
        ray_local, tmp_path, monkeypatch):
    # the workers import this module by value: it is a test file, not part of the installed package
    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(actors.sweep, "SessionFleet", ray_local.remote(num_cpus=0)(CrashingFleet))
    data = make_spec_dict(engine={"kind": "serve_sim", "simulator": {"pool_tokens": 160_000}}, time_scale=60.0,
                          seeds=[1], arms=[{"name": "base"}],
                          controller={"name": "admission-only", "params": {"k": 1}})
    spec = parse_spec(data)
    assert min(p.session_id for p in plan_sessions(spec, spec.arm("base"), 1)) == CRASHING_SESSION

    [info] = run_sweep(spec, tmp_path, run_keys(spec), num_fleets=2)
    assert info["status"] == "completed_with_errors", info["error"]
    assert info["counts"]["sessions_crashed"] == 1
    assert info["error"] == "1 session(s) crashed (sessions.parquet status 'error' has the exception)"

    run_dir = tmp_path / "runs" / "base-s1"
    sessions = pq.read_table(run_dir / "sessions.parquet").to_pylist()
    crashed = [s for s in sessions if s["status"] == "error"]
    assert [(s["session_id"], s["error"], s["turns_completed"]) for s in crashed] == [
        (CRASHING_SESSION, f"RuntimeError: {INJECTED}", 0)]
    # it gave its admission back: the sessions behind it were admitted and ran their turns
    turns = pq.read_table(run_dir / "turns.parquet").to_pylist()
    assert {t["session_id"] for t in turns if t["error"] is None} - {CRASHING_SESSION}
    assert any(s["status"] == "completed" for s in sessions)
    samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
    assert max(samples["sessions_admitted"]) == 1  # one at a time, as the controller says
    assert min(samples["sessions_in_engine"]) >= 0 and samples["sessions_in_system"][-1] >= 0
