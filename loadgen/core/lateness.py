"""How late a wall-clock run fires its timers against the scaled clock, and when that is too late.

A live run (and serve-sim) keeps time with ``WallClock``: every workload time is divided by the
time scale and handed to the event loop. A loop that is busy (a slow callback, a loaded machine,
a 60x scale that leaves microseconds per event) fires timers late; at time scale X a real delay
of d seconds is X * d seconds of workload time. ``WallClock`` records each timer's lateness here
(``LatenessHistogram``); the live runner turns the figures into run.json's ``lag`` and the
``lagging`` flag (``lag_report``, docs/results-format.md#lag).

The histogram is deterministic (no sampling): fixed geometric buckets, so quantiles are exact to
one bucket (at most 9% high; never above the exact maximum) and two snapshots of a long-lived
histogram (serve-sim's) can be subtracted to get one run's window.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional

# bucket 0 holds lateness <= SMALLEST_S (including timers that fired a hair early); bucket k >= 1
# holds (SMALLEST_S * RATIO^(k-1), SMALLEST_S * RATIO^k]; the last one everything above
SMALLEST_S = 1e-6
BUCKETS_PER_DOUBLING = 8
RATIO = 2.0 ** (1.0 / BUCKETS_PER_DOUBLING)
NUM_BUCKETS = 1 + math.ceil(BUCKETS_PER_DOUBLING * math.log2(1e5 / SMALLEST_S))  # up to ~1 day late

# A run is lagging when its p99 timer lateness exceeds this fraction of its median turn latency
# (why 5%: docs/results-format.md#lag)
LAG_BOUND_FRACTION = 0.05


def bucket_index(late_s: float) -> int:
    if not late_s > SMALLEST_S:  # also NaN
        return 0
    return min(NUM_BUCKETS - 1, max(1, math.ceil(BUCKETS_PER_DOUBLING * math.log2(late_s / SMALLEST_S))))


def bucket_upper_s(index: int) -> float:
    return SMALLEST_S * RATIO ** index


class LatenessHistogram:
    """Timer lateness in scaled (workload) seconds: count, sum, exact max and fixed buckets."""

    __slots__ = ("count", "sum_s", "max_s", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.sum_s = 0.0
        self.max_s = 0.0
        self.buckets: dict[int, int] = {}  # bucket index -> timers (sparse: most lateness is tiny)

    def record(self, late_s: float) -> None:
        late_s = late_s if late_s > 0.0 else 0.0  # a timer may fire within the loop's clock resolution early
        self.count += 1
        self.sum_s += late_s
        if late_s > self.max_s:
            self.max_s = late_s
        k = bucket_index(late_s)
        self.buckets[k] = self.buckets.get(k, 0) + 1

    def quantile_s(self, q: float) -> float:
        """The q-quantile's bucket upper edge, capped at the exact maximum; 0 with no timers."""
        if self.count == 0:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for k in sorted(self.buckets):
            seen += self.buckets[k]
            if seen >= rank:
                return min(bucket_upper_s(k), self.max_s) if k else min(SMALLEST_S, self.max_s)
        return self.max_s

    def summary(self) -> dict:
        """``{"num_timers", "p50_s", "p99_s", "max_s"}`` (zeros with no timers: virtual time is never late)."""
        return {"num_timers": self.count, "p50_s": self.quantile_s(0.50), "p99_s": self.quantile_s(0.99),
                "max_s": self.max_s}

    def to_json(self) -> dict:
        return {"count": self.count, "sum_s": self.sum_s, "max_s": self.max_s,
                "buckets": {str(k): n for k, n in sorted(self.buckets.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LatenessHistogram":
        """The inverse of ``to_json``; ValueError when ``data`` is not one."""
        try:
            hist = cls()
            hist.count = int(data["count"])
            hist.sum_s = float(data["sum_s"])
            hist.max_s = float(data["max_s"])
            hist.buckets = {int(k): int(n) for k, n in data["buckets"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a lateness histogram: {exc!r}") from None
        return hist

    @classmethod
    def merged(cls, histograms: "Iterable[LatenessHistogram]") -> "LatenessHistogram":
        """One histogram of all these timers (several fleets' clocks of one run, several replicas)."""
        out = cls()
        for hist in histograms:
            out.count += hist.count
            out.sum_s += hist.sum_s
            out.max_s = max(out.max_s, hist.max_s)
            for k, n in hist.buckets.items():
                out.buckets[k] = out.buckets.get(k, 0) + n
        return out

    def since(self, earlier: "LatenessHistogram") -> "LatenessHistogram":
        """The timers recorded after the snapshot ``earlier`` of this same histogram. The window's
        maximum is not kept by the histogram: it is its highest bucket's upper edge (capped at the
        overall maximum), so it reads up to one bucket (9%) high. A histogram with fewer timers
        than the snapshot started again (serve-sim restarted): all of it is the window."""
        if self.count < earlier.count:
            return LatenessHistogram.from_json(self.to_json())
        out = LatenessHistogram()
        out.count = self.count - earlier.count
        out.sum_s = self.sum_s - earlier.sum_s
        for k, n in self.buckets.items():
            n -= earlier.buckets.get(k, 0)
            if n > 0:
                out.buckets[k] = n
        if out.buckets:
            top = max(out.buckets)
            out.max_s = min(self.max_s, bucket_upper_s(top) if top else SMALLEST_S)
        return out


def lag_report(driver: LatenessHistogram, server: Optional[LatenessHistogram],
               median_turn_s: Optional[float]) -> tuple[bool, dict]:
    """(lagging, run.json ``lag``): the figures of the side (driver or server) with the larger p99,
    the bound (LAG_BOUND_FRACTION of the median turn latency; None without a completed turn, and
    then the run is not called lagging) and both sides' figures."""
    sides = {"driver": driver.summary(), "server": server.summary() if server is not None else None}
    source = "server" if sides["server"] is not None and sides["server"]["p99_s"] > sides["driver"]["p99_s"] \
        else "driver"
    worst = sides[source]
    bound_s = LAG_BOUND_FRACTION * median_turn_s if median_turn_s is not None and median_turn_s > 0 else None
    lagging = bound_s is not None and worst["p99_s"] > bound_s
    return lagging, {"p50_s": worst["p50_s"], "p99_s": worst["p99_s"], "max_s": worst["max_s"],
                     "bound_s": bound_s, "source": source, "num_timers": worst["num_timers"],
                     "median_turn_s": median_turn_s, **sides}
