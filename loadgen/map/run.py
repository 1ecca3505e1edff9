"""Running the map's points: each one simulated in memory, kept as one outcome row.

A point's run is the simulated run ``loadgen run`` would make of its spec, but its rows never
reach disk: the outcome (persistent degradation, end hit ratio, throughput, latency, collapse
time) is computed from the in-memory tables with the same analysis functions and only that row
is kept, in ``DIR/outcomes.parquet``. Writing each run's Parquet costs more than a tenth of
a run's time and thousands of run directories nobody reads.

Execution is a function from points to rows (``Executor``): in this process, a pool of local
processes, or Ray tasks (actors/map.py). The map is planned in phases, each from the rows so
far, so a rerun plans the same points and skips those whose rows exist (resume).
"""

from __future__ import annotations

import math
import multiprocessing
import os
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..analysis.outcomes import run_outcome
from ..analysis.runs import RunData, float_column, success_mask
from ..analysis.windows import degraded_stretch_start_s, run_busy_times
from ..core.recording import RunRecorder
from ..core.runner import RunKey, run_info, simulate
from .analysis import cell_table
from .bisect import plan_bisection
from .grid import MapGrid, MapJob, MapPoint, point_spec

OUTCOMES_FILE = "outcomes.parquet"

OUTCOME_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("fingerprint", pa.string()), ("phase", pa.string()),
    ("controller", pa.string()), ("rate_per_s", pa.float64()), ("trigger_factor", pa.float64()),
    ("seed", pa.int64()), ("duration_s", pa.float64()), ("status", pa.string()), ("error", pa.string()),
    ("persistently_degraded", pa.bool_()), ("collapse_s", pa.float64()),
    ("hit_ratio_last10min", pa.float64()), ("sessions_in_system_last5min", pa.float64()),
    ("turns_completed", pa.int64()), ("sessions_arrived", pa.int64()), ("sessions_completed", pa.int64()),
    ("turns_per_s_last10min", pa.float64()), ("turns_per_s_after_trigger", pa.float64()),
    ("turn_latency_p50_s", pa.float64()), ("turn_latency_p90_s", pa.float64()), ("engine_steps", pa.int64()),
])

Executor = Callable[[MapJob, Sequence[MapPoint]], Iterator[dict]]


def _latency_quantiles(turns: pa.Table, after_s: float) -> tuple[float, float]:
    """p50 and p90 of what a turn waited from ready (gateway wait included) to its last token."""
    ok = success_mask(turns)
    finish_s = float_column(turns, "finish_s")
    latency_s = (finish_s - float_column(turns, "ready_s"))[ok & (finish_s >= after_s)]
    if latency_s.size == 0:
        return math.nan, math.nan
    return float(np.quantile(latency_s, 0.5)), float(np.quantile(latency_s, 0.9))


