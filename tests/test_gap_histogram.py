"""The run's inter-token gaps as a histogram (loadgen/core/gap_histogram.py): percentiles within
0.5% of the exact nearest-rank ones, an exact mean, and stretches added bucket by bucket exactly
as step by step."""

import math
import random

import numpy as np
import pytest

from loadgen.core.gap_histogram import GapHistogram


def _exact(gaps, q):
    s = sorted(gaps)
    return s[max(1, math.ceil(q * len(s))) - 1]


def test_percentiles_lie_within_half_a_percent_and_the_mean_is_exact():
    rng = random.Random(3)
    gaps = [rng.lognormvariate(math.log(0.03), 0.6) for _ in range(20_000)]
    hist = GapHistogram()
    for g in gaps:
        hist.add(g)
    for q in (0.5, 0.9, 0.99):
        assert hist.quantile_s(q) == pytest.approx(_exact(gaps, q), rel=0.005)
    assert hist.mean_s() == pytest.approx(sum(gaps) / len(gaps), rel=1e-12)


@pytest.mark.parametrize("first_s, step_s, num_steps, count", [
    (0.02, 0.0, 500, 7), (0.02, 1e-5, 2000, 3), (0.001, 2e-4, 300, 1), (0.5, 0.1, 40, 128), (0.03, 1e-9, 7, 5)])
def test_a_stretch_lands_in_the_buckets_its_steps_would(first_s, step_s, num_steps, count):
    fast, slow = GapHistogram(), GapHistogram()
    fast.add_linear(first_s, step_s, num_steps, count)
    for i in range(num_steps):
        slow.add(first_s + step_s * i, count)
    assert fast.counts == slow.counts and fast.num_gaps == slow.num_gaps
    assert fast.total_s == pytest.approx(slow.total_s, rel=1e-12)


def test_it_survives_a_round_trip_through_json_and_merges():
    a, b = GapHistogram(), GapHistogram()
    a.add_linear(0.02, 1e-4, 100, 4)
    b.add(0.5, 3)
    again = GapHistogram.from_json(a.to_json())
    assert again.counts == a.counts and again.num_gaps == 400
    again.merge(b)
    assert again.num_gaps == 403 and again.quantile_s(1.0) == pytest.approx(0.5, rel=0.005)
    assert GapHistogram().quantile_s(0.5) is None and GapHistogram().mean_s() is None


def test_a_dropped_token_takes_its_gap_back():
    hist = GapHistogram()
    hist.add(0.02, 3)
    hist.remove(0.02 * (1 + 1e-15))  # recomputed with a rounding of its own
    assert hist.num_gaps == 2 and sum(hist.counts.values()) == 2
    with pytest.raises(ValueError, match="no gap of"):
        hist.remove(5.0)
