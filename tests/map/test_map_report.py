"""The map's text report against its own map.json: the recommendation says only what the
intervals show (a grid edge is a lower limit, a few seeds show nothing safe), names the budgets
it tried, and the tipping line counts the seeds map.json has tipping. Synthetic outcome rows."""

from __future__ import annotations

import pytest

from loadgen.core.spec import parse_spec
from loadgen.map.analysis import seeds_to_show_safe, wilson_interval
from loadgen.map.budgets import parse_budgets
from loadgen.map.grid import GridError, MapGrid, MapPoint, controller_policy, map_job, point_spec
from loadgen.map.report import summarize_map
from loadgen.map.bounds import spec_bounds
from tests.conftest import make_spec_dict

RATES = (0.03, 0.035, 0.04, 0.045)
FACTORS = (0.0, 1.5)


def _job():
    data = make_spec_dict()
    data["arms"][1]["triggers"][0]["extra_rate_factor"] = 1.5
    spec = parse_spec(data)
    return map_job(spec, None, FACTORS), spec


DURATION_S = _job()[1].duration_s


def _row(controller, rate, factor, seed, degraded, phase="grid"):
    point = MapPoint(controller, rate, factor, seed, DURATION_S, phase)
    return {"run_id": point.run_id, "phase": phase, "status": "completed", "controller": controller,
            "rate_per_s": rate, "trigger_factor": factor, "seed": seed, "duration_s": DURATION_S,
            "persistently_degraded": degraded, "turns_per_s_after_trigger": 1.0, "turn_latency_p50_s": 1.0}


def _summary(rows, controllers, seeds):
    job, spec = _job()
    grid = MapGrid(RATES, FACTORS, tuple(seeds), tuple(controllers), horizon_s=0, bisect_steps=0)
    return summarize_map(job, grid, rows, spec_bounds(spec, spec.engine.load_cost_model()))


def _the_small_map(seeds=range(1, 5)):
    """The issue's map: budgeter 0 of n degraded everywhere; none: seeds 1 and 2 tip at 0.035
    and 0.04 (seed 1 at x1.125 by bisection, seed 2 only at x1.5)."""
    rows = []
    for rate in RATES:
        for seed in seeds:
            rows += [_row("budgeter", rate, f, seed, False) for f in FACTORS]
            tips = rate in (0.035, 0.04) and seed in (1, 2)
            rows += [_row("none", rate, 0.0, seed, False), _row("none", rate, 1.5, seed, tips)]
            if tips:
                rows.append(_row("none", rate, 1.125, seed, seed == 1, phase="bisect"))
    return rows


def test_with_four_seeds_per_cell_nothing_is_shown_safe_and_the_report_says_why():
    summary = _summary(_the_small_map(), ("none", "budgeter"), range(1, 5))
    report = summary["report"]
    rec = summary["recommendation"]
    assert rec["shown_safe"] is False and rec["highest_safe_rate_by_factor"]["1.5"] is None
    assert rec["highest_safe_rate_observed_by_factor"]["1.5"] == 0.045
    assert "keeps P(degraded) < 10% up to 0.045/s" not in report
    upper = wilson_interval(0, 4)[1]
    assert round(upper, 2) == 0.49
    assert (f"no budget recommended: none tried is shown safe at any grid rate with trigger x1.5: with 4 seeds per "
            f"cell, 0 degraded still leaves P(degraded) up to {upper:.0%}") in report
    assert f"{seeds_to_show_safe()} seeds per cell can show P < 10%" in report and seeds_to_show_safe() == 35
    assert "under 10% up to at least 0.045/s, the top of the grid" in report
    assert "budgets tried, admit/park: 0.75/0.95 (the spec's, the only one; --budgets" in report
    boundary = {(b["controller"], b["trigger_factor"]): b for b in summary["boundaries"]}
    assert boundary[("budgeter", 1.5)]["highest_safe_rate"] is None
    assert boundary[("budgeter", 1.5)]["highest_safe_rate_observed"] == 0.045


def test_the_tipping_line_counts_the_seeds_map_json_has_tipping():
    summary = _summary(_the_small_map(), ("none", "budgeter"), range(1, 5))
    tipping = {t["rate_per_s"]: t for t in summary["tipping"] if t["controller"] == "none"}
    assert [s["min_factor"] for s in tipping[0.035]["seeds"]] == [1.125, 1.5, None, None]
    assert tipping[0.035]["median_min_factor"] is None  # half the seeds censored: the median is above x1.5
    (line,) = [ln for ln in summary["report"].splitlines() if ln.startswith("minimal tipping trigger")]
    assert "0.035/s: 2/4 tip at x1.12-x1.5, median >x1.5" in line
    assert "0.04/s: 2/4 tip at x1.12-x1.5, median >x1.5" in line
    assert "0.03/s: 0/4 tip;" in line and "0.035: >" not in line
    # and the cells agree: 2 of 4 degraded at x1.5
    cell = [c for c in summary["cells"] if (c["controller"], c["rate_per_s"], c["trigger_factor"]) == ("none", 0.035, 1.5)]
    assert cell[0]["num_degraded"] == 2


def test_with_enough_seeds_the_grid_edge_is_a_lower_limit():
    seeds = range(1, seeds_to_show_safe() + 1)
    summary = _summary(_the_small_map(seeds), ("none", "budgeter"), seeds)
    rec = summary["recommendation"]
    assert rec["shown_safe"] and rec["highest_safe_rate_by_factor"]["1.5"] == 0.045
    assert ("recommended: budgeter with admit_fraction 0.75" in summary["report"]
            and "with trigger x1.5 it keeps P(degraded) < 10% (95% upper bound) up to at least 0.045/s, the top of "
                "the grid." in summary["report"])


