"""serve-sim over real HTTP: what a client sees when it hangs up, retries, or asks the wrong way."""

import asyncio

import pytest

from loadgen.cli import main
from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.live.serve_sim_prompts import PromptMapper

PROMPT = [(i * 7919) % 29989 + 1 for i in range(4000)]


def test_a_retry_after_a_client_timeout_hits_what_the_aborted_request_computed(serve_sim_factory):
    # real time: the 4000-token prefill takes 0.25 s of engine time, the 20000-token decode ~100 s,
    # so the client's 2 s timeout always falls in the decode, whatever the machine's load
    server = serve_sim_factory(1.0)

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=server.url, model="sim", request_timeout_s=2.0))
        try:
            first = await client.generate(TurnRequest(1, 0, len(PROMPT), 20000, token_ids=PROMPT))
            retry = await client.generate(TurnRequest(1, 0, len(PROMPT), 1, token_ids=PROMPT))
            metrics = (await client.scrape()).metrics
        finally:
            await client.close()
        return first, retry, metrics

    first, retry, metrics = asyncio.run(go())
    assert first.error is not None and "timeout after 2 s" in first.error
    assert retry.error is None
    # vLLM: the aborted request's full prompt blocks keep their hashes; the retry hits all of
    # them below its last token, (4000 - 1) // 16 blocks
    assert retry.cached_tokens == 3984
    assert metrics.num_running == 0 and metrics.num_waiting == 0  # the hung-up request is gone


def test_after_an_abort_only_the_retried_prompt_continues_the_stream():
    m = PromptMapper(block_size=4)
    prompt = list(range(1, 41))
    _, _, s1 = m.map(prompt, 0)
    m.aborted(s1, m.chained_hashes(prompt))
    # a longer prompt could hit blocks only the aborted request's output filled: a new stream
    _, _, other = m.map(prompt + [7] * 8, 0)
    m.release(other)
    _, _, retry = m.map(prompt, 0)
    assert other != s1 and retry == s1


@pytest.mark.parametrize("argv,message", [
    (["--port", "70000"], "--port 70000: a TCP port is 1..65535"),
    (["--pool-tokens", "16"], "--pool-tokens 16 cannot hold one request of --max-model-len 40960 tokens"),
    (["--pool-tokens", "16", "--max-model-len", "8"], "--pool-tokens 16: the pool needs at least 2 blocks"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens 0: must be >= 1"),
    (["--pool-tokens", "1000"], "--pool-tokens (1000) must be a multiple of --block-size (16)"),
])
def test_bad_serve_sim_options_are_clear_errors(capsys, argv, message):
    assert main(["serve-sim", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


@pytest.mark.parametrize("sigma", [0.0, 0.4])
def test_serve_sim_steps_with_the_jitter_its_cost_model_measured(serve_sim_factory, tmp_path, sigma):
    """A calibrated cost.json carries the engine's step jitter; serve-sim standing in for that
    engine is then as noisy (and exactly as steady without it)."""
    import json
    import statistics

    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"name": "jittery", "t0_s": 0.05, "a_s_per_token": 0.0, "b_s_per_token2": 0.0,
                                "g_s_per_token": 0.0, "step_jitter_sigma": sigma}))
    server = serve_sim_factory(1.0, "--cost-model", str(cost))

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=server.url, model="sim"))
        try:  # one 50 ms step each: 16 fresh one-block prompts, one after another
            return [await client.generate(TurnRequest(1, i, 16, 1, token_ids=[i * 100 + k + 1 for k in range(16)]))
                    for i in range(16)]
        finally:
            await client.close()

    ttfts = [r.first_token_s - r.submitted_s for r in asyncio.run(go())]
    spread = statistics.pstdev(ttfts) / statistics.median(ttfts)
    # lognormal with sd 0.4: a spread near 0.4; without jitter only the machine's timers (< 0.1)
    assert (spread > 0.2) if sigma else (spread < 0.1), ttfts


@pytest.mark.parametrize("flavor,details", [("vllm", {"cached_tokens": 0}), ("sglang", None)])
def test_a_cold_completion_reports_cached_tokens_as_its_engine_does(serve_sim_factory, flavor, details):
    # vLLM reports 0 cached tokens (its guard is `num_cached_tokens is not None`); SGLang omits the field
    import json
    import urllib.request

    server = serve_sim_factory(30.0, "--flavor", flavor)
    body = json.dumps({"model": "sim", "prompt": PROMPT[:64], "max_tokens": 2}).encode()
    request = urllib.request.Request(f"{server.url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        usage = json.loads(response.read())["usage"]
    assert usage["prompt_tokens"] == 64 and usage.get("prompt_tokens_details") == details
