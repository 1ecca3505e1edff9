"""The client's SGLang paths end to end against a real ``serve-sim --flavor sglang`` process."""

import asyncio
import json
import urllib.error
import urllib.request

import pyarrow.parquet as pq
import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import OpenAIEngineSpec, parse_spec
from loadgen.live.http_client import (FLUSH_MAX_ATTEMPTS, FLUSH_RETRY_INTERVAL_S, EndpointOptions,
                                      OpenAIEngineClient, PreflightError)
from loadgen.live.runner import run_live
from loadgen.live.serve_sim_wire import SGLANG_FLUSH_TEXT
from tests.conftest import make_spec_dict

TIME_SCALE = 30.0
PROMPT = [(i * 7919) % 29989 + 1 for i in range(4000)]
# the shared system prompt: not a multiple of vLLM's 16-token block, as SGLang caches every token
SYSTEM_PROMPT_TOKENS = 2005


def sglang(serve_sim_factory, time_scale=TIME_SCALE, *extra):
    return serve_sim_factory(time_scale, "--flavor", "sglang", *extra)


def get(url):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def post(url, payload=None):
    data = json.dumps(payload).encode() if payload is not None else b""
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def client_for(sim, time_scale=TIME_SCALE, **options):
    return OpenAIEngineClient(WallClock(time_scale), EndpointOptions(url=sim.url, model="sim", **options))


def test_preflight_detects_sglang_and_reads_the_pool_from_server_info(serve_sim_factory):
    server = sglang(serve_sim_factory, TIME_SCALE, "--pool-tokens", "300000")
    _, metrics_text = get(server.url + "/metrics")
    # SGLang 0.5.x's names, and no pool gauge: the pool comes from /get_server_info
    assert "sglang:token_usage{" in metrics_text and "sglang:cached_tokens_total{" in metrics_text
    assert "max_total_num_tokens" not in metrics_text and "vllm:" not in metrics_text
    assert json.loads(get(server.url + "/get_server_info")[1])["max_total_num_tokens"] == 300000
    assert json.loads(get(server.url + "/get_model_info")[1])["model_path"] == "sim"
    assert post(server.url + "/reset_prefix_cache")[0] == 404  # vLLM's reset is not SGLang's API

    async def go():
        client = client_for(server)
        try:
            return await client.preflight()
        finally:
            await client.close()

    info = asyncio.run(go())
    assert info["server"] == "sglang" and info["pool_tokens"] == 300000
    # the probe sent again hits all but its last token (SGLang caps a match at the prompt minus one)
    assert info["probe_cached_tokens"] == [0, 511, 511]


