"""Paired comparisons of arms by seed, with the exact sign test over discordant pairs."""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence


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

def twin_baselines(spec_arms: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """For each arm with triggers, its twin: the arm without triggers that is the same in every
    other field (the pair that differs only in the trigger, e.g. a router's burst and no-burst
    arms); arms without such a twin are left out."""
    def rest(arm: Mapping[str, Any]) -> dict:
        return {k: v for k, v in arm.items() if k not in ("name", "triggers")}

    untriggered = [a for a in spec_arms if not a.get("triggers")]
    twins = {}
    for arm in spec_arms:
        if arm.get("triggers"):
            twin = next((u["name"] for u in untriggered if rest(u) == rest(arm)), None)
            if twin is not None:
                twins[arm["name"]] = twin
    return twins


def paired_comparisons(run_outcomes: Sequence[Mapping[str, Any]], baseline_arm: str,
                       twins: Optional[Mapping[str, str]] = None) -> dict:
    """Pair runs by seed between each arm and its baseline (in order of first appearance): its
    twin where ``twins`` names one (``twin_baselines``), else ``baseline_arm``; an arm that is
    another's twin is that arm's baseline and is not compared itself.

    Seeds present in only one arm of a comparison are skipped. Returns the `pairs` object of
    summary.json; each comparison names its ``baseline_arm``.
    """
    by_arm = _runs_by_arm_and_seed(run_outcomes)
    twins = {arm: twin for arm, twin in (twins or {}).items() if arm in by_arm and twin in by_arm}
    comparisons = []
    for arm, treated in by_arm.items():
        if arm == baseline_arm or arm in twins.values():
            continue
        base = twins.get(arm, baseline_arm)
        if base not in by_arm:  # its baseline did not run (--arms left it out): no pairs to show
            continue
        comparisons.append({**_comparison(arm, by_arm[base], treated), "baseline_arm": base})
    return {"baseline_arm": baseline_arm, "comparisons": comparisons}
