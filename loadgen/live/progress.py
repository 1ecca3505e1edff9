"""What a person watching a live experiment wants to know: how far the run is, how it is doing,
and how long the whole spec will take.

Live runs take wall-clock time (a 90-minute run takes 90 minutes at time scale 1), so the
estimate is said before anything starts and kept up to date as runs end. Everything here is a
pure function of the spec, the run keys and the sample rows a run records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

RECENT_S = 60.0  # run time over which "current" turns/s and hit ratio are measured


@dataclass(frozen=True)
class LiveSnapshot:
    """One live run at one sample."""

    t_s: float  # run time (already scaled: workload seconds)
    duration_s: float
    turns_per_s: Optional[float]  # over the last RECENT_S of run time
    hit_ratio: Optional[float]  # the engine's prefix-cache counters over the last RECENT_S
    sessions_in_system: int

    def describe(self) -> str:
        def fmt(value: Optional[float], digits: int) -> str:
            return "-" if value is None else f"{value:.{digits}f}"

        return (f"{_clock(self.t_s)}/{_clock(self.duration_s)} run time, {fmt(self.turns_per_s, 2)} turns/s, "
                f"hit {fmt(self.hit_ratio, 2)}, {self.sessions_in_system} sessions in system")


class LiveProgress:
    """Feed it each samples.parquet row of a live run; it says where the run stands."""

    def __init__(self, duration_s: float, recent_s: float = RECENT_S) -> None:
        self.duration_s = duration_s
        self.recent_s = recent_s
        self._rows: list[dict] = []

    def sample(self, row: dict) -> LiveSnapshot:
        self._rows.append(row)
        now = float(row["t_s"])
        # the oldest kept sample at least recent_s back (or the first one) is the reference
        while len(self._rows) > 2 and float(self._rows[1]["t_s"]) <= now - self.recent_s:
            self._rows.pop(0)
        ref = self._rows[0]
        span_s = now - float(ref["t_s"])
        turns_per_s = hit_ratio = None
        if span_s > 0:
            turns_per_s = (row["turns_completed_total"] - ref["turns_completed_total"]) / span_s
            queries = row["prefix_cache_queries_total"] - ref["prefix_cache_queries_total"]
            if queries > 0:
                hit_ratio = (row["prefix_cache_hits_total"] - ref["prefix_cache_hits_total"]) / queries
        return LiveSnapshot(now, self.duration_s, turns_per_s, hit_ratio, int(row["sessions_in_system"]))


def wall_time_s(num_runs: int, duration_s: float, time_scale: float) -> float:
    """Wall time of ``num_runs`` live runs one after another (preflights and reports not counted)."""
    return num_runs * duration_s / time_scale


def wall_time_left_s(num_runs_left: int, current: Optional[LiveSnapshot], duration_s: float,
                     time_scale: float) -> float:
    """Wall time left: the runs not started, and what remains of the run under way."""
    left_s = wall_time_s(num_runs_left, duration_s, time_scale)
    if current is not None:
        left_s += max(0.0, current.duration_s - current.t_s) / time_scale
    return left_s


def describe_estimate(num_runs: int, duration_s: float, time_scale: float) -> str:
    """The up-front line, e.g. '24 runs x 90 min at time scale 1: about 36 h of wall time'."""
    return (f"{num_runs} runs x {duration_s / 60:g} min at time scale {time_scale:g}, one after another: "
            f"about {describe_duration(wall_time_s(num_runs, duration_s, time_scale))} of wall time")


def describe_duration(seconds: float) -> str:
    """36 h, 2 h 15 min, 45 min, 30 s."""
    if seconds >= 3600:
        hours, rest = divmod(round(seconds / 60), 60)
        return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"
    if seconds >= 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds:.0f} s"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"
