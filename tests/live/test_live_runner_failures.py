"""Live runs against a test double at the transport seam: what is recorded when things go wrong."""

import json

import orjson
import pyarrow.parquet as pq

from loadgen.core.runner import RunKey
from loadgen.core.spec import OpenAIEngineSpec, parse_spec
from loadgen.live.transport import MockResponse, MockTransport
from loadgen.live.runner import run_live
from tests.conftest import make_spec_dict

PROBE = [(i * 7919) % 29989 + 1 for i in range(512)]  # the preflight's repeated prompt
METRICS = ('# TYPE vllm:cache_config_info gauge\n'
           'vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="10000"} 1.0\n')


def completion(prompt_tokens: int, output_tokens: int) -> MockResponse:
    chunks = [{"choices": [{"index": 0, "text": "x", "token_ids": [7]}]} for _ in range(output_tokens)]
    chunks.append({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
                                            "prompt_tokens_details": {"cached_tokens": 256}}})
    return MockResponse(lines=[b"data: " + orjson.dumps(c) + b"\n" for c in chunks] + [b"data: [DONE]\n"])


def server(fail_request: int):
    """A vLLM double whose ``fail_request``-th load request (after the preflight) raises an
    error no engine adapter expects: the session sending it crashes."""
    seen = {"load": 0}

    def handler(method, path, body):
        if path == "/v1/models":
            return MockResponse(json={"data": [{"id": "m", "max_model_len": 40960}]})
        if path == "/metrics":
            return MockResponse(text=METRICS)
        if path.startswith("/reset_prefix_cache"):
            return MockResponse(text="")
        if path == "/v1/completions":
            if body["prompt"] != PROBE:
                seen["load"] += 1
                if seen["load"] == fail_request:
                    return RuntimeError("injected engine failure")
            return completion(len(body["prompt"]), body["max_tokens"])
        return MockResponse(status=404, text="Not Found")
    return handler


def live_spec(**controller):
    data = make_spec_dict(seeds=[1], arms=[{"name": "base"}], controller=controller or {"name": "none"})
    spec = parse_spec({**data, "engine": {"kind": "sim", "pool_tokens": 160000}})
    return spec.model_copy(update={"engine": OpenAIEngineSpec(url="http://engine:8000", model="m"),
                                   "time_scale": 300.0})


def test_a_crashed_session_is_recorded_releases_its_admission_and_marks_the_run(tmp_path):
    # one session at a time: a crashed session that kept its admission would stop the run cold
    spec = live_spec(name="admission-only", params={"k": 1})
    info = run_live(spec, RunKey("base", 1), tmp_path, transport=MockTransport(server(fail_request=1)))
    assert info["status"] == "completed_with_errors" and info["counts"]["sessions_crashed"] == 1
    assert "1 session(s) crashed" in info["error"]
    run_dir = tmp_path / "runs" / "base-s1"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "completed_with_errors"
    sessions = pq.read_table(run_dir / "sessions.parquet").to_pylist()
    crashed = [s for s in sessions if s["status"] == "error"]
    assert len(crashed) == 1 and crashed[0]["error"] == "RuntimeError: injected engine failure"
    assert crashed[0]["turns_completed"] == 0 and crashed[0]["session_id"] == min(s["session_id"] for s in sessions)
    turns = pq.read_table(run_dir / "turns.parquet").to_pylist()
    # the sessions after it were admitted and ran
    assert {t["session_id"] for t in turns} - {crashed[0]["session_id"]}
    samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
    assert all(n >= 0 for n in samples["sessions_in_engine"]) and samples["sessions_admitted"][-1] <= 1


def test_a_run_without_crashes_is_completed(tmp_path):
    info = run_live(live_spec(), RunKey("base", 1), tmp_path, transport=MockTransport(server(fail_request=0)))
    assert info["status"] == "completed" and info["counts"]["sessions_crashed"] == 0
