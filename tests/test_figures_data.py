"""What the latency figures are drawn from: collapsed runs apart from healthy ones (a pooled
median hides a collapsed minority), and no All-NaN warning where a window has no first token."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from loadgen.analysis import summarize
from loadgen.analysis.latency import nearest_rank, turn_latencies
from loadgen.analysis.latency_figures import (collapsed_run_ids, figure_latency_over_time, figure_ttft_vs_depth,
                                              latency_over_time_series, median_over_runs, run_groups,
                                              ttft_depth_series)
from loadgen.analysis.runs import load_run
from tests.factories import sample_row, turn_row, write_run_dir

DURATION_S = 1800.0


def _turns(hit_ratio: float, ttft_s: float) -> list[dict]:
    # a turn every 10 s, turn index cycling 0..4 and prompts growing with it
    rows = []
    for i in range(int(DURATION_S / 10) - 1):
        finish_s = 10.0 + 10 * i
        prompt = 2000 * (1 + i % 5)
        rows.append(turn_row(finish_s, prompt, int(prompt * hit_ratio), turn_index=i % 5, ready_s=finish_s - ttft_s - 1,
                             admit_s=finish_s - ttft_s - 1, first_token_s=finish_s - 1.0))
    return rows


@pytest.fixture
def one_collapsed_of_four(tmp_path):
    for seed in range(1, 5):
        collapsed = seed == 4
        write_run_dir(tmp_path, f"burst-s{seed}", "burst", seed,
                      _turns(0.1 if collapsed else 0.9, 120.0 if collapsed else 0.2),
                      [sample_row(t, 10) for t in range(0, int(DURATION_S), 60)], [], DURATION_S, None)
    summary = summarize(tmp_path)
    runs = [load_run(tmp_path / "runs" / f"burst-s{s}") for s in range(1, 5)]
    return summary, runs


def test_collapsed_runs_are_drawn_apart_in_ttft_vs_depth(one_collapsed_of_four):
    summary, runs = one_collapsed_of_four
    collapsed = collapsed_run_ids(summary)
    assert collapsed == {"burst-s4"}
    groups = dict(run_groups(runs, collapsed))
    assert [r.run_json["seed"] for r in groups["healthy"]] == [1, 2, 3]
    assert [r.run_json["seed"] for r in groups["collapsed"]] == [4]
    healthy, broken = ttft_depth_series(groups["healthy"]), ttft_depth_series(groups["collapsed"])
    assert list(broken["turn_index"]) == [0, 1, 2, 3, 4]
    assert np.allclose(healthy["median_by_turn_s"], 0.2) and np.allclose(broken["median_by_turn_s"], 120.0)
    by_prompt = broken["median_by_prompt_s"][np.isfinite(broken["median_by_prompt_s"])]  # empty deciles: NaN
    assert len(by_prompt) >= 3 and np.allclose(by_prompt, 120.0)
    # pooled, as the figure drew it before: the median at every depth is the healthy runs'
    pooled = np.concatenate([turn_latencies(r.turns).ttft_s for r in runs])
    assert nearest_rank(pooled, 0.5) == pytest.approx(0.2)
    fig = figure_ttft_vs_depth({"burst": runs}, {"burst": "C0"}, "exp", collapsed)
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert labels == ["burst, healthy (3)", "burst, collapsed (1)"]
    assert np.allclose(fig.axes[0].lines[1].get_ydata(), 120.0)


def test_the_latency_over_time_figure_shows_a_collapsed_minority(one_collapsed_of_four):
    summary, runs = one_collapsed_of_four
    groups = dict(run_groups(runs, collapsed_run_ids(summary)))
    _, healthy = latency_over_time_series(groups["healthy"], "ttft_p90_s")
    _, broken = latency_over_time_series(groups["collapsed"], "ttft_p90_s")
    assert np.nanmax(healthy) < 1.0 and np.nanmin(broken) > 100.0
    fig = figure_latency_over_time({"burst": runs}, {"burst": "C0"}, "exp", collapsed_run_ids(summary))
    ys = {line.get_label(): line.get_ydata() for line in fig.axes[0].lines if not line.get_label().startswith("_")}
    assert np.nanmin(ys["collapsed (1): ttft p90"]) > 100.0
    assert np.nanmax(ys["healthy (3): ttft p90"]) < 1.0


def test_windows_without_a_first_token_give_nan_without_a_warning(tmp_path):
    values = np.array([[math.nan, 1.0, math.inf], [math.nan, 3.0, math.nan]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        median = median_over_runs(values)
    assert math.isnan(median[0]) and median[1] == 2.0 and math.isnan(median[2])
    # a chat run whose first minutes have no first token (a text-only endpoint's TTFT unknown)
    rows = [turn_row(10.0 + 10 * i, 1000, 900, first_token_s=math.nan if i < 30 else 10.0 * i + 9.0)
            for i in range(170)]
    write_run_dir(tmp_path, "chat-s1", "chat", 1, rows, [sample_row(0, 1)], [], DURATION_S, None)
    run = load_run(tmp_path / "runs" / "chat-s1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure_latency_over_time({"chat": [run]}, {"chat": "C0"}, "exp", set())
