"""The flags beside persistently_degraded: ends_degraded, degraded_windows_after_trigger and the
"degraded only in its final window" label, on synthetic recorded tables (docs/results-format.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.analysis import format_outcome_table, summarize
from tests.factories import sample_row, steady_turns, write_run_dir

SPEC = {"name": "exp", "arms": [{"name": "no-burst"}, {"name": "burst"}]}
BURST = [{"kind": "burst", "start_s": 900.0, "end_s": 1200.0}]
TRIGGER_END_S, DURATION_S = 1200.0, 2700.0  # five 5-minute windows after the trigger

HEALTHY = steady_turns(0.0, 2700.0, 10.0, 0.9)
# hit ratio 0.47 from 1500 on: degraded at the documented threshold 0.5, healthy at 0.45
BORDERLINE = steady_turns(0.0, 1500.0, 10.0, 0.9) + steady_turns(1500.0, 2700.0, 10.0, 0.47)
# healthy until the final window [2400, 2700), then 0.2: the last 10 minutes average 0.55
FINAL_WINDOW_ONLY = steady_turns(0.0, 2400.0, 10.0, 0.9) + steady_turns(2400.0, 2700.0, 10.0, 0.2)
# degraded in windows [1200, 1500) and [1500, 1800), healthy after
RECOVERED = (steady_turns(0.0, 1200.0, 10.0, 0.9) + steady_turns(1200.0, 1800.0, 10.0, 0.1)
             + steady_turns(1800.0, 2700.0, 10.0, 0.9))


def _experiment(root: Path) -> dict:
    samples = [sample_row(t, 10) for t in range(0, 2701, 30)]
    for seed, burst_rows in ((1, BORDERLINE), (2, FINAL_WINDOW_ONLY), (3, RECOVERED)):
        write_run_dir(root, f"no-burst-s{seed}", "no-burst", seed, HEALTHY, samples, [], DURATION_S,
                      TRIGGER_END_S, spec=SPEC)
        write_run_dir(root, f"burst-s{seed}", "burst", seed, burst_rows, samples, BURST, DURATION_S,
                      TRIGGER_END_S, spec=SPEC)
    return summarize(root)


def _flags(summary: dict, arm: str, seed: int) -> tuple:
    (run,) = [r for r in summary["runs"] if r["arm"] == arm and r["seed"] == seed]
    return (run["persistently_degraded"], run["ends_degraded"], run["degraded_windows_after_trigger"],
            run["degraded_only_in_final_window"])


def test_summary_runs_carry_how_a_run_ends_and_how_much_of_it_was_degraded(tmp_path: Path) -> None:
    summary = _experiment(tmp_path)
    assert _flags(summary, "burst", 1) == (True, True, pytest.approx(4 / 5), False)
    assert _flags(summary, "burst", 2) == (True, False, pytest.approx(1 / 5), True)
    assert _flags(summary, "burst", 3) == (False, False, pytest.approx(2 / 5), False)
    for seed in (1, 2, 3):
        assert _flags(summary, "no-burst", seed) == (False, False, 0.0, False)
    # the published comparison is unchanged: a final-window-only run still counts as degraded
    (burst,) = summary["pairs"]["comparisons"]
    assert (burst["degraded_arm"], burst["degraded_baseline"], burst["discordant_arm_only"]) == (2, 0, 2)


@pytest.mark.parametrize("pending,share", [(3, 2 / 5), (0, 0.0)], ids=["stalled", "idle"])
def test_a_run_with_no_turns_at_the_end_ends_degraded(tmp_path: Path, pending: int, share: float) -> None:
    stopped = steady_turns(0.0, 1900.0, 10.0, 0.9)  # nothing finishes in the last 10 minutes
    # three sessions in the system all along: waiting for the engine (stalled), or thinking (idle)
    samples = [sample_row(t, 3, sessions_thinking=3 - pending) for t in range(0, 2700, 10)]
    write_run_dir(tmp_path, "burst-s1", "burst", 1, stopped, samples, BURST, DURATION_S, TRIGGER_END_S, spec=SPEC)
    (run,) = summarize(tmp_path)["runs"]
    assert run["hit_ratio_last10min"] is None and run["ends_degraded"] is True
    # [2100, 2400) and [2400, 2700) have no finished turn: degraded when requests were pending in
    # them, else idle and not judged (three healthy windows before)
    assert run["degraded_windows_after_trigger"] == pytest.approx(share)
    assert run["persistently_degraded"] is (pending > 0)


def test_a_single_window_after_the_trigger_is_not_labelled_final_window_only(tmp_path: Path) -> None:
    # a 10-minute run whose burst ends at minute 3: one full window [180, 480), degraded
    rows = steady_turns(0.0, 180.0, 10.0, 0.9) + steady_turns(180.0, 600.0, 10.0, 0.2)
    write_run_dir(tmp_path, "burst-s1", "burst", 1, rows, [], BURST, 600.0, 180.0, spec=SPEC)
    (run,) = summarize(tmp_path)["runs"]
    assert run["persistently_degraded"] is True and run["degraded_windows_after_trigger"] == 1.0
    assert run["degraded_only_in_final_window"] is False


def test_printed_table_shows_the_flags_and_labels_final_window_only_runs(tmp_path: Path) -> None:
    text = format_outcome_table(_experiment(tmp_path))
    lines = text.splitlines()
    assert lines[2].split("|")[2].split() == ["hit10m", "sess5m", "degraded", "ends", "degwin"]
    rows = {int(line.split("|")[0]): [cell.split() for cell in line.split("|")[1:]]
            for line in lines[3:6]}
    assert rows[1][1][2:] == ["YES", "YES", "0.80"]
    assert rows[2][1][2:] == ["final", "no", "0.20"]
    assert rows[3][1][2:] == ["no", "no", "0.40"]
    assert rows[1][0][2:] == ["no", "no", "0.00"]
    (comparison,) = [line for line in lines if line.startswith("burst vs no-burst")]
    assert "persistently degraded 2/3 (burst) vs 0/3 (no-burst)" in comparison
    assert "only in the final window: 1 (burst) / 0 (no-burst)" in comparison
    assert comparison.endswith("ends degraded 1/3 (burst) vs 0/3 (no-burst)")
