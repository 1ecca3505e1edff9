"""``loadgen calibrate`` recovers a known step-cost model from a serve-sim that runs it."""

import asyncio
import json

import pytest

from loadgen.live.calibrate import CalibrationPlan, calibrate, check_cost_model
from loadgen.core.clock import WallClock
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.sim.cost import StepCostModel

# slow enough per step that timer jitter on a busy 2-core machine stays small beside it
TRUTH = StepCostModel(t0_s=0.02, a_s_per_token=100e-6, b_s_per_token2=10e-9, g_s_per_token=400e-9, name="truth")
PLAN = CalibrationPlan(cold_contexts=(16, 500, 1500, 3000, 6000), incremental=((1000, 500), (5000, 250)),
                       decode=((1, 500), (4, 2000), (8, 1000)), decode_tokens=12, queues=((6, 800, 1024),),
                       queue_output_tokens=4, repeats=2, chunk_tokens=2048)


def test_calibration_recovers_the_constants_of_the_engine_it_measures(tmp_path, serve_sim_factory):
    cost_file = tmp_path / "truth.json"
    cost_file.write_text(json.dumps(TRUTH.to_json()))
    server = serve_sim_factory(1.0, "--cost-model", str(cost_file), "--max-num-batched-tokens", "2048")

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=server.url))
        try:
            return await calibrate(client, PLAN, name="measured")
        finally:
            await client.close()

    result = asyncio.run(go())
    fitted = result.fit.model
    assert result.pool_tokens == 400_000 and result.block_size == 16
    assert fitted.t0_s == pytest.approx(TRUTH.t0_s, rel=0.25)
    assert fitted.a_s_per_token == pytest.approx(TRUTH.a_s_per_token, rel=0.25)
    assert fitted.b_s_per_token2 == pytest.approx(TRUTH.b_s_per_token2, rel=0.35)
    assert fitted.g_s_per_token == pytest.approx(TRUTH.g_s_per_token, rel=0.35)
    assert result.fit.max_abs_relative_residual < 0.25
    # the queue row replays the scheduler's mixed steps: the engine's own constants predict it
    queue_row = next(r for r in result.fit.rows if r["label"].startswith("queue of 6"))
    assert abs(queue_row["relative_residual"]) < 0.1

    # --check: the engine's own model holds; one twice as fast as the engine is caught
    assert check_cost_model(TRUTH, result.measurements, result.fit.request_overhead_s).median_ratio == \
        pytest.approx(1.0, abs=0.1)
    fast = StepCostModel(TRUTH.t0_s / 2, TRUTH.a_s_per_token / 2, TRUTH.b_s_per_token2 / 2, TRUTH.g_s_per_token / 2,
                         name="fast")
    assert check_cost_model(fast, result.measurements, result.fit.request_overhead_s).median_ratio > 1.7
