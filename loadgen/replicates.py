"""``loadgen run --replicates R``: each simulated run again under R draws of its step jitter, and
the probability that the run ends persistently degraded, per arm x seed.

A system near its tipping point can go either way; one run of a twin cannot say which. The
twin's step times carry the jitter ``loadgen calibrate`` measured (loadgen/sim/jitter.py), each
replicate its own keyed draw, so replicate r of a seed is the same run bit for bit every time.
Replicate 0 is the run in RESULTS/runs; replicate r >= 1 goes to RESULTS/replicates/r<r>/runs.
``replicates.json`` holds, per run id, every replicate's end state and P(persistently degraded);
``loadgen compare`` scores a real engine's outcomes against it. Seeds run in batches into one
results directory add their rows to it (with one R for all), and ``--resume`` skips the
replicates already completed with the same spec."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Callable, Optional

from .analysis.outcomes import run_outcome
from .analysis.probability import REPLICATES_FILE
from .analysis.runs import load_run
from .core.recording import write_json_atomic
from .core.run_pool import run_pooled
from .core.runner import RunKey, completed_run, run_simulated
from .core.spec import ExperimentSpec, SpecError

def check_replicates(spec: ExperimentSpec, num_replicates: int, spec_dir: Optional[Path] = None,
                     out_dir: Optional[Path] = None) -> None:
    if num_replicates < 1:
        raise SpecError(f"--replicates {num_replicates}: give at least 1")
    if spec.engine.kind != "sim":
        raise SpecError(f"--replicates applies to simulated runs (the twin); engine kind {spec.engine.kind!r}")
    if num_replicates > 1 and not all(spec.engine_for(a).load_cost_model(spec_dir).step_jitter_sigma > 0
                                      for a in spec.arms):
        raise SpecError("--replicates: the cost model has no step jitter, so every replicate would be the same run; "
                        "use the cost.json `loadgen calibrate` wrote (it measures step_jitter_sigma), or set "
                        "step_jitter_sigma > 0 in the spec's engine.cost_model (inline, or in its cost.json)")
    earlier = _earlier(out_dir) if out_dir is not None else None
    if earlier is not None and earlier["num_replicates"] != num_replicates:
        raise SpecError(f"--replicates {num_replicates}: {Path(out_dir) / REPLICATES_FILE} holds "
                        f"{earlier['num_replicates']} replicates per run ({', '.join(earlier['runs'])}); give "
                        f"--replicates {earlier['num_replicates']} to add runs to it, or another --out")


def _earlier(out_dir: Path) -> Optional[dict]:
    """The replicates.json an earlier invocation wrote in ``out_dir``, None without one."""
    try:
        return json.loads((Path(out_dir) / REPLICATES_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{Path(out_dir) / REPLICATES_FILE}: unreadable ({exc}); move it away to start afresh") from None


def replicate_dir(out_dir: Path, replicate: int) -> Path:
    return Path(out_dir) if replicate == 0 else Path(out_dir) / "replicates" / f"r{replicate}"


def run_replicates(spec: ExperimentSpec, out_dir: Path, keys: list[RunKey], num_replicates: int,
                   spec_dir: Optional[Path] = None, on_done: Callable[[RunKey, int, dict], None] = lambda *a: None,
                   num_workers: int = 1, resume: bool = False,
                   on_start: Callable[[int], None] = lambda num_jobs: None) -> dict:
    """Replicates 1..R-1 of ``keys`` (replicate 0 is the plain run, already in ``out_dir``; with
    ``resume``, those already completed with this spec are kept), over ``num_workers`` processes
    (loadgen/core/run_pool.py), then ``replicates.json``: {run id: {"degraded": [per replicate],
    "final_window_only": [per replicate], "p_degraded"}}, with the rows of earlier invocations
    into the same directory (``check_replicates`` saw they have the same R). ``on_start`` gets the
    number of replicate runs to run, ``on_done`` each as it ends."""
    jobs = [(key, r) for r in range(1, num_replicates) for key in keys
            if not (resume and completed_run(replicate_dir(out_dir, r), spec, key) is not None)]
    on_start(len(jobs))
    work = partial(_replicate_one, spec, out_dir, spec_dir)
    if num_workers > 1 and len(jobs) > 1:  # each replicate writes only its own directory: same bytes
        for (key, r), info, _ in run_pooled(work, jobs, min(num_workers, len(jobs))):
            on_done(key, r, info)
    else:
        for key, r in jobs:
            on_done(key, r, work((key, r)))
    earlier = _earlier(out_dir)
    table = dict(earlier["runs"]) if earlier is not None and earlier["num_replicates"] == num_replicates else {}
    for key in keys:
        outcomes = [run_outcome(load_run(replicate_dir(out_dir, r) / "runs" / key.run_id))
                    for r in range(num_replicates)]
        ends = [bool(o["persistently_degraded"]) for o in outcomes]
        table[key.run_id] = {"arm": key.arm, "seed": key.seed, "degraded": ends,
                             "final_window_only": [bool(o["degraded_only_in_final_window"]) for o in outcomes],
                             "p_degraded": sum(ends) / len(ends)}
    summary = {"num_replicates": num_replicates, "runs": table}
    write_json_atomic(Path(out_dir) / REPLICATES_FILE, summary)
    return summary


def _replicate_one(spec: ExperimentSpec, out_dir: Path, spec_dir: Optional[Path], job: tuple[RunKey, int]) -> dict:
    key, r = job
    return run_simulated(spec, key, replicate_dir(out_dir, r), spec_dir, replicate=r)


def format_replicates(summary: dict) -> str:
    """One line a run; a replicate degraded only in its final window counts as degraded, as the
    paired table counts it, and is named as the table labels it (``final``)."""
    lines = [f"P(persistently degraded) over {summary['num_replicates']} step-jitter replicates:"]
    for run_id, row in summary["runs"].items():
        p = row["p_degraded"]
        verdict = "borderline" if 0 < p < 1 else ("degraded" if p == 1 else "healthy")
        final = sum(row.get("final_window_only") or [])  # absent in files written before 2026-12-07
        if final:
            verdict += f" ({final} of {len(row['degraded'])} only in the final window: 'final' in the paired table)"
        lines.append(f"  {run_id:24s} {p:5.2f}  {verdict}")
    return "\n".join(lines)
