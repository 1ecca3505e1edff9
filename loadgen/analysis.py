"""Outcome analysis of recorded runs: windows, per-run outcomes, paired comparisons, summary.json.

Everything here is a pure function of the files a run wrote (docs/results-format.md) and of the
definitions in SPEC.md section 7. Nothing reads the system clock and nothing plots; figures live
in ``loadgen.report``.

Window convention: a turn belongs to the window in which it *finishes*; windows are half-open
``[start, start + width)`` except that the last window of a series also takes turns finishing
exactly at its end (a turn finishing at the run's end belongs to the run). Only successful turns
(``error`` null) count.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .recording import SAMPLE_SCHEMA, SESSION_SCHEMA, TURN_SCHEMA

__all__ = [
    "TURNS_SCHEMA",
    "SAMPLES_SCHEMA",
    "RunData",
    "WindowSeries",
    "load_run",
    "window_series",
    "hit_ratio_between",
    "persistently_degraded",
    "run_outcome",
    "sign_test_p",
    "paired_comparisons",
    "summarize",
    "write_summary",
    "outcome_table",
    "format_outcome_table",
    "SESSIONS_SCHEMA",
    "Cohort",
    "collapsed_at",
    "recovery_time_s",
    "cohort",
    "first_turn_gateway_waits_s",
    "first_phase_end_s",
    "quantile_nearest_rank",
    "control_outcome",
    "cohort_completion_by_arrival",
    "recovery_table",
    "format_recovery_table",
]

# the files' schemas are the recorder's: one definition (the test factories keep their own
# copy, written from docs/results-format.md, so tests check code against the contract)
TURNS_SCHEMA = TURN_SCHEMA
SAMPLES_SCHEMA = SAMPLE_SCHEMA
SESSIONS_SCHEMA = SESSION_SCHEMA

# The columns this module actually reads; a file lacking one of them is malformed for us.
_TURNS_REQUIRED = ("finish_s", "prompt_tokens", "cached_tokens", "error")
_SAMPLES_REQUIRED = ("t_s", "sessions_in_system")
_SESSIONS_REQUIRED = ("arrival_s", "first_admit_s", "finish_s", "status")
_RUN_JSON_REQUIRED = ("run_id", "arm", "seed", "duration_s")

LAST_HIT_WINDOW_S = 600.0
LAST_SESSIONS_WINDOW_S = 300.0
DEGRADED_HIT_RATIO = 0.5
DEGRADED_WINDOW_S = 300.0

# Tolerance for "a window ends by the run's end" so float rounding never drops a full window.
_EPS_S = 1e-9


# --------------------------------------------------------------------------------------------
# Loading


@dataclass
class RunData:
    """One run as recorded: run.json as a dict and its Parquet tables.

    ``sessions`` is empty for results written before sessions.parquet existed; the measures
    that need it (cohorts, first-turn gateway waits) are then undefined (None).
    """

    run_dir: Path
    run_json: dict
    turns: pa.Table
    samples: pa.Table
    sessions: pa.Table = field(default_factory=SESSIONS_SCHEMA.empty_table)


def _read_run_json(path: Path) -> dict:
    """Parse run.json, raising ValueError naming the file when absent or malformed."""
    if not path.is_file():
        raise ValueError(f"{path}: missing run.json")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: malformed run.json: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: malformed run.json: expected a JSON object")
    missing = [key for key in _RUN_JSON_REQUIRED if key not in data]
    if missing:
        raise ValueError(f"{path}: malformed run.json: missing keys {missing}")
    return data


def _read_table(path: Path, schema: pa.Schema, required: Sequence[str]) -> pa.Table:
    """Read one Parquet file, raising ValueError naming the file when absent or malformed."""
    if not path.is_file():
        raise ValueError(f"{path}: missing {path.name}")
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{path}: malformed {path.name}: {exc}") from exc
    missing = [name for name in required if name not in table.column_names]
    if missing:
        if table.num_rows == 0:
            # A writer that closed before its first row may not have written our schema;
            # an empty table with the documented columns means the same thing.
            return schema.empty_table()
        raise ValueError(f"{path}: malformed {path.name}: missing columns {missing}")
    return table


def load_run(run_dir: str | os.PathLike) -> RunData:
    """Load run.json, turns.parquet, samples.parquet and (when present) sessions.parquet."""
    run_path = Path(run_dir)
    run_json = _read_run_json(run_path / "run.json")
    turns = _read_table(run_path / "turns.parquet", TURNS_SCHEMA, _TURNS_REQUIRED)
    samples = _read_table(run_path / "samples.parquet", SAMPLES_SCHEMA, _SAMPLES_REQUIRED)
    sessions_path = run_path / "sessions.parquet"
    sessions = (_read_table(sessions_path, SESSIONS_SCHEMA, _SESSIONS_REQUIRED) if sessions_path.is_file()
                else SESSIONS_SCHEMA.empty_table())
    return RunData(run_dir=run_path, run_json=run_json, turns=turns, samples=samples, sessions=sessions)


# --------------------------------------------------------------------------------------------
# Column helpers


def _float_column(table: pa.Table, name: str) -> np.ndarray:
    """A column as float64 with nulls as NaN."""
    column = table.column(name).cast(pa.float64())
    return np.asarray(column.to_numpy(), dtype=np.float64)


def _success_mask(turns: pa.Table) -> np.ndarray:
    """True for turns that succeeded (error null; an empty string is tolerated as success)."""
    errors = turns.column("error").to_pylist()
    finish_s = _float_column(turns, "finish_s")
    ok = np.fromiter((err is None or err == "" for err in errors), dtype=bool, count=len(errors))
    return ok & np.isfinite(finish_s)


@dataclass
class _SuccessfulTurns:
    """The columns of successful turns that window statistics need."""

    finish_s: np.ndarray
    prompt_tokens: np.ndarray
    cached_tokens: np.ndarray


def _successful_turns(turns: pa.Table) -> _SuccessfulTurns:
    mask = _success_mask(turns)
    return _SuccessfulTurns(
        finish_s=_float_column(turns, "finish_s")[mask],
        prompt_tokens=np.nan_to_num(_float_column(turns, "prompt_tokens")[mask]),
        cached_tokens=np.nan_to_num(_float_column(turns, "cached_tokens")[mask]),
    )


def _json_float(value: float) -> Optional[float]:
    """A plain float, or None when undefined (NaN / inf), so json.dumps stays strict."""
    value = float(value)
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------------------------
# Windows


@dataclass
class WindowSeries:
    """Per-window statistics of successful turns; index i is the window at window_starts_s[i]."""

    window_starts_s: np.ndarray
    window_widths_s: np.ndarray  # width_s except possibly a shorter last window
    hit_ratio: np.ndarray  # sum cached / sum prompt, NaN when no turns (or no prompt tokens)
    turns_per_s: np.ndarray
    recomputed_prompt_tokens_per_s: np.ndarray  # sum (prompt - cached) / width
    num_turns: np.ndarray  # int64


def _num_windows(start_s: float, end_s: float, width_s: float) -> int:
    if end_s <= start_s:
        return 0
    return int(math.ceil((end_s - start_s) / width_s - _EPS_S))


def window_series(turns: pa.Table, start_s: float, end_s: float, width_s: float) -> WindowSeries:
    """Token-weighted hit ratio, turns/s, recomputed prompt tokens/s and turn counts per window.

    Windows tile [start_s, end_s) with width width_s; the last one is shorter when the span is
    not a multiple of width_s, and its rates use its own width.
    """
    if width_s <= 0:
        raise ValueError(f"width_s must be positive, got {width_s}")
    num_windows = _num_windows(start_s, end_s, width_s)
    window_starts_s = start_s + width_s * np.arange(num_windows, dtype=np.float64)
    window_widths_s = np.minimum(width_s, end_s - window_starts_s)

    ok = _successful_turns(turns)
    in_span = (ok.finish_s >= start_s) & (ok.finish_s <= end_s) & (num_windows > 0)
    index = np.floor((ok.finish_s[in_span] - start_s) / width_s).astype(np.int64)
    # A turn finishing exactly at end_s belongs to the last window, not to one past it.
    index = np.minimum(index, max(num_windows - 1, 0))

    num_turns = np.bincount(index, minlength=num_windows).astype(np.int64)
    prompt_sum = np.bincount(index, weights=ok.prompt_tokens[in_span], minlength=num_windows)
    cached_sum = np.bincount(index, weights=ok.cached_tokens[in_span], minlength=num_windows)

    with np.errstate(divide="ignore", invalid="ignore"):
        hit_ratio = np.where(prompt_sum > 0, cached_sum / prompt_sum, np.nan)
    return WindowSeries(
        window_starts_s=window_starts_s,
        window_widths_s=window_widths_s,
        hit_ratio=hit_ratio.astype(np.float64),
        turns_per_s=num_turns / window_widths_s if num_windows else np.zeros(0),
        recomputed_prompt_tokens_per_s=(
            (prompt_sum - cached_sum) / window_widths_s if num_windows else np.zeros(0)
        ),
        num_turns=num_turns,
    )


def hit_ratio_between(turns: pa.Table, start_s: float, end_s: float) -> float:
    """Token-weighted hit ratio of successful turns finishing in [start_s, end_s]; NaN if none."""
    ok = _successful_turns(turns)
    in_span = (ok.finish_s >= start_s) & (ok.finish_s <= end_s)
    prompt_tokens = float(ok.prompt_tokens[in_span].sum())
    if prompt_tokens <= 0:
        return math.nan
    return float(ok.cached_tokens[in_span].sum()) / prompt_tokens


def _num_turns_between(turns: pa.Table, start_s: float, end_s: float) -> int:
    ok = _successful_turns(turns)
    return int(np.count_nonzero((ok.finish_s >= start_s) & (ok.finish_s <= end_s)))


# --------------------------------------------------------------------------------------------
# Per-run outcome


def persistently_degraded(
    turns: pa.Table,
    reference_trigger_end_s: Optional[float],
    duration_s: float,
    threshold: float = DEGRADED_HIT_RATIO,
    window_s: float = DEGRADED_WINDOW_S,
) -> bool:
    """Whether the run stays degraded from its first degraded window after the trigger to its end.

    Windows are [te + window_s*k, te + window_s*(k+1)) for those ending by duration_s, with te
    = reference_trigger_end_s (0 when the experiment has no trigger). A window is degraded when
    its hit ratio is below threshold or it has no finished turns. No full window: False.
    """
    trigger_end_s = 0.0 if reference_trigger_end_s is None else float(reference_trigger_end_s)
    if duration_s <= trigger_end_s:
        return False
    num_full_windows = int(math.floor((duration_s - trigger_end_s) / window_s + _EPS_S))
    if num_full_windows == 0:
        return False
    series = window_series(
        turns, trigger_end_s, trigger_end_s + num_full_windows * window_s, window_s
    )
    # NaN (an empty window) compares False to >= threshold, so it counts as degraded.
    degraded = ~(series.hit_ratio >= threshold)
    if not degraded.any():
        return False
    first_degraded = int(np.argmax(degraded))
    return bool(degraded[first_degraded:].all())


def _mean_sessions_between(samples: pa.Table, start_s: float, end_s: float) -> float:
    t_s = _float_column(samples, "t_s")
    sessions = _float_column(samples, "sessions_in_system")
    in_span = (t_s >= start_s) & (t_s <= end_s) & np.isfinite(sessions)
    if not in_span.any():
        return math.nan
    return float(sessions[in_span].mean())


def _last_sample_int(samples: pa.Table, name: str) -> Optional[int]:
    if samples.num_rows == 0 or name not in samples.column_names:
        return None
    t_s = _float_column(samples, "t_s")
    values = _float_column(samples, name)
    finite = np.isfinite(values) & np.isfinite(t_s)
    if not finite.any():
        return None
    return int(values[finite][np.argmax(t_s[finite])])


def _count(run: RunData, key: str, sample_column: str) -> Optional[int]:
    """A run-level count: run.json counts, else the last sample's cumulative total."""
    counts = run.run_json.get("counts") or {}
    if isinstance(counts, Mapping) and counts.get(key) is not None:
        return int(counts[key])
    return _last_sample_int(run.samples, sample_column)


