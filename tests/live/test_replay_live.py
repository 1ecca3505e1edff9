"""A trace replayed live against serve-sim over real HTTP: open loop on the recorded clock, the
recorded prefixes shared on the wire, every request answered before the run ends."""

import json

import pyarrow.parquet as pq
import yaml

from loadgen.cli import main


def test_a_replay_against_an_endpoint_sends_on_the_recorded_clock_and_waits_for_every_answer(
        tmp_path, serve_sim_factory):
    server = serve_sim_factory(1.0)
    # 0.1 s apart; every request shares the first two 512-token blocks (1024 tokens); the last
    # one's 200 output tokens take seconds of engine time, far past the last send (1.9 s)
    rows = [{"timestamp": 100 * k, "input_length": 1300, "output_length": 200 if k == 19 else 4,
             "hash_ids": [1, 2, 100 + k]} for k in range(20)]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"experiment": "replay-live", "seeds": [1],
                                    "engine": {"kind": "openai", "url": server.url},
                                    "workload": {"replay": {"path": str(trace)}},
                                    "arms": [{"name": "replay"}]}))
    out = tmp_path / "out"
    assert main(["run", str(spec), "--out", str(out), "--no-figures"]) == 0
    run = json.loads((out / "runs" / "replay-s1" / "run.json").read_text())
    assert run["status"] == "completed" and run["counts"]["sessions_completed"] == 20
    turns = sorted(pq.read_table(out / "runs" / "replay-s1" / "turns.parquet").to_pylist(),
                   key=lambda t: t["session_id"])
    assert [t["error"] for t in turns] == [None] * 20
    assert [t["prompt_tokens"] for t in turns] == [1300] * 20
    assert turns[-1]["finish_s"] > 2.5  # answered after the recorded span: the run waited for it
    # open loop: each request goes at its time, not after the one before it is answered
    for k, t in enumerate(turns):
        assert abs(t["submitted_s"] - 0.1 * k) < 0.25, (k, t["submitted_s"])
    # the shared blocks are the same ids on the wire: serve-sim hits on them once the first has run
    assert all(t["cached_tokens"] >= 1024 for t in turns[2:])
    row, = json.loads((out / "summary.json").read_text())["serving_by_arm"]
    assert row["completed"] == 20 and row["max_abs_send_lateness_ms"] is not None
    # every streamed gap pooled: 3 gaps of each 4-token answer and 199 of the long one
    assert run["counts"]["inter_token_gaps"]["num_gaps"] == 19 * 3 + 199
    assert row["median_itl_ms"] <= row["p99_itl_ms"]


def test_a_replays_client_timeout_is_the_http_clients_timeout(tmp_path, serve_sim_factory):
    server = serve_sim_factory(1.0)
    # seconds of decoding at serve-sim's speed: the client gives up first
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 64, "output_length": 4000}) + "\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"experiment": "replay-timeout", "seeds": [1],
                                    "engine": {"kind": "openai", "url": server.url, "retry": {"max_attempts": 1}},
                                    "workload": {"replay": {"path": str(trace), "client_timeout_s": 0.5}},
                                    "arms": [{"name": "replay"}]}))
    out = tmp_path / "out"
    main(["run", str(spec), "--out", str(out), "--no-figures"])
    turn, = pq.read_table(out / "runs" / "replay-s1" / "turns.parquet").to_pylist()
    assert "timeout after 0.5 s" in turn["error"]
    assert turn["finish_s"] < 2.0
