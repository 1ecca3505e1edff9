"""Paired comparisons of two arms: per-seed differences, bootstrap intervals, sign test, CLI."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.analysis.uncertainty import bootstrap_interval, compare_arms, paired_difference
from loadgen.cli import main
from tests.factories import steady_turns, write_run_dir


def test_bootstrap_interval_is_the_same_for_a_seed_and_moves_with_another():
    values = list(np.random.Generator(np.random.PCG64(7)).normal(1.0, 2.0, size=12))
    assert bootstrap_interval(values, seed=3) == bootstrap_interval(values, seed=3)
    assert bootstrap_interval(values, num_resamples=50, seed=3) != bootstrap_interval(values, num_resamples=50, seed=4)
    assert bootstrap_interval([], seed=3) == (None, None)


def test_bootstrap_interval_covers_the_true_difference_in_most_synthetic_experiments():
    """Twelve seeds whose B - A is 0.5 plus noise: the 95% interval of the median should hold
    0.5 in about 95% of experiments (percentile bootstrap of a median runs a little narrow)."""
    rng = np.random.Generator(np.random.PCG64(11))
    covered = 0
    num_experiments = 200
    for i in range(num_experiments):
        a = {s: float(v) for s, v in enumerate(rng.normal(10.0, 1.0, size=12))}
        b = {s: a[s] + 0.5 + float(rng.normal(0.0, 0.3)) for s in a}
        lo, hi = paired_difference(a, b, num_resamples=2000, seed=i)["ci95"]
        covered += lo <= 0.5 <= hi
    assert covered / num_experiments >= 0.88


def test_paired_difference_reports_medians_and_the_exact_sign_test():
    a = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 2.0, 6: None}
    b = {1: 2.0, 2: 3.0, 3: 1.5, 4: 1.0, 5: 1.0, 6: 9.0, 7: 4.0}
    result = paired_difference(a, b)
    assert result["n"] == 5  # seed 6 has no A value, seed 7 no A run
    assert [p["diff"] for p in result["per_seed"]] == [1.0, 2.0, 0.5, 0.0, -1.0]
    assert result["median_diff"] == 0.5
    assert (result["num_b_higher"], result["num_b_lower"]) == (3, 1)
    assert result["sign_test_p"] == pytest.approx(0.625)  # 2 * (1 + 4) / 16


def _two_arm_results(root):
    spec = {"name": "exp", "arms": [{"name": "a"}, {"name": "b"}]}
    for seed in (1, 2, 3, 4, 5):
        write_run_dir(root, f"a-s{seed}", "a", seed, steady_turns(0.0, 1200.0, 10.0, 0.5), [], [], 1200.0, None,
                      spec=spec)
        write_run_dir(root, f"b-s{seed}", "b", seed, steady_turns(0.0, 1200.0, 10.0, 0.5 + 0.05 * seed), [], [],
                      1200.0, None, spec=spec)


def test_compare_arms_pairs_any_two_arms_by_seed(tmp_path):
    from loadgen.analysis import summarize

    _two_arm_results(tmp_path)
    comparison = compare_arms(summarize(tmp_path), "a", "b")
    hit = next(m for m in comparison["metrics"] if m["metric"] == "hit ratio, last 10 min")
    assert hit["n"] == 5 and hit["median_diff"] == pytest.approx(0.15)
    assert hit["num_b_higher"] == 5 and hit["sign_test_p"] == pytest.approx(0.0625)
    lo, hi = hit["ci95"]
    assert 0.05 <= lo <= 0.15 <= hi <= 0.25
    with pytest.raises(ValueError, match="no completed runs of arm 'c'"):
        compare_arms(summarize(tmp_path), "a", "c")


def test_report_compare_arms_prints_the_comparison_and_rejects_bad_arms(tmp_path, capsys):
    _two_arm_results(tmp_path)
    assert main(["report", str(tmp_path), "--no-figures", "--compare-arms", "b,a"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("hit ratio, last 10 min"))
    assert line.split()[-3:] == ["0", "5", "0.0625"]  # B = a is lower on every seed
    assert main(["report", str(tmp_path), "--no-figures", "--compare-arms", "a"]) == 2
    assert "--compare-arms: expected two different arm names as A,B" in capsys.readouterr().err
    # a mistyped arm is refused before anything is printed or drawn, not after the figures
    assert main(["report", str(tmp_path), "--compare-arms", "a,c"]) == 2
    captured = capsys.readouterr()
    assert "--compare-arms: no completed runs of arm 'c'; arms with runs: ['a', 'b']" in captured.err
    assert captured.out == "" and not (tmp_path / "figures").exists()