def run_outcome(run: RunData) -> dict:
    """The per-run fields of a summary.json `runs` entry (None where a value is undefined)."""
    info = run.run_json
    duration_s = float(info["duration_s"])
    last_hit_start_s = max(0.0, duration_s - LAST_HIT_WINDOW_S)
    last_hit_width_s = duration_s - last_hit_start_s

    turns_completed = _count(run, "turns_completed", "turns_completed_total")
    if turns_completed is None:
        turns_completed = int(_success_mask(run.turns).sum())
    num_last_turns = _num_turns_between(run.turns, last_hit_start_s, duration_s)

    return {
        "run_id": str(info["run_id"]),
        "experiment": info.get("experiment"),
        "arm": str(info["arm"]),
        "seed": int(info["seed"]),
        "duration_s": duration_s,
        "hit_ratio_last10min": _json_float(
            hit_ratio_between(run.turns, last_hit_start_s, duration_s)
        ),
        "sessions_in_system_last5min": _json_float(
            _mean_sessions_between(
                run.samples, duration_s - LAST_SESSIONS_WINDOW_S, duration_s
            )
        ),
        "persistently_degraded": persistently_degraded(
            run.turns, info.get("reference_trigger_end_s"), duration_s
        ),
        "turns_completed": turns_completed,
        "sessions_completed": _count(run, "sessions_completed", "sessions_completed_total"),
        "turns_per_s_last10min": (
            _json_float(num_last_turns / last_hit_width_s) if last_hit_width_s > 0 else None
        ),
        **control_outcome(run),
    }


