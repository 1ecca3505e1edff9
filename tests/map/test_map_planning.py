"""The map's grid, point specs, resume and bisection, with a stand-in executor where only the
orchestration is under test (the simulated runs are covered by test_cli_map.py)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from loadgen.core.spec import BurstTrigger, parse_spec
from loadgen.map.analysis import tipping_table
from loadgen.map.bisect import plan_bisection, tipping_bracket
from loadgen.map.grid import GridError, MapGrid, MapPoint, map_job, parse_values, point_spec
from loadgen.map.run import OUTCOMES_FILE, run_map
from tests.conftest import make_spec, make_spec_dict


def test_ranges_and_lists_parse_to_sorted_exact_values():
    assert parse_values("0.02:0.06:0.0025", "--rates") == [round(0.02 + i * 0.0025, 9) for i in range(17)]
    assert parse_values("0.02:0.06:0.0025", "--rates")[8] == 0.04  # no float drift in the keys
    assert parse_values("3,0,1.5,1.5", "--trigger-factors") == [0.0, 1.5, 3.0]
    assert parse_values("1:1:1", "--x") == [1.0]


@pytest.mark.parametrize("text, message", [
    ("a:b:c", "--rates: cannot read 'a:b:c'"),
    ("0.06:0.02:0.01", "--rates: range '0.06:0.02:0.01' needs start <= stop"),
    ("0.02:0.06", "--rates: cannot read"),
    ("0,0.05", "--rates: every value must be > 0, got 0"),
])
def test_bad_grid_options_name_the_option(text, message):
    with pytest.raises(GridError, match=message.replace("(", r"\(")):
        parse_values(text, "--rates", 0.0, allow_minimum=False)


def test_unknown_controller_is_named():
    with pytest.raises(GridError, match=r"unknown \['fancy'\]; valid controllers"):
        MapGrid((0.01,), (0.0,), (1,), ("none", "fancy"))


def test_point_spec_changes_only_rate_trigger_factor_controller_seed_and_length():
    spec = make_spec()
    job = map_job(spec, None, [0.0, 1.0])
    burst = spec.arm("burst").triggers[0]
    triggered = point_spec(job, MapPoint("budgeter", 0.05, 3.0, 7, 600.0))
    assert triggered.workload.arrival_rate_per_s == 0.05
    assert triggered.seeds == [7]
    (trigger,) = triggered.arms[0].triggers
    assert isinstance(trigger, BurstTrigger)
    assert (trigger.extra_rate_factor, trigger.start_s, trigger.duration_s) == (3.0, burst.start_s, burst.duration_s)
    assert (triggered.controller.name, triggered.controller.start_s) == ("budgeter", 0.0)
    assert triggered.workload.sessions == spec.workload.sessions and triggered.engine == spec.engine
    untriggered = point_spec(job, MapPoint("none", 0.05, 0.0, 7, 3600.0))
    assert untriggered.arms[0].triggers == [] and untriggered.duration_s == 3600.0
    # every point judges its windows from the burst's end, with or without the burst
    assert job.reference_trigger_end_s == burst.start_s + burst.duration_s


def test_the_spec_controller_params_follow_its_name_into_the_map():
    data = make_spec_dict(controller={"name": "budgeter", "params": {"admit_fraction": 0.6}})
    job = map_job(parse_spec(data), None, [0.0])
    assert point_spec(job, MapPoint("budgeter", 0.03, 0.0, 1, 600.0)).controller.params == {"admit_fraction": 0.6}
    assert point_spec(job, MapPoint("none", 0.03, 0.0, 1, 600.0)).controller.params == {}


def test_a_spec_without_a_burst_maps_only_factor_zero():
    spec = make_spec(arms=[{"name": "base"}])
    with pytest.raises(GridError, match="no arm of the spec has a `kind: burst` trigger"):
        map_job(spec, None, [0.0, 1.0])
    assert map_job(spec, None, [0.0]).burst is None


# ---------------------------------------------------------------- orchestration and resume
TIPPING_FACTOR = {0.01: 1.3, 0.02: 0.0}  # per rate: a run tips when factor >= this


class StandIn:
    """An executor whose outcome is a known function of the point (tips at TIPPING_FACTOR)."""

    def __init__(self, stop_after=None):
        self.points = []
        self.stop_after = stop_after

    def __call__(self, job, points):
        for point in points:
            if self.stop_after is not None and len(self.points) >= self.stop_after:
                raise KeyboardInterrupt
            self.points.append(point)
            yield {"run_id": point.run_id, "fingerprint": job.fingerprint, "phase": point.phase,
                   "controller": point.controller, "rate_per_s": point.rate_per_s,
                   "trigger_factor": point.trigger_factor, "seed": point.seed, "duration_s": point.duration_s,
                   "status": "completed", "error": None,
                   "persistently_degraded": point.trigger_factor >= TIPPING_FACTOR[point.rate_per_s],
                   "collapse_s": None}


def _grid(**overrides):
    values = dict(rates_per_s=(0.01, 0.02), trigger_factors=(0.0, 1.0, 2.0), seeds=(1, 2), controllers=("none",),
                  horizon_s=0.0, bisect_steps=3)
    values.update(overrides)
    return MapGrid(**values)


def test_bisection_narrows_each_seed_to_grid_spacing_over_two_to_the_steps(tmp_path):
    spec = make_spec()
    job = map_job(spec, None, [1.0])
    execute = StandIn()
    store, ran = run_map(job, _grid(), tmp_path, execute)
    # rate 0.01: bracket (1, 2) -> 1.5 tips -> 1.25 does not -> 1.375 tips; rate 0.02 tips at 0: nothing to search
    probes = [p.trigger_factor for p in execute.points if p.phase == "bisect" and p.seed == 1]
    assert probes == [1.5, 1.25, 1.375]
    assert ran == {"grid": 12, "bisect": 6, "escape": 0}
    table = {(t["rate_per_s"]): t for t in tipping_table(store.rows.values(), ["none"], [0.01, 0.02], [1, 2],
                                                         spec.duration_s)}
    assert table[0.01]["median_min_factor"] == 1.375
    assert [s["max_not_tipping"] for s in table[0.01]["seeds"]] == [1.25, 1.25]
    assert table[0.02]["median_min_factor"] == 0.0


def test_a_rerun_of_a_complete_map_runs_nothing_and_a_changed_spec_reruns_everything(tmp_path):
    job = map_job(make_spec(), None, [1.0])
    run_map(job, _grid(), tmp_path, StandIn())
    again = StandIn()
    _, ran = run_map(job, _grid(), tmp_path, again)
    assert again.points == [] and ran == {"grid": 0, "bisect": 0, "escape": 0}
    changed = map_job(make_spec(duration_s=700), None, [1.0])
    rerun = StandIn()
    run_map(changed, _grid(), tmp_path, rerun)
    assert len([p for p in rerun.points if p.phase == "grid"]) == 12


def test_an_interrupted_map_keeps_its_finished_runs_and_resumes_from_them(tmp_path):
    job = map_job(make_spec(), None, [1.0])
    with pytest.raises(KeyboardInterrupt):
        run_map(job, _grid(), tmp_path, StandIn(stop_after=5))
    assert pq.read_table(tmp_path / OUTCOMES_FILE).num_rows == 5
    resumed = StandIn()
    run_map(job, _grid(), tmp_path, resumed)
    assert len([p for p in resumed.points if p.phase == "grid"]) == 7


def test_tipping_bracket_cases():
    assert tipping_bracket({0.0: False, 1.0: False, 2.0: True}) == (1.0, 2.0)
    assert tipping_bracket({0.0: True, 1.0: True}) == (None, 0.0)
    assert tipping_bracket({0.0: False, 3.0: False}) == (3.0, None)
    # not monotone: the bracket sits below the smallest factor that tipped
    assert tipping_bracket({0.0: False, 1.0: True, 2.0: False, 3.0: True}) == (0.0, 1.0)


def test_bisection_plans_nothing_once_brackets_are_narrow_enough():
    grid = _grid(rates_per_s=(0.01,), seeds=(1,), bisect_steps=1)
    rows = [{"controller": "none", "rate_per_s": 0.01, "seed": 1, "duration_s": 600.0, "phase": "grid",
             "status": "completed", "trigger_factor": f, "persistently_degraded": f >= 2} for f in (0.0, 1.0, 2.0)]
    (probe,) = plan_bisection(rows, grid, 600.0)
    assert (probe.trigger_factor, probe.phase) == (1.5, "bisect")
    rows.append({**rows[0], "phase": "bisect", "trigger_factor": 1.5, "persistently_degraded": False})
    assert plan_bisection(rows, grid, 600.0) == []


def test_a_map_of_another_grid_in_the_same_directory_reports_only_its_own_points(tmp_path):
    """Rows another grid wrote into the directory are kept (a rerun of that grid resumes from
    them; an identical point is reused, the same run bit for bit) but are no part of this map:
    not in its rows, its cells or its bisection."""
    from loadgen.map.analysis import cell_table

    job = map_job(make_spec(), None, [1.0])
    run_map(job, _grid(), tmp_path, StandIn())  # rates 0.01, 0.02 x seeds 1, 2
    smaller = _grid(rates_per_s=(0.02,), seeds=(1,))
    execute = StandIn()
    store, ran = run_map(job, smaller, tmp_path, execute)
    assert ran == {"grid": 0, "bisect": 0, "escape": 0}  # its points were all run by the first grid
    rows = store.map_rows()
    assert sorted((r["rate_per_s"], r["seed"]) for r in rows) == [(0.02, 1)] * 3
    assert [(c["rate_per_s"], c["n"]) for c in cell_table(rows)] == [(0.02, 1)] * 3
    assert len(store.rows) == 18  # the first grid's rows stay in outcomes.parquet
    assert pq.read_table(tmp_path / OUTCOMES_FILE).num_rows == 18
    # and the first grid, rerun, still finds all of its own
    again = StandIn()
    store, ran = run_map(job, _grid(), tmp_path, again)
    assert again.points == [] and len(store.map_rows()) == 18


@pytest.mark.parametrize("horizon_s", [float("nan"), float("inf"), -1.0])
def test_a_horizon_that_is_not_a_finite_length_is_refused_before_any_run(horizon_s):
    with pytest.raises(GridError, match="--horizon-h"):
        _grid(horizon_s=horizon_s)
