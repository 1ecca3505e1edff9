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


def test_two_arms_that_end_alike_are_both_visible_in_ttft_vs_depth(one_collapsed_of_four):
    _, runs = one_collapsed_of_four
    healthy = runs[:3]
    fig = figure_ttft_vs_depth({"no-burst": healthy, "burst": healthy}, {"no-burst": "C0", "burst": "C1"}, "exp",
                               collapsed=set())
    first, second = fig.axes[0].lines
    assert np.array_equal(first.get_ydata(), second.get_ydata())  # the same medians: one would hide the other
    # the earlier arm is the wider line beneath, the later one drawn over it
    assert first.get_linewidth() >= second.get_linewidth() + 2 and first.get_zorder() < second.get_zorder()


def test_log_axes_read_as_plain_numbers(one_collapsed_of_four):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    summary, runs = one_collapsed_of_four
    healthy = runs[:3]  # TTFT 0.2 s throughout: less than a decade, where minor ticks are labelled
    fig = figure_latency_over_time({"burst": healthy}, {"burst": "C0"}, "exp", set())
    FigureCanvasAgg(fig).draw()
    axis = fig.axes[0].yaxis
    labels = [t.get_text() for t in axis.get_majorticklabels() + axis.get_minorticklabels() if t.get_text()]
    assert labels and all("times" not in t and "^" not in t for t in labels), labels
    assert "0.2" in labels


def test_cost_of_control_gives_each_arm_its_own_row():
    from loadgen.analysis.latency_figures import figure_cost_of_control

    alike = {"ttft_s": {"p90": 0.27, "p99": 9.0}, "turns_per_s": 0.93, "tasks_finished": 90, "tasks_arrived": 96}
    summary = {"experiment": "exp", "latency_by_arm": [{"arm": a, **alike} for a in ("session-cap", "budgeter")]}
    fig = figure_cost_of_control(summary, {"session-cap": "C0", "budgeter": "C1"})
    points = [tuple(c.get_offsets()[0]) for c in fig.axes[0].collections]
    assert len(points) == 4 and len(set(points)) == 4  # p90 and p99 of two arms that ended alike: 4 places
    rows = {t.get_position()[1]: t.get_text() for t in fig.axes[0].get_yticklabels()}
    assert rows == {1: "session-cap", 0: "budgeter"}  # the first arm on top, as in the tables
