"""Tests for loadgen.analysis against synthetic run directories (docs/results-format.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loadgen.analysis import (
    format_outcome_table,
    load_run,
    outcome_table,
    paired_comparisons,
    persistently_degraded,
    run_outcome,
    sign_test_p,
    summarize,
    window_series,
    write_summary,
)

try:  # run as `python -m pytest` from the repo root, or with tests/ on sys.path
    from tests.factories import sample_row, steady_turns, turn_row, write_run_dir
except ImportError:  # pragma: no cover
    from factories import sample_row, steady_turns, turn_row, write_run_dir

BURST = [{"kind": "burst", "start_s": 900.0, "end_s": 1200.0}]
ARMS_SPEC = {"name": "exp", "arms": [{"name": "no-burst"}, {"name": "burst"}]}


def _turns_table(rows: list[dict], tmp_path: Path) -> pa.Table:
    run_dir = write_run_dir(tmp_path, "r-s1", "r", 1, rows, [], [], 3600.0, None)
    return load_run(run_dir).turns


# --------------------------------------------------------------------------------------------
# Windows


def test_window_hit_ratio_is_token_weighted(tmp_path: Path) -> None:
    rows = [
        turn_row(10.0, 1000, 900),  # 90% hit, large turn
        turn_row(20.0, 100, 0),  # 0% hit, small turn
        turn_row(30.0, 5000, 5000, error="timeout"),  # failed: must not count
        turn_row(70.0, 200, 50),
        turn_row(180.0, 400, 400),  # exactly at end_s: belongs to the last window
    ]
    series = window_series(_turns_table(rows, tmp_path), 0.0, 180.0, 60.0)

    np.testing.assert_allclose(series.window_starts_s, [0.0, 60.0, 120.0])
    # Token weighted: 900/1100, not the per-turn mean (0.9 + 0) / 2.
    assert series.hit_ratio[0] == pytest.approx(900 / 1100)
    assert series.hit_ratio[1] == pytest.approx(50 / 200)
    assert series.hit_ratio[2] == pytest.approx(1.0)
    np.testing.assert_array_equal(series.num_turns, [2, 1, 1])
    np.testing.assert_allclose(series.turns_per_s, [2 / 60, 1 / 60, 1 / 60])
    np.testing.assert_allclose(series.recomputed_prompt_tokens_per_s, [200 / 60, 150 / 60, 0.0])


def test_window_without_turns_is_nan_and_partial_last_window(tmp_path: Path) -> None:
    rows = [turn_row(10.0, 100, 50), turn_row(140.0, 100, 100)]
    series = window_series(_turns_table(rows, tmp_path), 0.0, 150.0, 60.0)

    np.testing.assert_allclose(series.window_widths_s, [60.0, 60.0, 30.0])
    assert math.isnan(series.hit_ratio[1])
    assert series.num_turns[1] == 0 and series.turns_per_s[1] == 0.0
    # The short last window's rate uses its own 30 s width.
    assert series.turns_per_s[2] == pytest.approx(1 / 30)


# --------------------------------------------------------------------------------------------
# Per-run outcome


def test_last_10min_figures(tmp_path: Path) -> None:
    turns = (
        steady_turns(0.0, 3000.0, 10.0, hit_ratio=0.2)  # before the last 10 min: ignored
        + [turn_row(3100.0, 3000, 2700), turn_row(3500.0, 1000, 100)]
        + [turn_row(3550.0, 9999, 9999, error="engine error")]
    )
    samples = [sample_row(t, 100) for t in range(0, 3300, 10)] + [
        sample_row(3300.0, 10),
        sample_row(3450.0, 20),
        sample_row(3600.0, 30),
    ]
    run_dir = write_run_dir(
        tmp_path, "burst-s7", "burst", 7, turns, samples, BURST, 3600.0, 1200.0,
        counts={"sessions_arrived": 50, "sessions_completed": 42, "turns_completed": 302},
    )
    outcome = run_outcome(load_run(run_dir))

    assert set(outcome) == {
        "run_id", "experiment", "arm", "seed", "duration_s", "hit_ratio_last10min",
        "sessions_in_system_last5min", "persistently_degraded", "turns_completed",
        "sessions_completed", "turns_per_s_last10min",
        # control outcomes (added with the controllers; the fields above are unchanged)
        "controller", "control_start_s", "collapsed_at_control", "recovered", "recovery_time_min",
        "cohort_sessions_after_control", "cohort_done_after_control", "cohort_completion_median_min",
        "cohort_completion_p90_min", "gateway_wait_p90_first_turn_s",
        # beside persistently_degraded (added later; the fields above are unchanged)
        "ends_degraded", "degraded_windows_after_trigger", "degraded_only_in_final_window",
        # latency, tasks and SLO goodput (added later; the fields above are unchanged)
        "latency", "latency_last10min", "tasks_arrived", "tasks_finished", "task_completion_p50_min",
        "task_completion_p90_min", "slo_turns_met", "slo_turns_met_share", "slo_goodput_turns_per_s",
        "slo_tasks_met", "slo_tasks_counted", "slo_tasks_met_share", "slo_goodput_tasks_per_s",
        "slo_met_at_percentile",
        # the simulated engine's flavour; a live run that fell behind its time scale (added later)
        "engine_flavor", "offload_cpu_tokens", "lagging",
        # measured vs ideal hit ratio (added later; the fields above are unchanged)
        "measured_hit_ratio", "ideal_hit_ratio", "engine_miss_share", "ideal_hit_ratio_last10min",
        "ideal_block_size", "ideal_block_size_assumed",
        # prompt lengths against the plan, re-tokenization drift (added with chat prompts)
        "prompt_tokens_off_plan_turns", "prompt_tokens_off_plan_max", "retokenization_drift_turns",
        "retokenization_drift_tokens_total", "retokenization_drift_unknown_turns",
        # turns retried, failed and cut short, by cause (added with retried turns' latency)
        "turn_attempts", "turns_retried", "retries_per_turn_mean", "retries_per_turn_max", "turns_failed",
        "turns_truncated", "failed_attempts_by_cause", "failed_turns_by_cause",
    }
    assert outcome["hit_ratio_last10min"] == pytest.approx((2700 + 100) / (3000 + 1000))
    # windows after te = 1200: six at 0.2, [3000, 3300) at 0.9, [3300, 3600) at 0.1: the run ends
    # in a degraded window (the healthy one before does not clear it), though its last 10 minutes
    # read 0.7
    assert outcome["ends_degraded"] is False and outcome["persistently_degraded"] is True
    assert outcome["degraded_windows_after_trigger"] == pytest.approx(7 / 8)
    # the stretch it ends in is the final window alone (a healthy one before): printed "final"
    assert outcome["degraded_only_in_final_window"] is True
    assert outcome["sessions_in_system_last5min"] == pytest.approx(20.0)
    assert outcome["turns_per_s_last10min"] == pytest.approx(2 / 600)
    assert outcome["turns_completed"] == 302 and outcome["sessions_completed"] == 42
    assert (outcome["run_id"], outcome["arm"], outcome["seed"]) == ("burst-s7", "burst", 7)
    assert outcome["experiment"] == "exp" and outcome["duration_s"] == 3600.0


def test_zero_row_turns_are_tolerated(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, "a-s1", "a", 1, [], [], [], 1800.0, None)
    run = load_run(run_dir)
    assert run.turns.num_rows == 0

    outcome = run_outcome(run)
    assert outcome["hit_ratio_last10min"] is None
    assert outcome["sessions_in_system_last5min"] is None
    assert outcome["turns_per_s_last10min"] == 0.0
    # No finished turn and no sample with a request pending: no window is judged.
    assert outcome["persistently_degraded"] is False and outcome["degraded_windows_after_trigger"] is None
    json.dumps(outcome, allow_nan=False)


def test_zero_row_turns_without_schema_are_tolerated(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, "a-s1", "a", 1, [], [], [], 1800.0, None)
    pq.write_table(pa.table({}), run_dir / "turns.parquet")
    assert load_run(run_dir).turns.num_rows == 0


# Runs for the persistent-degradation cases: te = 1200, duration 2700, five 5-minute windows
# [1200,1500) .. [2400,2700).
HEALTHY = steady_turns(0.0, 2700.0, 10.0, hit_ratio=0.9)
RECOVERED = (
    steady_turns(0.0, 900.0, 10.0, 0.9)
    + steady_turns(900.0, 1800.0, 10.0, 0.1)  # degraded through windows 0 and 1
    + steady_turns(1800.0, 2700.0, 10.0, 0.9)
)
COLLAPSED = steady_turns(0.0, 1500.0, 10.0, 0.9) + steady_turns(1500.0, 2700.0, 10.0, 0.1)
STOPPED = steady_turns(0.0, 2100.0, 10.0, 0.9)  # no turn finishes after 2100
# one healthy window between an early degraded one and a collapse to the end (docs/experiments.md's
# seed 501 of trace-recovery)
RELAPSED = (steady_turns(0.0, 1500.0, 10.0, 0.1) + steady_turns(1500.0, 1800.0, 10.0, 0.9)
            + steady_turns(1800.0, 2700.0, 10.0, 0.02))


@pytest.mark.parametrize(
    ("rows", "expected"),
    [(HEALTHY, False), (RECOVERED, False), (COLLAPSED, True), (STOPPED, False), (RELAPSED, True)],
    ids=["healthy", "recovered", "collapsed", "idle-windows-unjudged", "relapsed"],
)
def test_persistently_degraded_cases(tmp_path: Path, rows: list[dict], expected: bool) -> None:
    turns = _turns_table(rows, tmp_path)
    assert persistently_degraded(turns, 1200.0, 2700.0) is expected


def test_a_window_without_finished_turns_is_degraded_only_when_requests_were_pending(tmp_path: Path) -> None:
    from loadgen.analysis.windows import window_states

    turns = _turns_table(STOPPED, tmp_path)
    # pending at 2150 s and 2450 s (a stall): windows [2100, 2400) and [2400, 2700) are degraded
    stalled = np.array([2150.0, 2450.0])
    assert persistently_degraded(turns, 1200.0, 2700.0, busy_s=stalled) is True
    states = window_states(turns, 1200.0, 2700.0)
    assert states[:3].tolist() == [0.0, 0.0, 0.0] and np.isnan(states[3:]).all()
    assert window_states(turns, 1200.0, 2700.0, busy_s=stalled)[3:].tolist() == [1.0, 1.0]
    # a sample before the trigger or at the end says nothing about the windows
    assert persistently_degraded(turns, 1200.0, 2700.0, busy_s=np.array([100.0, 2700.0])) is False


def test_persistently_degraded_aligns_windows_to_reference_trigger_end(tmp_path: Path) -> None:
    # Degraded (hit 0.2) only in [2400, 2700], fully healthy (1.0) before.
    rows = steady_turns(0.0, 2400.0, 10.0, 1.0) + steady_turns(2400.0, 2700.0, 10.0, 0.2)
    turns = _turns_table(rows, tmp_path)

    # te = 1200: the last window is [2400, 2700), all degraded.
    assert persistently_degraded(turns, 1200.0, 2700.0) is True
    # te = 1350: the last window that ends by 2700 is [2250, 2550), half healthy (0.6 >= 0.5);
    # [2550, 2850) does not end by the run end and must not be used.
    assert persistently_degraded(turns, 1350.0, 2700.0) is False


def test_control_arm_uses_reference_trigger_end_not_its_own_triggers(tmp_path: Path) -> None:
    rows = steady_turns(0.0, 2400.0, 10.0, 1.0) + steady_turns(2400.0, 2700.0, 10.0, 0.2)
    aligned = write_run_dir(tmp_path, "ctl-s1", "ctl", 1, rows, [], [], 2700.0, 1200.0)
    shifted = write_run_dir(tmp_path, "ctl-s2", "ctl", 2, rows, [], [], 2700.0, 1350.0)
    assert run_outcome(load_run(aligned))["persistently_degraded"] is True
    assert run_outcome(load_run(shifted))["persistently_degraded"] is False


def test_persistently_degraded_false_when_no_full_window_fits(tmp_path: Path) -> None:
    turns = _turns_table([], tmp_path)
    assert persistently_degraded(turns, 2500.0, 2700.0) is False
    assert persistently_degraded(turns, 2700.0, 2700.0) is False


# --------------------------------------------------------------------------------------------
# Sign test and pairing


@pytest.mark.parametrize(
    ("k", "n", "p"),
    [
        (0, 9, 2 / 512),
        (9, 9, 2 / 512),
        (1, 5, 0.375),
        (4, 5, 0.375),
        (0, 0, 1.0),
        (3, 6, 1.0),
        (0, 1, 1.0),
        (2, 10, 2 * (1 + 10 + 45) / 1024),
        (1, 12, 2 * 13 / 4096),
    ],
)
def test_sign_test_p_known_values(k: int, n: int, p: float) -> None:
    assert sign_test_p(k, n) == pytest.approx(p, rel=1e-12)


def test_sign_test_rejects_bad_counts() -> None:
    with pytest.raises(ValueError):
        sign_test_p(3, 2)


def _outcome(arm: str, seed: int, degraded: bool) -> dict:
    return {
        "run_id": f"{arm}-s{seed}", "experiment": "exp", "arm": arm, "seed": seed,
        "duration_s": 3600.0, "hit_ratio_last10min": 0.2 if degraded else 0.9,
        "sessions_in_system_last5min": 40.0 if degraded else 10.0,
        "persistently_degraded": degraded, "turns_completed": 100, "sessions_completed": 10,
        "turns_per_s_last10min": 0.1,
    }


def test_paired_comparisons_pairs_by_seed_and_skips_missing() -> None:
    outcomes = [
        _outcome("no-burst", 1, False),
        _outcome("no-burst", 2, False),
        _outcome("no-burst", 3, True),  # no burst twin: skipped
        _outcome("burst", 1, True),
        _outcome("burst", 2, False),
        _outcome("burst", 4, True),  # no baseline twin: skipped
        _outcome("flush", 2, True),
        _outcome("flush", 3, False),
    ]
    pairs = paired_comparisons(outcomes, "no-burst")

    assert pairs["baseline_arm"] == "no-burst"
    burst, flush = pairs["comparisons"]
    assert burst["arm"] == "burst" and flush["arm"] == "flush"
    assert burst["n_pairs"] == 2
    assert [p["seed"] for p in burst["per_seed"]] == [1, 2]
    assert burst["per_seed"][0]["baseline"]["run_id"] == "no-burst-s1"
    assert burst["per_seed"][0]["arm"]["run_id"] == "burst-s1"
    assert (burst["degraded_baseline"], burst["degraded_arm"]) == (0, 1)
    assert (burst["discordant_arm_only"], burst["discordant_baseline_only"]) == (1, 0)
    assert burst["sign_test_p"] == 1.0

    assert [p["seed"] for p in flush["per_seed"]] == [2, 3]
    assert (flush["discordant_arm_only"], flush["discordant_baseline_only"]) == (1, 1)


def test_paired_comparisons_nine_of_nine() -> None:
    outcomes = [_outcome("no-burst", s, False) for s in range(9)]
    outcomes += [_outcome("burst", s, True) for s in range(9)]
    (burst,) = paired_comparisons(outcomes, "no-burst")["comparisons"]
    assert burst["discordant_arm_only"] == 9
    assert burst["sign_test_p"] == pytest.approx(0.00390625)


def test_paired_comparisons_rejects_duplicate_runs() -> None:
    with pytest.raises(ValueError, match="two runs"):
        paired_comparisons([_outcome("a", 1, False), _outcome("a", 1, True)], "a")


# --------------------------------------------------------------------------------------------
# summary.json


def _write_experiment(root: Path) -> None:
    """Two seeds x two arms (burst collapses on seed 1 only) plus one failed run."""
    samples = [sample_row(t, 12) for t in range(0, 2701, 30)]
    for seed in (1, 2):
        write_run_dir(
            root, f"no-burst-s{seed}", "no-burst", seed, HEALTHY, samples, [], 2700.0, 1200.0,
            spec=ARMS_SPEC,
        )
    write_run_dir(root, "burst-s1", "burst", 1, COLLAPSED, samples, BURST, 2700.0, 1200.0,
                  spec=ARMS_SPEC)
    write_run_dir(root, "burst-s2", "burst", 2, RECOVERED, samples, BURST, 2700.0, 1200.0,
                  spec=ARMS_SPEC)
    write_run_dir(root, "burst-s3", "burst", 3, [], [], BURST, 2700.0, 1200.0,
                  spec=ARMS_SPEC, status="failed")


def test_summary_round_trip(tmp_path: Path) -> None:
    _write_experiment(tmp_path)
    summary = write_summary(tmp_path)

    text = (tmp_path / "summary.json").read_text()
    # Strict JSON: no NaN / Infinity tokens.
    loaded = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert loaded == summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "summary.json"]

    assert summary["experiment"] == "exp"
    assert summary["incomplete_runs"] == ["burst-s3"]
    # Spec order: baseline arm first even though "burst" sorts first alphabetically.
    assert [r["run_id"] for r in summary["runs"]] == [
        "no-burst-s1", "no-burst-s2", "burst-s1", "burst-s2",
    ]
    assert summary["pairs"]["baseline_arm"] == "no-burst"
    (burst,) = summary["pairs"]["comparisons"]
    assert burst["n_pairs"] == 2 and burst["degraded_arm"] == 1
    assert burst["discordant_arm_only"] == 1 and burst["sign_test_p"] == 1.0
    assert summarize(tmp_path) == summary


def test_summary_baseline_alphabetical_without_spec_arms(tmp_path: Path) -> None:
    for arm in ("zeta", "alpha"):
        write_run_dir(tmp_path, f"{arm}-s1", arm, 1, HEALTHY, [], [], 2700.0, None)
    summary = summarize(tmp_path)
    assert summary["pairs"]["baseline_arm"] == "alpha"
    assert [c["arm"] for c in summary["pairs"]["comparisons"]] == ["zeta"]


def test_missing_turns_parquet_is_a_clear_error(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, "a-s1", "a", 1, HEALTHY, [], [], 2700.0, None)
    (run_dir / "turns.parquet").unlink()
    with pytest.raises(ValueError, match="turns.parquet"):
        load_run(run_dir)
    # the summary goes on without it and says which run and file it could not read
    (unreadable,) = summarize(tmp_path)["unreadable_runs"]
    assert unreadable["run_id"] == "a-s1" and "turns.parquet: missing turns.parquet" in unreadable["error"]


def test_malformed_files_are_clear_errors(tmp_path: Path) -> None:
    run_dir = write_run_dir(tmp_path, "a-s1", "a", 1, HEALTHY, [], [], 2700.0, None)
    (run_dir / "samples.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="samples.parquet"):
        load_run(run_dir)
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(ValueError, match="run.json"):
        load_run(run_dir)


def test_outcome_table_rows_and_text(tmp_path: Path) -> None:
    _write_experiment(tmp_path)
    summary = summarize(tmp_path)

    rows = outcome_table(summary)
    assert [row["seed"] for row in rows] == [1, 2]
    assert list(rows[0]["arms"]) == ["no-burst", "burst"]
    assert rows[0]["arms"]["burst"]["persistently_degraded"] is True
    assert rows[1]["arms"]["burst"]["persistently_degraded"] is False
    assert rows[0]["arms"]["no-burst"]["hit_ratio_last10min"] == pytest.approx(0.9)

    text = format_outcome_table(summary)
    lines = text.splitlines()
    assert "no-burst" in lines[1] and "burst" in lines[1]
    assert any(line.strip().startswith("1 |") and "YES" in line for line in lines)
    assert "discordant" in text and "p = 1" in text
    assert "burst-s3" in text  # incomplete runs are mentioned


# --------------------------------------------------------------------------------------------
# Control outcomes (recovery, cohorts, gateway waits)

from loadgen.analysis import (  # noqa: E402
    collapsed_at,
    cohort,
    first_turn_gateway_waits_s,
    format_recovery_table,
    quantile_nearest_rank,
    recovery_time_s,
)

try:
    from tests.factories import session_row
except ImportError:  # pragma: no cover
    from factories import session_row

CONTROL_S = 1200.0


def _collapse_then(hit_after: float, recover_at_s: float, duration_s: float = 3600.0) -> list[dict]:
    """Turns every 10 s: hit ratio 0.1 before recover_at_s, hit_after from then on."""
    return steady_turns(0.0, recover_at_s, 10.0, 0.1) + steady_turns(recover_at_s, duration_s, 10.0, hit_after)


def test_recovery_time_is_the_first_slid_window_from_which_all_are_recovered(tmp_path: Path) -> None:
    turns = _turns_table(_collapse_then(0.9, CONTROL_S + 450.0), tmp_path)
    # windows [1200 + 60k, +300): k = 6 holds 9 turns at 0.1 (ratio 0.66), k = 7 only 3 (0.82)
    assert recovery_time_s(turns, CONTROL_S, 3600.0) == 420.0
    assert collapsed_at(turns, CONTROL_S)


def test_no_recovery_when_a_later_window_dips_or_follow_up_is_short(tmp_path: Path) -> None:
    dip = _collapse_then(0.9, 1500.0)
    dip = [turn_row(r["finish_s"], r["prompt_tokens"], 0 if 3000 <= r["finish_s"] < 3060 else r["cached_tokens"])
           for r in dip]
    assert recovery_time_s(_turns_table(dip, tmp_path / "dip"), CONTROL_S, 3600.0) is None
    # recovered at minute 52 of 60: 8 minutes of follow-up are not the 10 the rule needs
    late = _turns_table(_collapse_then(0.9, 3120.0), tmp_path / "late")
    assert recovery_time_s(late, CONTROL_S, 3600.0) is None
    assert recovery_time_s(late, CONTROL_S, 3600.0, follow_up_s=300.0) == 1920.0


def test_a_healthy_run_recovers_at_once_and_an_empty_window_is_not_recovered(tmp_path: Path) -> None:
    healthy = _turns_table(steady_turns(0.0, 3600.0, 10.0, 0.95), tmp_path / "a")
    assert recovery_time_s(healthy, CONTROL_S, 3600.0) == 0.0 and not collapsed_at(healthy, CONTROL_S)
    silent = _turns_table(steady_turns(0.0, 1500.0, 10.0, 0.95) + steady_turns(2400.0, 3600.0, 10.0, 0.95),
                          tmp_path / "b")
    # [2100, 2400) is the last window with no finished turn; [2160, 2460) has turns again
    assert recovery_time_s(silent, CONTROL_S, 3600.0) == 960.0
    assert collapsed_at(silent, 2400.0)  # nothing finished in the 5 minutes before: degraded
    assert not collapsed_at(silent, 0.0)


def test_nearest_rank_quantiles_keep_unfinished_sessions_infinite() -> None:
    assert quantile_nearest_rank(np.array([4.0, 1.0, 3.0, 2.0]), 0.5) == 2.0
    assert quantile_nearest_rank(np.array([4.0, 1.0, 3.0, 2.0]), 0.9) == 4.0
    assert quantile_nearest_rank(np.array([1.0, np.inf, 2.0]), 0.5) == 2.0
    assert quantile_nearest_rank(np.array([1.0, np.inf, 2.0]), 0.9) == np.inf
    assert math.isnan(quantile_nearest_rank(np.zeros(0), 0.5))


def _sessions_table(rows: list[dict], tmp_path: Path) -> pa.Table:
    run_dir = write_run_dir(tmp_path, "r-s1", "r", 1, [], [], [], 3600.0, None, sessions_rows=rows)
    return load_run(run_dir).sessions


def test_cohort_counts_arrivals_in_a_half_open_window(tmp_path: Path) -> None:
    sessions = _sessions_table([
        session_row(1100.0, 1100.0, 1400.0),  # before the window
        session_row(1200.0, 1250.0, 1500.0),  # done after 300 s
        session_row(1300.0, 1300.0, 2300.0),  # done after 1000 s
        session_row(2000.0),                  # still waiting at the end
        session_row(2400.0, 2400.0, 2500.0),  # the window is [1200, 2400)
    ], tmp_path)
    c = cohort(sessions, 1200.0, 2400.0)
    assert (c.num_sessions, c.num_completed) == (3, 2) and c.done_fraction == pytest.approx(2 / 3)
    assert sorted(c.arrival_to_completion_s) == [300.0, 1000.0, np.inf]


def test_first_turn_waits_count_never_admitted_sessions_until_the_end(tmp_path: Path) -> None:
    sessions = _sessions_table([
        session_row(100.0, 100.0, 900.0),
        session_row(200.0, 260.0, 1000.0),
        session_row(1000.0),               # never admitted: waited 2600 s by the end
        session_row(2000.0, 2500.0),       # after the first phase
    ], tmp_path)
    waits_s = first_turn_gateway_waits_s(sessions, arrived_before_s=1800.0, duration_s=3600.0)
    assert sorted(waits_s) == [0.0, 60.0, 2600.0]


def _control_results(root: Path) -> None:
    """Arm none stays collapsed after control at 1200 s; arm budgeter recovers 7 minutes in."""
    spec = {"name": "exp", "arms": [{"name": "none"}, {"name": "budgeter"}]}
    for seed in (1, 2):
        cohort_rows = [session_row(1300.0, 1300.0, 1900.0 + 60 * seed), session_row(1500.0, 1700.0, 2100.0),
                       session_row(100.0, 100.0, 800.0)]
        write_run_dir(root, f"none-s{seed}", "none", seed, _collapse_then(0.1, 3600.0), [], BURST, 3600.0,
                      1200.0, spec=spec, controller="none", control_start_s=CONTROL_S,
                      sessions_rows=[session_row(1300.0, 1300.0), session_row(1500.0, 1500.0)])
        write_run_dir(root, f"budgeter-s{seed}", "budgeter", seed, _collapse_then(0.9, CONTROL_S + 450.0), [],
                      BURST, 3600.0, 1200.0, spec=spec, controller="budgeter", control_start_s=CONTROL_S,
                      sessions_rows=cohort_rows)


def test_summary_gains_control_fields_and_a_recovery_table(tmp_path: Path) -> None:
    _control_results(tmp_path)
    summary = summarize(tmp_path)
    by_id = {r["run_id"]: r for r in summary["runs"]}
    ctl = by_id["budgeter-s1"]
    assert (ctl["controller"], ctl["control_start_s"], ctl["collapsed_at_control"]) == ("budgeter", 1200.0, True)
    assert (ctl["recovered"], ctl["recovery_time_min"]) == (True, 7.0)
    assert ctl["cohort_sessions_after_control"] == 2 and ctl["cohort_done_after_control"] == 1.0
    assert ctl["cohort_completion_median_min"] == pytest.approx(10.0)  # nearest rank of {11, 10} min
    assert ctl["gateway_wait_p90_first_turn_s"] == 200.0
    stuck = by_id["none-s2"]
    assert (stuck["recovered"], stuck["recovery_time_min"], stuck["cohort_done_after_control"]) == (False, None, 0.0)
    assert stuck["cohort_completion_median_min"] is None  # unfinished: no number to give

    none_row, budgeter_row = summary["recovery"]
    assert (none_row["arm"], none_row["num_collapsed"], none_row["num_recovered"]) == ("none", 2, 0)
    assert budgeter_row["basis"] == "collapsed" and budgeter_row["num_recovered"] == 2
    assert budgeter_row["recovery_time_min_median"] == 7.0 and budgeter_row["cohort_sessions"] == 4
    assert budgeter_row["cohort_completion_p90_min"] == pytest.approx(12.0)  # pooled: 10, 10, 11, 12 min
    json.dumps(summary, allow_nan=False)

    text = format_recovery_table(summary)
    lines = text.splitlines()
    assert lines[0] == "Recovery: experiment exp"
    assert lines[2].split() == ["none", "none", "20", "2/2", "0/2", "-", "0.100", "0.00", "n/f", "n/f"]
    assert lines[3].split() == ["budgeter", "budgeter", "20", "2/2", "2/2", "7", "(7)", "0.900", "1.00",
                                "10.0", "12.0"]


def test_recovery_times_under_five_minutes_read_less_than_five(tmp_path: Path) -> None:
    _control_results(tmp_path)
    summary = summarize(tmp_path)
    summary["recovery"][1]["recovery_time_min_median"] = 3.0
    summary["recovery"][1]["recovery_time_min_max"] = 4.0
    assert "<5 (<5)" in format_recovery_table(summary)


def test_no_recovery_table_without_control(tmp_path: Path) -> None:
    write_run_dir(tmp_path, "a-s1", "a", 1, steady_turns(0.0, 3600.0, 10.0, 0.9), [], [], 3600.0, None)
    summary = summarize(tmp_path)
    assert summary["recovery"] is None and format_recovery_table(summary) is None
    run = summary["runs"][0]  # written without sessions.parquet: cohort measures are undefined
    assert run["cohort_sessions_after_control"] == 0 and run["cohort_done_after_control"] is None
    assert run["gateway_wait_p90_first_turn_s"] is None and run["recovered"] is True


def test_the_degraded_stretch_a_run_ends_in_starts_after_its_last_healthy_window(tmp_path: Path) -> None:
    from loadgen.analysis.windows import degraded_stretch_start_s

    # windows after te = 1200: [1200, 1500) degraded, [1500, 1800) healthy, then degraded to the end
    assert degraded_stretch_start_s(_turns_table(RELAPSED, tmp_path), 1200.0, 2700.0) == 1800.0
    assert degraded_stretch_start_s(_turns_table(COLLAPSED, tmp_path), 1200.0, 2700.0) == 1500.0
    assert degraded_stretch_start_s(_turns_table(RECOVERED, tmp_path), 1200.0, 2700.0) is None
