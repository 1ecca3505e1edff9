"""The gateway as a proxy: pass-through, sessions, demand, parking, keys (real HTTP on loopback)."""

import asyncio

import aiohttp
import orjson
import pytest

from tests.gateway.doubles import Upstream, gateway_url, running_gateway, wait_until


def run(coro):
    return asyncio.run(coro)


def completion(prompt_len: int, max_tokens: int = 4, stream: bool = True, first: int = 1) -> bytes:
    return orjson.dumps({"model": "m", "prompt": list(range(first, first + prompt_len)), "max_tokens": max_tokens,
                         "stream": stream})


async def post(http, url, body: bytes, session: str = None, headers=None, path="/v1/completions"):
    h = {"Content-Type": "application/json", **({"X-Session-ID": session} if session else {}), **(headers or {})}
    async with http.post(url + path, data=body, headers=h) as resp:
        return resp.status, dict(resp.headers), await resp.read()


def test_responses_pass_through_byte_for_byte_streamed_or_not_and_other_paths_too():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url]) as gw, aiohttp.ClientSession() as http:
            for stream in (True, False):
                direct = await post(http, up.url, completion(10, 5, stream), "s")
                proxied = await post(http, gateway_url(gw), completion(10, 5, stream), "s")
                assert proxied[0] == direct[0] == 200 and proxied[2] == direct[2]
                assert proxied[1]["Content-Type"] == direct[1]["Content-Type"]
            async with http.get(gateway_url(gw) + "/v1/models?x=1") as resp:
                assert orjson.loads(await resp.read()) == {"path": "/v1/models?x=1", "method": "GET"}
            async with http.put(gateway_url(gw) + "/tokenize", data=b"abc") as resp:
                assert orjson.loads(await resp.read()) == {"path": "/tokenize", "method": "PUT"}
            assert up.requests[-1][3] == b"abc"
            async with http.get(gateway_url(gw) + "/health") as resp:
                assert resp.status == 200
            # the request went upstream as it came, minus per-connection headers
            method, path, headers, body = up.requests[1]
            assert (method, path, body) == ("POST", "/v1/completions", completion(10, 5, True))
            assert headers["X-Session-ID"] == "s"
        await up.stop()

    run(main())


@pytest.mark.parametrize("header", ["X-Session-ID", "x-session-token", "x-dynamo-session-id", "X-SMG-Routing-Key"])
def test_each_known_session_header_names_the_session(header):
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url]) as gw, aiohttp.ClientSession() as http:
            for name in ("a", "b", "a"):
                await post(http, gateway_url(gw), completion(10, first=len(name)), headers={header: name})
            assert sorted(gw.sessions) == ["h:a", "h:b"]
            # turn by turn: the second turn of a updated its demand (10 prompt + 4 output each)
            assert gw.gate.demand_tokens == 28
        await up.stop()

    run(main())


def test_a_configured_header_and_the_fingerprint_without_one():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], session_headers=["X-Agent"], fingerprint_tokens=8) as gw, \
                aiohttp.ClientSession() as http:
            await post(http, gateway_url(gw), completion(5), headers={"X-Agent": "z"})
            assert list(gw.sessions) == ["h:z"]
            # completions: a short first prompt, then the same prompt grown: one session
            await post(http, gateway_url(gw), completion(5, first=50))
            await post(http, gateway_url(gw), completion(30, first=50))
            # another start: another session
            await post(http, gateway_url(gw), completion(30, first=60))
            # chat: system + first user message name the session, whatever follows
            msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task 1"}]
            for extra in ([], [{"role": "assistant", "content": "x"}, {"role": "user", "content": "tool"}]):
                await post(http, gateway_url(gw), orjson.dumps({"messages": msgs + extra, "max_tokens": 2}),
                           path="/v1/chat/completions")
            other = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task 2"}]
            await post(http, gateway_url(gw), orjson.dumps({"messages": other, "max_tokens": 2}),
                       path="/v1/chat/completions")
            kinds = sorted(k[0] for k in gw.sessions)
            assert kinds == ["c", "c", "h", "p", "p"], gw.sessions.keys()
        await up.stop()

    run(main())


