import json
from dataclasses import replace

import numpy as np

import pytest

from loadgen.sim.cost import (CALIBRATION_QWEN3_8B_MI300X, QWEN3_8B_MI300X, StepCostModel, decode_step,
                              fit_cost_model, loaded_lines_qwen3_8b_mi300x, marginal_cold_turn, prefill,
                              queue_drain)


def test_preset_is_the_least_squares_fit_of_the_calibration_numbers():
    fit = fit_cost_model(CALIBRATION_QWEN3_8B_MI300X).model
    for field in ("t0_s", "a_s_per_token", "b_s_per_token2", "g_s_per_token", "mixed_decode_s_per_token"):
        assert getattr(fit, field) == pytest.approx(getattr(QWEN3_8B_MI300X, field), rel=1e-9)


def test_fit_residuals_stay_within_what_the_docs_report():
    result = fit_cost_model(CALIBRATION_QWEN3_8B_MI300X)
    assert result.model.mixed_decode_s_per_token == 0.0  # the preset has no mixed-step term
    direct = [r for r in result.rows if not r["label"].startswith("cold turn")]
    # per-operation measurements within 16%; the linear c(L) fits of whole turns within 35%
    assert max(abs(r["relative_residual"]) for r in direct) < 0.16
    assert result.max_abs_relative_residual < 0.35
    m = result.model  # the rough fit of docs/engine-model.md: t0 ~5 ms, a 50-60 us, b ~3 ns, g 40-60 ns
    assert 3e-3 < m.t0_s < 7e-3 and 45e-6 < m.a_s_per_token < 65e-6
    assert 2e-9 < m.b_s_per_token2 < 4.5e-9 and 35e-9 < m.g_s_per_token < 70e-9


ISOLATED_ROWS = [m for m in CALIBRATION_QWEN3_8B_MI300X if not m.label.startswith("cold turn")]


@pytest.mark.parametrize("mixed_fraction", [1.0, 0.15, 0.012])
def test_the_mixed_step_fit_of_both_loaded_lines(mixed_fraction):
    """docs/engine-model.md#the-mixed-step-decode-term: the isolated rows and both loaded lines fit
    within 14% with the mixed-step term, whose size is 145.8 ns over the share of a loaded turn's
    decodes that run beside a chunk; the other constants do not depend on that share."""
    result = fit_cost_model(ISOLATED_ROWS + list(loaded_lines_qwen3_8b_mi300x(mixed_fraction)))
    assert result.max_abs_relative_residual < 0.14
    assert result.model.mixed_decode_s_per_token * mixed_fraction == pytest.approx(145.83e-9, rel=1e-3)
    assert result.model.a_s_per_token == pytest.approx(45.76e-6, rel=1e-3)


def test_without_the_mixed_step_term_both_loaded_lines_do_not_fit():
    """The four constants cannot follow both loaded lines: the loaded turns stay 11-30% cheaper
    than measured and the isolated rows move to +21%."""
    plain = fit_cost_model(ISOLATED_ROWS + list(loaded_lines_qwen3_8b_mi300x(0.0)))
    assert plain.model.mixed_decode_s_per_token == 0.0
    loaded = [r["relative_residual"] for r in plain.rows if "turn c(" in r["label"]]
    assert min(loaded) < -0.25 and max(loaded) < -0.1
    assert max(r["relative_residual"] for r in plain.rows) > 0.2


def test_only_the_loaded_turns_fraction_of_decodes_is_mixed():
    turn = marginal_cold_turn("t", 1.0, 20_000, 300, mixed_fraction=0.25)
    assert turn.mixed_decode_context_tokens == 0.25 * turn.decode_context_tokens == 0.25 * (300 * 20_000 + 300 * 300 / 2)
    assert marginal_cold_turn("t", 1.0, 20_000, 300).mixed_decode_context_tokens == 0
    assert prefill("p", 1.0, 20_000).mixed_decode_context_tokens == 0
    assert decode_step("d", 1.0, 32, 25_000).mixed_decode_context_tokens == 0


def test_fit_recovers_known_constants_exactly():
    truth = StepCostModel(0.004, 40e-6, 2e-9, 30e-9)
    shapes = [prefill(f"{n}@{c}", 1.0, n, c) for n, c in [(1000, 0), (8000, 0), (2000, 10000), (500, 30000)]]
    shapes += [decode_step(f"batch {b}", 1.0, b, ctx) for b, ctx in [(1, 5000), (16, 20000), (64, 30000)]]
    exact = [replace(m, seconds=float(np.dot(m.features(), truth.coefficients()))) for m in shapes]
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


def test_fit_recovers_a_known_mixed_step_term_from_queue_rows():
    """Drained queues put decodes beside prefill chunks: with decode-only rows pinning g, their
    extra time pins the mixed-step term."""
    truth = StepCostModel(0.004, 40e-6, 2e-9, 30e-9, mixed_decode_s_per_token=60e-9)
    shapes = [prefill(f"{n}@{c}", 1.0, n, c, chunk_tokens=2048) for n, c in [(16, 0), (1500, 0), (1000, 8000)]]
    shapes += [decode_step(f"batch {b}", 1.0, b, ctx) for b, ctx in [(1, 500), (8, 4000)]]
    shapes += [queue_drain(f"queue {q}", 1.0, q, n, c, 16, chunk_tokens=2048) for q, n, c in [(8, 800, 4000),
                                                                                          (6, 1500, 1024)]]
    assert all(m.mixed_decode_context_tokens > 0 for m in shapes[-2:])
    exact = [replace(m, seconds=float(np.dot(m.features(), truth.coefficients()))) for m in shapes]
    fit = fit_cost_model(exact)
    assert fit.model.mixed_decode_s_per_token == pytest.approx(60e-9, rel=1e-6)


def test_a_cost_file_may_leave_the_mixed_term_out_and_must_not_make_it_negative(tmp_path):
    four = {"t0_s": 0.005, "a_s_per_token": 5e-5, "b_s_per_token2": 3e-9, "g_s_per_token": 5e-8}
    assert StepCostModel.from_json(four).mixed_decode_s_per_token == 0.0
    assert "mixed_decode_s_per_token" not in StepCostModel.from_json(four).to_json()  # digests of old specs hold
    assert StepCostModel.from_json(QWEN3_8B_MI300X.to_json()) == QWEN3_8B_MI300X
    with pytest.raises(ValueError, match="mixed_decode_s_per_token"):
        StepCostModel.from_json({**four, "mixed_decode_s_per_token": -1e-9})
