"""Live runs on a server that keeps its prefix cache between runs: no run reuses another's token ids.

A test double at the transport seam plays a vLLM-like server whose cache of whole 16-token
blocks survives from run to run unless reset; several runs go against it one after another.
"""

from __future__ import annotations

import json

import orjson
import pyarrow.parquet as pq
import pytest

from loadgen.core.runner import RunKey
from loadgen.core.spec import OpenAIEngineSpec, parse_spec
from loadgen.live.http_client import PreflightError
from loadgen.live.transport import MockResponse, MockTransport
from loadgen.live.runner import run_live
from tests.conftest import make_spec_dict

BLOCK = 16
TIME_SCALE = 240.0  # a 240 s run takes about one second
SYSTEM_PROMPT_TOKENS = 2000


class CachingServer:
    """/v1/completions reports as cached the leading whole blocks it has seen before (at most
    prompt - 1 tokens, as vLLM); /reset_prefix_cache exists only in ``dev_mode``."""

    def __init__(self, dev_mode: bool = True) -> None:
        self.dev_mode = dev_mode
        self.blocks: set[int] = set()
        self.prompts: list[list[int]] = []  # every session prompt (probes left out), in order
        self.num_resets = 0
        self._next_id = 1

    def __call__(self, method: str, path: str, body):
        if path == "/v1/models":
            return MockResponse(json={"data": [{"id": "tiny", "max_model_len": 65536}]})
        if path == "/metrics":
            return MockResponse(text="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
        if path.startswith("/reset_prefix_cache") and self.dev_mode:
            self.blocks.clear()
            self.num_resets += 1
            return MockResponse(json={})
        if path == "/v1/completions":
            return self._complete(body["prompt"], body["max_tokens"])
        return MockResponse(status=404, text="Not Found")

    def _complete(self, prompt: list[int], max_tokens: int) -> MockResponse:
        keys, key = [], None  # a block's key is its chain: the previous block's key and its ids
        for end in range(BLOCK, len(prompt) + 1, BLOCK):
            key = hash((key, tuple(prompt[end - BLOCK:end])))
            keys.append(key)
        cached = 0
        for key in keys:
            if key not in self.blocks:
                break
            cached += BLOCK
        cached = min(cached, (len(prompt) - 1) // BLOCK * BLOCK)
        self.blocks.update(keys)
        if len(prompt) > 600:  # not a preflight probe
            self.prompts.append(list(prompt))
        ids = list(range(self._next_id, self._next_id + max_tokens))
        self._next_id += max_tokens
        usage = {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        chunks = [{"choices": [{"index": 0, "text": "x", "token_ids": [t]}]} for t in ids]
        lines = [b"data: " + orjson.dumps(c) + b"\n" for c in chunks + [{"choices": [], "usage": usage}]]
        return MockResponse(lines=lines + [b"data: [DONE]\n"])


def _spec(**engine):
    data = make_spec_dict(duration_s=240, seeds=[3, 4])
    data["workload"]["arrival_rate_per_s"] = 0.05
    data["workload"]["sessions"]["system_prompt_tokens"] = SYSTEM_PROMPT_TOKENS
    spec = parse_spec(data)
    return spec.model_copy(update={"engine": OpenAIEngineSpec(url="http://engine:8000", pool_tokens=400_000,
                                                              **engine), "time_scale": TIME_SCALE})


def _run(spec, server: CachingServer, arm: str, seed: int, out) -> tuple[dict, list[list[int]]]:
    before = len(server.prompts)
    info = run_live(spec, RunKey(arm, seed), out, MockTransport(server))
    return info, server.prompts[before:]


def _turns(out, run_id: str) -> dict:
    return pq.read_table(out / "runs" / run_id / "turns.parquet").to_pydict()


def test_runs_of_another_seed_or_arm_send_other_ids_and_get_no_hits_from_an_unflushed_server(tmp_path):
    server = CachingServer()
    spec = _spec(flush_before_run=False)
    runs = {}
    for arm, seed in (("base", 3), ("burst", 3), ("base", 4)):
        info, prompts = _run(spec, server, arm, seed, tmp_path)
        assert info["status"] == "completed" and info["flushed_before_run"] is False and len(prompts) > 10
        runs[(arm, seed)] = prompts
    assert server.num_resets == 0

    for key, prompts in runs.items():
        # the shared system prompt is one prompt within a run...
        assert len({tuple(p[:SYSTEM_PROMPT_TOKENS]) for p in prompts}) == 1, key
    # ...and another in each run, as is every other block a run sends
    first_blocks = {key: {tuple(p[:BLOCK]) for p in prompts} for key, prompts in runs.items()}
    assert len(set.union(*first_blocks.values())) == 3
    later_blocks = {key: {tuple(p[k:k + BLOCK]) for p in prompts for k in range(0, len(p) - BLOCK, BLOCK)}
                    for key, prompts in runs.items()}
    assert not later_blocks[("base", 3)] & later_blocks[("burst", 3)]
    assert not later_blocks[("base", 3)] & later_blocks[("base", 4)]

    for arm, seed in (("burst", 3), ("base", 4)):
        turns = _turns(tmp_path, f"{arm}-s{seed}")
        first_turns = sorted((r, c, s) for r, c, s, k in zip(turns["ready_s"], turns["cached_tokens"],
                                                             turns["session_id"], turns["turn_index"]) if k == 0)
        # the run's first request finds nothing of the earlier runs in the cache; later sessions
        # hit the run's own system prompt and nothing more
        assert first_turns[0][1] == 0
        assert all(c <= SYSTEM_PROMPT_TOKENS for _, c, _ in first_turns)
        assert any(c == SYSTEM_PROMPT_TOKENS // BLOCK * BLOCK for _, c, _ in first_turns[1:])


def test_paired_arms_send_the_same_shapes_with_other_contents(tmp_path):
    server = CachingServer()
    spec = _spec()
    for arm in ("base", "burst"):
        assert run_live(spec, RunKey(arm, 3), tmp_path, MockTransport(server))["status"] == "completed"
    base, burst = _turns(tmp_path, "base-s3"), _turns(tmp_path, "burst-s3")

    def first_prompts(turns):
        return {s: p for s, k, p, trig in zip(turns["session_id"], turns["turn_index"], turns["prompt_tokens"],
                                               turns["is_trigger_session"]) if k == 0 and not trig}

    shared = set(first_prompts(base)) & set(first_prompts(burst))
    assert len(shared) > 5 and all(first_prompts(base)[s] == first_prompts(burst)[s] for s in shared)
    assert server.num_resets == 2  # flush_before_run (the default): one reset per run


def test_a_failed_reset_before_the_run_stops_it_naming_the_server_flag(tmp_path):
    server = CachingServer(dev_mode=False)
    with pytest.raises(PreflightError, match="VLLM_SERVER_DEV_MODE=1.*flush_before_run: false"):
        run_live(_spec(), RunKey("base", 3), tmp_path, MockTransport(server))
    info = json.loads((tmp_path / "runs" / "base-s3" / "run.json").read_text())
    assert info["status"] == "failed" and "VLLM_SERVER_DEV_MODE=1" in info["error"]
    assert server.prompts == []  # no session ran

    info = run_live(_spec(flush_before_run=False), RunKey("base", 3), tmp_path / "unflushed", MockTransport(server))
    assert info["status"] == "completed" and info["flushed_before_run"] is False and server.prompts
