"""Latency, SLO goodput, per-session results and windows.parquet on small hand-made runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from loadgen.analysis import load_run, summarize
from loadgen.analysis.latency import format_latency_table, nearest_rank, nearest_rank_by_group, turn_latencies
from loadgen.analysis.sessions import session_results
from loadgen.analysis.windows_table import write_windows
from tests.factories import session_row, turn_row, write_run_dir

SPEC = {"name": "exp", "arms": [{"name": "a"}]}


def _turn(finish_s: float, ready_s: float, first_token_s: float, itl_s: float, admit_s: float | None = None,
          session_id: int = 0, turn_index: int = 0, **extra) -> dict:
    return turn_row(finish_s, 1000, 500, ready_s=ready_s, admit_s=ready_s if admit_s is None else admit_s,
                    first_token_s=first_token_s, itl_mean_s=itl_s, itl_max_s=itl_s, session_id=session_id,
                    turn_index=turn_index, **extra)


# Ten turns finishing at 10, 20, ..., 100 s with TTFT 1..10 s, ITL 0.01..0.10 s, turn latency
# 2..20 s; the last three waited at the gateway 1, 2 and 3 s; one failed turn that must not count.
TURNS = [_turn(10.0 * k, 10.0 * k - 2.0 * k, 10.0 * k - 2.0 * k + k, 0.01 * k,
               admit_s=10.0 * k - 2.0 * k + max(0, k - 7), session_id=k % 2, turn_index=k // 2)
         for k in range(1, 11)]
FAILED = turn_row(55.0, 1000, 0, error="HTTP 500", ready_s=50.0, admit_s=50.0, first_token_s=math.nan,
                  session_id=0, turn_index=9)


def _run(tmp_path: Path, turns=TURNS, duration_s: float = 120.0, spec=SPEC, sessions=None) -> Path:
    return write_run_dir(tmp_path, "a-s1", "a", 1, turns, [], [], duration_s, None, spec=spec,
                         sessions_rows=sessions)


def test_latency_percentiles_match_hand_computed_nearest_ranks(tmp_path):
    _run(tmp_path, TURNS + [FAILED])
    run = summarize(tmp_path)["runs"][0]
    lat = run["latency"]
    assert lat["num_turns"] == 10  # the failed turn is not a latency
    # nearest rank: p50 = 5th smallest, p90 = 9th, p99 = 10th of ten values
    assert lat["ttft_s"] == {"p50": 5.0, "p90": 9.0, "p99": 10.0, "mean": 5.5}
    assert lat["turn_s"] == {"p50": 10.0, "p90": 18.0, "p99": 20.0, "mean": 11.0}
    assert lat["itl_s"]["p50"] == pytest.approx(0.05) and lat["itl_s"]["p99"] == pytest.approx(0.10)
    assert lat["gateway_wait_s"] == {"p50": 0.0, "p90": 2.0, "p99": 3.0, "mean": 0.6}
    # the last 10 minutes of a 120 s run is the whole run; a 65 s window keeps turns finishing >= 55 s
    assert run["latency_last10min"] == lat
    json.dumps(run, allow_nan=False)


def test_latency_of_the_last_ten_minutes_only_counts_turns_finishing_in_them(tmp_path):
    _run(tmp_path, TURNS, duration_s=650.0)  # last 10 min: [50, 650] holds the turns at 50..100 s
    last = summarize(tmp_path)["runs"][0]["latency_last10min"]
    assert last["num_turns"] == 6
    assert last["ttft_s"]["p50"] == 7.0  # TTFT 5..10: the 3rd smallest of six
    assert last["ttft_s"]["mean"] == pytest.approx(7.5)


def test_slo_goodput_when_every_none_or_half_of_the_turns_meet_it(tmp_path):
    cases = {"every": ({"ttft_s": 10.0}, 10), "none": ({"ttft_s": 0.5}, 0), "half": ({"ttft_s": 5.0}, 5),
             "half by turn latency and itl": ({"turn_s": 100.0, "itl_s": 0.05}, 5)}
    for name, (slo, num_met) in cases.items():
        root = tmp_path / name.replace(" ", "-")
        _run(root, spec={**SPEC, "slo": slo})
        run = summarize(root)["runs"][0]
        assert run["slo_turns_met"] == num_met, name
        assert run["slo_turns_met_share"] == pytest.approx(num_met / 10), name
        assert run["slo_goodput_turns_per_s"] == pytest.approx(num_met / 120.0), name


def test_tasks_meet_the_slo_by_completion_time_and_their_turns_percentile(tmp_path):
    sessions = [session_row(0.0, 0.0, 300.0, session_id=0),  # 5 min, turns 2,4,..,10 (TTFT 2..10)
                session_row(10.0, 10.0, 2000.0, session_id=1),  # 33 min: misses task_min 30
                session_row(3000.0, 3000.0, session_id=2)]  # unfinished
    slo = {"task_min": 30, "ttft_s": 10.0, "percentile": 50}
    _run(tmp_path, duration_s=3600.0, spec={**SPEC, "slo": slo}, sessions=sessions)
    run = summarize(tmp_path)["runs"][0]
    assert run["slo_tasks_met"] == 1
    # counted: tasks arriving at least task_s (1800 s) before the end: the first two
    assert run["slo_tasks_counted"] == 2 and run["slo_tasks_met_share"] == 0.5
    assert run["tasks_arrived"] == 3 and run["tasks_finished"] == 2
    assert run["task_completion_p50_min"] == 5.0 and run["task_completion_p90_min"] == pytest.approx(1990 / 60)

    strict = tmp_path / "strict"  # the p50 TTFT of session 0's turns is 6 s: a 5 s target fails it
    _run(strict, duration_s=3600.0, spec={**SPEC, "slo": {**slo, "ttft_s": 5.0}}, sessions=sessions)
    assert summarize(strict)["runs"][0]["slo_tasks_met"] == 0


def test_runs_without_an_slo_have_null_goodput_and_old_fields_unchanged(tmp_path):
    _run(tmp_path)
    summary = summarize(tmp_path)
    run = summary["runs"][0]
    assert run["slo_goodput_turns_per_s"] is None and run["slo_tasks_met_share"] is None
    assert run["hit_ratio_last10min"] == 0.5 and run["turns_completed"] == 10
    row = summary["latency_by_arm"][0]
    assert row["arm"] == "a" and row["num_turns"] == 10 and row["ttft_s"]["p90"] == 9.0
    table = format_latency_table(summary)
    lines = table.splitlines()
    assert lines[1].split()[:4] == ["arm", "TTFT", "p50", "p90"]
    assert lines[2].split()[:4] == ["a", "5.0s", "9.0s", "10.0s"]
    assert all(len(line) < 120 for line in lines)
    # three of the ten turns waited at the gateway: the table says which share it held
    assert row["turns_held"] == 3
    end = lines[1].index(" held") + len(" held")  # right-aligned under its header
    assert lines[2][end - 4:end] == " 30%"


def test_per_session_results_join_sessions_and_their_turns(tmp_path):
    sessions = [session_row(0.0, 0.0, 300.0, session_id=0), session_row(5.0, 7.0, session_id=1)]
    run_dir = _run(tmp_path, sessions=sessions)
    table = session_results(load_run(run_dir)).to_pylist()
    s0, s1 = table
    # session 0: turns k = 2, 4, 6, 8, 10; turn latencies 2k; turns 8 and 10 waited 1 and 3 s (parked)
    assert s0["turn_latency_total_s"] == pytest.approx(2 * (2 + 4 + 6 + 8 + 10))
    assert s0["turn_latency_mean_s"] == pytest.approx(12.0)
    assert s0["parked_s"] == pytest.approx(1.0 + 3.0)
    assert s0["cached_share"] == 0.5 and s0["task_s"] == 300.0 and s0["status"] == "completed"
    # session 1: unfinished, waited 2 s for admission; its turn 0 (k = 1) is not parked time
    assert math.isnan(s1["task_s"]) and s1["first_wait_s"] == 2.0
    assert s1["parked_s"] == pytest.approx(2.0)  # k = 9 waited 2 s at a turn boundary


def test_windows_parquet_has_one_row_per_minute_with_rates_and_percentiles(tmp_path):
    run_dir = _run(tmp_path, TURNS, duration_s=120.0)
    path = write_windows(run_dir)
    rows = pq.read_table(path).to_pylist()
    assert [r["window_start_s"] for r in rows] == [0.0, 60.0]
    first, second = rows
    # [0, 60): turns at 10..50 s; [60, 120]: turns at 60..100 s
    assert (first["num_turns"], second["num_turns"]) == (5, 5)
    assert first["turns_per_s"] == pytest.approx(5 / 60) and first["hit_ratio"] == 0.5
    assert first["prompt_tokens_per_s"] == pytest.approx(5000 / 60)
    assert first["generated_tokens_per_s"] == pytest.approx(500 / 60)  # factory turns output 100 tokens
    assert first["ttft_p50_s"] == 3.0 and first["ttft_p99_s"] == 5.0 and second["ttft_p90_s"] == 10.0
    assert second["gateway_wait_p99_s"] == 3.0


def test_percentiles_by_window_are_each_windows_nearest_rank():
    rng = np.random.default_rng(7)
    for num_groups, n in ((1, 0), (5, 1), (9, 40), (90, 3000)):
        values = rng.exponential(size=n).round(2)  # ties included
        values[rng.random(n) < 0.1] = np.nan  # a one-token turn's ITL, say
        group = np.sort(rng.integers(0, num_groups, size=n))
        qs = (0.5, 0.9, 0.99)
        for q, got in zip(qs, nearest_rank_by_group(values, group, num_groups, qs)):
            want = [nearest_rank(values[group == k], q) for k in range(num_groups)]
            np.testing.assert_array_equal(got, want)  # NaN where a window has no finite value
