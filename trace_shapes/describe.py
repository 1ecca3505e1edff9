"""What a pool of sessions looks like, recorded and as replayed: the numbers ``loadgen shapes describe`` prints."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

import numpy as np

from .records import RecordedSession
from .replay import prepare, replay_stats

PERCENTILES = (10, 50, 90, 99)


def distribution(values: Sequence[float]) -> dict[str, float]:
    """Count, mean, percentiles (linear interpolation) and max of ``values``."""
    if len(values) == 0:
        return {"n": 0}
    array = np.asarray(values, dtype=float)
    summary = {"n": int(array.size), "mean": float(array.mean())}
    for q, value in zip(PERCENTILES, np.percentile(array, PERCENTILES)):
        summary[f"p{q}"] = float(value)
    summary["max"] = float(array.max())
    return summary


def describe_sessions(sessions: Sequence[RecordedSession], truncate_at_tokens: int,
                      over_tokens: Sequence[int] = (38_000,), name: str = "") -> dict[str, Any]:
    """Recorded statistics and what replay at ``truncate_at_tokens`` keeps of them."""
    growth = [p[k + 1] - p[k] for s in sessions for p in [s.prompt_tokens] for k in range(s.num_calls - 1)]
    gaps = [g for s in sessions for g in s.gaps_s]
    max_context = [s.max_context_tokens() for s in sessions]
    recorded = {
        "num_sessions": len(sessions),
        "models": dict(Counter(s.model for s in sessions).most_common()),
        "calls_per_session": distribution([s.num_calls for s in sessions]),
        "initial_context_tokens": distribution([s.prompt_tokens[0] for s in sessions]),
        "per_call_context_tokens": distribution([p for s in sessions for p in s.prompt_tokens]),
        "session_max_context_tokens": distribution(max_context),
        "output_tokens_per_call": distribution([o for s in sessions for o in s.output_tokens]),
        "growth_per_turn_tokens": distribution(growth),
        "appended_per_turn_tokens": distribution([a for s in sessions for a in s.appended_tokens()]),
        "gap_s": distribution([g for g in gaps if g is not None]),
        "num_gaps_missing": sum(g is None for g in gaps),
        "share_of_sessions_over": {str(limit): float(np.mean([m > limit for m in max_context]))
                                   for limit in over_tokens},
    }
    prepared = [prepare(s, truncate_at_tokens) for s in sessions]
    pool = [p for p in prepared if p is not None]
    replay = {
        "truncate_at_tokens": truncate_at_tokens,
        **replay_stats(sessions, pool).__dict__,
        "calls_per_session": distribution([p.num_calls for p in pool]),
        "per_call_context_tokens": distribution([c for p in pool for c in p.prompt_tokens]),
    }
    return {"name": name, "recorded": recorded, "replay": replay}


def _row(label: str, summary: dict[str, float], unit: str = "") -> str:
    if not summary.get("n"):
        return f"  {label:28s} (none)"
    cells = "  ".join(f"p{q} {_fmt(summary[f'p{q}'], unit)}" for q in PERCENTILES)
    return f"  {label:28s} {cells}  mean {_fmt(summary['mean'], unit)}  max {_fmt(summary['max'], unit)}"


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value:.3g}s"
    if abs(value) >= 1_000_000:
        return f"{value / 1e6:.2f}M"
    if abs(value) >= 10_000:
        return f"{value / 1000:.1f}K"
    return f"{value:.0f}"


def _share(part: int, whole: int) -> str:
    return f"{part} of {whole} ({100 * part / whole:.1f}%)" if whole else f"{part} of 0"


def format_description(description: dict[str, Any], notes: Optional[Sequence[str]] = None) -> str:
    rec, rep = description["recorded"], description["replay"]
    models = ", ".join(f"{m} {n}" for m, n in rec["models"].items())
    lines = [f"{description['name']}: {rec['num_sessions']} sessions ({models})"]
    lines += [f"  note: {note}" for note in notes or ()]
    lines += ["recorded:", *recorded_lines(rec)]
    lines += [
        f"  shrinking turns (next prompt < prompt + output): "
        f"{_share(rep['num_shrinking_turns'], rep['num_recorded_turns'])}",
        f"replay at truncate_at_tokens={rep['truncate_at_tokens']:,}:",
        f"  sessions: {rep['num_recorded_sessions'] - rep['num_dropped_sessions']} kept, "
        f"{rep['num_dropped_sessions']} dropped (first call too long), "
        f"{rep['num_truncated_sessions']} truncated",
        _row("calls per session", rep["calls_per_session"]),
        _row("per-call context (tokens)", rep["per_call_context_tokens"]),
        f"  turns raised to stay append-only: {_share(rep['num_raised_turns'], rep['num_kept_turns'])}, "
        f"+{rep['num_extra_tokens']:,} prompt tokens in all",
        f"  gaps the fallback fills: {_share(rep['num_kept_gaps_missing'], rep['num_kept_turns'])}",
    ]
    return "\n".join(lines)


def recorded_lines(rec: dict[str, Any]) -> list[str]:
    """The recorded section's rows (calls, contexts, outputs, growth, gaps, long sessions)."""
    lines = [
        _row("calls per session", rec["calls_per_session"]),
        _row("initial context (tokens)", rec["initial_context_tokens"]),
        _row("per-call context (tokens)", rec["per_call_context_tokens"]),
        _row("session max context", rec["session_max_context_tokens"]),
        _row("output per call (tokens)", rec["output_tokens_per_call"]),
        _row("growth per turn (tokens)", rec["growth_per_turn_tokens"]),
        _row("appended beyond output", rec["appended_per_turn_tokens"]),
        _row("gaps", rec["gap_s"], unit="s"),
    ]
    num_gaps = rec["gap_s"].get("n", 0) + rec["num_gaps_missing"]
    lines.append(f"  gaps recorded: {_share(rec['gap_s'].get('n', 0), num_gaps)}")
    for limit, share in rec["share_of_sessions_over"].items():
        lines.append(f"  sessions over {int(limit):,} tokens: {100 * share:.1f}%")
    return lines
