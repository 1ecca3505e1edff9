"""Sim-to-real (benchmarks/sim_to_real.py): each source of real GPU runs mapped onto a simulated
replay, on a small extract of the public data (tests/fixtures/gpu, README there)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from real_runs import PROFILES, discover, inference_perf_trace  # noqa: E402
from roofline import CONSTANTS, Stage, fit_constants, stage_features  # noqa: E402

DATA = ROOT / "tests" / "fixtures" / "gpu"
SCRIPT = ROOT / "benchmarks" / "sim_to_real.py"
COLLAPSED = "20260218-135247-mixtral-8x7b-v0-1-tp2-reasoning"


@pytest.fixture(scope="module")
def runs():
    return {(r.source, r.name): r for r in discover(DATA)}


def test_an_llmservingsim_run_replays_its_workload_file_with_its_kernel_profile(runs):
    run = runs[("LSS", "RTXPRO6000/Llama-3.1-8B")]
    m = run.mapping
    assert run.split == "fit"  # its decode-only seconds give the host time
    assert m.trace_path.name == "sharegpt-llama-3.1-8b-300-sps10.jsonl" and m.profile_dir.is_dir()
    assert (m.tp, m.num_layers) == (1, 32) and not m.over_http
    assert m.engine["max_num_seqs"] == 128 and m.engine["max_num_batched_tokens"] == 2048
    # not recorded: vLLM's budget, 96 GiB x 0.9 less 8.03B bf16 weights, in whole 16-token blocks
    assert m.engine["pool_tokens"] % 16 == 0 and 560_000 < m.engine["pool_tokens"] < 600_000
    assert run.measured["ttft_mean"] > 0 and run.measured["tpot_mean"] > 0


def test_a_data_parallel_run_is_listed_with_why_it_is_not_mapped(runs):
    run = runs[("LSS", "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507")]
    assert run.mapping is None and "data_parallel_size 2" in run.unmapped


def test_an_inference_perf_training_run_takes_its_echoed_workload_and_recorded_pool(runs):
    run = runs[("TRN", "20260217-155451-llama-2-7b-tp1-codegen")]
    sp = run.mapping.shared_prefix
    # the echoed config (10 groups x 10 prompts), not the profile's 11 x 4 multi-turn users
    assert (sp.num_groups, sp.prompts_per_group) == (10, 10)
    assert (sp.system_prompt_tokens, sp.question_tokens, sp.output_tokens) == (100, 466, 247)
    assert sp.stages == ((5.0, 600), (10.0, 600))
    assert run.mapping.engine["pool_tokens"] == 7463 * 16 and run.mapping.over_http
    assert run.split == "fit" and run.failed == 0
    # per output token from the means (inference-perf's own field is per streamed chunk)
    assert run.measured["tpot_mean"] == pytest.approx((2080.7 - 28.0) / 246, rel=1e-3)


def test_a_trainval_run_takes_its_settings_from_the_physics_file(runs):
    run = runs[("S2R-tv", "63-mistral-nemo-12b-tp1-codegen-1-1")]
    assert run.split == "validation"
    assert run.mapping.engine["pool_tokens"] == 19251 * 16
    assert (run.mapping.shared_prefix.num_groups, run.mapping.shared_prefix.prompts_per_group) == (11, 4)
    # the training run it repeats is listed, not simulated twice
    twin = runs[("S2R-tv", "20260217-155451-llama-2-7b-tp1-codegen")]
    assert twin.mapping is None and "same measurement" in twin.unmapped


def test_an_iter36_run_takes_the_workload_of_its_profile_name_and_a_budgeted_pool(runs):
    run = runs[("S2R-36", "14-qwen3-14b-tp1-codegen-1")]
    s, q, o, stages = PROFILES["codegen"]
    sp = run.mapping.shared_prefix
    assert (sp.system_prompt_tokens, sp.question_tokens, sp.output_tokens, sp.stages) == (s, q, o, stages)
    assert any("profile" in note for note in run.notes) and any("KV pool not recorded" in n for n in run.notes)
    # relabelled training runs (same means) are recognised as the same measurement
    assert "20260218-150956" in runs[("S2R-36", "2-codellama-34b-tp2-codegen")].unmapped


def test_llm_d_traces_are_listed_with_what_they_lack(runs):
    run = runs[("LLMD", "sharegpt-h200.jsonl")]
    assert run.mapping is None and "send times" in run.unmapped


def test_the_inference_perf_trace_sends_at_constant_intervals_and_repeats_each_prompt():
    sp = next(r for r in discover(DATA) if r.name == "20260217-155451-llama-2-7b-tp1-codegen").mapping.shared_prefix
    rows = inference_perf_trace(sp, seed=1)
    assert len(rows) == 5 * 600 + 10 * 600
    t = np.array([r["timestamp"] for r in rows])
    assert np.allclose(np.diff(t[:3000]), 200.0) and np.allclose(np.diff(t[3000:]), 100.0)
    assert all(r["input_length"] == 566 and r["output_length"] == 247 for r in rows)
    assert all(len(r["hash_ids"]) == 36 for r in rows)  # ceil(566 / 16)
    assert rows[0]["hash_ids"] == rows[100]["hash_ids"] != rows[1]["hash_ids"]  # 100 prompts, in a cycle
    prefixes = {tuple(r["hash_ids"][:6]) for r in rows[:100]}  # 100 // 16 whole system-prompt blocks
    assert len(prefixes) == 10  # one per group
    assert inference_perf_trace(sp, seed=1) == rows and inference_perf_trace(sp, seed=2) != rows


def test_the_roofline_fit_recovers_the_constants_its_stages_were_made_with():
    runs = discover(DATA)
    lines = [r.mapping.roofline for r in runs if r.mapping is not None and r.mapping.roofline is not None]
    truth = dict(zip(CONSTANTS, (0.002, 1.1, 30e-6, 0.6, 1.3)))
    stages = []
    for k, roofline in enumerate(lines):
        for rate, decode_s in ((2.0, 2.0 + k), (9.0, 4.0 + k)):
            s = Stage(roofline, rate, 566, 6, 247, 1.0, decode_s)
            tpot = float(stage_features(s) @ np.array([truth[c] for c in CONSTANTS]))
            stages.append(Stage(roofline, rate, 566, 6, 247, tpot, decode_s))
    constants, residuals = fit_constants(stages)
    assert max(abs(v) for v in residuals) < 0.05
    assert constants["k_weights"] == pytest.approx(1.1, rel=0.1) and constants["h_s"] == pytest.approx(0.002, rel=0.3)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--data", str(DATA), *args], capture_output=True,
                          text=True, timeout=600)


def test_asking_for_a_run_that_cannot_be_mapped_exits_2_naming_why():
    done = _run("--run", "RTXPRO6000/Qwen3-30B-A3B-Instruct-2507")
    assert done.returncode == 2 and "data_parallel_size 2" in done.stderr and "Traceback" not in done.stderr
    done = _run("--run", "no-such-run")
    assert done.returncode == 2 and "no such run" in done.stderr


def test_the_benchmark_writes_each_mapped_runs_signed_errors_by_split(tmp_path):
    out = tmp_path / "s2r.json"
    done = _run("--json", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    by_run = {r["run"]: r for r in result["runs"]}
    assert set(by_run) == {"RTXPRO6000/Llama-3.1-8B", "20260217-155451-llama-2-7b-tp1-codegen",
                           "20260218-150956-codellama-34b-tp2-codegen", "63-mistral-nemo-12b-tp1-codegen-1-1",
                           "14-qwen3-14b-tp1-codegen-1", COLLAPSED}
    for row in by_run.values():
        assert row["split"] in ("fit", "validation")
        for key in ("ttft_mean_error", "e2e_mean_error", "itl_mean_error"):
            assert np.isfinite(row[key])
        assert row["e2e_mean_error"] == pytest.approx(row["e2e_mean_simulated"] / row["e2e_mean_measured"] - 1)
    # a regression band on what each mapping gives: a wrong rate, pool or length moves E2E by far more
    for name in ("20260217-155451-llama-2-7b-tp1-codegen", "63-mistral-nemo-12b-tp1-codegen-1-1",
                 "14-qwen3-14b-tp1-codegen-1"):
        assert abs(by_run[name]["e2e_mean_error"]) < 0.25, (name, by_run[name]["e2e_mean_error"])
    assert {u["run"] for u in result["unmapped"]} >= {"RTXPRO6000/Qwen3-30B-A3B-Instruct-2507", "sharegpt-h200.jsonl"}
    assert "not mapped:" in done.stdout and "validation:" in done.stdout
    # the collapsed run, left out of the fit, replayed again with the step time it measured at 128
    # running: the queue, the client's 300 s timeout and the abort then give its collapse (the real
    # run: mean TTFT 103 s, 3,294 of 4,800 requests timed out)
    assert by_run[COLLAPSED]["split"] == "validation" and by_run[COLLAPSED]["measured_failed"] == 3294
    (given,) = result["collapsed_given_step_time"]
    assert given["run"] == COLLAPSED and given["measured_step_ms"] == pytest.approx(36.9, abs=0.1)
    assert given["scale"] > 1.2  # the roofline's step at 128 running is short of the measured one
    assert 1 / 1.5 < 1 + given["ttft_mean_error"] < 1.5
    assert given["simulated_failed"] == pytest.approx(3294, rel=0.15)