def run_point(job: MapJob, point: MapPoint) -> dict:
    """Simulate one point in memory; its outcome row (status failed with the error if it raised)."""
    row = {"run_id": point.run_id, "fingerprint": job.fingerprint, "phase": point.phase,
           "controller": point.controller, "rate_per_s": point.rate_per_s, "trigger_factor": point.trigger_factor,
           "seed": point.seed, "duration_s": point.duration_s}
    try:
        spec = point_spec(job, point)
        key = RunKey("map", point.seed)
        recorder = RunRecorder(None, point.run_id, key.arm, key.seed, spec.recording.flush_interval_s)
        counts = simulate(spec, key, recorder, job.spec_dir)
        recorder.close()
    except Exception as exc:  # recorded in the row; the map goes on
        return {**row, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
    tables = recorder.tables()
    info = run_info(spec, key, "sim", spec.engine.pool_tokens, status="completed", counts=counts)
    # escape runs have no trigger: their windows start at 0
    reference_end_s = job.reference_trigger_end_s if point.phase != "escape" else None
    info["reference_trigger_end_s"] = reference_end_s
    run = RunData(Path(point.run_id), info, tables["turns"], tables["samples"], tables["sessions"])
    outcome = run_outcome(run)
    after_s = reference_end_s or 0.0
    p50, p90 = _latency_quantiles(run.turns, after_s)
    num_after = int(np.count_nonzero(success_mask(run.turns) & (float_column(run.turns, "finish_s") >= after_s)))
    return {
        **row, "status": "completed", "error": None,
        "persistently_degraded": bool(outcome["persistently_degraded"]),
        "collapse_s": degraded_stretch_start_s(run.turns, reference_end_s, point.duration_s,
                                               run_busy_times(run.samples)),
        "hit_ratio_last10min": outcome["hit_ratio_last10min"],
        "sessions_in_system_last5min": outcome["sessions_in_system_last5min"],
        "turns_completed": counts["turns_completed"], "sessions_arrived": counts["sessions_arrived"],
        "sessions_completed": counts["sessions_completed"],
        "turns_per_s_last10min": outcome["turns_per_s_last10min"],
        "turns_per_s_after_trigger": num_after / (point.duration_s - after_s),
        "turn_latency_p50_s": p50, "turn_latency_p90_s": p90, "engine_steps": counts["engine_steps"],
    }


# ---------------------------------------------------------------- executors
def run_in_process(job: MapJob, points: Sequence[MapPoint]) -> Iterator[dict]:
    for point in points:
        yield run_point(job, point)


_WORKER_JOB: Optional[MapJob] = None


def _init_worker(job: MapJob) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job


def _run_in_worker(point: MapPoint) -> dict:
    return run_point(_WORKER_JOB, point)


def process_pool(num_workers: Optional[int] = None) -> Executor:
    """Points over ``num_workers`` local processes (default: one per CPU), results as they finish."""
    workers = num_workers or os.cpu_count() or 1

    def execute(job: MapJob, points: Sequence[MapPoint]) -> Iterator[dict]:
        if workers == 1 or len(points) <= 1:
            yield from run_in_process(job, points)
            return
        # fork shares the loaded modules and the job with the workers at no cost (Linux); the
        # chunks are small so a slow point (a long healthy run) does not hold back a whole chunk
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with multiprocessing.get_context(method).Pool(workers, _init_worker, (job,)) as pool:
            yield from pool.imap_unordered(_run_in_worker, points, chunksize=2)

    return execute


# ---------------------------------------------------------------- the outcome table
class OutcomeStore:
    """outcomes.parquet: every finished point's row; rewritten as rows arrive, so an interrupted
    map keeps what it finished. Rows of another spec (another fingerprint) are dropped. Rows of
    another grid of the same spec are kept (its rerun resumes from them, and a point both grids
    plan is one run, the same bit for bit), but only the points this map planned are its rows
    (``map_rows``): its report never counts another grid's cells."""

    def __init__(self, out_dir: Path, fingerprint: str, save_every: int = 200) -> None:
        self.path = Path(out_dir) / OUTCOMES_FILE
        self.fingerprint = fingerprint
        self.save_every = save_every
        self.rows: dict[str, dict] = {}
        self.planned: set[str] = set()  # the run ids of this map's points, phase by phase
        self._unsaved = 0
        if self.path.is_file():
            try:
                table = pq.read_table(self.path)
            except (OSError, pa.ArrowException) as exc:
                raise ValueError(f"{self.path}: cannot read the outcome table ({exc}); remove it to start over") from None
            for row in table.to_pylist():
                if row.get("fingerprint") == fingerprint and row.get("status") == "completed":
                    self.rows[row["run_id"]] = row

    def plan(self, points: Iterable[MapPoint]) -> list[MapPoint]:
        """Make ``points`` this map's; those without a row yet are returned, to run."""
        points = list(points)
        self.planned.update(p.run_id for p in points)
        return [p for p in points if p.run_id not in self.rows]

    def map_rows(self) -> list[dict]:
        """The rows of this map's planned points (sorted by run id)."""
        return [self.rows[run_id] for run_id in sorted(self.planned) if run_id in self.rows]

    def add(self, row: dict) -> None:
        self.rows[row["run_id"]] = row
        self._unsaved += 1
        if self._unsaved >= self.save_every:
            self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        pq.write_table(self.table(), tmp)
        os.replace(tmp, self.path)
        self._unsaved = 0

    def table(self) -> pa.Table:
        # sorted rows: the same map writes the same bytes whatever order its runs finished in
        rows = [self.rows[k] for k in sorted(self.rows)]
        return pa.Table.from_pylist([{f: r.get(f) for f in OUTCOME_SCHEMA.names} for r in rows], schema=OUTCOME_SCHEMA)


# ---------------------------------------------------------------- planning the escape runs
def band_rates(cells: Sequence[dict], controller: str, max_rates: int) -> list[float]:
    """Rates where history decides for ``controller``: with no trigger most runs stay healthy
    (P < 0.9) while some trigger of the grid tips at least 10% of them. At most ``max_rates``,
    spread evenly over the band."""
    by_rate: dict[float, dict[float, float]] = {}
    for c in cells:
        if c["controller"] == controller and c["n"]:
            by_rate.setdefault(c["rate_per_s"], {})[c["trigger_factor"]] = c["p"]
    band = sorted(r for r, ps in by_rate.items() if ps.get(0.0, 1.0) < 0.9 and max(ps.values()) >= 0.1)
    if len(band) <= max_rates:
        return band
    if max_rates == 0:
        return []
    picks = sorted({band[round(i * (len(band) - 1) / max(max_rates - 1, 1))] for i in range(max_rates)})
    return picks


def plan_escape(cells: Sequence[dict], grid: MapGrid) -> list[MapPoint]:
    """Long untriggered runs at the band's rates, uncontrolled: time to spontaneous collapse."""
    if grid.horizon_s <= 0 or "none" not in grid.controllers:
        return []
    return [MapPoint("none", rate, 0.0, seed, grid.horizon_s, "escape")
            for rate in band_rates(cells, "none", grid.max_escape_rates) for seed in grid.seeds]


# ---------------------------------------------------------------- the whole map
Progress = Callable[[str, int, int], None]  # (phase, runs done, runs planned in the phase)


def run_map(job: MapJob, grid: MapGrid, out_dir: Path, execute: Executor,
            progress: Optional[Progress] = None) -> tuple[OutcomeStore, dict[str, int]]:
    """Run the grid, then the bisection probes, then the escape runs, each skipping the points
    already in ``out_dir``'s outcome table; returns the table and the runs each phase ran."""
    store = OutcomeStore(out_dir, job.fingerprint)
    ran: dict[str, int] = {"grid": 0, "bisect": 0, "escape": 0}
    duration_s = job.spec.duration_s

    def run_phase(phase: str, points: list[MapPoint]) -> None:
        todo = store.plan(points)
        if progress:
            progress(phase, 0, len(todo))
        try:
            for i, row in enumerate(execute(job, todo), 1):
                store.add(row)
                ran[phase] += 1
                if progress:
                    progress(phase, i, len(todo))
        finally:  # interrupted too: what finished is kept, and a rerun resumes from it
            store.save()

    run_phase("grid", grid.grid_points(duration_s))
    for _ in range(grid.bisect_steps):
        # each plan halves the brackets the rows so far leave open, so a resumed map plans
        # exactly the probes it has not run yet
        probes = plan_bisection(store.map_rows(), grid, duration_s)
        if not probes:
            break
        run_phase("bisect", probes)
    run_phase("escape", plan_escape(cell_table(store.map_rows()), grid))
    return store, ran
