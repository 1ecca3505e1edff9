"""``loadgen run --replicates R``: each simulated run again under R draws of its step jitter, and
the probability that the run ends persistently degraded, per arm x seed.

A system near its tipping point can go either way; one run of a twin cannot say which. The
twin's step times carry the jitter ``loadgen calibrate`` measured (loadgen/sim/jitter.py), each
replicate its own keyed draw, so replicate r of a seed is the same run bit for bit every time.
Replicate 0 is the run in RESULTS/runs; replicate r >= 1 goes to RESULTS/replicates/r<r>/runs.
``replicates.json`` holds, per run id, every replicate's end state and P(persistently degraded);
``loadgen compare`` scores a real engine's outcomes against it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Callable, Optional

from .analysis.outcomes import run_outcome
from .analysis.probability import REPLICATES_FILE
from .analysis.runs import load_run
from .core.recording import write_json_atomic
from .core.run_pool import run_pooled
from .core.runner import RunKey, run_simulated
from .core.spec import ExperimentSpec, SpecError

def check_replicates(spec: ExperimentSpec, num_replicates: int, spec_dir: Optional[Path] = None) -> None:
    if num_replicates < 1:
        raise SpecError(f"--replicates {num_replicates}: give at least 1")
    if spec.engine.kind != "sim":
        raise SpecError(f"--replicates applies to simulated runs (the twin); engine kind {spec.engine.kind!r}")
    if num_replicates > 1 and not all(spec.engine_for(a).load_cost_model(spec_dir).step_jitter_sigma > 0
                                      for a in spec.arms):
        raise SpecError("--replicates: the cost model has no step jitter, so every replicate would be the same run; "
                        "use the cost.json `loadgen calibrate` wrote (it measures step_jitter_sigma) or set it")


def replicate_dir(out_dir: Path, replicate: int) -> Path:
    return Path(out_dir) if replicate == 0 else Path(out_dir) / "replicates" / f"r{replicate}"


def run_replicates(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], num_replicates: int,
                   spec_dir: Optional[Path] = None, on_done: Callable[[RunKey, int, dict], None] = lambda *a: None,
                   num_workers: int = 1) -> dict:
    """Replicates 1..R-1 of ``keys`` (replicate 0 is the plain run, already in ``out_dir``), over
    ``num_workers`` processes (loadgen/core/run_pool.py), then ``replicates.json``: {run id:
    {"degraded": [per replicate], "p_degraded"}}."""
    jobs = [(key, r) for r in range(1, num_replicates) for key in keys]
    work = partial(_replicate_one, spec, out_dir, spec_dir)
    if num_workers > 1 and len(jobs) > 1:  # each replicate writes only its own directory: same bytes
        for (key, r), info, _ in run_pooled(work, jobs, min(num_workers, len(jobs))):
            on_done(key, r, info)
    else:
        for key, r in jobs:
            on_done(key, r, work((key, r)))
    table = {}
    for key in keys:
        ends = []
        for r in range(num_replicates):
            run_dir = replicate_dir(out_dir, r) / "runs" / key.run_id
            ends.append(bool(run_outcome(load_run(run_dir))["persistently_degraded"]))
        table[key.run_id] = {"arm": key.arm, "seed": key.seed, "degraded": ends,
                             "p_degraded": sum(ends) / len(ends)}
    summary = {"num_replicates": num_replicates, "runs": table}
    write_json_atomic(Path(out_dir) / REPLICATES_FILE, summary)
    return summary


def _replicate_one(spec: ExperimentSpec, out_dir: Path, spec_dir: Optional[Path], job: tuple[RunKey, int]) -> dict:
    key, r = job
    return run_simulated(spec, key, replicate_dir(out_dir, r), spec_dir, replicate=r)


def format_replicates(summary: dict) -> str:
    lines = [f"P(persistently degraded) over {summary['num_replicates']} step-jitter replicates:"]
    for run_id, row in summary["runs"].items():
        p = row["p_degraded"]
        verdict = "borderline" if 0 < p < 1 else ("degraded" if p == 1 else "healthy")
        lines.append(f"  {run_id:24s} {p:5.2f}  {verdict}")
    return "\n".join(lines)