# --------------------------------------------------------------------------------------------
# Control outcomes: collapse at switch-on, recovery, cohorts, gateway waits

COLLAPSE_WINDOW_S = 300.0
RECOVERED_HIT_RATIO = 0.8
RECOVERY_WINDOW_S = 300.0
RECOVERY_STEP_S = 60.0
RECOVERY_FOLLOW_UP_S = 600.0
COHORT_WINDOW_S = 1200.0


def _window_hit_ratios(turns: pa.Table, starts_s: np.ndarray, width_s: float, run_end_s: float) -> np.ndarray:
    """Hit ratio of successful turns finishing in each [start, start + width_s), NaN when none.

    Windows may overlap; one ending at the run's end also takes turns finishing exactly then.
    """
    ok = _successful_turns(turns)
    order = np.argsort(ok.finish_s, kind="stable")
    finish_s = ok.finish_s[order]
    prompt_cum = np.concatenate([[0.0], np.cumsum(ok.prompt_tokens[order])])
    cached_cum = np.concatenate([[0.0], np.cumsum(ok.cached_tokens[order])])
    ends_s = starts_s + width_s
    lo = np.searchsorted(finish_s, starts_s, side="left")
    hi = np.where(ends_s >= run_end_s - _EPS_S, np.searchsorted(finish_s, ends_s, side="right"),
                  np.searchsorted(finish_s, ends_s, side="left"))
    prompt_tokens = prompt_cum[hi] - prompt_cum[lo]
    cached_tokens = cached_cum[hi] - cached_cum[lo]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(prompt_tokens > 0, cached_tokens / prompt_tokens, np.nan)


