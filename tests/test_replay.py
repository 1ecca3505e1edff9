"""A recorded trace replayed on its own clock (loadgen/core/replay.py, trace_shapes/timed.py):
every request at its recorded time, with its recorded lengths and prefixes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import SpecError, parse_spec
from trace_shapes.rows import TraceFormatError
from trace_shapes.timed import load_timed

EXAMPLE = Path(__file__).parents[1] / "examples" / "replay-sharegpt.yaml"
ENGINE = {"kind": "sim", "pool_tokens": 200_000, "block_size": 16, "max_num_batched_tokens": 2048,
          "max_model_len": 32768}


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spec(trace: Path, flavor: str = "vllm", **replay) -> dict:
    engine = dict(ENGINE, flavor=flavor)
    return {"experiment": "replay", "seeds": [1], "engine": engine,
            "workload": {"replay": {"path": str(trace), **replay}}, "arms": [{"name": "replay"}]}


def _turns(data: dict, tmp_path: Path, seed: int = 1):
    spec = parse_spec(data)
    info = run_simulated(spec, RunKey("replay", seed), tmp_path / f"out-{seed}")
    turns = pq.read_table(tmp_path / f"out-{seed}" / "runs" / f"replay-s{seed}" / "turns.parquet").to_pylist()
    return info, sorted(turns, key=lambda t: (t["session_id"], t["turn_index"]))


def _mooncake(t_ms: float, prompt: int, output: int, hashes: list[int], **extra) -> dict:
    return {"timestamp": t_ms, "input_length": prompt, "output_length": output, "hash_ids": hashes, **extra}


def test_every_request_goes_at_its_recorded_time_with_its_lengths_and_the_run_ends_when_all_are_answered(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [
        {"arrival_time_ns": 50_000_000, "input_toks": 300, "output_toks": 40},
        {"arrival_time_ns": 1_250_000_000, "input_toks": 700, "output_toks": 5},
        {"arrival_time_ns": 1_250_000_000, "input_toks": 64, "output_toks": 300},
        {"arrival_time_ns": 4_000_000_000, "input_toks": 2000, "output_toks": 80}])
    info, turns = _turns(_spec(trace), tmp_path)
    assert [t["submitted_s"] for t in turns] == [0.05, 1.25, 1.25, 4.0]
    assert [(t["prompt_tokens"], t["output_tokens"]) for t in turns] == [(300, 40), (700, 5), (64, 300), (2000, 80)]
    assert all(t["error"] is None for t in turns)
    assert info["counts"]["sessions_completed"] == 4
    # no duration given: the run went on past the last send (4 s) until the last answer
    assert info["counts"]["ended_s"] == max(t["finish_s"] for t in turns) > 4.0
    # at half speed every request goes twice as late
    _, slow = _turns(_spec(trace, speed=0.5), tmp_path, seed=1)
    assert [t["submitted_s"] for t in slow] == [0.1, 2.5, 2.5, 8.0]


def test_a_duration_cuts_the_replay_there(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [
        {"arrival_time_ns": 0, "input_toks": 300, "output_toks": 40},
        {"arrival_time_ns": 20_000_000_000, "input_toks": 300, "output_toks": 40}])
    info, turns = _turns({**_spec(trace), "duration_s": 10}, tmp_path)
    assert len(turns) == 1 and info["counts"]["sessions_planned"] == 2 and info["counts"]["sessions_arrived"] == 1


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_requests_that_share_recorded_block_hashes_hit_on_them_and_others_do_not(tmp_path, flavor):
    # 512-token blocks: request 2 shares request 1's first two blocks, request 3 shares nothing
    trace = _write(tmp_path / "t.jsonl", [
        _mooncake(0, 1500, 10, [1, 2, 3]),
        _mooncake(2000, 1400, 10, [1, 2, 9]),
        _mooncake(4000, 1400, 10, [7, 8, 10])])
    _, turns = _turns(_spec(trace, flavor), tmp_path)
    cached = [t["cached_tokens"] for t in turns]
    assert cached[0] == 0 and cached[2] == 0
    assert cached[1] == 1024  # exactly the shared blocks (1024 tokens is whole 16-token blocks and pages)
    assert [t["cacheable_prefix_tokens"] for t in turns] == [0, 1024, 0]


def test_recorded_token_ids_are_what_requests_share(tmp_path):
    shared = list(range(1, 401))
    trace = _write(tmp_path / "t.jsonl", [
        {"arrival_time_ns": 0, "input_toks": 450, "output_toks": 4, "input_tok_ids": shared + [7] * 50},
        {"arrival_time_ns": 10 ** 9, "input_toks": 420, "output_toks": 4, "input_tok_ids": shared + [9] * 20}])
    _, turns = _turns(_spec(trace), tmp_path)
    assert [t["cached_tokens"] for t in turns] == [0, 400]  # 25 whole blocks of 16


def test_a_later_turn_of_a_session_goes_at_its_time_or_when_the_earlier_is_answered(tmp_path):
    # turn 1 is recorded 1 ms after turn 0, long before turn 0 can be answered (500 output tokens)
    trace = _write(tmp_path / "t.jsonl", [
        _mooncake(0, 1000, 500, [1, 2], session_id="a"),
        _mooncake(1, 1600, 20, [1, 2, 3, 4], session_id="a"),
        _mooncake(1, 300, 20, [50], session_id="b"),
        _mooncake(30_000, 600, 20, [50, 51], session_id="b")])
    _, turns = _turns(_spec(trace), tmp_path)
    a0, a1, b0, b1 = turns
    assert a0["session_id"] == a1["session_id"] != b0["session_id"]
    assert a1["submitted_s"] == a0["finish_s"] > 0.1
    assert b0["submitted_s"] == 0.001  # another session is not held back
    assert b1["submitted_s"] == 30.0 > b0["finish_s"]  # answered long before: the turn keeps its recorded time
    assert a1["cached_tokens"] >= 1000 - 16  # the earlier turn's prompt (its full blocks)


def test_the_same_trace_and_seed_give_the_same_result_bit_for_bit(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [
        _mooncake(k * 37.5, 600 + 13 * k, 30 + k, [k % 3, 100 + k]) for k in range(40)])
    _, first = _turns(_spec(trace), tmp_path / "a")
    _, second = _turns(_spec(trace), tmp_path / "b")
    assert first == second


def test_unsorted_rows_are_sorted_with_a_note_and_a_bad_row_names_its_line_and_field(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [_mooncake(500, 100, 5, [1]), _mooncake(100, 100, 5, [2])])
    loaded = load_timed(trace)
    assert loaded.format == "mooncake" and [r.t_s for r in loaded.requests] == [0.1, 0.5]
    assert any("sorted by time" in note for note in loaded.notes)
    bad = _write(tmp_path / "bad.jsonl", [_mooncake(0, 100, 5, [1]), {"timestamp": 3, "input_length": -4,
                                                                       "output_length": 5}])
    with pytest.raises(TraceFormatError, match=r"row 2: field 'input_length': expected an integer >= 1, got -4"):
        load_timed(bad)
    with pytest.raises(SpecError, match=r"workload\.replay\.path: .*row 2: field 'input_length'"):
        parse_spec(_spec(bad))


def test_replay_refuses_a_drawn_arrival_rate_and_a_run_without_duration_needs_a_replay(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [_mooncake(0, 100, 5, [1])])
    data = _spec(trace)
    data["workload"]["arrival_rate_per_s"] = 0.1
    with pytest.raises(SpecError, match="workload.arrival_rate_per_s: not with replay"):
        parse_spec(data)
    data = _spec(trace)
    data["arms"] = [{"name": "b", "triggers": [{"kind": "burst", "extra_rate_factor": 1, "start_s": 0,
                                                "duration_s": 1}]}]
    with pytest.raises(SpecError, match=r"arms\[0\]\.triggers\[0\]: a burst trigger"):
        parse_spec(data)
    data = _spec(trace)
    data["engine"]["offload"] = {"cpu_tokens": 100_000}
    with pytest.raises(SpecError, match="engine.offload: a trace replay is not modelled"):
        parse_spec(data)
    with pytest.raises(SpecError, match="duration_s: missing"):
        parse_spec({"experiment": "x", "seeds": [1], "workload": {"arrival_rate_per_s": 0.1},
                    "arms": [{"name": "a"}]})


def test_a_bad_trace_row_exits_2_naming_it(tmp_path):
    bad = _write(tmp_path / "bad.jsonl", [{"arrival_time_ns": 0, "input_toks": 10, "output_toks": "many"}])
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(bad)))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "row 1: field 'output_toks': expected an integer >= 1, got 'many'" in proc.stderr


def test_the_example_replays_the_shipped_extract_on_its_clock(tmp_path):
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["workload"]["replay"]["path"] = str(EXAMPLE.parent / spec["workload"]["replay"]["path"])
    rows = [json.loads(line) for line in (EXAMPLE.parent / "traces" / "sharegpt-llama-3.1-8b-60.jsonl").open()]
    _, turns = _turns(spec, tmp_path)
    by_time = sorted(turns, key=lambda t: t["submitted_s"])
    assert [t["submitted_s"] for t in by_time] == [r["arrival_time_ns"] / 1e9 for r in rows]
    assert [(t["prompt_tokens"], t["output_tokens"]) for t in by_time] == [(r["input_toks"], r["output_toks"])
                                                                           for r in rows]


def test_a_replay_prints_vllm_bench_serve_metrics_not_the_paired_verdicts(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [
        {"arrival_time_ns": k * 200_000_000, "input_toks": 500 + 40 * k, "output_toks": 20 + k} for k in range(12)])
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(trace)))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--out", str(out), "--no-figures"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "Serving metrics" in proc.stdout and "TTFT" in proc.stdout and "degraded" not in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    row, = summary["serving_by_arm"]
    # the closed-loop verdicts are not given for a replay, and say why
    run_entry, = summary["runs"]
    assert run_entry["persistently_degraded"] is None and run_entry["ends_degraded"] is None
    assert "not judged" in run_entry["verdicts"] and summary["pairs"]["comparisons"] == []
    turns = pq.read_table(out / "runs" / "replay-s1" / "turns.parquet").to_pylist()
    ttft_ms = sorted((t["first_token_s"] - t["ready_s"]) * 1e3 for t in turns)
    e2e_ms = [(t["finish_s"] - t["ready_s"]) * 1e3 for t in turns]
    duration = max(t["finish_s"] for t in turns) - min(t["submitted_s"] for t in turns)
    assert (row["num_requests"], row["completed"], row["failed"]) == (12, 12, 0)
    assert row["mean_ttft_ms"] == pytest.approx(sum(ttft_ms) / 12)
    assert row["p90_ttft_ms"] == pytest.approx(ttft_ms[10])  # nearest rank: the 11th of 12
    assert row["mean_e2el_ms"] == pytest.approx(sum(e2e_ms) / 12)
    assert row["request_throughput"] == pytest.approx(12 / duration)
    assert row["output_throughput"] == pytest.approx(sum(t["output_tokens"] for t in turns) / duration)
    tpot = [(t["finish_s"] - t["first_token_s"]) / (t["output_tokens"] - 1) * 1e3 for t in turns]
    assert row["mean_tpot_ms"] == pytest.approx(sum(tpot) / 12)
    assert row["max_abs_send_lateness_ms"] == pytest.approx(0.0, abs=1e-9)  # virtual time sends exactly on time
    # ITL pools every gap: its percentiles lie between the smallest request mean and the longest gap
    gaps = [t["output_tokens"] - 1 for t in turns]
    assert row["mean_itl_ms"] == pytest.approx(sum(t["itl_mean_s"] * g for t, g in zip(turns, gaps)) / sum(gaps) * 1e3)
    lo, hi = min(t["itl_mean_s"] for t in turns) * 1e3, max(t["itl_max_s"] for t in turns) * 1e3
    assert lo * 0.99 <= row["median_itl_ms"] <= row["p90_itl_ms"] <= row["p99_itl_ms"] <= hi * 1.01
    # running, waiting and KV usage every second of the run
    samples = pq.read_table(out / "runs" / "replay-s1" / "samples.parquet").to_pylist()
    assert [s["t_s"] for s in samples[:4]] == [0.0, 1.0, 2.0, 3.0]
    assert max(s["num_running"] for s in samples) > 0


def test_validate_says_what_will_be_replayed_and_what_the_trace_needed(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [_mooncake(500, 100, 0, [1]), _mooncake(100, 100, 5, [2])])
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**_spec(trace, speed=2.0), "duration_s": 0.1}))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "validate", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"replay: {trace} (mooncake): 2 requests recorded over 0.500 s, sent at speed 2, cut at 0.1 s" in proc.stdout
    assert "1 row with 0 output tokens: replayed with 1" in proc.stdout
    assert "1 row earlier than the row before: sorted by time" in proc.stdout


def test_commands_that_cannot_honour_a_replay_refuse_it(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [_mooncake(0, 100, 5, [1])])
    data = _spec(trace)
    data["engine"] = {"kind": "openai", "url": "http://127.0.0.1:9", "api": "chat"}
    with pytest.raises(SpecError, match="engine.api: a replay sends each prompt as its token ids"):
        parse_spec(data)
    data = _spec(trace)
    data["engine"].update(replicas=2, router={"policy": "cache_aware"})
    with pytest.raises(SpecError, match="engine.replicas: a trace replay on a simulated deployment"):
        parse_spec(data)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(_spec(trace)))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "map", str(spec), "--out", str(tmp_path / "m"),
                           "--trigger-factors", "0"], capture_output=True, text=True)
    assert proc.returncode == 2 and "a replayed trace (workload.replay) sends its own recorded times" in proc.stderr


@pytest.mark.parametrize("flavor, pool_tokens, output_tokens", [
    ("vllm", 200_000, 60), ("vllm", 8000, 300), ("sglang", 200_000, 60), ("sglang", 8000, 300)])
def test_the_run_counts_every_token_gap_once(tmp_path, flavor, pool_tokens, output_tokens):
    # the engines add their gaps as they commit steps and stretches; each request's own gaps
    # (its mean ITL times its gaps) must add up to the same total, preemptions (the small pool) included
    trace = _write(tmp_path / "t.jsonl", [
        _mooncake(k * 40.0, 800 + 37 * (k % 9), output_tokens + 23 * (k % 7), [k % 4, 500 + k]) for k in range(60)])
    data = _spec(trace, flavor)
    data["engine"]["pool_tokens"] = pool_tokens
    info, turns = _turns(data, tmp_path)
    assert (sum(t["num_preemptions"] for t in turns) > 0) == (pool_tokens < 10_000)  # resumed requests' gaps too
    hist = info["counts"]["inter_token_gaps"]
    ok = [t for t in turns if t["error"] is None]
    assert len(ok) == 60
    assert hist["num_gaps"] == sum(t["output_tokens"] - 1 for t in ok)
    assert hist["total_s"] == pytest.approx(sum(t["itl_mean_s"] * (t["output_tokens"] - 1) for t in ok), rel=1e-9)


def test_an_aiperf_session_sends_its_history_before_each_turn(tmp_path):
    # AIPerf's session rows record what a turn adds: turn 1's prompt is turn 0's prompt, its answer, then 300
    trace = _write(tmp_path / "t.jsonl", [
        _mooncake(0, 1024, 50, [1, 2], session_id="s"),
        _mooncake(10, 300, 20, [3], session_id="s")])
    loaded = load_timed(trace, "aiperf")
    assert [(r.input_tokens, r.added_tokens) for r in loaded.requests] == [(1024, 1024), (1024 + 50 + 300, 300)]
    _, turns = _turns(_spec(trace, format="aiperf"), tmp_path)
    assert [t["prompt_tokens"] for t in turns] == [1024, 1374]
    assert turns[1]["cacheable_prefix_tokens"] == 1024  # the first turn's prompt; its answer was never sent before
    assert turns[1]["cached_tokens"] == 1024


def test_a_client_timeout_fails_the_request_and_the_engine_aborts_it_freeing_its_place(tmp_path):
    # one engine slot: a long request holds it; the next waits behind it unless the client gives up
    rows = [{"arrival_time_ns": 0, "input_toks": 64, "output_toks": 4000},
            {"arrival_time_ns": 100_000_000, "input_toks": 64, "output_toks": 4}]
    trace = _write(tmp_path / "t.jsonl", rows)
    data = _spec(trace)
    data["engine"] = dict(data["engine"], max_num_seqs=1)
    _, waited = _turns(data, tmp_path)
    data["workload"]["replay"]["client_timeout_s"] = 2.0
    _, gave_up = _turns(data, tmp_path / "timeout")
    assert waited[0]["error"] is None and waited[1]["first_token_s"] > waited[0]["finish_s"]
    assert gave_up[0]["error"].startswith("timeout after 2 s")
    assert gave_up[0]["finish_s"] == pytest.approx(2.0)
    # the aborted request left the engine: the next one ran at once, long before the first would have ended
    assert gave_up[1]["error"] is None and gave_up[1]["first_token_s"] < 2.5 < waited[1]["first_token_s"]


def test_a_client_timeout_is_refused_on_the_simulated_sglang_engine(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [{"arrival_time_ns": 0, "input_toks": 64, "output_toks": 4}])
    with pytest.raises(SpecError, match="client_timeout_s"):
        parse_spec(_spec(trace, flavor="sglang", client_timeout_s=5.0))
