"""`loadgen map`'s runs as Ray tasks (the session fixture's local cluster): the same rows as in process."""

from __future__ import annotations

from actors.map import ray_executor
from loadgen.map.grid import MapPoint, map_job
from loadgen.map.run import run_in_process
from tests.conftest import make_spec


def test_ray_tasks_give_the_rows_of_in_process_runs(ray_local):
    job = map_job(make_spec(), None, [2.0])
    points = [MapPoint(c, 0.05, f, 1, 600.0) for c in ("none", "budgeter") for f in (0.0, 2.0)]
    points.append(MapPoint("none", 0.05, 0.0, 2, 900.0, "escape"))
    by_ray = sorted(ray_executor(points_per_task=2)(job, points), key=lambda r: r["run_id"])
    in_process = sorted(run_in_process(job, points), key=lambda r: r["run_id"])
    assert [r["status"] for r in by_ray] == ["completed"] * len(points)
    assert by_ray == in_process
