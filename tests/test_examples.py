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
    # the six gateway limits; thunderagent has its own example (examples/thunderagent-recovery.yaml)
    limits = [name for name, policy in POLICIES.items() if not getattr(policy, "needs_program_table", False)]
    assert _controllers("recovery") == {name: (name, {}, 1200.0) for name in limits}
    assert _controllers("thunderagent-recovery") == {name: (name, {}, 1200.0)
                                                     for name in ("none", "budgeter", "thunderagent")}
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


# ---------------------------------------------------------------- no cache, CPU offload, drain
def test_offload_no_cache_and_drain_examples_say_what_the_matrix_says():
    no_cache = load_spec(EXAMPLES / "no-cache.yaml")
    assert (no_cache.workload.arrival_rate_per_s, len(no_cache.seeds), no_cache.engine.enable_prefix_caching) == (
        0.0086, 4, False)
    (extra,) = no_cache.arm("burst").triggers
    assert (extra.kind, extra.num_sessions, extra.start_s, extra.duration_s) == ("extra_sessions", 16, 900.0, 300.0)
    paired = load_spec(EXAMPLES / "offload-paired.yaml")
    assert (paired.workload.arrival_rate_per_s, len(paired.seeds), paired.engine.offload.cpu_tokens) == (
        0.035, 6, 900_000)
    (burst,) = paired.arm("burst").triggers
    assert (burst.extra_rate_factor, burst.start_s, burst.duration_s) == (1.5, 900.0, 300.0)
    recovery = load_spec(EXAMPLES / "offload-recovery.yaml")
    assert (recovery.workload.arrival_rate_per_s, len(recovery.seeds), recovery.engine.offload.cpu_tokens) == (
        0.04, 3, 900_000)
    assert _controllers("offload-recovery") == {"none": ("none", {}, 1200.0), "budgeter": ("budgeter", {}, 1200.0)}
    for arm in recovery.arms:
        (b,) = arm.triggers
        assert (b.extra_rate_factor, b.start_s, b.duration_s) == (1.0, 600.0, 240.0)
    drain = load_spec(EXAMPLES / "drain.yaml")
    assert (drain.workload.arrival_rate_per_s, drain.duration_s) == (0.04, 7200.0)
    drops = {arm.name: [(t.at_s, t.arrival_rate_per_s) for t in arm.triggers if t.kind == "rate_change"]
             for arm in drain.arms}
    assert drops == {"drop-0.006": [(1800.0, 0.006)], "drop-0.010": [(1800.0, 0.010)],
                     "drop-0.014": [(1800.0, 0.014)], "drop-0.018": [(1800.0, 0.018)], "cache-off": []}
    assert drain.engine_for(drain.arm("cache-off")).enable_prefix_caching is False


@pytest.mark.parametrize("name", ["no-cache", "offload-paired", "offload-recovery"])
def test_offload_and_no_cache_examples_run_shortened(tmp_path, name):
    """Every arm of the first seed, cut to 25 minutes: each run records its CPU tier (run.json,
    summary runs); without a cache no turn hits."""
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    spec = spec.model_copy(update={"duration_s": 1500.0})
    results = run_experiment(spec, tmp_path, run_keys(spec, [spec.seeds[0]]))
    assert [r["status"] for r in results] == ["completed"] * len(spec.arms)
    tier = None if spec.engine.offload is None else spec.engine.offload.cpu_tokens
    assert {r["offload_cpu_tokens"] for r in results} == {tier}
    summary = summarize(tmp_path)
    assert {run["offload_cpu_tokens"] for run in summary["runs"]} == {tier}
    assert sum(r["counts"]["turns_completed"] for r in results) > 100 * len(spec.arms)
    if name == "no-cache":
        import pyarrow.parquet as pq
        for r in results:
            cached = pq.read_table(tmp_path / "runs" / r["run_id"] / "turns.parquet").column("cached_tokens")
            assert max(cached.to_pylist()) == 0


def test_drain_example_fits_the_cold_turn_and_orders_the_drift_by_rate(tmp_path):
    """One seed of examples/drain.yaml, cut to 70 minutes (the rate drops at minute 30): the
    cache-off arm yields the cold-turn fit, every collapsed arm its rate after the drop and the
    drift of the cold work it owes, lower rates draining faster."""
    spec = load_spec(EXAMPLES / "drain.yaml")
    spec = spec.model_copy(update={"duration_s": 4200.0})
    results = run_experiment(spec, tmp_path, run_keys(spec, [spec.seeds[0]]))
    assert [r["status"] for r in results] == ["completed"] * len(spec.arms)
    summary = summarize(tmp_path)
    fit = summary["cold_turn_fit"]
    assert set(fit) == {"intercept_s", "slope_s_per_token", "windows", "session_cold_work_s", "break_even_rate_per_s"}
    assert fit["windows"] >= 20
    # the engine's step costs are fitted to a measured cold-turn line of 0.146 ms/token
    assert 0.08e-3 < fit["slope_s_per_token"] < 0.2e-3
    assert fit["break_even_rate_per_s"] == pytest.approx(1 / fit["session_cold_work_s"])
    runs = {run["arm"]: run for run in summary["runs"]}
    assert runs["cache-off"]["rate_after_change_per_s"] is None and runs["cache-off"]["cold_work_drift_s_per_h"] is None
    drops = [f"drop-{r}" for r in ("0.006", "0.010", "0.014", "0.018")]
    assert [runs[a]["rate_after_change_per_s"] for a in drops] == [0.006, 0.010, 0.014, 0.018]
    drift = [runs[a]["cold_work_drift_s_per_h"] for a in drops]
    assert drift[0] < 0 and drift[0] < drift[-1]


def test_subagents_example_pairs_the_main_example_with_trees_and_runs_shortened(tmp_path):
    """examples/subagents-paired.yaml: the main example's engine, rate and burst, tasks drawn as
    orchestrator-workers trees, none vs budgeter (tree_policy trees); its first seed, cut to 25
    minutes, runs every arm and reports its tasks."""
    main = load_spec(EXAMPLES / "paired-burst.yaml")
    spec = load_spec(EXAMPLES / "subagents-paired.yaml")
    assert spec.engine == main.engine and spec.seeds == main.seeds and spec.duration_s == main.duration_s
    assert spec.workload.arrival_rate_per_s == main.workload.arrival_rate_per_s
    assert spec.arm("burst").triggers == main.arm("burst").triggers == spec.arm("burst-budgeter").triggers
    assert {spec.controller_for(a).name for a in spec.arms} == {"none", "budgeter"}
    spec = spec.model_copy(update={"duration_s": 1500.0})
    results = run_experiment(spec, tmp_path, run_keys(spec, [spec.seeds[0]]))
    assert [r["status"] for r in results] == ["completed"] * len(spec.arms)
    rows = summarize(tmp_path)["trees_by_arm"]
    assert [r["arm"] for r in rows] == [a.name for a in spec.arms]
    assert all(r["trees_ended"] > 10 and r["sessions_per_tree_mean"] > 3 for r in rows)
