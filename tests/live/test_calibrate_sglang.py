"""``loadgen calibrate`` against serve-sim's SGLang flavour writes a cost model that says it is
SGLang's, which a spec of the sglang flavour then takes as its engine.cost_model."""

import json

import pytest

from loadgen.cli import main
from loadgen.core.spec import SimEngineSpec
from loadgen.live.calibrate import CalibrationPlan
from loadgen.sim.cost import StepCostModel

from tests.live.conftest import ServeSim

TRUTH = StepCostModel(t0_s=0.02, a_s_per_token=60e-6, b_s_per_token2=10e-9, g_s_per_token=2e-6, name="truth")
PLAN = CalibrationPlan(cold_contexts=(16, 1500, 3000), incremental=((1000, 500),), decode=((1, 500), (4, 2000)),
                       decode_tokens=16, queues=(), repeats=1, chunk_tokens=2048)


def test_a_calibration_of_an_sglang_server_records_the_flavour_and_is_selectable(tmp_path):
    truth = tmp_path / "truth.json"
    truth.write_text(json.dumps(TRUTH.to_json()))
    # the overlap on (SGLang's default) and nothing to hide (hidden_cpu_s 0): steps cost the truth
    server = ServeSim(1.0, "--flavor", "sglang", "--cost-model", str(truth), "--max-num-batched-tokens", "2048")
    out = tmp_path / "sglang.json"
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("loadgen.live.calibrate.CalibrationPlan", lambda repeats, chunk_tokens: PLAN)
            code = main(["calibrate", "--endpoint", server.url, "--out", str(out), "--max-num-batched-tokens", "2048",
                         "--force"])
    finally:
        server.kill()
    assert code == 0
    data = json.loads(out.read_text())
    assert data["flavor"] == "sglang" and "hidden_cpu_s" not in data
    model = SimEngineSpec(flavor="sglang", cost_model=str(out)).load_cost_model()
    assert model.flavor == "sglang"
    assert model.t0_s == pytest.approx(TRUTH.t0_s, rel=0.3)
