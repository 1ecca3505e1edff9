"""Whole experiments: every run of a spec, one after another, simulated or against a live endpoint.

The one place that knows both runners, so that the run core (loadgen/core) and the live side
(loadgen/live) never import each other in a circle.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import yaml

from .analysis.windows_table import write_windows
from .core.recording import write_json_atomic
from .core.run_pool import run_pooled
from .core.runner import RunKey, completed_run, mark_interrupted, run_simulated
from .core.same_spec import check_results_dir_spec
from .core.spec import ExperimentSpec, SpecError

if TYPE_CHECKING:
    from .live.progress import LiveSnapshot


def run_experiment(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], spec_dir: Optional[Path] = None,
                   on_run_done: Optional[Callable[[RunKey, dict, float], None]] = None,
                   on_run_start: Optional[Callable[[RunKey], None]] = None,
                   wall_time: Optional[Callable[[], float]] = None, resume: bool = False,
                   on_run_skipped: Optional[Callable[[RunKey, dict], None]] = None,
                   on_progress: Optional[Callable[[RunKey, LiveSnapshot], None]] = None,
                   num_workers: int = 1) -> list[dict]:
    """Run ``keys`` (simulated ones over ``num_workers`` processes, live ones one after another);
    a failed run is recorded and the others go on. Results come back in ``keys``' order.

    MixedSpecError, before anything is written, when ``out_dir`` holds runs of another spec
    (``loadgen.core.same_spec``: one results directory, one spec). With ``resume``, runs whose
    run.json says completed for this same spec are skipped (reported to ``on_run_skipped``).
    A completed run also gets its windows.parquet (loadgen/analysis/windows_table.py).
    """
    out_dir = Path(out_dir)
    if spec.engine.kind == "openai":  # the live client, imported only for a live run
        from .live.http_client import PreflightError
        from .live.runner import preflight_endpoint, run_live
    if spec.engine.kind == "openai" and keys:
        try:
            preflight_endpoint(spec)
        except PreflightError as exc:  # bad input (the endpoint given): one message, exit 2, no run
            raise SpecError(f"{spec.engine.url}: preflight failed, no run started: {exc}") from None
    check_results_dir_spec(out_dir, spec)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    results: dict[RunKey, dict] = {}
    to_run = []
    for key in keys:
        if resume and (done := completed_run(out_dir, spec, key)) is not None:
            results[key] = done
            if on_run_skipped:
                on_run_skipped(key, done)
        else:
            to_run.append(key)
    if spec.engine.kind != "openai" and num_workers > 1 and len(to_run) > 1:
        try:
            for key, info, wall_s in run_pooled(partial(_simulate_one, spec, out_dir, spec_dir), to_run,
                                                min(num_workers, len(to_run)), on_run_start,
                                                partial(_lost_run, out_dir)):
                results[key] = info
                if on_run_done:
                    on_run_done(key, info, wall_s)
        except KeyboardInterrupt as exc:  # Ctrl-C: the runs under way say so in their run.json
            for key in (exc.args[1] if len(exc.args) > 1 else []):
                mark_interrupted(spec, key, out_dir)
            raise
        return [results[key] for key in keys]
    for key in to_run:
        if on_run_start:
            on_run_start(key)
        t0 = wall_time() if wall_time else 0.0
        try:
            if spec.engine.kind == "openai":
                info = run_live(spec, key, out_dir, on_progress=(
                    (lambda snapshot, key=key: on_progress(key, snapshot)) if on_progress else None))
                if info.get("status") == "completed":
                    write_windows(out_dir / "runs" / key.run_id)
            else:
                info = _simulate_one(spec, out_dir, spec_dir, key)
        except KeyboardInterrupt:  # Ctrl-C: the run under way says so in its run.json
            mark_interrupted(spec, key, out_dir)
            raise
        except Exception as exc:  # recorded in run.json; the experiment goes on
            info = _failed(key, exc)
        results[key] = info
        if on_run_done:
            on_run_done(key, info, (wall_time() - t0) if wall_time else 0.0)
    return [results[key] for key in keys]


def _simulate_one(spec: ExperimentSpec, out_dir: Path, spec_dir: Optional[Path], key: RunKey) -> dict:
    """One simulated run and its windows.parquet; a failure is its run.json, not an exception."""
    try:
        info = run_simulated(spec, key, out_dir, spec_dir)
        if info.get("status") == "completed":
            write_windows(out_dir / "runs" / key.run_id)
    except Exception as exc:
        return _failed(key, exc)
    return info


def _lost_run(out_dir: Path, key: RunKey, exitcode: Optional[int]) -> dict:
    """The worker process running ``key`` died (killed for memory, a native crash): the run is
    recorded as failed in its run.json, with the rows it wrote, and the experiment goes on."""
    error = f"its worker process died (exit code {exitcode}) before the run ended"
    path = out_dir / "runs" / key.run_id / "run.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"run_id": key.run_id, "status": "failed", "error": error}
    info.update(status="failed", error=error)
    write_json_atomic(path, info)
    return info


def _failed(key: RunKey, exc: Exception) -> dict:
    return {"run_id": key.run_id, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
