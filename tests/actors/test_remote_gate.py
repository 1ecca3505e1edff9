"""The fleet's stand-ins for the gateway and the recorder, in virtual time (no cluster needed).

A run whose sessions ask the gateway through RemoteGate -> GateHost (as a fleet asks the
controller actor) and record through RecorderProxy -> replay (as the recorder actor does) must
record exactly what the same run records with the in-process gateway and recorder."""

from __future__ import annotations

import inspect
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from actors.controller import FleetCounts, GateHost, merge_counts
from actors.fleet import RecorderProxy, RemoteGate
from actors.recorder import replay
from controllers import make_policy
from loadgen.core.clock import VirtualClock
from loadgen.core.engines import SimEngineClient
from loadgen.core.gateway import Gateway
from loadgen.core.recording import RunRecorder
from loadgen.core.runner import RunKey, engine_config
from loadgen.core.session import RunEnv, SessionCounts, run_session
from loadgen.core.spec import parse_spec
from loadgen.core.workload import plan_sessions
from tests.conftest import make_spec_dict


class _InProcessMethod:
    """``handle.method.remote(...)`` on a local object: an awaitable, as a Ray actor method gives."""

    def __init__(self, method) -> None:
        self.method = method

    def remote(self, *args):
        result = self.method(*args)
        return result if inspect.iscoroutine(result) else _Ready(result)


class _Ready:
    """An answer already there; like an ObjectRef, fine to drop without awaiting."""

    def __init__(self, value) -> None:
        self.value = value

    def __await__(self):
        return self.value
        yield  # a generator: awaitable without ever suspending


class _InProcessHandle:
    def __init__(self, target) -> None:
        self.target = target
        self.calls: list[str] = []  # the actor methods called, in order

    def __getattr__(self, name: str) -> _InProcessMethod:
        self.calls.append(name)
        return _InProcessMethod(getattr(self.target, name))


def _run(spec, key: RunKey, run_dir: Path, through_actors: bool) -> list[str]:
    clock = VirtualClock()
    engine = SimEngineClient(clock, engine_config(spec.engine), spec.engine.load_cost_model())
    arm = spec.arm(key.arm)
    ctl = spec.controller_for(arm)
    gateway = Gateway(clock, make_policy(ctl.name, **ctl.params), engine.pool_tokens, ctl.start_s)
    recorder = RunRecorder(run_dir, key.run_id, key.arm, key.seed, spec.recording.flush_interval_s)
    proxy = RecorderProxy()
    if through_actors:
        # the calls of a virtual instant go in one batch, as a fleet's calls of one loop pass
        handle = _InProcessHandle(GateHost(gateway))
        gate = RemoteGate(handle, clock)
        env = RunEnv(clock, engine, gate, proxy)
    else:
        env = RunEnv(clock, engine, gateway, recorder)
    for plan in plan_sessions(spec, arm, key.seed):
        clock.call_at(plan.arrival_s, lambda p=plan: clock.spawn(run_session(p, env)))
    clock.run(until_s=spec.duration_s)
    replay(recorder, proxy.take())
    recorder.close()
    return handle.calls if through_actors else []


# session-cap switched on mid-run, when more sessions are active than it allows: it parks them
@pytest.mark.parametrize("controller", [{"name": "none"},
                                        {"name": "session-cap", "params": {"k": 2, "k_hi": 2}, "start_s": 150},
                                        {"name": "admission-only", "start_s": 120},
                                        {"name": "adaptive-cap", "start_s": 120},
                                        {"name": "aimd", "start_s": 120},
                                        {"name": "budgeter", "start_s": 120}])
def test_remote_gate_and_recorder_proxy_record_what_the_in_process_run_records(tmp_path, controller):
    data = make_spec_dict(controller=controller)
    data["workload"]["arrival_rate_per_s"] = 0.1
    spec = parse_spec(data)
    key = RunKey("burst", 1)
    _run(spec, key, tmp_path / "in-process", through_actors=False)
    calls = _run(spec, key, tmp_path / "actors", through_actors=True)
    for name in ("turns.parquet", "sessions.parquet"):
        assert (tmp_path / "actors" / name).read_bytes() == (tmp_path / "in-process" / name).read_bytes()
    if controller["name"] == "session-cap":  # the remote path really waited and parked
        assert sum(pq.read_table(tmp_path / "actors" / "sessions.parquet")["num_parks"].to_pylist()) > 0
        assert max(pq.read_table(tmp_path / "actors" / "turns.parquet")["gateway_wait_s"].to_pylist()) > 0
    # what nothing waits on rode with the next question or went in batches: never a call of its own,
    # and fewer calls than the gateway answered and was told
    turns = pq.read_table(tmp_path / "actors" / "turns.parquet")
    num_told = turns["error"].null_count + pq.read_table(tmp_path / "actors" / "sessions.parquet").num_rows
    assert "turn_completed" not in calls and "session_ended" not in calls and "gate_batch" in calls
    num_questions = turns.num_rows  # every turn asked once (arrive or before_turn)
    assert len([c for c in calls if c != "admitted"]) < num_questions + num_told


def test_replay_refuses_what_is_not_a_recorder_event(tmp_path):
    recorder = RunRecorder(tmp_path, "r", "a", 1, 600.0)
    with pytest.raises(ValueError, match="close"):
        replay(recorder, [("close", ())])


def test_fleet_counts_add_up():
    a = FleetCounts(SessionCounts(in_system=2, thinking=1, arrived_total=5, demand_tokens=100), 7)
    b = FleetCounts(SessionCounts(in_system=1, parked=1, arrived_total=3, completed_total=2, demand_tokens=50), 4)
    total = merge_counts([a, b])
    assert total.sessions == SessionCounts(in_system=3, thinking=1, parked=1, arrived_total=8, completed_total=2,
                                           demand_tokens=150)
    assert total.turns_completed == 11
