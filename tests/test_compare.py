import json

import pytest

from loadgen.analysis.compare import compare_runs, format_comparison, write_comparison
from tests.factories import steady_turns, write_run_dir


def _dir(root, hit_after_trigger):
    turns = steady_turns(0, 600, 5, 0.9) + steady_turns(600, 1800, 5, hit_after_trigger)
    write_run_dir(root, "burst-s1", "burst", 1, turns, [], [{"kind": "burst", "start_s": 300, "end_s": 600}],
                  1800, 600)
    write_run_dir(root, "only-here-s1", "only-here", 1, steady_turns(0, 1800, 5, 0.9), [], [], 1800, 600)
    return root


def test_compare_matches_runs_and_scores_agreement(tmp_path):
    real = _dir(tmp_path / "real", 0.1)
    sim = _dir(tmp_path / "sim", 0.2)
    (sim / "runs" / "only-here-s1").rename(sim / "runs" / "elsewhere-s1")
    result = compare_runs(real, sim, width_s=300)
    (run,) = result["runs"]
    assert run["run_id"] == "burst-s1" and run["end_state_agrees"]
    assert run["real"]["persistently_degraded"] and run["sim"]["persistently_degraded"]
    # 2 windows at 0.9 on both sides, 4 windows differing by 0.1
    assert run["hit_ratio_mean_abs_diff"] == pytest.approx(4 * 0.1 / 6, abs=1e-6)
    assert result["only_real"] == ["only-here-s1"] and result["only_sim"] == ["elsewhere-s1"]
    assert "end-state agreement 100%" in format_comparison(result)
    paths = write_comparison(result, tmp_path / "out")
    assert paths[0].read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "out" / "compare.json").read_text())["end_state_agreement"] == 1.0


def test_disagreeing_end_states_are_counted(tmp_path):
    result = compare_runs(_dir(tmp_path / "real", 0.1), _dir(tmp_path / "sim", 0.9), width_s=300)
    burst = [r for r in result["runs"] if r["run_id"] == "burst-s1"][0]
    assert not burst["end_state_agrees"] and result["end_state_agreement"] == 0.5


def test_no_common_runs_is_an_error(tmp_path):
    write_run_dir(tmp_path / "a", "x-s1", "x", 1, [], [], [], 600, None)
    write_run_dir(tmp_path / "b", "y-s1", "y", 1, [], [], [], 600, None)
    with pytest.raises(ValueError, match="no run ids in common"):
        compare_runs(tmp_path / "a", tmp_path / "b")