def collapsed_at(turns: pa.Table, at_s: float, window_s: float = COLLAPSE_WINDOW_S,
                 threshold: float = DEGRADED_HIT_RATIO) -> bool:
    """Whether the run was degraded at ``at_s``: hit ratio < threshold over the window_s before it.

    A window with no finished turn counts as degraded (as in persistently_degraded); at time 0
    there is nothing before, so nothing has collapsed.
    """
    if at_s <= 0:
        return False
    start_s = max(0.0, at_s - window_s)
    ratio = _window_hit_ratios(turns, np.array([start_s]), at_s - start_s, math.inf)[0]
    return not ratio >= threshold


def recovery_time_s(turns: pa.Table, control_start_s: float, duration_s: float,
                    threshold: float = RECOVERED_HIT_RATIO, window_s: float = RECOVERY_WINDOW_S,
                    step_s: float = RECOVERY_STEP_S, follow_up_s: float = RECOVERY_FOLLOW_UP_S) -> Optional[float]:
    """SPEC.md section 7: from control start to the start of the first window_s window (slid by
    step_s from control start) from which every later window has hit ratio >= threshold.

    Windows end by the run's end; an empty window is not recovered. The recovered stretch must
    be observed for at least ``follow_up_s`` (window start + follow_up_s <= duration_s), else the
    run has not (yet) recovered: None.
    """
    span_s = duration_s - control_start_s
    if span_s < window_s - _EPS_S:
        return None
    num_windows = int(math.floor((span_s - window_s) / step_s + _EPS_S)) + 1
    starts_s = control_start_s + step_s * np.arange(num_windows, dtype=np.float64)
    good = _window_hit_ratios(turns, starts_s, window_s, duration_s) >= threshold
    if not good[-1]:
        return None
    bad = np.flatnonzero(~good)
    first_good = int(bad[-1]) + 1 if bad.size else 0
    if starts_s[first_good] + follow_up_s > duration_s + _EPS_S:
        return None
    return float(starts_s[first_good] - control_start_s)


@dataclass
class Cohort:
    """The sessions arriving in a window: how many, how many finished by the run's end, and when."""

    num_sessions: int
    num_completed: int
    arrival_to_completion_s: np.ndarray  # inf for a session not finished by the run's end

    @property
    def done_fraction(self) -> float:
        return self.num_completed / self.num_sessions if self.num_sessions else math.nan

    @staticmethod
    def pooled(cohorts: Iterable["Cohort"]) -> "Cohort":
        cohorts = list(cohorts)
        times = [c.arrival_to_completion_s for c in cohorts]
        return Cohort(sum(c.num_sessions for c in cohorts), sum(c.num_completed for c in cohorts),
                      np.concatenate(times) if times else np.zeros(0))


def cohort(sessions: pa.Table, start_s: float, end_s: float) -> Cohort:
    """Sessions (sessions.parquet rows) arriving in [start_s, end_s)."""
    arrival_s = _float_column(sessions, "arrival_s")
    finish_s = _float_column(sessions, "finish_s")
    completed = np.array([status == "completed" for status in sessions.column("status").to_pylist()], dtype=bool)
    in_cohort = (arrival_s >= start_s) & (arrival_s < end_s)
    times_s = np.where(completed, finish_s - arrival_s, math.inf)[in_cohort]
    return Cohort(int(in_cohort.sum()), int((completed & in_cohort).sum()), times_s)


