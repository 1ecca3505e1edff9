import json
from dataclasses import replace

import numpy as np

import pytest

from loadgen.sim.cost import (CALIBRATION_QWEN3_8B_MI300X, QWEN3_8B_MI300X, StepCostModel, decode_step,
                              fit_cost_model, prefill)


def test_preset_is_the_least_squares_fit_of_the_calibration_numbers():
    fit = fit_cost_model(CALIBRATION_QWEN3_8B_MI300X).model
    for field in ("t0_s", "a_s_per_token", "b_s_per_token2", "g_s_per_token"):
        assert getattr(fit, field) == pytest.approx(getattr(QWEN3_8B_MI300X, field), rel=1e-9)


def test_fit_residuals_stay_within_what_the_docs_report():
    result = fit_cost_model(CALIBRATION_QWEN3_8B_MI300X)
    direct = [r for r in result.rows if not r["label"].startswith("cold turn")]
    # per-operation measurements within 16%; the linear c(L) fits of whole turns within 35%
    assert max(abs(r["relative_residual"]) for r in direct) < 0.16
    assert result.max_abs_relative_residual < 0.35
    m = result.model  # the rough fit of docs/engine-model.md: t0 ~5 ms, a 50-60 us, b ~3 ns, g 40-60 ns
    assert 3e-3 < m.t0_s < 7e-3 and 45e-6 < m.a_s_per_token < 65e-6
    assert 2e-9 < m.b_s_per_token2 < 4.5e-9 and 35e-9 < m.g_s_per_token < 70e-9


def test_fit_recovers_known_constants_exactly():
    truth = StepCostModel(0.004, 40e-6, 2e-9, 30e-9)
    shapes = [prefill(f"{n}@{c}", 1.0, n, c) for n, c in [(1000, 0), (8000, 0), (2000, 10000), (500, 30000)]]
    shapes += [decode_step(f"batch {b}", 1.0, b, ctx) for b, ctx in [(1, 5000), (16, 20000), (64, 30000)]]
    exact = [replace(m, seconds=float(np.dot(m.features(), [truth.t0_s, truth.a_s_per_token,
                                                            truth.b_s_per_token2, truth.g_s_per_token])))
             for m in shapes]
    fit = fit_cost_model(exact)
    assert fit.max_abs_relative_residual < 1e-9
    assert fit.model.b_s_per_token2 == pytest.approx(truth.b_s_per_token2, rel=1e-6)


def test_cost_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(QWEN3_8B_MI300X.to_json()))
    assert StepCostModel.from_file(path) == QWEN3_8B_MI300X
    path.write_text(json.dumps({"t0_s": 1, "speed": 2}))
    with pytest.raises(ValueError, match="speed"):
        StepCostModel.from_file(path)
