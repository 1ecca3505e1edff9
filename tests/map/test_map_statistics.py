"""The map's statistics against hand-computed values: intervals, probabilities per cell,
boundaries, Kaplan-Meier with censoring, the mean time to collapse, the analytic bounds."""

from __future__ import annotations

import math

import pytest

from loadgen.core.spec import parse_spec
from loadgen.map.analysis import (cell_table, controller_gain, crossing_rate, escape_table, highest_safe_rate,
                                  kaplan_meier, mean_time_to_collapse, poisson_mean_interval, restricted_mean_s,
                                  wilson_interval)
from loadgen.map.bounds import spec_bounds
from loadgen.sim.cost import StepCostModel
from tests.conftest import make_spec_dict

Z = 1.959963984540054


def test_wilson_interval_by_hand():
    # k = 0 of 20: the upper limit is z^2 / (n + z^2)
    assert wilson_interval(0, 20) == (0.0, pytest.approx(Z * Z / (20 + Z * Z)))
    lo, hi = wilson_interval(10, 20)
    half = Z * math.sqrt(0.25 / 20 + Z * Z / 1600) / (1 + Z * Z / 20)
    assert (lo, hi) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert (round(lo, 4), round(hi, 4)) == (0.2993, 0.7007)
    assert wilson_interval(20, 20) == (pytest.approx(20 / (20 + Z * Z)), 1.0)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def _row(controller, rate, factor, seed, degraded, **extra):
    return {"run_id": f"{controller}-{rate}-{factor}-{seed}", "phase": "grid", "status": "completed",
            "controller": controller, "rate_per_s": rate, "trigger_factor": factor, "seed": seed,
            "duration_s": 600.0, "persistently_degraded": degraded, **extra}


# P(degraded) per rate at factor 1 for `none`: 0/4, 1/4, 3/4, 4/4
SYNTHETIC = [_row("none", rate, 1.0, seed, seed < k) for rate, k in ((0.01, 0), (0.02, 1), (0.03, 3), (0.04, 4))
             for seed in range(4)]


def test_cell_probabilities_and_intervals_from_a_synthetic_table():
    cells = {c["rate_per_s"]: c for c in cell_table(SYNTHETIC + [{**SYNTHETIC[0], "phase": "bisect", "run_id": "x",
                                                                  "persistently_degraded": True}])}
    assert [(cells[r]["num_degraded"], cells[r]["n"]) for r in (0.01, 0.02, 0.03, 0.04)] == [(0, 4), (1, 4), (3, 4), (4, 4)]
    assert cells[0.03]["p"] == 0.75
    assert (cells[0.03]["p_low"], cells[0.03]["p_high"]) == pytest.approx(wilson_interval(3, 4))
    cells = cell_table(SYNTHETIC)
    assert highest_safe_rate(cells, "none", 1.0, key="p") == 0.01  # by the estimates
    assert highest_safe_rate(cells, "none", 1.0) is None  # 0 of 4: the upper bound is 0.49, not under 10%
    assert crossing_rate(cells, "none", 1.0, 0.5) == pytest.approx(0.02 + (0.5 - 0.25) / 0.5 * 0.01)
    assert crossing_rate(cells, "none", 1.0, 0.1) == pytest.approx(0.01 + 0.1 / 0.25 * 0.01)
    assert crossing_rate(cells, "none", 1.0, 1.0) == 0.04
    assert highest_safe_rate(cell_table([_row("none", 0.01, 1.0, 0, True)]), "none", 1.0) is None


def test_what_a_controller_buys_is_paired_by_seed_over_runs_both_healthy():
    rows = [
        _row("none", 0.02, 1.0, 1, False, turns_per_s_after_trigger=2.0, turn_latency_p50_s=4.0),
        _row("none", 0.02, 1.0, 2, False, turns_per_s_after_trigger=1.0, turn_latency_p50_s=2.0),
        _row("none", 0.02, 1.0, 3, True, turns_per_s_after_trigger=0.5, turn_latency_p50_s=40.0),
        _row("budgeter", 0.02, 1.0, 1, False, turns_per_s_after_trigger=1.8, turn_latency_p50_s=6.0),
        _row("budgeter", 0.02, 1.0, 2, False, turns_per_s_after_trigger=1.0, turn_latency_p50_s=2.0),
        _row("budgeter", 0.02, 1.0, 3, False, turns_per_s_after_trigger=1.2, turn_latency_p50_s=5.0),
    ]
    (gain,) = controller_gain(rows, cell_table(rows), "budgeter")
    assert (gain["p_baseline"], gain["p_controller"], gain["moved"]) == (pytest.approx(1 / 3), 0.0, pytest.approx(1 / 3))
    assert gain["num_healthy_pairs"] == 2  # seed 3 is cured, not a cost
    assert gain["throughput_ratio_median"] == pytest.approx((0.9 + 1.0) / 2)
    assert gain["latency_ratio_median"] == pytest.approx((1.5 + 1.0) / 2)
    assert gain["moved_to_healthy"] is False


