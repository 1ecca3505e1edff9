"""The recovery experiment live through the gateway: loadgen (controller none) -> loadgen gateway
(budgeter from minute 20) -> serve-sim at 30x. It ends as the in-process budgeter does in virtual time."""

import math

import numpy as np
import pyarrow.parquet as pq
import yaml

from loadgen.analysis.recovery import collapsed_at, recovery_time_s
from loadgen.analysis.windows import window_hit_ratios
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import OpenAIEngineSpec, parse_spec
from loadgen.live.runner import run_live
from tests.live.conftest import ServeSim

TIME_SCALE = 30.0
SEED = 5  # collapsed by the burst when control starts (examples/recovery.yaml, 40 min)
CONTROL_START_S = 1200.0


def recovery_spec(controller: dict):
    data = yaml.safe_load(open("examples/recovery.yaml"))
    data.update(duration_min=40, seeds=[SEED], controller={"name": "none"})
    data["arms"] = [{"name": "gated", "triggers": data["arms"][0]["triggers"], "controller": controller}]
    return parse_spec(data)


def outcome(out, duration_s: float) -> tuple:
    turns = pq.read_table(out / "runs" / f"gated-s{SEED}" / "turns.parquet")
    end_hit = window_hit_ratios(turns, np.array([duration_s - 600.0]), 600.0, duration_s)[0]
    return collapsed_at(turns, CONTROL_START_S), recovery_time_s(turns, CONTROL_START_S, duration_s), end_hit


def test_the_recovery_experiment_through_the_gateway_ends_in_the_in_process_budgeters_state(tmp_path):
    budgeter = {"name": "budgeter", "start_s": CONTROL_START_S}
    in_process = recovery_spec(budgeter)
    run_simulated(in_process, RunKey("gated", SEED), tmp_path / "virtual")
    collapsed, recovered_after_s, end_hit = outcome(tmp_path / "virtual", in_process.duration_s)
    assert collapsed and recovered_after_s is not None  # the state to reach: collapsed, then recovered

    server = ServeSim(TIME_SCALE)
    try:
        uncontrolled = recovery_spec({"name": "none"})  # the load generator runs no limit...
        engine = OpenAIEngineSpec(url=server.url, gateway={"controller": budgeter})  # ...the proxy does
        live = uncontrolled.model_copy(update={"engine": engine, "time_scale": TIME_SCALE})
        info = run_live(live, RunKey("gated", SEED), tmp_path / "live")
    finally:
        server.kill()
    assert info["status"] == "completed" and info["controller"] == "none"
    gw = info["gateway"]
    assert gw["controller"] == "budgeter" and gw["parks"]["parked"] + gw["parks"]["waiting"] > 0
    samples = pq.read_table(tmp_path / "live" / "runs" / f"gated-s{SEED}" / "samples.parquet").to_pydict()
    after = [i for i, t in enumerate(samples["t_s"]) if t >= CONTROL_START_S]
    assert all(samples["gateway_limit"][i] == 0.75 * 400_000 for i in after)  # the proxy's gate, sampled
    assert max(samples["sessions_gateway_waiting"][i] + samples["sessions_parked"][i] for i in after) > 0
    live_collapsed, live_recovered_after_s, live_end_hit = outcome(tmp_path / "live", live.duration_s)
    assert live_collapsed == collapsed and live_recovered_after_s is not None
    assert not math.isnan(live_end_hit) and abs(live_end_hit - end_hit) < 0.05
