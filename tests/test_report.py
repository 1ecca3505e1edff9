"""Tests for loadgen.analysis.figures: figures are written, are PNGs and stay small."""

from __future__ import annotations

from pathlib import Path

from loadgen.analysis import summarize
from loadgen.analysis.figures import arm_colors, write_figures

try:  # run as `python -m pytest` from the repo root, or with tests/ on sys.path
    from tests.factories import sample_row, steady_turns, write_run_dir
except ImportError:  # pragma: no cover
    from factories import sample_row, steady_turns, write_run_dir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SPEC = {"name": "exp", "arms": [{"name": "no-burst"}, {"name": "burst"}]}
BURST = [{"kind": "burst", "start_s": 900.0, "end_s": 1200.0}]


def _write_results(root: Path) -> None:
    """Seeds 1 and 2 in both arms, seed 3 only in the baseline arm."""
    healthy = steady_turns(0.0, 2700.0, 15.0, 0.9)
    collapsed = steady_turns(0.0, 1200.0, 15.0, 0.9) + steady_turns(1200.0, 2700.0, 30.0, 0.1)
    calm = [sample_row(t, 10) for t in range(0, 2701, 10)]
    crowded = [sample_row(t, 10 + t // 60) for t in range(0, 2701, 10)]
    for seed in (1, 2, 3):
        write_run_dir(root, f"no-burst-s{seed}", "no-burst", seed, healthy, calm, [], 2700.0,
                      1200.0, spec=SPEC)
    for seed in (1, 2):
        write_run_dir(root, f"burst-s{seed}", "burst", seed, collapsed, crowded, BURST, 2700.0,
                      1200.0, spec=SPEC)


def test_write_figures_writes_pngs_per_pair_and_overview(tmp_path: Path) -> None:
    _write_results(tmp_path)
    summary = summarize(tmp_path)
    paths = write_figures(tmp_path, summary)

    figures_dir = tmp_path / "figures"
    assert sorted(p.name for p in paths) == ["overview.png", "pair-s1.png", "pair-s2.png"]
    # Seed 3 ran in one arm only: no pair figure.
    assert not (figures_dir / "pair-s3.png").exists()
    for path in paths:
        data = path.read_bytes()
        assert path.parent == figures_dir
        assert data.startswith(PNG_MAGIC)
        assert 1_000 < len(data) < 300_000


def test_arm_colors_are_stable_and_distinct(tmp_path: Path) -> None:
    _write_results(tmp_path)
    colors = arm_colors(summarize(tmp_path))
    assert list(colors) == ["no-burst", "burst"]
    assert colors["no-burst"] != colors["burst"]


def test_write_figures_with_no_runs(tmp_path: Path) -> None:
    summary = summarize(tmp_path)
    assert write_figures(tmp_path, summary) == []


# --------------------------------------------------------------------------------------------
# Controller figures

import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from loadgen.analysis.figures import (  # noqa: E402
    figure_arm_timeseries,
    figure_cohort_completion,
    figure_mix_shift_scatter,
)
from loadgen.analysis import load_results  # noqa: E402

try:
    from tests.factories import session_row
except ImportError:  # pragma: no cover
    from factories import session_row

CONTROL_SPEC = {"name": "exp", "arms": [{"name": "none"}, {"name": "cap"}]}
MIX_SHIFT = [{"kind": "mix_shift", "start_s": 1800.0, "end_s": 1800.0}]


def _write_controlled(root: Path, triggers=BURST) -> None:
    """Both arms: 4 sessions arriving in [0, 300), 2 in [1200, 1500); the cap arm finishes all."""
    for arm, finish_late in (("none", math.nan), ("cap", 2000.0)):
        for seed in (1, 2):
            sessions = [session_row(60.0 * i, 60.0 * i, 600.0) for i in range(4)]
            sessions += [session_row(1250.0, 1300.0 + 100 * seed, finish_late), session_row(1300.0, 1300.0)]
            write_run_dir(root, f"{arm}-s{seed}", arm, seed, steady_turns(0.0, 2700.0, 15.0, 0.9),
                          [sample_row(t, 5) for t in range(0, 2701, 10)], triggers, 2700.0, 1200.0,
                          spec=CONTROL_SPEC, controller="session-cap" if arm == "cap" else "none",
                          control_start_s=1200.0, sessions_rows=sessions)


def test_controller_figures_are_written_when_there_is_control(tmp_path: Path) -> None:
    _write_controlled(tmp_path)
    names = sorted(p.name for p in write_figures(tmp_path, summarize(tmp_path)))
    assert names == ["arms-timeseries.png", "cohort-completion.png", "overview.png", "pair-s1.png", "pair-s2.png"]
    for name in ("arms-timeseries.png", "cohort-completion.png"):
        assert (tmp_path / "figures" / name).read_bytes().startswith(PNG_MAGIC)


def test_cohort_completion_plots_the_pooled_share_per_arrival_cohort(tmp_path: Path) -> None:
    _write_controlled(tmp_path)
    results = load_results(tmp_path)
    summary, runs_by_arm = results.summary, results.runs_by_arm
    assert list(runs_by_arm) == ["none", "cap"] and [len(r) for r in runs_by_arm.values()] == [2, 2]
    fig = figure_cohort_completion(runs_by_arm, arm_colors(summary), "exp")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    # 5-minute cohorts: [0, 300) all done in both arms; [1200, 1500): none 0 of 4, cap 2 of 4
    np.testing.assert_allclose(lines["none"].get_ydata()[[0, 4]], [1.0, 0.0])
    np.testing.assert_allclose(lines["cap"].get_ydata()[[0, 4]], [1.0, 0.5])
    assert np.isnan(lines["cap"].get_ydata()[1])  # nobody arrived in [300, 600)
    assert lines["control starts"].get_xdata()[0] == 20.0


def test_arm_timeseries_has_a_row_per_arm_and_a_line_per_seed(tmp_path: Path) -> None:
    _write_controlled(tmp_path)
    results = load_results(tmp_path)
    fig = figure_arm_timeseries(results.runs_by_arm, arm_colors(results.summary), "exp")
    assert len(fig.axes) == 4
    hit_lines = [line for line in fig.axes[0].get_lines() if len(line.get_xdata()) > 2]
    assert len(hit_lines) == 2 and np.nanmax(hit_lines[0].get_ydata()) == pytest.approx(0.9)


def test_mix_shift_scatter_has_one_point_per_run(tmp_path: Path) -> None:
    _write_controlled(tmp_path, triggers=MIX_SHIFT)
    summary = summarize(tmp_path)
    assert "mix-shift-scatter.png" in [p.name for p in write_figures(tmp_path, summary)]
    fig = figure_mix_shift_scatter(summary, arm_colors(summary))
    offsets = {c.get_label(): c.get_offsets() for c in fig.axes[0].collections}
    # first phase = arrivals before the shift at 1800 s: waits 0 x 5 and 50 + 100 seed; p90 the 6th of 6
    for arm in ("none", "cap"):
        np.testing.assert_allclose(sorted(map(tuple, offsets[arm])), [(150.0, 0.9), (250.0, 0.9)])
