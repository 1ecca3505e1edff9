"""``loadgen compare`` scores the real end states against the twin's P(persistently degraded)."""

import json

import pytest

from loadgen.analysis.compare import compare_runs, format_comparison
from loadgen.analysis.probability import score_probabilities
from tests.factories import steady_turns, write_run_dir


def _results(root, hits: dict):
    """One run per run id: healthy (hit 0.9 throughout) or degraded after minute 10 (hit 0.1)."""
    for run_id, hit in hits.items():
        turns = steady_turns(0, 600, 5, 0.9) + steady_turns(600, 1800, 5, hit)
        write_run_dir(root, run_id, run_id.rsplit("-", 1)[0], int(run_id.rsplit("s", 1)[1]), turns, [], [], 1800, 600)
    return root


def test_the_brier_score_certain_agreement_and_borderline_runs():
    replicates = {"num_replicates": 4, "runs": {"a-s1": {"p_degraded": 1.0}, "a-s2": {"p_degraded": 0.0},
                                                "a-s3": {"p_degraded": 0.5}, "a-s4": {"p_degraded": 0.0}}}
    score = score_probabilities(replicates, {"a-s1": True, "a-s2": False, "a-s3": True, "a-s4": True})
    assert score["brier_score"] == pytest.approx((0 + 0 + 0.25 + 1) / 4)
    assert score["num_certain"] == 3 and score["certain_agreement"] == pytest.approx(2 / 3)
    assert score["borderline"] == ["a-s3"]


def test_compare_reads_the_twins_replicates_and_names_borderline_seeds(tmp_path):
    real = _results(tmp_path / "real", {"burst-s1": 0.1, "burst-s2": 0.9})
    sim = _results(tmp_path / "sim", {"burst-s1": 0.1, "burst-s2": 0.1})
    (sim / "replicates.json").write_text(json.dumps({"num_replicates": 5, "runs": {
        "burst-s1": {"degraded": [True] * 5, "p_degraded": 1.0},
        "burst-s2": {"degraded": [True, False, True, False, False], "p_degraded": 0.4}}}))
    result = compare_runs(real, sim, width_s=300)
    score = result["probabilities"]
    assert [r["real_degraded"] for r in score["runs"]] == [True, False]
    assert score["brier_score"] == pytest.approx((0 + 0.16) / 2)
    assert score["borderline"] == ["burst-s2"] and score["certain_agreement"] == 1.0
    text = format_comparison(result)
    assert "borderline: burst-s2" in text and "Brier score 0.080" in text


def test_without_replicates_compare_has_no_probabilities(tmp_path):
    real = _results(tmp_path / "real", {"burst-s1": 0.1})
    result = compare_runs(real, _results(tmp_path / "sim", {"burst-s1": 0.1}), width_s=300)
    assert result["probabilities"] is None and "Brier" not in format_comparison(result)