def test_demand_is_the_prompt_plus_output_budget_and_text_is_estimated_from_the_last_usage():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url]) as gw, aiohttp.ClientSession() as http:
            await post(http, gateway_url(gw), completion(100, 20), "ids")
            assert gw.gate.active["h:ids"] == 120
            text = orjson.dumps({"prompt": "w " * 400, "max_tokens": 10, "stream": True})
            await post(http, gateway_url(gw), text, "text")
            # first turn: body bytes / 4; the double's usage then says len(body) // 4 prompt tokens
            assert gw.gate.active["h:text"] == len(text) // 4 + 10
            longer = orjson.dumps({"prompt": "w " * 800, "max_tokens": 10, "stream": True})
            await post(http, gateway_url(gw), longer, "text")
            # scaled from the last usage by the body's growth, at least that prompt plus its output
            expect = max((len(text) // 4) * len(longer) / len(text), len(text) // 4 + 10)
            assert gw.gate.active["h:text"] == int(expect) + 10
        await up.stop()

    run(main())


def test_a_session_over_the_budget_is_held_in_the_gateway_until_admitted():
    async def main():
        up = await Upstream().start()
        # budgeter: admit while D + d <= 0.75 * 1000
        async with running_gateway([up.url], pool_tokens=1000, controller="budgeter") as gw, \
                aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            await post(http, url, completion(600, 4), "a")  # admitted, D = 604, stays active (thinking)
            b = asyncio.ensure_future(post(http, url, completion(400, 4, first=7), "b"))
            await wait_until(lambda: len(gw.gate.waiting_new) == 1)
            await asyncio.sleep(0.05)
            assert not b.done() and len(up.requests) == 1  # nothing of b went upstream
            # a's last turn: when it completes, a ends and b is admitted
            await post(http, url, completion(610, 4), "a", headers={"x-dynamo-session-final": "true"})
            status, _, body = await b
            assert status == 200 and b"[DONE]" in body and len(up.requests) == 3
            assert list(gw.sessions) == ["h:b"] and gw.gate.num_admitted == 1
            async with http.get(url + "/metrics") as resp:
                text = (await resp.read()).decode()
            assert 'loadgen_gateway_parks_total{queue="waiting"} 1.0' in text
            assert "loadgen_gateway_controller_limit 750.0" in text
            assert "_created" not in text  # prometheus_client's timestamp series, left out
        await up.stop()

    run(main())


@pytest.mark.parametrize("mode", ["admit", "reject"])
def test_the_maximum_park_time_admits_anyway_or_answers_429(mode):
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], pool_tokens=1000, controller="budgeter", max_park_s=0.2,
                                   on_max_park=mode, retry_after_s=7) as gw, aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            await post(http, url, completion(700, 4), "a")
            status, headers, _ = await post(http, url, completion(700, 4, first=9), "b")
            if mode == "admit":
                assert status == 200 and gw.gate.num_admitted == 2 and len(up.requests) == 2
            else:
                assert status == 429 and headers["Retry-After"] == "7" and len(up.requests) == 1
                assert not gw.gate.waiting_new and list(gw.sessions) == ["h:a"]
        await up.stop()

    run(main())


def test_a_session_ends_after_its_idle_timeout_and_frees_its_demand():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], idle_timeout_s=0.2) as gw, aiohttp.ClientSession() as http:
            await post(http, gateway_url(gw), completion(10), "a")
            assert gw.gate.num_admitted == 1
            await wait_until(lambda: gw.gate.num_admitted == 0, 3.0)
            assert not gw.sessions and gw.gate.demand_tokens == 0
        await up.stop()

    run(main())