def test_native_generate_reports_cached_tokens_in_meta_info(serve_sim_factory):
    server = sglang(serve_sim_factory)
    body = {"input_ids": PROMPT[:1000], "sampling_params": {"max_new_tokens": 4}}
    first = json.loads(post(server.url + "/generate", body)[1])
    again = json.loads(post(server.url + "/generate", body)[1])
    assert first["meta_info"]["cached_tokens"] == 0 and len(first["output_ids"]) == 4
    assert again["meta_info"]["cached_tokens"] == 999
    assert again["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


def test_flush_is_refused_while_a_request_runs_and_the_client_retries_until_idle(serve_sim_factory):
    # at x30 the 1000-token decode lasts about 15 s of run time: the flush sent with it is refused
    # (HTTP 400) and retried every 0.5 s of run time, far fewer than the 120 attempts allowed
    server = sglang(serve_sim_factory)

    async def go():
        client = client_for(server, server="sglang")
        try:
            before = await client.generate(TurnRequest(1, 0, len(PROMPT), 1, token_ids=PROMPT))
            running = asyncio.ensure_future(client.generate(TurnRequest(1, 1, len(PROMPT), 1000, token_ids=PROMPT)))
            await client.clock.sleep(1.0)  # the request is running
            refused = await asyncio.to_thread(post, server.url + "/flush_cache")
            flushed_at = await client.flush_async()
            during = await running
            after = await client.generate(TurnRequest(1, 2, len(PROMPT), 1, token_ids=PROMPT))
        finally:
            await client.close()
        return before, refused, flushed_at, during, after

    before, refused, flushed_at, during, after = asyncio.run(go())
    assert refused == (400, SGLANG_FLUSH_TEXT)  # SGLang's answer to a flush while busy
    assert during.error is None and during.cached_tokens == 3999
    assert flushed_at >= during.finish_s - 1.0  # it happened once the server was idle (1 s: HTTP slack x30)
    assert after.cached_tokens == 0  # and it happened: the prompt cached twice before is gone


def test_a_flush_that_never_finds_the_server_idle_fails_after_the_bounded_retries(serve_sim_factory):
    server = sglang(serve_sim_factory)  # a 20000-token decode outlasts the 60 s of retries

    async def go():
        client = client_for(server, server="sglang", request_timeout_s=30.0)
        try:
            running = asyncio.ensure_future(client.generate(TurnRequest(1, 0, len(PROMPT), 20000, token_ids=PROMPT)))
            await client.clock.sleep(1.0)
            with pytest.raises(PreflightError) as exc_info:
                await client.flush_async()
            running.cancel()
            return str(exc_info.value), client.flush_times_s
        finally:
            await client.close()

    message, flush_times = asyncio.run(go())
    assert f"refused {FLUSH_MAX_ATTEMPTS} times, {FLUSH_RETRY_INTERVAL_S:g} s of run time apart" in message
    assert "HTTP 400" in message and flush_times == []


def live_spec(url, duration_s=240, triggers=()):
    data = make_spec_dict(duration_s=duration_s, seeds=[3])
    data["workload"]["arrival_rate_per_s"] = 0.05
    data["workload"]["sessions"]["system_prompt_tokens"] = SYSTEM_PROMPT_TOKENS
    data["arms"] = [{"name": "base", "triggers": list(triggers)}]
    spec = parse_spec({**data, "engine": {"kind": "sim", "flavor": "sglang", "pool_tokens": 400000}})
    live = spec.model_copy(update={"engine": OpenAIEngineSpec(url=url), "time_scale": TIME_SCALE})
    return spec, live


def turns(out, run_id="base-s3"):
    return pq.read_table(out / "runs" / run_id / "turns.parquet").to_pydict()


def by_turn(t):
    return {(s, k): (p, c) for s, k, p, c, e in zip(t["session_id"], t["turn_index"], t["prompt_tokens"],
                                                     t["cached_tokens"], t["error"]) if e is None}


def test_live_run_against_sglang_serve_sim_agrees_with_virtual_time(tmp_path, serve_sim_factory):
    server = sglang(serve_sim_factory)
    sim_spec, spec = live_spec(server.url)
    info = run_live(spec, RunKey("base", 3), tmp_path / "live")
    assert info["status"] == "completed" and info["engine_flavor"] == "sglang"
    assert info["preflight"]["server"] == "sglang" and info["pool_tokens"] == 400000
    virtual_info = run_simulated(sim_spec, RunKey("base", 3), tmp_path / "virtual")
    assert virtual_info["engine_flavor"] == "sglang"
    live, virtual = by_turn(turns(tmp_path / "live")), by_turn(turns(tmp_path / "virtual"))
    common = set(live) & set(virtual)
    assert len(common) >= 0.85 * len(virtual) > 20
    assert sum(c for _, c in live.values()) > 0
    assert all(live[key] == virtual[key] for key in common)  # same prompts, same cached tokens, turn by turn
    samples = pq.read_table(tmp_path / "live" / "runs" / "base-s3" / "samples.parquet").to_pydict()
    # sglang:cached_tokens_total / prompt_tokens_total scraped; retractions: no total in SGLang 0.5.x
    assert max(samples["prefix_cache_hits_total"]) > 0 and max(samples["prefix_cache_queries_total"]) > 0
    assert samples["pool_tokens"][0] == 400000 and set(samples["num_preemptions_total"]) == {-1}


def test_a_flush_trigger_during_load_waits_for_an_idle_server_then_empties_the_cache(tmp_path, serve_sim_factory):
    server = sglang(serve_sim_factory)
    at_s = 120.0
    _, spec = live_spec(server.url, triggers=[{"kind": "flush", "at_s": at_s}])
    info = run_live(spec, RunKey("base", 3), tmp_path)
    assert info["status"] == "completed" and info["counts"]["flush_errors"] == []
    (flushed_s,) = info["counts"]["flush_times_s"]
    assert at_s <= flushed_s <= at_s + FLUSH_MAX_ATTEMPTS * FLUSH_RETRY_INTERVAL_S + 5.0
    t = turns(tmp_path)
    rows = sorted(zip(t["session_id"], t["admit_s"], t["finish_s"], t["cached_tokens"], t["error"]))
    # each session's first turn sent after the flush found its own context gone: it hits at most
    # the shared system prompt (cached again by whichever turn came first)
    first_after = {}
    for session, admit, finish, cached, error in rows:
        if error is None and admit > flushed_s and session not in first_after:
            first_after[session] = cached
    assert first_after and all(c <= SYSTEM_PROMPT_TOKENS for c in first_after.values())
    continuing = [s for s, a, f, c, e in rows if e is None and a < flushed_s and c > SYSTEM_PROMPT_TOKENS]
    assert continuing  # before the flush, sessions did hit their own contexts


@pytest.mark.parametrize("argv,message", [
    (["--page-size", "0"], "--page-size 0: must be >= 1"),
    (["--offload-cpu-tokens", "900000"], "--offload-cpu-tokens models vLLM's offloading: it needs --flavor vllm"),
])
def test_bad_sglang_serve_sim_options_are_clear_errors(capsys, argv, message):
    from loadgen.cli import main

    assert main(["serve-sim", "--flavor", "sglang", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