def test_budgets_the_map_searched_become_the_recommendation():
    labels = parse_budgets("0.6,0.9/0.98", {})
    assert labels == ("budgeter@0.6-0.95", "budgeter@0.9-0.98")
    seeds = range(1, 36)
    rows = []
    for rate in RATES:
        for seed in seeds:
            for f in FACTORS:
                rows.append(_row(labels[0], rate, f, seed, False))
                # the looser budget degrades one seed in 35 from 0.04/s on
                rows.append(_row(labels[1], rate, f, seed, rate >= 0.04 and seed == 1))
                rows.append(_row("none", rate, f, seed, False))
    summary = _summary(rows, ("none",) + labels, seeds)
    rec = summary["recommendation"]
    assert (rec["controller"], rec["admit_fraction"], rec["park_fraction"]) == (labels[0], 0.6, 0.95)
    assert [b["highest_safe_rate_by_factor"]["1.5"] for b in rec["budgets_tried"]] == [0.045, 0.035]
    assert ("budgets tried (--budgets), admit/park, and how far each is shown safe with trigger x1.5: 0.6/0.95 at "
            "least 0.045/s, the top of the grid; 0.9/0.98 0.035/s") in summary["report"]
    assert "recommended: budgeter with admit_fraction 0.6" in summary["report"]


def test_a_budget_label_runs_the_budgeter_with_its_fractions():
    job, _ = _job()
    spec = point_spec(job, MapPoint("budgeter@0.6-0.9", 0.03, 1.5, 1, 600.0))
    assert spec.controller.name == "budgeter"
    assert (spec.controller.params["admit_fraction"], spec.controller.params["park_fraction"]) == (0.6, 0.9)
    assert controller_policy("none") == ("none", {})
    MapGrid(RATES, FACTORS, (1,), ("none", "budgeter@0.6-0.9"))  # a known policy under its label


@pytest.mark.parametrize("text, message", [("0.9/0.8", "needs 0 < admit_fraction <= park_fraction"),
                                           ("x", "cannot read 'x'"), ("0.6,0.6", "names one budget twice"),
                                           (",", "no budgets")])
def test_bad_budgets_name_the_flag(text, message):
    with pytest.raises(GridError, match=f"--budgets: .*{message}"):
        parse_budgets(text, {})


def test_loadgen_map_with_budgets_runs_each_budget_and_recommends_among_them(tmp_path):
    import json
    import subprocess
    import sys

    import yaml

    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    args = [sys.executable, "-m", "loadgen.cli", "map", str(spec), "--out", str(tmp_path / "m"), "--rates", "0.05",
            "--trigger-factors", "2", "--seeds", "1", "--horizon-h", "0", "--bisect-steps", "0", "--quiet",
            "--no-figures", "--workers", "1"]
    proc = subprocess.run(args + ["--budgets", "0.6,0.9/0.98"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "m" / "map.json").read_text())
    assert summary["grid"]["controllers"] == ["none", "budgeter@0.6-0.95", "budgeter@0.9-0.98"]
    assert [b["controller"] for b in summary["recommendation"]["budgets_tried"]] == summary["grid"]["controllers"][1:]
    assert "budgets tried (--budgets), admit/park, and how far each is shown safe with trigger x2: 0.6/0.95" \
        in proc.stdout
    assert "trigger x0:" not in proc.stdout  # a grid without factor 0 has no line for it
    proc = subprocess.run(args + ["--budgets", "0.9/0.5"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--budgets: '0.9/0.5' needs 0 < admit_fraction <= park_fraction" in proc.stderr


def test_with_enough_seeds_a_budget_degraded_at_the_lowest_rate_is_not_blamed_on_the_seed_count():
    seeds = range(1, seeds_to_show_safe() + 1)
    rows = [_row(c, rate, f, seed, c == "budgeter" and seed <= 5) for c in ("none", "budgeter") for rate in RATES
            for f in FACTORS for seed in seeds]
    report = _summary(rows, ("none", "budgeter"), seeds)["report"]
    assert ("no budget recommended: none tried is shown safe at any grid rate with trigger x1.5: runs degraded at "
            "the lowest grid rate already") in report
    assert "0 degraded still leaves" not in report


def test_with_routers_each_routers_tipping_line_is_labelled_and_the_header_counts_routers():
    rows = []
    for rate in RATES:
        for seed in range(1, 5):
            tips = rate == 0.04 and seed == 1
            rows += [_row("none+round_robin", rate, 0.0, seed, False), _row("none+round_robin", rate, 1.5, seed, False),
                     _row("none+consistent_hash", rate, 0.0, seed, False),
                     _row("none+consistent_hash", rate, 1.5, seed, tips)]
    summary = _summary(rows, ("none+round_robin", "none+consistent_hash"), range(1, 5))
    report = summary["report"].splitlines()
    assert "x 4 seeds x 1 controller x 2 routers = 64 runs" in report[0]
    lines = [ln for ln in report if ln.startswith("minimal tipping trigger")]
    assert [ln.split(";")[0] for ln in lines] == ["minimal tipping trigger (none+round_robin",
                                                 "minimal tipping trigger (none+consistent_hash"]
    assert "0.04/s: 0/4 tip" in lines[0] and "0.04/s: 1/4 tip at x1.5" in lines[1]