def test_client_keys_are_checked_and_never_sent_upstream_where_the_upstream_key_goes():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], client_keys=["k1", "k2"], upstream_key="UP") as gw, \
                aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            assert (await post(http, url, completion(3), "a"))[0] == 401
            assert (await post(http, url, completion(3), "a", {"Authorization": "Bearer nope"}))[0] == 401
            assert not up.requests
            assert (await post(http, url, completion(3), "a", {"Authorization": "Bearer k2"}))[0] == 200
            assert up.requests[0][2]["Authorization"] == "Bearer UP"
            async with http.get(url + "/health") as resp:  # a probe needs no key
                assert resp.status == 200
            # the gateway's own metrics and status need no client key, and stay readable while it drains
            for draining in (False, True):
                if draining:  # as a drain starts, its listener left open
                    gw.drain_started.set_result(None)
                assert gw.draining == draining
                for path in ("/metrics", "/status"):
                    async with http.get(url + path) as resp:
                        assert resp.status == 200, (path, draining)
            assert (await post(http, url, completion(3), "a", {"Authorization": "Bearer k2"}))[0] == 503
        await up.stop()

    run(main())


def test_pool_tokens_auto_reads_the_upstreams_pools_as_the_preflight_does():
    from loadgen.gateway.proxy import read_pool_tokens
    from tests.live.conftest import ServeSim

    async def vllm_like():
        ups = [await Upstream().start(), await Upstream().start()]  # 1000 blocks of 16 each
        try:
            return await read_pool_tokens([u.url for u in ups])
        finally:
            for u in ups:
                await u.stop()

    assert run(vllm_like()) == 2 * 16_000
    sglang = ServeSim(1.0, "--flavor", "sglang", "--pool-tokens", "123456")
    try:
        assert run(read_pool_tokens([sglang.url])) == 123456
    finally:
        sglang.kill()
    with pytest.raises(ValueError, match="pool_tokens: auto could not read"):
        run(read_pool_tokens(["http://127.0.0.1:9"]))


def test_one_debug_line_per_decision_and_no_prompt_or_key_in_the_log(caplog):
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], client_keys=["sekrit-key"], upstream_key="UPKEY") as gw, \
                aiohttp.ClientSession() as http:
            auth = {"Authorization": "Bearer sekrit-key"}
            for _ in range(3):
                body = orjson.dumps({"prompt": "confidential words " * 50, "max_tokens": 3, "stream": True})
                assert (await post(http, gateway_url(gw), body, "s", auth))[0] == 200
        await up.stop()

    with caplog.at_level("DEBUG", logger="loadgen.gateway"):
        run(main())
    decisions = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decision")]
    assert len(decisions) == 3 and "event=arrive" in decisions[0] and "event=turn" in decisions[1]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "confidential" not in text and "sekrit" not in text and "UPKEY" not in text


def test_the_gateway_reads_as_one_engine_in_its_metrics_and_resets_every_upstreams_cache():
    from loadgen.live.server_metrics import parse_metrics

    async def main():
        ups = [await Upstream(gauges=(3, 1, 0.25)).start(), await Upstream(gauges=(2, 0, 0.75)).start()]
        async with running_gateway([u.url for u in ups], pool_tokens=32_000, scrape_interval_s=0.05) as gw, \
                aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            await wait_until(lambda: all("server" in gw.engine_signals.get(u.url, {}) for u in ups))
            async with http.get(url + "/metrics") as resp:
                scraped = parse_metrics((await resp.read()).decode())
            # the pool the gate computes with, in the upstreams' 16-token blocks; their gauges summed
            assert (scraped.server, scraped.pool_tokens, scraped.block_size) == ("vllm", 32_000, 16)
            m = scraped.metrics
            assert (m.num_running, m.num_waiting, m.kv_usage) == (5, 1, 0.5)
            status, _, body = await post(http, url, b"", path="/reset_prefix_cache?reset_running_requests=true")
            assert status == 200 and orjson.loads(body) == {"upstreams": 2, "done": 2, "failed": []}
            for up in ups:  # each upstream got the reset, its query string included
                assert up.requests[-1][:2] == ("POST", "/reset_prefix_cache?reset_running_requests=true")
            async with http.get(url + "/get_server_info") as resp:  # SGLang's pool: the gate's
                assert orjson.loads(await resp.read()) == {"max_total_num_tokens": 32_000, "page_size": 1,
                                                           "model_path": "m"}
            await ups[1].stop()
            status, _, body = await post(http, url, b"", path="/flush_cache")
            answer = orjson.loads(body)
            assert status == 502 and (answer["upstreams"], answer["done"]) == (2, 1)
            assert answer["failed"][0]["upstream"] == ups[1].url
        await ups[0].stop()

    run(main())


