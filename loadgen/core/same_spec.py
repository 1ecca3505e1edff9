"""Whether runs belong together: the fields in which two resolved specs differ.

A results directory holds the runs of one spec, so that its paired table compares like with
like. Runs of one directory may differ only in
- the seeds (each run.json records only its own seed),
- the arms listed (``--arms`` runs some of them; a run of one arm says nothing about another),
  but an arm present in both specs must be the same arm,
- the engine's URL (the same engine reached at another address, ``--endpoint``),
- the description (prose; it changes no result).

``loadgen run`` and ``loadgen sweep`` check a directory before writing into it
(:func:`check_results_dir_spec`, or :func:`move_runs_aside` with ``--force-new-spec``); the
report checks the runs it pairs; ``loadgen compare`` checks only what must match between a real
engine and the simulator (:func:`compared_fields`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from .spec import ExperimentSpec

# dotted paths (see spec_differences) that may differ between runs of one results directory
RESULTS_DIR_EXEMPT = ("seeds", "description", "engine.url")
# what the previous runs' files are moved into by --force-new-spec, numbered from 1
PREVIOUS_PREFIX = "previous-"
_MOVED_ASIDE = ("runs", "spec.yaml", "summary.json", "figures", "compare", "replicates", "replicates.json")


class MixedSpecError(ValueError):
    """Runs of different specs where one spec is expected; the message names runs and fields."""


def spec_differences(a: Any, b: Any, exempt: Sequence[str] = RESULTS_DIR_EXEMPT, _path: str = "") -> list[str]:
    """Dotted paths of the fields in which ``a`` and ``b`` (spec dicts as run.json records them)
    differ, e.g. ``workload.arrival_rate_per_s`` or ``arms[burst].triggers[0].start_s``.

    Arms are matched by name (``arms[NAME]``) and only those in both are compared; ``exempt``
    paths are skipped. A field present on one side only is a difference unless it is None (an
    optional field newer than the recorded spec).
    """
    if _path in exempt:
        return []
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        found = []
        for key in list(a) + [k for k in b if k not in a]:
            path = f"{_path}.{key}" if _path else str(key)
            if key not in a or key not in b:
                # a field added to specs after a run was recorded, left at None, is no difference
                if path not in exempt and (a.get(key) is not None or b.get(key) is not None):
                    found.append(path)
            elif path == "arms" and _path == "":
                found += _arm_differences(a[key], b[key], exempt)
            else:
                found += spec_differences(a[key], b[key], exempt, path)
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in spec_differences(x, y, exempt, f"{_path}[{i}]")]
    return [] if _equal(a, b) else [_path or "(whole spec)"]


def _equal(a: Any, b: Any) -> bool:
    # 600 and 600.0 are the same number; True is not 1 (a spec field is one or the other)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _arm_differences(a: Any, b: Any, exempt: Sequence[str]) -> list[str]:
    if not (isinstance(a, list) and isinstance(b, list)):
        return [] if a == b else ["arms"]
    by_name_a, by_name_b = _arms_by_name(a), _arms_by_name(b)
    found = []
    for name in [n for n in by_name_a if n in by_name_b]:
        found += spec_differences(by_name_a[name], by_name_b[name], exempt, f"arms[{name}]")
    return found


def _arms_by_name(arms: list) -> dict[str, Any]:
    return {str(arm.get("name")) if isinstance(arm, Mapping) else str(arm): arm for arm in arms}


def value_at(spec: Any, path: str) -> Any:
    """The value at a path spec_differences named (``<absent>`` when there is none)."""
    value, previous = spec, None
    for part in path.replace("]", "").replace("[", ".").split("."):
        if isinstance(value, list) and previous == "arms":
            value = _arms_by_name(value).get(part, "<absent>")
        elif isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return "<absent>"
        previous = part
    return value


def describe_differences(a: Any, b: Any, paths: Sequence[str], limit: int = 6) -> str:
    """``field (A vs B)``, comma-separated, at most ``limit`` of them."""
    def short(value: Any) -> str:
        text = json.dumps(value) if not isinstance(value, str) or value == "<absent>" else repr(value)
        return text if len(text) <= 40 else text[:37] + "..."

    shown = [f"{p} ({short(value_at(a, p))} vs {short(value_at(b, p))})" for p in paths[:limit]]
    more = f" and {len(paths) - limit} more" if len(paths) > limit else ""
    return ", ".join(shown) + more


def compared_fields(spec: Mapping[str, Any], arm: str) -> dict:
    """What ``loadgen compare`` needs equal between a real and a simulated run of ``arm``: the
    workload, the seed, the arm's triggers and its controller (the arm's own, else the
    experiment's). The engine, the recording, the time scale and the run length may differ
    (compare reads the common length)."""
    this = _arms_by_name(spec.get("arms") or []).get(arm)
    this = this if isinstance(this, Mapping) else {}
    return {"workload": spec.get("workload"), "seeds": spec.get("seeds"),
            "arms": [{"name": arm, "triggers": this.get("triggers") or [],
                      "controller": this.get("controller") or spec.get("controller")}]}


def recorded_specs(out_dir: Path) -> dict[str, dict]:
    """run id -> the spec its run.json records, for every run under ``out_dir/runs`` that has one."""
    specs = {}
    for path in sorted((Path(out_dir) / "runs").glob("*/run.json")):
        try:
            spec = json.loads(path.read_text()).get("spec")
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable run.json is the report's to list, not a spec to compare
        if isinstance(spec, dict):
            specs[path.parent.name] = spec
    return specs


def check_results_dir_spec(out_dir: Path, spec: ExperimentSpec) -> None:
    """MixedSpecError when ``out_dir`` holds runs of a spec other than ``spec`` (the exempt
    fields aside), naming the first such run and the fields that differ."""
    new = spec.model_dump(mode="json")
    for run_id, old in recorded_specs(out_dir).items():
        paths = spec_differences(old, new)
        if paths:
            raise MixedSpecError(
                f"{out_dir} holds runs of another spec (e.g. {run_id}); it differs in "
                f"{describe_differences(old, new, paths)} (recorded vs this spec). Use another --out, "
                f"or --force-new-spec to move the old runs aside to {out_dir / (PREVIOUS_PREFIX + 'N')}/")


def move_runs_aside(out_dir: Path) -> Optional[Path]:
    """Move the runs, spec, summary and figures of ``out_dir`` into ``out_dir/previous-N`` (the
    first N free); returns that directory, or None when there was nothing to move."""
    out_dir = Path(out_dir)
    present = [name for name in _MOVED_ASIDE if (out_dir / name).exists()]
    present += sorted(p.name for p in out_dir.glob("compare-vs-*"))  # loadgen compare's default outputs
    if not present:
        return None
    n = 1
    while (out_dir / f"{PREVIOUS_PREFIX}{n}").exists():
        n += 1
    target = out_dir / f"{PREVIOUS_PREFIX}{n}"
    target.mkdir()
    for name in present:
        (out_dir / name).rename(target / name)
    return target


def claim_results_dir(out_dir: Path, spec: ExperimentSpec, force_new_spec: bool = False) -> Optional[Path]:
    """Make ``out_dir`` ready for runs of ``spec``: MixedSpecError when it holds runs of another
    spec, unless ``force_new_spec``, which moves them aside; returns where they went (or None)."""
    try:
        check_results_dir_spec(out_dir, spec)
    except MixedSpecError:
        if not force_new_spec:
            raise
        return move_runs_aside(out_dir)
    return None