def quantile_nearest_rank(values: np.ndarray, q: float) -> float:
    """The nearest-rank q-quantile (the ceil(q n)-th smallest): no interpolation, so it stays
    well defined with infinite values (unfinished sessions). NaN for no values."""
    if len(values) == 0:
        return math.nan
    rank = min(len(values), max(1, math.ceil(q * len(values) - 1e-12)))
    return float(np.sort(values)[rank - 1])


def first_phase_end_s(run_json: Mapping[str, Any]) -> float:
    """The end of a run's first phase: its first session-mix shift, else the run's end."""
    shifts = [float(t["start_s"]) for t in run_json.get("triggers") or []
              if t.get("kind") == "mix_shift" and t.get("start_s") is not None]
    return min(shifts) if shifts else float(run_json["duration_s"])


def first_turn_gateway_waits_s(sessions: pa.Table, arrived_before_s: float, duration_s: float) -> np.ndarray:
    """Gateway wait before the first turn of each session arriving before ``arrived_before_s``.

    A session the gateway never admitted counts with what it had waited by the run's end
    (a lower bound): leaving it out would flatter exactly the limits that hold sessions longest.
    """
    arrival_s = _float_column(sessions, "arrival_s")
    admit_s = _float_column(sessions, "first_admit_s")
    waits_s = np.where(np.isfinite(admit_s), admit_s - arrival_s, duration_s - arrival_s)
    return waits_s[arrival_s < arrived_before_s]


def _control_start_s(run_json: Mapping[str, Any]) -> float:
    return float(run_json.get("control_start_s") or 0.0)


def _cohort_after_control(run: RunData) -> Cohort:
    start_s = _control_start_s(run.run_json)
    return cohort(run.sessions, start_s, start_s + COHORT_WINDOW_S)


def _minutes_or_none(seconds: float) -> Optional[float]:
    return _json_float(seconds / 60.0)


def control_outcome(run: RunData) -> dict:
    """The per-run control fields of a summary.json `runs` entry (None where undefined)."""
    info = run.run_json
    duration_s = float(info["duration_s"])
    control_start_s = _control_start_s(info)
    recovery_s = recovery_time_s(run.turns, control_start_s, duration_s)
    after_control = _cohort_after_control(run)
    waits_s = first_turn_gateway_waits_s(run.sessions, first_phase_end_s(info), duration_s)
    return {
        "controller": str(info.get("controller") or "none"),
        "control_start_s": control_start_s,
        "collapsed_at_control": collapsed_at(run.turns, control_start_s),
        "recovered": recovery_s is not None,
        "recovery_time_min": None if recovery_s is None else recovery_s / 60.0,
        "cohort_sessions_after_control": after_control.num_sessions,
        "cohort_done_after_control": _json_float(after_control.done_fraction),
        "cohort_completion_median_min": _minutes_or_none(
            quantile_nearest_rank(after_control.arrival_to_completion_s, 0.5)),
        "cohort_completion_p90_min": _minutes_or_none(
            quantile_nearest_rank(after_control.arrival_to_completion_s, 0.9)),
        "gateway_wait_p90_first_turn_s": _json_float(quantile_nearest_rank(waits_s, 0.9)),
    }


