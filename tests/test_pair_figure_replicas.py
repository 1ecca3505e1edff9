"""A deployment's pair figure holds its per-replica panels; one engine's has its three panels only
(loadgen/analysis/figures.py, loadgen/analysis/replica_figures.py)."""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from loadgen.analysis.figures import arm_colors, figure_jobs, pair_figure
from loadgen.analysis.runs import load_run
from loadgen.analysis.summary import write_summary
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict
from tests.test_deployment import deployment_spec


def _pair(spec, tmp_path):
    for arm in ("base", "burst"):
        run_simulated(spec, RunKey(arm, 1), tmp_path)
    summary = write_summary(tmp_path)
    runs = [load_run(tmp_path / "runs" / entry["run_id"]) for entry in summary["runs"]]
    return summary, pair_figure(1, runs, arm_colors(summary), summary.get("experiment"))


def _lines(ax: Axes) -> int:
    """Lines of data (the reference lines, axhline, are drawn unlabelled over the axes' width)."""
    return sum(1 for line in ax.get_lines() if not line.get_label().startswith("_") or len(line.get_xdata()) > 2)


def test_a_deployments_pair_figure_has_each_arms_replicas_and_the_imbalance(tmp_path):
    summary, fig = _pair(deployment_spec({"policy": "round_robin"}, replicas=3), tmp_path)
    try:
        titles = [ax.get_title() for ax in fig.axes]
        # the three panels, then per arm a row (hit ratio per replica | requests per replica), then the imbalance
        assert len(fig.axes) == 3 + 2 * 2 + 1
        assert titles[0].startswith("Hit ratio per") and titles[-1] == "load imbalance over time (1: even)"
        rows = fig.axes[3:-1]
        assert [ax.get_ylabel().split("\n")[0] for ax in rows[::2]] == ["base", "burst"]
        assert all(_lines(ax) == 3 for ax in rows)  # one line per replica in every panel
        assert _lines(fig.axes[-1]) == 2  # one line per arm
        assert [t.get_text() for t in rows[0].get_legend().get_texts()] == ["replica 0", "replica 1", "replica 2"]
    finally:
        plt.close(fig)
    # the panels are in the pair figure: no separate per-replica figure for a seed that has one
    names = [path.name for path, _ in figure_jobs(tmp_path, summary)]
    assert "pair-s1.png" in names and not any(n.startswith("replicas-s") or n == "imbalance.png" for n in names)


def test_one_engines_pair_figure_has_its_three_panels_only(tmp_path):
    summary, fig = _pair(parse_spec(make_spec_dict(engine={"kind": "sim", "pool_tokens": 48_000}, seeds=[1])),
                         tmp_path)
    try:
        assert [ax.get_title().split(" per ")[0] for ax in fig.axes] == [
            "Hit ratio", "Turn throughput", "Sessions in the system (arrived, not finished)"]
    finally:
        plt.close(fig)
    assert not any(path.name.startswith("replicas-s") for path, _ in figure_jobs(tmp_path, summary))


def test_a_deployment_seed_without_a_pair_figure_gets_its_replica_panels_alone(tmp_path):
    spec = deployment_spec({"policy": "round_robin"}, replicas=2)
    run_simulated(spec, RunKey("base", 1), tmp_path)
    names = [path.name for path, _ in figure_jobs(tmp_path, write_summary(tmp_path))]
    assert "replicas-s1.png" in names and "pair-s1.png" not in names


def test_many_arms_of_different_routers_are_small_multiples_a_panel_per_router(tmp_path):
    data = make_spec_dict(seeds=[1])
    burst = next(a for a in data["arms"] if a["name"] == "burst")["triggers"]
    routers = ("round_robin", "random", "least_outstanding", "power_of_two")
    data["engine"] = {"kind": "sim", "pool_tokens": 48_000, "replicas": 2, "router": {"policy": "round_robin"}}
    data["arms"] = [{"name": f"{r.replace('_', '-')}-{kind}", "engine": {"router": {"policy": r}},
                     "triggers": burst if kind == "burst" else []}
                    for r in routers for kind in ("no-burst", "burst")]
    spec = parse_spec(data)
    for arm in spec.arms:
        run_simulated(spec, RunKey(arm.name, 1), tmp_path)
    summary = write_summary(tmp_path)
    runs = [load_run(tmp_path / "runs" / entry["run_id"]) for entry in summary["runs"]]
    fig = pair_figure(1, runs, arm_colors(summary), summary.get("experiment"))
    try:
        hit_axes = [ax for ax in fig.axes if ax.get_title()]
        assert [ax.get_title() for ax in hit_axes] == ["round-robin", "random", "least-outstanding", "power-of-two"]
        for ax in hit_axes:  # burst and no-burst of one router in one panel, in two colours
            lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
            assert [line.get_label() for line in lines] == ["no-burst", "burst"]
            assert len({line.get_color() for line in lines}) == 2
        # every panel has the same two: one legend for the figure, not one over each panel's start
        assert all(ax.get_legend() is None for ax in fig.axes)
        assert [t.get_text() for t in fig.legends[0].get_texts()][:2] == ["no-burst", "burst"]
        width, height = fig.get_size_inches()
        assert len(fig.axes) == 8 and height < 1.2 * width  # not a panel row per arm
    finally:
        plt.close(fig)
    # the replicas, not drawn there, get their own figure
    names = [path.name for path, _ in figure_jobs(tmp_path, summary)]
    assert "pair-s1.png" in names and "replicas-s1.png" in names
