"""summary.json: every completed run's outcome, the paired comparisons and the recovery table."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from ..core.recording import PARTS_DIR, part_files
from ..core.same_spec import describe_differences, spec_differences
from .drain import cold_turn_fit, drain_fields
from .latency import latency_by_arm
from .trees import trees_by_arm
from .outcomes import run_outcome
from .paired import paired_comparisons, twin_baselines
from .recovery import has_control, recovery_table
from .runs import RunData, load_run, read_run_json
from .serving import is_replay, serving_by_arm
from .tables import table_arms
from .uncertainty import recovery_intervals


def _spec_arm_names(run_json: Mapping[str, Any]) -> list[str]:
    """Arm names in the order the resolved spec lists them ([] when it does not)."""
    spec = run_json.get("spec")
    arms = spec.get("arms") if isinstance(spec, Mapping) else None
    if not isinstance(arms, list):
        return []
    names = []
    for arm in arms:
        name = arm.get("name") if isinstance(arm, Mapping) else arm
        if isinstance(name, str):
            names.append(name)
    return names

def _experiment_name(run_jsons: Sequence[Mapping[str, Any]]) -> Optional[str]:
    names = sorted({str(r["experiment"]) for r in run_jsons if r.get("experiment") is not None})
    if not names:
        return None
    # One results directory holds one experiment; if it does not, say so rather than pick one.
    return names[0] if len(names) == 1 else ", ".join(names)

def _arm_order(run_jsons: Sequence[Mapping[str, Any]], arms: Iterable[str]) -> list[str]:
    """Arms in spec order first, then any others alphabetically."""
    present = set(arms)
    spec_names = _spec_arm_names(run_jsons[0]) if run_jsons else []
    ordered = [name for name in dict.fromkeys(spec_names) if name in present]
    return ordered + sorted(present - set(ordered))

def _baseline_arm(run_jsons: Sequence[Mapping[str, Any]], arms: Iterable[str]) -> Optional[str]:
    spec_names = _spec_arm_names(run_jsons[0]) if run_jsons else []
    if spec_names:
        return spec_names[0]
    present = sorted(set(arms))
    return present[0] if present else None

# the verdicts of a long closed-loop run (degradation over 5- and 10-minute windows after a trigger),
# which say nothing true of a replayed trace's seconds to minutes of open-loop requests
REPLAY_UNJUDGED = ("persistently_degraded", "ends_degraded", "degraded_windows_after_trigger",
                   "degraded_only_in_final_window")
REPLAY_VERDICTS = ("not judged: a replayed trace is an open-loop benchmark (serving_by_arm), not a "
                   "closed-loop run whose degradation these verdicts judge")


def summarize(results_dir: str | os.PathLike, load: Callable[[Path], RunData] = load_run) -> dict:
    """Build the summary.json dict from every completed run under results_dir/runs/; ``load``
    reads a run directory (a caller that draws figures next reads each run once).

    Runs whose status is not "completed" are left out of `runs` and `pairs` and listed by id
    under `incomplete_runs`; runs whose files cannot be read (a corrupt Parquet file, a
    malformed run.json) are listed under `unreadable_runs` with the reason, and the others are
    summarized. Completed runs of different specs raise ResultsError: one paired table compares
    runs of one spec (loadgen.core.same_spec says which fields may differ).
    """
    runs_root = Path(results_dir) / "runs"
    run_dirs = sorted(p for p in runs_root.iterdir() if p.is_dir()) if runs_root.is_dir() else []

    completed: list[RunData] = []
    incomplete_runs: list[str] = []
    unreadable_runs: list[dict] = []
    for run_dir in run_dirs:
        if not (run_dir / "run.json").exists() and not any(run_dir.glob("*.parquet")):
            continue  # not a run (yet): a directory a run was about to write into
        try:
            run_json = read_run_json(run_dir / "run.json")
            if run_json.get("status") != "completed":
                incomplete_runs.append(str(run_json["run_id"]))
                continue
            unmerged = [p.name for p in part_files(run_dir / PARTS_DIR)]
            if unmerged:  # rows written but not merged (a corrupt part): the tables would miss them
                raise ValueError(f"{run_dir / PARTS_DIR}: rows that cannot be merged into the run's tables "
                                 f"({', '.join(unmerged)})")
            completed.append(load(run_dir))
        except ValueError as exc:  # the message names the file and what is wrong with it
            unreadable_runs.append({"run_id": run_dir.name, "error": str(exc)})
    _check_one_spec(Path(results_dir), completed)

    run_jsons = [run.run_json for run in completed]
    outcomes = [run_outcome(run) for run in completed]
    fit = cold_turn_fit(completed)  # from the cache-off runs, if any (loadgen.analysis.drain)
    for run, outcome in zip(completed, outcomes):
        outcome.update(drain_fields(run, fit))
    arms = _arm_order(run_jsons, (o["arm"] for o in outcomes))
    arm_rank = {arm: i for i, arm in enumerate(arms)}
    outcomes.sort(key=lambda o: (arm_rank[o["arm"]], o["seed"], o["run_id"]))

    baseline_arm = _baseline_arm(run_jsons, arms)
    replays = any(is_replay(r) for r in run_jsons)
    if replays:  # an open-loop benchmark: its table is serving_by_arm (loadgen.analysis.serving)
        for outcome in outcomes:
            outcome.update({key: None for key in REPLAY_UNJUDGED}, verdicts=REPLAY_VERDICTS)
    if baseline_arm is None or replays:
        pairs: dict = {"baseline_arm": baseline_arm, "comparisons": []}
        if replays:
            pairs["not_judged"] = REPLAY_VERDICTS
    else:
        spec = run_jsons[0].get("spec") if run_jsons else None
        spec_arms = [a for a in (spec.get("arms") or []) if isinstance(a, Mapping)] if isinstance(spec, Mapping) else []
        pairs = paired_comparisons(outcomes, baseline_arm, twin_baselines(spec_arms))
    summary = {
        "experiment": _experiment_name(run_jsons),
        "runs": outcomes,
        "pairs": pairs,
        "recovery": (recovery_intervals(completed, recovery_table(completed, arms))
                     if has_control(run_jsons) else None),
        "incomplete_runs": sorted(incomplete_runs),
        "latency_by_arm": latency_by_arm(completed, outcomes),
        "unreadable_runs": unreadable_runs,
        "cold_turn_fit": fit,
    }
    serving = serving_by_arm(completed, arms)  # only for replayed traces (loadgen.analysis.serving)
    if serving is not None:
        summary["serving_by_arm"] = serving
    trees = trees_by_arm(completed, arms)  # only for runs of session trees (loadgen.analysis.trees)
    if trees is not None:
        summary["trees_by_arm"] = trees
    return summary


def _check_one_spec(results_dir: Path, runs: Sequence[RunData]) -> None:
    """ResultsError naming two runs of different specs and the fields that differ."""
    groups: list[RunData] = []  # one run of each distinct spec, in run-id order
    for run in runs:
        spec = run.run_json.get("spec")
        if not isinstance(spec, dict):
            continue  # results from before run.json recorded the spec: nothing to compare
        if all(spec_differences(g.run_json["spec"], spec) for g in groups):
            groups.append(run)
    if len(groups) > 1:
        first, other = groups[0], groups[1]
        a, b = first.run_json["spec"], other.run_json["spec"]
        same_as = lambda g: [r.run_dir.name for r in runs if isinstance(r.run_json.get("spec"), dict)
                             and not spec_differences(g.run_json["spec"], r.run_json["spec"])]
        more = f" ({len(groups) - 2} more specs besides)" if len(groups) > 2 else ""
        raise ResultsError(
            f"{results_dir}: runs of different specs cannot share one paired table: "
            f"{', '.join(same_as(first))} and {', '.join(same_as(other))}{more} differ in "
            f"{describe_differences(a, b, spec_differences(a, b))}. Keep one spec per results directory "
            f"(`loadgen run --force-new-spec` moves old runs aside)")

def write_summary(results_dir: str | os.PathLike, load: Callable[[Path], RunData] = load_run) -> dict:
    """Rebuild summary.json in results_dir atomically (temp file + os.replace); return the dict."""
    summary = summarize(results_dir, load)
    target = Path(results_dir) / "summary.json"
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    # allow_nan=False: a NaN slipping through would make the file unreadable by strict parsers.
    tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, target)
    return summary


class ResultsError(ValueError):
    """A results directory that cannot be read: the message names it and says what was expected."""


def check_results_dir(results_dir: str | os.PathLike) -> Path:
    """``results_dir`` as a Path, or ResultsError when it holds no runs/ folder."""
    path = Path(results_dir)
    if (path / "run.json").is_file() and path.parent.name == "runs":
        raise ResultsError(f"{path}: is one run's folder; its results directory is {path.parent.parent}: "
                           f"`loadgen report {path.parent.parent}`")
    if not (path / "runs").is_dir():
        what = "does not exist" if not path.exists() else "is not a results directory (no runs/ folder)"
        raise ResultsError(f"{path}: {what}; run `loadgen run SPEC --out {path}` first")
    return path


@dataclass
class Results:
    """A results directory as the notebook and the report read it."""

    results_dir: Path
    summary: dict
    runs_by_arm: dict[str, list[RunData]]  # in the summary's arm order, seeds ascending


def load_results(results_dir: str | os.PathLike) -> Results:
    """The summary of every completed run under ``results_dir`` and those runs, loaded by arm."""
    path = check_results_dir(results_dir)
    load = lru_cache(maxsize=None)(load_run)  # the summary's runs are the ones returned: read once
    summary = summarize(path, load)
    runs_by_arm: dict[str, list[RunData]] = {arm: [] for arm in table_arms(summary)}
    for entry in sorted(summary["runs"], key=lambda e: int(e["seed"])):
        runs_by_arm[str(entry["arm"])].append(load(path / "runs" / entry["run_id"]))
    return Results(path, summary, {arm: runs for arm, runs in runs_by_arm.items() if runs})