def test_a_run_start_gives_a_fresh_gate_and_lets_an_earlier_runs_held_request_go():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], pool_tokens=1000, controller="budgeter", time_scale=100.0) as gw, \
                aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            await post(http, url, completion(600, 4), "a")  # admitted and thinking: b does not fit beside it
            b = asyncio.ensure_future(post(http, url, completion(400, 4, first=7), "b"))
            await wait_until(lambda: len(gw.gate.waiting_new) == 1)
            await asyncio.sleep(0.05)  # 5 s of the gateway's clock
            assert gw.clock.now() > 4.0 and not b.done()
            status, _, body = await post(http, url, b"", path="/loadgen/run_start")
            assert status == 200 and orjson.loads(body)["clock_s"] < 1.0
            assert (await b)[0] == 200  # not lost: sent on
            assert not gw.sessions and gw.gate.num_admitted == 0 and gw.gate.demand_tokens == 0
            async with http.get(url + "/metrics") as resp:  # how a run knows it is talking to a gateway
                assert "loadgen_gateway_active_sessions" in (await resp.read()).decode()
        await up.stop()

    run(main())


def test_a_request_sent_beside_a_sessions_turn_is_no_turn_of_the_gate():
    """Parallel calls of one session (a second request while its turn is out) pass the gate
    without a decision and feed it no completion: the gate sees what the in-process one would."""
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], controller="aimd") as gw, aiohttp.ClientSession() as http:
            calls = []
            completed = gw.gate.turn_completed
            gw.gate.turn_completed = lambda key, latency_s: (calls.append(key), completed(key, latency_s))
            url = gateway_url(gw)
            up.hold = True
            turn = asyncio.ensure_future(post(http, url, completion(10), "s"))
            await wait_until(lambda: len(up.held) == 1)
            beside = asyncio.ensure_future(post(http, url, completion(12), "s"))
            await wait_until(lambda: len(up.held) == 2)
            up.release()
            assert [(await f)[0] for f in (turn, beside)] == [200, 200]
            assert calls == ["h:s"]
        await up.stop()

    run(main())


def test_a_hung_upstream_delays_no_others_scrape_and_a_failed_scrape_reads_unknown():
    from loadgen.live.server_metrics import parse_metrics

    async def main():
        ups = [await Upstream(gauges=(3, 1, 0.25)).start(), await Upstream(gauges=(2, 0, 0.75)).start()]
        ups[1].metrics_fault = "hang"
        async with running_gateway([u.url for u in ups], scrape_interval_s=0.05, router="llm_d") as gw, \
                aiohttp.ClientSession() as http:
            await asyncio.sleep(0.5)
            assert ups[0].num_scrapes >= 5 and ups[1].num_scrapes == 1  # scraped on, beside the hung one
            ups[1].metrics_fault = None
            await wait_until(lambda: gw.engine_signals[ups[1].url].get("num_running") == 2, timeout_s=15)
            ups[0].metrics_fault = "500"
            await wait_until(lambda: gw.engine_signals[ups[0].url].get("error") is not None)
            signals = gw.engine_signals[ups[0].url]
            assert signals["num_running"] is None and signals["kv_usage"] is None  # not the last good values
            assert [v.num_running for v in gw.routing.views()] == [-1, 2]  # the router reads it unknown
            async with http.get(gateway_url(gw) + "/metrics") as resp:
                text = (await resp.read()).decode()
            m = parse_metrics(text).metrics
            assert (m.num_running, m.num_waiting) == (-1, -1)  # a sum over an unknown upstream: left out
            assert f'loadgen_gateway_upstream_engine{{gauge="num_running",upstream="{ups[0].url}"}} NaN' in text
        for up in ups:
            await up.stop()

    run(main())


