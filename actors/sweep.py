"""``loadgen sweep``: every run of a spec (seeds x arms) on a Ray cluster.

* Simulated engine: each run is a Ray task (one CPU) anywhere in the cluster; it simulates into
  a scratch directory and hands its files back, so the results are the files an in-process
  ``loadgen run`` writes, byte for byte.
* Launched engine (vllm, sglang, serve_sim): runs go a pair at a time (the arms of one seed). A
  placement group reserves one bundle of ``num_gpus`` GPUs per arm, so the arms run at the same
  time, each on its own engine, and share one run-time origin. As many pairs run at once as the
  cluster has GPUs for; the rest wait. Per run: an engine actor on its bundle, a controller actor
  beside it, the run's sessions sharded over the sweep's fleets, its rows written by the
  sweep's recorder on this node.

A failed run is marked failed in its run.json and the others go on. Running the same sweep again
resumes it: a run whose run.json says completed, for the same spec, is skipped.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import ray
import yaml
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from loadgen import __version__
from loadgen.clock import WallClock, epoch_s
from loadgen.http_client import EndpointOptions
from loadgen.recording import write_json_atomic
from loadgen.runner import RunKey, run_simulated
from loadgen.session import RetryPolicy
from loadgen.spec import ExperimentSpec, LaunchedEngineSpec, SimEngineSpec
from loadgen.workload import plan_sessions

from .cluster import cluster_resources, num_alive_nodes
from .controller import ControllerActor
from .engine import EngineActor
from .fleet import LiveRunSettings, SessionFleet
from .recorder import RecorderActor

# wall seconds between sending a pair's sessions to the fleets and run time 0, so that every
# fleet and controller is ready when the first session arrives
START_LEAD_S = 1.0


class SweepError(ValueError):
    """A sweep that cannot run on this cluster or with this engine."""


@dataclass(frozen=True)
class RunStart:
    """A run has begun: where it runs, and (live runs) its engine actor."""

    key: RunKey
    placement: dict = field(default_factory=dict)
    engine: Any = None


RunStarted = Callable[[RunStart], None]
RunDone = Callable[[RunKey, dict], None]


def run_sweep(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], spec_dir: Optional[Path] = None,
              num_fleets: Optional[int] = None, on_run_start: Optional[RunStarted] = None,
              on_run_done: Optional[RunDone] = None) -> list[dict]:
    """Run ``keys`` on the connected Ray cluster, skipping completed ones; returns each run's run.json."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    done = {key: info for key in keys if (info := completed_run(out_dir, spec, key)) is not None}
    todo = [key for key in keys if key not in done]
    if isinstance(spec.engine, SimEngineSpec):
        results = _simulate(spec, out_dir, todo, spec_dir, on_run_start, on_run_done)
    elif isinstance(spec.engine, LaunchedEngineSpec):
        results = asyncio.run(_LiveSweep(spec, out_dir, num_fleets, on_run_start, on_run_done).run(todo))
    else:
        raise SweepError(f"engine kind {spec.engine.kind!r}: a sweep launches its own engines (vllm, sglang, "
                         "serve_sim) or simulates (sim); run against a shared endpoint with `loadgen run --endpoint`")
    results.update(done)
    return [results[key] for key in keys]


def completed_run(out_dir: Path, spec: ExperimentSpec, key: RunKey) -> Optional[dict]:
    """run.json of a run already completed with this spec (a changed spec runs again), else None."""
    try:
        info = json.loads((out_dir / "runs" / key.run_id / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("status") == "completed" and info.get("spec") == run_spec(spec, key):
        return info
    return None


def run_spec(spec: ExperimentSpec, key: RunKey) -> dict:
    """The spec as a run records it (run.json "spec"): the experiment's, with only this seed."""
    return {**spec.model_dump(mode="json"), "seeds": [key.seed]}


# ---------------------------------------------------------------- simulated engine: Ray tasks
@dataclass(frozen=True)
class SimulatedRun:
    info: dict
    files: dict[str, bytes]  # path inside the run directory -> content


@ray.remote(num_cpus=1)
def simulate_run(spec: ExperimentSpec, key: RunKey, spec_dir: Optional[str]) -> SimulatedRun:
    """One simulated run on whichever node Ray picks; its files come back with the result."""
    with tempfile.TemporaryDirectory(prefix="loadgen-sim-") as scratch:
        try:
            info = run_simulated(spec, key, Path(scratch), Path(spec_dir) if spec_dir else None)
        except Exception as exc:  # run.json (status failed) and the rows so far are in the files
            info = {"run_id": key.run_id, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        run_dir = Path(scratch) / "runs" / key.run_id
        files = {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    return SimulatedRun(info, files)


def _simulate(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], spec_dir: Optional[Path],
              on_run_start: Optional[RunStarted], on_run_done: Optional[RunDone]) -> dict[RunKey, dict]:
    pending = {}
    for key in keys:
        pending[simulate_run.remote(spec, key, str(spec_dir) if spec_dir else None)] = key
        if on_run_start:
            on_run_start(RunStart(key))
    results: dict[RunKey, dict] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        key = pending.pop(ready[0])
        try:
            run = ray.get(ready[0])
        except ray.exceptions.RayError as exc:  # the task's worker or node died
            run = SimulatedRun({"run_id": key.run_id, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}, {})
        _write_run_files(out_dir / "runs" / key.run_id, run.files)
        results[key] = run.info
        if on_run_done:
            on_run_done(key, run.info)
    return results


def _write_run_files(run_dir: Path, files: dict[str, bytes]) -> None:
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for name, content in files.items():
        path = run_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
