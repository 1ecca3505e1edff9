"""Replayed-trace session kinds in the workload: pairing, sampling, and whole simulated runs."""

from pathlib import Path

import pyarrow.parquet as pq

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from loadgen.core.workload import plan_sessions
from tests.conftest import make_spec_dict

SHAPES_FIXTURE = str(Path(__file__).parent / "trace_shapes" / "fixtures" / "shapes.jsonl")


def _spec(sessions: dict, **overrides):
    data = make_spec_dict(**overrides)
    data["engine"]["pool_tokens"] = 400_000
    data["workload"]["sessions"] = sessions
    return parse_spec(data)


def _base(spec, arm: str = "base", seed: int = 7):
    return [p for p in plan_sessions(spec, spec.arm(arm), seed) if not p.is_trigger]


def test_swebench_base_sessions_are_shared_by_the_arms():
    spec = _spec({"kind": "swebench"})
    assert _base(spec, "base") == _base(spec, "burst")
    assert {p.shape.kind for p in _base(spec)} == {"swebench"}
    assert _base(spec, seed=7) != _base(spec, seed=8)


def test_base_session_i_depends_only_on_seed_and_i():
    short = _base(_spec({"kind": "swebench"}, duration_s=600))
    long = _base(_spec({"kind": "swebench"}, duration_s=1800))
    assert len(long) > len(short) and long[:len(short)] == short  # more arrivals draw further, never differently
    data = make_spec_dict()
    data["arms"] = [{"name": "base"}, {"name": "slower", "triggers": [
        {"kind": "rate_change", "at_s": 300, "arrival_rate_per_s": 0.005}]}]
    data["engine"]["pool_tokens"] = 400_000
    data["workload"]["sessions"] = {"kind": "swebench", "sampling": "with_replacement"}
    spec = parse_spec(data)
    early = [p for p in _base(spec, "base") if p.arrival_s < 300]
    assert early and [p for p in _base(spec, "slower") if p.arrival_s < 300] == early


def test_sampling_with_and_without_replacement():
    # the fixture holds three sessions with initial contexts 1000, 2000 and 5000 tokens
    def initials(sampling: str) -> list[int]:
        spec = _spec({"kind": "trace_file", "path": SHAPES_FIXTURE, "format": "shapes", "sampling": sampling,
                      "gap_fallback": {"kind": "exponential", "mean_s": 1.0}}, duration_s=3000)
        return [p.shape.initial_tokens for p in _base(spec)]

    without = initials("without_replacement")
    assert len(without) >= 30
    assert all(sorted(without[k:k + 3]) == [1000, 2000, 5000] for k in range(0, len(without) - 2, 3))
    with_replacement = initials("with_replacement")
    assert set(with_replacement) == {1000, 2000, 5000}
    assert any(len(set(with_replacement[k:k + 3])) < 3 for k in range(0, len(with_replacement) - 2, 3))


def test_trigger_sessions_replay_from_their_own_draw_order():
    spec = _spec({"kind": "swebench"})
    burst = plan_sessions(spec, spec.arm("burst"), 7)
    extra = [p for p in burst if p.is_trigger]
    assert extra and all(p.shape.kind == "swebench" for p in extra)
    again = [p for p in plan_sessions(spec, spec.arm("burst"), 7) if p.is_trigger]
    assert again == extra


def test_tracelab_synthetic_and_mix_shift_to_replayed_shapes():
    data = make_spec_dict()
    data["engine"]["pool_tokens"] = 400_000
    data["arms"] = [{"name": "shift", "triggers": [{"kind": "mix_shift", "at_s": 300,
                                                    "sessions": {"kind": "swebench", "label": "swe"}}]}]
    data["workload"]["sessions"] = {"kind": "tracelab_synthetic", "system_prompt_tokens": 4000}
    spec = parse_spec(data)
    plans = _base(spec, "shift")
    before = [p.shape for p in plans if p.arrival_s < 300]
    after = [p.shape for p in plans if p.arrival_s >= 300]
    assert before and after and {s.kind for s in after} == {"swe"}
    assert {s.kind for s in before} == {"tracelab-synthetic"}
    assert all(s.max_context_tokens() <= 38_000 and s.shared_prefix_tokens == min(4000, s.initial_tokens)
               for s in before)


def test_replayed_sessions_run_on_the_simulated_engine_reproducibly(tmp_path):
    spec = _spec({"kind": "swebench"}, duration_s=900)
    info = run_simulated(spec, RunKey("base", 3), tmp_path / "one")
    assert info["status"] == "completed" and info["counts"]["turns_completed"] > 100
    turns_file = tmp_path / "one" / "runs" / "base-s3" / "turns.parquet"
    turns = pq.read_table(turns_file).to_pylist()
    assert all(t["error"] is None for t in turns) and {t["session_kind"] for t in turns} == {"swebench"}
    assert max(t["prompt_tokens"] + t["output_tokens"] for t in turns) <= 38_000
    run_simulated(spec, RunKey("base", 3), tmp_path / "two")
    assert (tmp_path / "two" / "runs" / "base-s3" / "turns.parquet").read_bytes() == turns_file.read_bytes()
