"""Paired comparisons of arms by seed, with the exact sign test over discordant pairs."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence


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