@pytest.mark.parametrize("tree_policy", ["trees", "sessions"])
def test_a_tree_behind_the_proxy_admits_its_child_by_the_tree_policy_and_never_deadlocks(tree_policy):
    """One place (session-cap k=1), taken by a parent between turns: its child, which names it in
    x-dynamo-parent-session-id, is admitted on arrival under tree_policy trees; under sessions it
    queues, and the liveness rule lets it in (its parent waits for it: nobody admitted can end a turn)."""
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], controller="session-cap", controller_options={"k": 1, "k_hi": 1},
                                   tree_policy=tree_policy) as gw, aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            assert (await post(http, url, completion(10), "p"))[0] == 200
            child = post(http, url, completion(10, first=5), "c",
                         headers={"x-dynamo-parent-session-id": "p", "x-dynamo-session-final": "true"})
            assert (await asyncio.wait_for(child, 2.0))[0] == 200  # no deadlock
            assert gw.sessions["h:p"].children == set() and not gw.sessions["h:p"].joining
            assert not gw.gate.joining and "h:c" not in gw.sessions
            unrelated = asyncio.ensure_future(post(http, url, completion(10, first=9), "q"))
            await wait_until(lambda: len(gw.gate.waiting_new) == 1)  # p holds the one place, thinking
            assert (await post(http, url, completion(12), "p", headers={"x-dynamo-session-final": "true"}))[0] == 200
            assert (await unrelated)[0] == 200
        await up.stop()

    run(main())


@pytest.mark.parametrize("tree_policy", ["trees", "sessions"])
def test_a_child_waits_like_a_new_session_only_under_tree_policy_sessions(tree_policy):
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], controller="session-cap", controller_options={"k": 2, "k_hi": 2},
                                   tree_policy=tree_policy) as gw, aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            for name in ("p", "q"):  # both places taken; q, no parent, can end a turn
                assert (await post(http, url, completion(10, first=len(name)), name))[0] == 200
            child = asyncio.ensure_future(post(http, url, completion(10, first=5), "c",
                                               headers={"x-dynamo-parent-session-id": "p"}))
            if tree_policy == "sessions":
                await wait_until(lambda: len(gw.gate.waiting_new) == 1)
                assert not child.done()
                await post(http, url, completion(12, first=2), "q", headers={"x-dynamo-session-final": "true"})
            assert (await asyncio.wait_for(child, 2.0))[0] == 200
            assert gw.metrics.parks.labels("waiting")._value.get() == (0 if tree_policy == "trees" else 1)
        await up.stop()

    run(main())


def test_the_proxys_clock_tells_apart_two_moments_of_one_loop_turn():
    """A request held until another's answer ends in the same loop turn was held for some time, not
    0 s: under uvloop the loop's clock is read once a turn, in whole milliseconds."""
    import time

    import uvloop

    from loadgen.gateway.proxy import proxy_clock

    async def held_s() -> float:
        clock = proxy_clock(60.0)
        arrived_s = clock.now()
        time.sleep(0.0002)  # no await: the same loop turn
        return clock.now() - arrived_s

    assert uvloop.run(held_s()) > 0.0