def test_kaplan_meier_with_censoring_by_hand():
    # collapse at 1, 2 and 3 h; censored at 2 h and at the 4 h horizon
    curve = kaplan_meier([1, 2, 2, 3, 4], [True, True, False, True, False])
    assert [(r["t_s"], r["at_risk"], r["events"]) for r in curve] == [(1, 5, 1), (2, 4, 1), (3, 2, 1)]
    assert [r["survival"] for r in curve] == pytest.approx([4 / 5, 4 / 5 * 3 / 4, 4 / 5 * 3 / 4 * 1 / 2])
    # Greenwood: S(t)^2 sum d / (n (n - d))
    assert curve[1]["se"] == pytest.approx(0.6 * math.sqrt(1 / 20 + 1 / 12))
    assert restricted_mean_s(curve, 4) == pytest.approx(1 + 0.8 + 0.6 + 0.3)


def test_mean_time_to_collapse_counts_censored_exposure_with_an_exact_poisson_interval():
    # Garwood limits for 3 events: 0.6187 and 8.7673; for 0: upper 3.6889
    assert poisson_mean_interval(3) == pytest.approx((0.61867, 8.76727), abs=2e-5)
    assert poisson_mean_interval(0) == pytest.approx((0.0, 3.68888), abs=2e-5)
    m = mean_time_to_collapse([1, 2, 2, 3, 4], [True, True, False, True, False])
    assert (m["exposure_s"], m["num_collapsed"], m["mean_s"]) == (12.0, 3, 4.0)
    assert (m["mean_low_s"], m["mean_high_s"]) == pytest.approx((12 / 8.76727, 12 / 0.61867), rel=1e-4)
    none = mean_time_to_collapse([6.0, 6.0], [False, False])
    assert none["mean_s"] is None and none["mean_high_s"] is None
    assert none["mean_low_s"] == pytest.approx(12 / 3.68888, rel=1e-4)


def test_escape_rows_become_censored_times_at_their_horizon():
    rows = [{"run_id": f"e{i}", "phase": "escape", "status": "completed", "rate_per_s": 0.03, "duration_s": 100.0,
             "persistently_degraded": d, "collapse_s": c}
            for i, (d, c) in enumerate([(True, 30.0), (False, None), (True, 60.0)])]
    (e,) = escape_table(rows)
    assert (e["num_collapsed"], e["exposure_s"], e["mean_s"]) == (2, 190.0, 95.0)
    assert [r["survival"] for r in e["kaplan_meier"]] == pytest.approx([2 / 3, 1 / 3])


def test_bounds_by_hand_for_a_two_turn_session():
    spec = parse_spec(make_spec_dict(
        engine={"kind": "sim", "pool_tokens": 16000, "cost_model": {"t0_s": 0.01, "a_s_per_token": 1e-4,
                                                                    "b_s_per_token2": 1e-8, "g_s_per_token": 1e-7}},
        workload={"arrival_rate_per_s": 0.1, "sessions": {
            "kind": "synthetic", "system_prompt_tokens": 100, "task_tokens": 900, "num_turns": 2,
            "output_tokens": 10, "tool_tokens": 90, "think_time_mean_s": 4.0}}))
    cost = StepCostModel(0.01, 1e-4, 1e-8, 1e-7)
    b = spec_bounds(spec, cost)
    # prompts 1000 and 1100 tokens; the shared 100-token system prompt is always cached
    decode0, decode1 = 1e-7 * (10 * 1000 + 50), 1e-7 * (10 * 1100 + 50)
    warm0 = 1e-4 * 910 + 1e-8 * 900 * (100 + 450) + decode0  # 900 new on the shared prompt
    warm1 = 1e-4 * 100 + 1e-8 * 90 * (1010 + 45) + decode1   # 90 tool tokens on the cached turn
    cold1 = 1e-4 * 1010 + 1e-8 * 1000 * (100 + 500) + decode1  # all but the shared prompt again
    assert b.mean_context_tokens == 1050 and b.turns_per_session == 2
    assert b.warm_turn_work_s == pytest.approx((warm0 + warm1) / 2)
    assert b.warm_turn_alone_s == pytest.approx(10 * 0.01 + (warm0 + warm1) / 2)
    assert b.session_cold_cost_s == pytest.approx(warm0 + cold1)  # the first turn is cold anyway
    assert b.drain_rate_per_s == pytest.approx(1 / (warm0 + cold1))
    assert b.saturation_rate_per_s == pytest.approx(1 / (2 * (warm0 + warm1) / 2))
    # the healthy bound solves lambda T (Z + R_alone / (1 - lambda T W)) L = C
    lam, W, R = b.healthy_rate_per_s, b.warm_turn_work_s, b.warm_turn_alone_s
    assert lam * 2 * (4.0 + R / (1 - lam * 2 * W)) * 1050 == pytest.approx(16000)
    assert lam < b.saturation_rate_per_s
    assert b.sessions_at_healthy == pytest.approx(16000 / 1050)
    assert b.warm_response_s(lam) == pytest.approx(b.warm_response_at_healthy_s)
