"""A sweep with engine.gateway: each launched engine gets a loadgen gateway in its controller actor,
and the fleets' turns go through it (serve-sim engine actors at 60x on the local Ray cluster)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from actors.sweep import run_sweep
from loadgen.core.runner import RunKey
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

pytestmark = pytest.mark.ray


def test_the_proxy_beside_each_launched_engine_enforces_the_arms_limit(ray_local, tmp_path):
    data = make_spec_dict(engine={"kind": "serve_sim", "simulator": {"pool_tokens": 160_000}, "gateway": {}},
                          time_scale=60.0, seeds=[1])
    data["arms"][1]["controller"] = {"name": "session-cap", "params": {"k": 1, "k_hi": 1}, "start_s": 150}
    spec = parse_spec(data)
    (info,) = run_sweep(spec, tmp_path, [RunKey("burst", 1)], num_fleets=2)
    assert info["status"] == "completed", info.get("error")
    gw = info["gateway"]
    assert gw["controller"] == "session-cap" and gw["control_start_s"] == 150
    assert gw["parks"]["parked"] + gw["parks"]["waiting"] > 0 and gw["sessions_ended"]["final"] > 0
    run_dir = tmp_path / "runs" / "burst-s1"
    sessions = pq.read_table(run_dir / "sessions.parquet").to_pydict()
    # the fleets' own gate admitted everyone at once: the waiting happened in the proxy, whose answers
    # say how long, recorded as the sessions' admissions
    assert max(f - a for a, f in zip(sessions["arrival_s"], sessions["first_admit_s"]) if f is not None) > 10.0
    samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
    after = [i for i, t in enumerate(samples["t_s"]) if t >= 150]
    assert all(samples["gateway_limit"][i] == 1 for i in after)
    assert max(samples["sessions_gateway_waiting"][i] + samples["sessions_parked"][i] for i in after) > 0
    turns = pq.read_table(run_dir / "turns.parquet").to_pydict()
    assert len(turns["session_id"]) > 20 and max(turns["cached_tokens"]) > 0
    assert max(turns["gateway_wait_s"]) > 10.0  # held in the proxy
