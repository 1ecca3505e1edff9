"""Every inter-token gap of a run, kept as a histogram: what ITL percentiles pool (``vllm bench
serve`` takes them over every gap of every request), without keeping millions of gaps.

Buckets are geometric, ``RATIO`` = 1.01 wide from ``FLOOR_S`` = 1 us up, so a percentile read from
the histogram (its bucket's geometric middle) is within 0.5% of the exact one; the mean is exact
(the sum is kept). The simulated engines add their gaps as they commit steps, a stretch of n
equal-count steps whose lengths grow linearly at once (``add_linear``); a live run adds each
streamed turn's gaps.
"""

from __future__ import annotations

import math
from typing import Optional

RATIO = 1.01
FLOOR_S = 1e-6
_LOG_RATIO = math.log(RATIO)


def _bucket(gap_s: float) -> int:
    if gap_s <= FLOOR_S:
        return 0
    return int(math.log(gap_s / FLOOR_S) / _LOG_RATIO) + 1


def _lower_edge_s(bucket: int) -> float:
    """The smallest gap of ``bucket`` (bucket 0 holds everything up to FLOOR_S)."""
    return 0.0 if bucket == 0 else FLOOR_S * RATIO ** (bucket - 1)


class GapHistogram:
    __slots__ = ("counts", "num_gaps", "total_s")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.num_gaps = 0
        self.total_s = 0.0

    def add(self, gap_s: float, count: int = 1) -> None:
        if count <= 0:
            return
        b = _bucket(gap_s)
        self.counts[b] = self.counts.get(b, 0) + count
        self.num_gaps += count
        self.total_s += gap_s * count

    def remove(self, gap_s: float) -> None:
        """Take back one gap added before (a token the engine computed, then dropped). Its length,
        computed again, may differ from the one added by a rounding: then it sits in a neighbouring
        bucket."""
        counts = self.counts
        b = _bucket(gap_s)
        for k in (b, b - 1, b + 1):
            if counts.get(k, 0) > 0:
                counts[k] -= 1
                if not counts[k]:
                    del counts[k]
                break
        else:
            raise ValueError(f"no gap of {gap_s!r} s to take back")
        self.num_gaps -= 1
        self.total_s -= gap_s

    def add_linear(self, first_s: float, step_s: float, num_steps: int, count: int) -> None:
        """``num_steps`` steps lasting ``first_s + step_s * i`` (i = 0..num_steps-1, step_s >= 0),
        each giving ``count`` gaps of its length: bucket by bucket, not step by step."""
        if num_steps <= 0 or count <= 0:
            return
        self.num_gaps += count * num_steps
        self.total_s += count * (first_s * num_steps + step_s * num_steps * (num_steps - 1) / 2.0)
        counts = self.counts
        i = 0
        while i < num_steps:
            b = _bucket(first_s + step_s * i)
            if step_s <= 0.0:
                end = num_steps
            else:  # the steps still short of the next bucket's lower edge
                end = min(num_steps, max(i + 1, math.ceil((_lower_edge_s(b + 1) - first_s) / step_s)))
                while end < num_steps and _bucket(first_s + step_s * end) == b:  # float edges
                    end += 1
                while end - 1 > i and _bucket(first_s + step_s * (end - 1)) != b:
                    end -= 1
            counts[b] = counts.get(b, 0) + count * (end - i)
            i = end

    def merge(self, other: "GapHistogram") -> None:
        for b, c in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + c
        self.num_gaps += other.num_gaps
        self.total_s += other.total_s

    def mean_s(self) -> Optional[float]:
        return self.total_s / self.num_gaps if self.num_gaps else None

    def quantile_s(self, q: float) -> Optional[float]:
        """The nearest-rank q-quantile (the ceil(q n)-th smallest gap), as its bucket's middle."""
        if not self.num_gaps:
            return None
        rank = max(1, math.ceil(q * self.num_gaps))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                if b == 0:
                    return FLOOR_S / 2
                return _lower_edge_s(b) * math.sqrt(RATIO)
        raise AssertionError("rank beyond the histogram")

    def to_json(self) -> dict:
        return {"ratio": RATIO, "floor_s": FLOOR_S, "num_gaps": self.num_gaps, "total_s": self.total_s,
                "buckets": [[b, c] for b, c in sorted(self.counts.items())]}

    @classmethod
    def from_json(cls, data: dict) -> "GapHistogram":
        if data.get("ratio") != RATIO or data.get("floor_s") != FLOOR_S:
            raise ValueError(f"a gap histogram of ratio {data.get('ratio')} and floor {data.get('floor_s')}: "
                             f"this version reads ratio {RATIO}, floor {FLOOR_S}")
        hist = cls()
        hist.counts = {int(b): int(c) for b, c in data["buckets"]}
        hist.num_gaps = int(data["num_gaps"])
        hist.total_s = float(data["total_s"])
        return hist
