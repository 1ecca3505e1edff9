"""The controller experiments of examples/ say what docs/experiments.md#experiment-matrix says and run on the simulated engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from controllers import POLICIES
from loadgen.analysis import summarize
from loadgen import run_experiment, run_keys
from loadgen.core.spec import load_spec

EXAMPLES = Path(__file__).parents[1] / "examples"


def _controllers(name: str) -> dict[str, tuple[str, dict, float]]:
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    return {arm.name: (spec.controller_for(arm).name, spec.controller_for(arm).params,
                       spec.controller_for(arm).start_s) for arm in spec.arms}


def test_recovery_arms_are_the_six_limits_from_minute_20():
    spec = load_spec(EXAMPLES / "recovery.yaml")
    assert (spec.workload.arrival_rate_per_s, spec.duration_s, spec.seeds) == (0.04, 3600.0, list(range(1, 17)))
    assert _controllers("recovery") == {name: (name, {}, 1200.0) for name in POLICIES}
    for arm in spec.arms:
        (burst,) = arm.triggers
        assert (burst.kind, burst.extra_rate_factor, burst.start_s, burst.duration_s) == ("burst", 1.0, 600.0, 240.0)


def test_mix_shift_and_threshold_arms():
    assert _controllers("mix-shift") == {
        "none": ("none", {}, 0.0),
        "cap-10": ("session-cap", {"k": 10, "k_hi": 12}, 0.0),
        "cap-14": ("session-cap", {"k": 14, "k_hi": 17}, 0.0),
        "cap-22": ("session-cap", {"k": 22, "k_hi": 27}, 0.0),
        "cap-34": ("session-cap", {"k": 34, "k_hi": 41}, 0.0),
        "adaptive-cap": ("adaptive-cap", {}, 0.0),
        "budgeter": ("budgeter", {}, 0.0),
    }
    bands = {arm: params for arm, (_, params, _) in _controllers("thresholds").items()}
    assert bands == {"none": {}, **{f"budgeter-{a}-{p}": {"admit_fraction": a, "park_fraction": p}
                                    for a, p in ((0.65, 0.85), (0.75, 0.95), (0.85, 0.98))}}
    assert _controllers("flush") == {"none": ("none", {}, 0.0), "budgeter": ("budgeter", {}, 0.0)}


@pytest.mark.parametrize("name", ["recovery", "flush", "mix-shift", "thresholds"])
def test_controller_example_runs_every_arm_on_the_simulated_engine(tmp_path, name):
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    results = run_experiment(spec, tmp_path, run_keys(spec, [spec.seeds[0]]))
    assert [r["status"] for r in results] == ["completed"] * len(spec.arms)
    summary = summarize(tmp_path)
    assert [row["arm"] for row in summary["recovery"]] == [arm.name for arm in spec.arms]


SGLANG_EXAMPLES = ["sglang-paired", "sglang-short-burst", "sglang-long-burst", "sglang-flush"]


def test_sglang_examples_say_what_the_matrix_says():
    paired = load_spec(EXAMPLES / "sglang-paired.yaml")
    assert (paired.workload.arrival_rate_per_s, len(paired.seeds), paired.engine.flavor) == (0.04, 4, "sglang")
    (burst,) = paired.arm("burst").triggers
    assert (burst.extra_rate_factor, burst.start_s, burst.duration_s) == (1.5, 900.0, 300.0)
    short = load_spec(EXAMPLES / "sglang-short-burst.yaml")
    assert len(short.seeds) == 10
    assert {arm.name: short.engine_for(arm).flavor for arm in short.arms} == {"vllm": "vllm", "sglang": "sglang"}
    assert short.arm("vllm").triggers == short.arm("sglang").triggers  # the same burst on both engines
    (b,) = short.arm("sglang").triggers
    assert (b.extra_rate_factor, b.start_s, b.duration_s) == (1.0, 600.0, 120.0)
    long = load_spec(EXAMPLES / "sglang-long-burst.yaml")
    assert len(long.seeds) == 3
    assert [t.duration_s for arm in long.arms for t in arm.triggers] == [300.0, 600.0]
    flush = load_spec(EXAMPLES / "sglang-flush.yaml")
    assert flush.engine.flavor == "sglang" and all(t.kind == "flush" for a in flush.arms for t in a.triggers)


@pytest.mark.parametrize("name", SGLANG_EXAMPLES)
def test_sglang_example_runs_shortened(tmp_path, name):
    """Every arm of the first seed, cut to 25 minutes (the triggers end by then): each run
    records which engine it ran on, and the report's runs carry it."""
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    spec = spec.model_copy(update={"duration_s": 1500.0})
    results = run_experiment(spec, tmp_path, run_keys(spec, [spec.seeds[0]]))
    assert [r["status"] for r in results] == ["completed"] * len(spec.arms)
    want = {arm.name: spec.engine_for(arm).flavor for arm in spec.arms}
    assert {r["arm"]: r["engine_flavor"] for r in results} == want
    summary = summarize(tmp_path)
    assert {run["arm"]: run["engine_flavor"] for run in summary["runs"]} == want
    turns = sum(r["counts"]["turns_completed"] for r in results)
    assert turns > 100 * len(spec.arms)
