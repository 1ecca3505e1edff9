"""The minimal tipping trigger: per (controller, rate, seed), bisection over the burst factor.

The grid's own factors give the first bracket (the largest factor that leaves the run healthy
below the smallest that tips it); each step probes the midpoint of the bracket the outcomes so
far leave open. A larger burst adds arrivals to the same stream (the extra stream's times are
its unit-rate points scaled by 1 / (factor x lambda)), so tipping is expected to be monotone in
the factor; where a seed is not, the bracket is taken below its smallest tipping factor.
"""

from __future__ import annotations

from typing import Iterable, Optional

from .grid import DIGITS, MapGrid, MapPoint


def degraded_by_factor(rows: Iterable[dict], controller: str, rate: float, seed: int,
                       duration_s: float) -> dict[float, bool]:
    return {r["trigger_factor"]: bool(r["persistently_degraded"]) for r in rows
            if r["controller"] == controller and r["rate_per_s"] == rate and r["seed"] == seed
            and r["duration_s"] == duration_s and r["phase"] in ("grid", "bisect") and r["status"] == "completed"}


def tipping_bracket(outcomes: dict[float, bool]) -> tuple[Optional[float], Optional[float]]:
    """(largest factor that did not tip below the smallest that did, smallest that did).

    (None, 0.0): tips with no trigger; (f, None): nothing tried tips (the largest tried is f)."""
    tipped = sorted(f for f, d in outcomes.items() if d)
    if not tipped:
        return (max(outcomes) if outcomes else None), None
    hi = tipped[0]
    below = [f for f, d in outcomes.items() if not d and f < hi]
    return (max(below) if below else None), hi


def plan_bisection(rows: Iterable[dict], grid: MapGrid, duration_s: float) -> list[MapPoint]:
    """The next probe of every (controller, rate, seed) whose bracket is open: its midpoint.

    The search starts from the grid's own bracket and halves it ``grid.bisect_steps`` times, so
    the minimal tipping factor is known to (grid spacing) / 2^steps. Rounded to DIGITS, so a
    rerun plans the same probes."""
    rows = list(rows)
    points = []
    for controller in grid.controllers:
        for rate in grid.rates_per_s:
            for seed in grid.seeds:
                outcomes = degraded_by_factor(rows, controller, rate, seed, duration_s)
                lo, hi = tipping_bracket(outcomes)
                if hi is None or lo is None:
                    continue
                grid_lo, grid_hi = tipping_bracket({f: d for f, d in outcomes.items() if f in grid.trigger_factors})
                if grid_hi is None or grid_lo is None:
                    continue
                if hi - lo <= (grid_hi - grid_lo) / 2 ** grid.bisect_steps * (1 + 1e-6):
                    continue
                mid = round((lo + hi) / 2, DIGITS)
                points.append(MapPoint(controller, rate, mid, seed, duration_s, "bisect"))
    return points


