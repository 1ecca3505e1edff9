"""Tests for loadgen.report: figures are written, are PNGs and stay small."""

from __future__ import annotations

from pathlib import Path

from loadgen.analysis import summarize
from loadgen.report import arm_colors, write_figures

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
