"""``loadgen map --address``: the map's runs as Ray tasks over every CPU of a cluster.

The same simulated runs as ``loadgen sweep``'s simulated-runs-as-tasks, but a task hands back
outcome rows, not run files: a map keeps one row per run (loadgen/map/run.py). Points travel in
small batches so a task's overhead is spread over a few runs.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import ray

from loadgen.map.grid import MapJob, MapPoint
from loadgen.map.run import Executor, run_point

POINTS_PER_TASK = 4


@ray.remote(num_cpus=1)
def simulate_points(job: MapJob, points: Sequence[MapPoint]) -> list[dict]:
    return [run_point(job, point) for point in points]


def ray_executor(points_per_task: int = POINTS_PER_TASK) -> Executor:
    """Points as Ray tasks on the connected cluster; rows as their tasks finish. A task lost with
    its worker or node gives failed rows for its points; the map goes on."""

    def execute(job: MapJob, points: Sequence[MapPoint]) -> Iterator[dict]:
        if not points:
            return
        job_ref = ray.put(job)
        pending = {}
        for i in range(0, len(points), points_per_task):
            batch = list(points[i:i + points_per_task])
            pending[simulate_points.remote(job_ref, batch)] = batch
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            batch = pending.pop(ready[0])
            try:
                rows = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                rows = [{"run_id": p.run_id, "fingerprint": job.fingerprint, "phase": p.phase,
                         "controller": p.controller, "rate_per_s": p.rate_per_s, "trigger_factor": p.trigger_factor,
                         "seed": p.seed, "duration_s": p.duration_s, "status": "failed",
                         "error": f"{type(exc).__name__}: {exc}"} for p in batch]
            yield from rows

    return execute