def cohort_completion_by_arrival(runs: Sequence[RunData], width_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Pooled over ``runs``: for arrival windows [k width_s, (k+1) width_s) up to the longest run,
    the window starts and the fraction of their sessions finished by the run's end (NaN if none)."""
    duration_s = max((float(r.run_json["duration_s"]) for r in runs), default=0.0)
    starts_s = width_s * np.arange(_num_windows(0.0, duration_s, width_s), dtype=np.float64)
    fractions = np.array([Cohort.pooled(cohort(r.sessions, s, s + width_s) for r in runs).done_fraction
                          for s in starts_s])
    return starts_s, fractions


def _has_control(run_jsons: Sequence[Mapping[str, Any]]) -> bool:
    return any((r.get("controller") or "none") != "none" or _control_start_s(r) > 0 for r in run_jsons)


def _end_hit_ratio(run: RunData) -> float:
    duration_s = float(run.run_json["duration_s"])
    return hit_ratio_between(run.turns, max(0.0, duration_s - LAST_HIT_WINDOW_S), duration_s)


def recovery_table(runs: Sequence[RunData], arms: Sequence[str]) -> list[dict]:
    """One row per arm for summary.json's `recovery`.

    Outcomes are over the arm's runs that had collapsed when control started (``basis``
    "collapsed"), the population the recovery question is about; over all its runs when none
    had ("all"). Recovery time: median and max over its recovered runs; end hit ratio: mean;
    cohort completion and arrival-to-completion quantiles: pooled over the runs' sessions.
    """
    rows = []
    for arm in arms:
        arm_runs = [r for r in runs if str(r.run_json["arm"]) == arm]
        outcomes = [control_outcome(r) for r in arm_runs]
        collapsed = [i for i, o in enumerate(outcomes) if o["collapsed_at_control"]]
        basis = collapsed or list(range(len(arm_runs)))
        times_min = [outcomes[i]["recovery_time_min"] for i in basis if outcomes[i]["recovered"]]
        hit_ratios = [h for h in (_end_hit_ratio(arm_runs[i]) for i in basis) if math.isfinite(h)]
        pooled = Cohort.pooled(_cohort_after_control(arm_runs[i]) for i in basis)
        rows.append({
            "arm": arm,
            "controller": outcomes[0]["controller"],  # every arm listed has a run
            "control_start_s": outcomes[0]["control_start_s"],
            "num_runs": len(arm_runs),
            "num_collapsed": len(collapsed),
            "basis": "collapsed" if collapsed else "all",
            "num_basis": len(basis),
            "num_recovered": len(times_min),
            "recovery_time_min_median": float(np.median(times_min)) if times_min else None,
            "recovery_time_min_max": max(times_min) if times_min else None,
            "hit_ratio_last10min_mean": float(np.mean(hit_ratios)) if hit_ratios else None,
            "cohort_sessions": pooled.num_sessions,
            "cohort_done": _json_float(pooled.done_fraction),
            "cohort_completion_median_min": _minutes_or_none(
                quantile_nearest_rank(pooled.arrival_to_completion_s, 0.5)),
            "cohort_completion_p90_min": _minutes_or_none(
                quantile_nearest_rank(pooled.arrival_to_completion_s, 0.9)),
        })
    return rows


# --------------------------------------------------------------------------------------------
# Paired comparisons


def sign_test_p(k: int, n: int) -> float:
    """Exact two-sided binomial sign test: min(1, 2 * sum_{i <= min(k, n-k)} C(n, i) / 2^n)."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"sign test needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1))
    # Integer arithmetic up to the one final division keeps the p-value exact for large n.
    return min(1.0, 2 * tail / 2**n)


def _runs_by_arm_and_seed(run_outcomes: Iterable[Mapping[str, Any]]) -> dict[str, dict[int, dict]]:
    by_arm: dict[str, dict[int, dict]] = {}
    for outcome in run_outcomes:
        arm, seed = str(outcome["arm"]), int(outcome["seed"])
        seeds = by_arm.setdefault(arm, {})
        if seed in seeds:
            raise ValueError(
                f"two runs for arm {arm!r} seed {seed}: "
                f"{seeds[seed].get('run_id')} and {outcome.get('run_id')}"
            )
        seeds[seed] = dict(outcome)
    return by_arm


def _comparison(arm: str, baseline: Mapping[int, dict], treated: Mapping[int, dict]) -> dict:
    seeds = sorted(set(baseline) & set(treated))
    per_seed = [{"seed": seed, "baseline": baseline[seed], "arm": treated[seed]} for seed in seeds]
    degraded_baseline = sum(bool(baseline[s]["persistently_degraded"]) for s in seeds)
    degraded_arm = sum(bool(treated[s]["persistently_degraded"]) for s in seeds)
    arm_only = sum(
        bool(treated[s]["persistently_degraded"]) and not baseline[s]["persistently_degraded"]
        for s in seeds
    )
    baseline_only = sum(
        bool(baseline[s]["persistently_degraded"]) and not treated[s]["persistently_degraded"]
        for s in seeds
    )
    return {
        "arm": arm,
        "n_pairs": len(seeds),
        "degraded_baseline": degraded_baseline,
        "degraded_arm": degraded_arm,
        "discordant_arm_only": arm_only,
        "discordant_baseline_only": baseline_only,
        "sign_test_p": sign_test_p(arm_only, arm_only + baseline_only),
        "per_seed": per_seed,
    }


def paired_comparisons(run_outcomes: Sequence[Mapping[str, Any]], baseline_arm: str) -> dict:
    """Pair runs by seed between baseline_arm and every other arm (in order of first appearance).

    Seeds present in only one arm of a comparison are skipped. Returns the `pairs` object of
    summary.json.
    """
    by_arm = _runs_by_arm_and_seed(run_outcomes)
    baseline = by_arm.get(baseline_arm, {})
    comparisons = [
        _comparison(arm, baseline, treated)
        for arm, treated in by_arm.items()
        if arm != baseline_arm
    ]
    return {"baseline_arm": baseline_arm, "comparisons": comparisons}


# --------------------------------------------------------------------------------------------
# summary.json


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


def summarize(results_dir: str | os.PathLike) -> dict:
    """Build the summary.json dict from every completed run under results_dir/runs/.

    Runs whose status is not "completed" are left out of `runs` and `pairs` and listed by id
    under `incomplete_runs`.
    """
    runs_root = Path(results_dir) / "runs"
    run_json_paths = sorted(runs_root.glob("*/run.json")) if runs_root.is_dir() else []

    completed: list[RunData] = []
    incomplete_runs: list[str] = []
    for path in run_json_paths:
        run_json = _read_run_json(path)
        if run_json.get("status") != "completed":
            incomplete_runs.append(str(run_json["run_id"]))
            continue
        completed.append(load_run(path.parent))

    run_jsons = [run.run_json for run in completed]
    outcomes = [run_outcome(run) for run in completed]
    arms = _arm_order(run_jsons, (o["arm"] for o in outcomes))
    arm_rank = {arm: i for i, arm in enumerate(arms)}
    outcomes.sort(key=lambda o: (arm_rank[o["arm"]], o["seed"], o["run_id"]))

    baseline_arm = _baseline_arm(run_jsons, arms)
    if baseline_arm is None:
        pairs: dict = {"baseline_arm": None, "comparisons": []}
    else:
        pairs = paired_comparisons(outcomes, baseline_arm)
    return {
        "experiment": _experiment_name(run_jsons),
        "runs": outcomes,
        "pairs": pairs,
        "recovery": recovery_table(completed, arms) if _has_control(run_jsons) else None,
        "incomplete_runs": sorted(incomplete_runs),
    }


def write_summary(results_dir: str | os.PathLike) -> dict:
    """Rebuild summary.json in results_dir atomically (temp file + os.replace); return the dict."""
    summary = summarize(results_dir)
    target = Path(results_dir) / "summary.json"
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    # allow_nan=False: a NaN slipping through would make the file unreadable by strict parsers.
    tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, target)
    return summary


# --------------------------------------------------------------------------------------------
# Paired outcome table


def _table_arms(summary: Mapping[str, Any]) -> list[str]:
    """Baseline arm, then compared arms, then any other arm with runs."""
    pairs = summary.get("pairs") or {}
    arms = [pairs.get("baseline_arm")] if pairs.get("baseline_arm") else []
    arms += [c["arm"] for c in pairs.get("comparisons", [])]
    arms += [r["arm"] for r in summary.get("runs", [])]
    return list(dict.fromkeys(arms))


def outcome_table(summary: Mapping[str, Any]) -> list[dict]:
    """One row per seed: {"seed": int, "arms": {arm: {hit/sessions/degraded fields} or None}}.

    Arms appear baseline first; an arm without a run for that seed maps to None.
    """
    arms = _table_arms(summary)
    by_seed: dict[int, dict[str, dict]] = {}
    for run in summary.get("runs", []):
        by_seed.setdefault(int(run["seed"]), {})[run["arm"]] = {
            "hit_ratio_last10min": run["hit_ratio_last10min"],
            "sessions_in_system_last5min": run["sessions_in_system_last5min"],
            "persistently_degraded": bool(run["persistently_degraded"]),
        }
    return [
        {"seed": seed, "arms": {arm: by_seed[seed].get(arm) for arm in arms}}
        for seed in sorted(by_seed)
    ]


def _fmt_number(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_cell(cell: Optional[Mapping[str, Any]]) -> list[str]:
    if cell is None:
        return ["-", "-", "-"]
    return [
        _fmt_number(cell["hit_ratio_last10min"], 3),
        _fmt_number(cell["sessions_in_system_last5min"], 1),
        "YES" if cell["persistently_degraded"] else "no",
    ]


def _fmt_comparison(comparison: Mapping[str, Any], baseline_arm: str) -> str:
    arm, n_pairs = comparison["arm"], comparison["n_pairs"]
    return (
        f"{arm} vs {baseline_arm}: {n_pairs} pairs; persistently degraded "
        f"{comparison['degraded_arm']}/{n_pairs} ({arm}) vs "
        f"{comparison['degraded_baseline']}/{n_pairs} ({baseline_arm}); discordant pairs "
        f"{comparison['discordant_arm_only']} ({arm} only) / "
        f"{comparison['discordant_baseline_only']} ({baseline_arm} only); "
        f"two-sided sign test p = {comparison['sign_test_p']:.4g}"
    )


def format_outcome_table(summary: Mapping[str, Any]) -> str:
    """The paired outcome table as fixed-width text, followed by one line per comparison."""
    arms = _table_arms(summary)
    rows = outcome_table(summary)
    sub_headers = ["hit10m", "sess5m", "degraded"]

    header = ["seed"] + sub_headers * len(arms)
    body = [
        [str(row["seed"])] + [cell for arm in arms for cell in _fmt_cell(row["arms"][arm])]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    # Each arm name heads its group of three columns; widen the group if the name is longer.
    for a, arm in enumerate(arms):
        first = 1 + 3 * a
        group_width = sum(widths[first : first + 3]) + 4  # two 2-space gaps inside a group
        widths[first + 2] += max(0, len(arm) - group_width)

    def group(cells: Sequence[str], a: int) -> str:
        first = 1 + 3 * a
        return "  ".join(cells[i].rjust(widths[i]) for i in range(first, first + 3))

    def join(cells: Sequence[str]) -> str:
        parts = [cells[0].rjust(widths[0])] + [group(cells, a) for a in range(len(arms))]
        return " | ".join(parts).rstrip()

    arm_titles = [" " * widths[0]] + [
        arm.ljust(sum(widths[1 + 3 * a : 4 + 3 * a]) + 4) for a, arm in enumerate(arms)
    ]
    pairs = summary.get("pairs") or {}
    lines = [
        f"Paired outcomes: experiment {summary.get('experiment')} "
        f"(baseline arm: {pairs.get('baseline_arm')})",
        " | ".join(arm_titles).rstrip(),
        join(header),
    ]
    lines += [join(cells) for cells in body]
    lines.append(
        "hit10m: token-weighted hit ratio, last 10 min; sess5m: mean sessions in system, "
        "last 5 min; degraded: persistently degraded"
    )
    for comparison in pairs.get("comparisons", []):
        lines.append(_fmt_comparison(comparison, str(pairs.get("baseline_arm"))))
    incomplete = summary.get("incomplete_runs") or []
    if incomplete:
        lines.append(f"incomplete runs (not counted): {', '.join(incomplete)}")
    return "\n".join(lines)


def _fmt_recovery_minutes(minutes: Optional[float]) -> str:
    """SPEC.md section 7: recovery times under 5 minutes are reported as "<5"."""
    if minutes is None:
        return "-"
    return "<5" if minutes < 5 else f"{minutes:.0f}"


def _fmt_completion_minutes(row: Mapping[str, Any], key: str) -> str:
    if row[key] is not None:
        return f"{row[key]:.1f}"
    return "-" if not row["cohort_sessions"] else "n/f"


def format_recovery_table(summary: Mapping[str, Any]) -> Optional[str]:
    """The per-arm recovery table as fixed-width text; None when the summary has none."""
    rows = summary.get("recovery")
    if not rows:
        return None
    header = ["arm", "controller", "ctl@min", "collapsed", "recovered", "recover min",
              "hit10m", "cohort20", "done med", "done p90"]
    body = []
    for row in rows:
        basis_mark = "" if row["basis"] == "collapsed" else "*"
        times = _fmt_recovery_minutes(row["recovery_time_min_median"])
        if row["num_recovered"] > 1:
            times += f" ({_fmt_recovery_minutes(row['recovery_time_min_max'])})"
        body.append([
            row["arm"], str(row["controller"]), f"{row['control_start_s'] / 60:g}",
            f"{row['num_collapsed']}/{row['num_runs']}",
            f"{row['num_recovered']}/{row['num_basis']}{basis_mark}", times,
            _fmt_number(row["hit_ratio_last10min_mean"], 3), _fmt_number(row["cohort_done"], 2),
            _fmt_completion_minutes(row, "cohort_completion_median_min"),
            _fmt_completion_minutes(row, "cohort_completion_p90_min"),
        ])
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]

    def join(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [f"Recovery: experiment {summary.get('experiment')}", join(header)]
    lines += [join(cells) for cells in body]
    lines += [
        "collapsed: hit ratio < 0.5 in the 5 min before control starts. The columns after it are over "
        "the arm's collapsed runs (* over all its runs when none collapsed).",
        "recover min: median (max) minutes from control start to the first 5-min window, slid by 1 min, "
        "from which every window has hit ratio >= 0.8, with >= 10 min of follow-up.",
        "hit10m: mean hit ratio over the last 10 min; cohort20: share of the sessions arriving in the 20 min "
        "after control start that finished by the run's end; done med/p90: their arrival-to-completion "
        "minutes (n/f: not finished by the run's end).",
    ]
    return "\n".join(lines)
