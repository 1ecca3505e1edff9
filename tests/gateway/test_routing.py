"""Several upstreams behind the gateway's router (``--router``: sticky-hash or a router of routers/),
real HTTP on loopback against engine doubles: where each request goes, the response header naming
the upstream, the per-upstream metrics, and the views the routers get."""

import asyncio
import math
import re
import subprocess
import sys

import aiohttp
import pytest

from tests.gateway.doubles import Upstream, gateway_url, running_gateway, wait_until
from tests.gateway.test_proxy import completion, post, run


async def upstreams(n: int, **kwargs) -> list[Upstream]:
    return [await Upstream(**kwargs).start() for _ in range(n)]


async def upstream_requests(http, gw) -> dict[str, float]:
    """loadgen_gateway_upstream_requests_total per upstream URL, from the gateway's /metrics."""
    async with http.get(gateway_url(gw) + "/metrics") as resp:
        text = (await resp.read()).decode()
    return {url: float(v) for url, v in re.findall(r'^loadgen_gateway_upstream_requests_total\{upstream="([^"]+)"\} '
                                                   r'(\S+)$', text, re.M)}


def test_round_robin_spreads_requests_1_2_3_even_within_one_session_and_names_the_upstream():
    async def main():
        ups = await upstreams(3)
        async with running_gateway([u.url for u in ups], router="round_robin") as gw, \
                aiohttp.ClientSession() as http:
            replicas = []
            for turn in range(6):  # one session: the router moves it every request
                status, headers, _ = await post(http, gateway_url(gw), completion(10 + turn), "s")
                assert status == 200
                replicas.append(headers["X-Loadgen-Replica"])
            assert replicas == ["0", "1", "2", "0", "1", "2"]
            assert [len(u.requests) for u in ups] == [2, 2, 2]
            assert await upstream_requests(http, gw) == {u.url: 2.0 for u in ups}
            assert gw.routing.outstanding == [0, 0, 0]
        for u in ups:
            await u.stop()

    run(main())


def test_consistent_hash_keeps_each_session_on_one_upstream_and_spreads_sessions():
    async def main():
        ups = await upstreams(3)
        async with running_gateway([u.url for u in ups], router="consistent_hash") as gw, \
                aiohttp.ClientSession() as http:
            where: dict[str, set] = {}
            for turn in range(3):
                for s in range(10):  # not a multiple of 3: round robin would move sessions
                    _, headers, _ = await post(http, gateway_url(gw), completion(10 + turn, first=s), f"s{s}")
                    where.setdefault(f"s{s}", set()).add(headers["X-Loadgen-Replica"])
            assert all(len(r) == 1 for r in where.values())
            assert len(set().union(*where.values())) > 1
            # what each upstream received agrees with the header
            for i, u in enumerate(ups):
                assert {h["X-Session-ID"] for _, _, h, _ in u.requests} == {s for s, r in where.items() if r == {str(i)}}
        for u in ups:
            await u.stop()

    run(main())


@pytest.mark.parametrize("router", ["least_outstanding", "power_of_two", "bounded_hash"])
def test_load_aware_routers_avoid_an_upstream_busy_with_a_request_in_flight(router):
    async def main():
        ups = await upstreams(3)
        for u in ups:
            u.hold = True
        async with running_gateway([u.url for u in ups], router=router) as gw, aiohttp.ClientSession() as http:
            first = asyncio.ensure_future(post(http, gateway_url(gw), completion(10), "busy"))
            await wait_until(lambda: sum(len(u.held) for u in ups) == 1)
            busy = next(i for i, u in enumerate(ups) if u.held)
            for i, u in enumerate(ups):
                u.hold = i == busy
            assert gw.routing.outstanding[busy] == 1
            # power_of_two: the busy one loses whenever it is drawn; bounded_hash: it is at its bound,
            # ceil(1.25 x (1 + 1) / 3) = 1, so a session hashed there walks on
            for s in range(8):
                _, headers, _ = await post(http, gateway_url(gw), completion(10, first=s), f"s{s}")
                assert headers["X-Loadgen-Replica"] != str(busy)
            assert len(ups[busy].requests) == 1
            ups[busy].release()
            assert (await first)[0] == 200
        for u in ups:
            await u.stop()

    run(main())


def test_an_engine_reading_router_sees_the_scraped_gauges_and_goes_to_the_idle_upstream():
    async def main():
        ups = [await Upstream(gauges=g).start() for g in ((8, 6, 0.9), (8, 6, 0.9), (1, 0, 0.1))]
        async with running_gateway([u.url for u in ups], router="llm_d", scrape_interval_s=0.05) as gw, \
                aiohttp.ClientSession() as http:
            await wait_until(lambda: all(u.num_scrapes for u in ups))
            await wait_until(lambda: len(gw.engine_signals) == 3 and all(
                s.get("num_running") is not None for s in gw.engine_signals.values()))
            views = gw.routing.views()
            assert [(v.num_running, v.num_waiting, v.kv_usage) for v in views] == [
                (8, 6, 0.9), (8, 6, 0.9), (1, 0, 0.1)]
            for s in range(4):  # new sessions, no prefix anywhere: the queue and KV scorers decide
                _, headers, _ = await post(http, gateway_url(gw), completion(10, first=s), f"s{s}")
                assert headers["X-Loadgen-Replica"] == "2"
        for u in ups:
            await u.stop()

    run(main())


def test_cache_aware_follows_the_shared_prefix_loadgen_names_and_spreads_without_it():
    async def main():
        ups = await upstreams(3)
        async with running_gateway([u.url for u in ups], router="cache_aware") as gw, aiohttp.ClientSession() as http:
            hint = {"X-Loadgen-Prefix-Tokens": "80"}
            _, first, _ = await post(http, gateway_url(gw), completion(100), "a", headers=hint)
            home = int(first["X-Loadgen-Replica"])
            assert ("prefix", 80) in gw.routing.router.tree.prefixes[home]
            # 80 of 100 tokens matched > cache_threshold 0.3: a new session with that prefix goes there
            _, second, _ = await post(http, gateway_url(gw), completion(100), "b", headers=hint)
            assert int(second["X-Loadgen-Replica"]) == home
            # without the hint nothing matches: the smallest tree (an upstream not yet sent anything)
            _, third, _ = await post(http, gateway_url(gw), completion(100), "c")
            assert int(third["X-Loadgen-Replica"]) != home
        for u in ups:
            await u.stop()

    run(main())


def test_a_router_that_reads_no_engine_state_gets_none_and_an_unscraped_upstream_reads_unknown():
    async def main():
        ups = await upstreams(2)
        async with running_gateway([u.url for u in ups], router="llm_d", scrape_interval_s=60) as gw:
            gw.engine_signals[ups[1].url] = {"num_running": 2, "num_waiting": 0, "kv_usage": None,
                                             "error": "ConnectionRefusedError"}
            assert all(v.num_running == -1 and math.isnan(v.kv_usage) for v in gw.routing.views())
        async with running_gateway([u.url for u in ups], router="round_robin", scrape_interval_s=0.05) as gw:
            await wait_until(lambda: all(u.num_scrapes for u in ups))
            assert all(v.num_running == -1 for v in gw.routing.views())
        for u in ups:
            await u.stop()

    run(main())


def test_one_upstream_passes_its_own_replica_header_several_replace_it_with_theirs():
    async def main():
        one = await Upstream(replica="7").start()
        async with running_gateway([one.url]) as gw, aiohttp.ClientSession() as http:
            for stream in (True, False):
                _, headers, _ = await post(http, gateway_url(gw), completion(10, stream=stream), "s")
                assert headers["X-Loadgen-Replica"] == "7"
        two = await Upstream(replica="7").start()
        async with running_gateway([one.url, two.url], router="round_robin") as gw, aiohttp.ClientSession() as http:
            seen = []
            for stream in (True, False):
                async with http.post(gateway_url(gw) + "/v1/completions", data=completion(10, stream=stream),
                                     headers={"X-Session-ID": "s"}) as resp:
                    await resp.read()
                    seen.append(resp.headers.getall("X-Loadgen-Replica"))
            assert seen == [["0"], ["1"]]  # the gateway's, once: not the upstreams' "7"
        await one.stop()
        await two.stop()

    run(main())


def _gateway_cli(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", "gateway", "--upstream", "http://127.0.0.1:9",
                           "--quiet", *args], capture_output=True, text=True, timeout=60)


def test_an_unknown_router_or_knob_exits_2_listing_the_valid_ones():
    proc = _gateway_cli("--router", "nope")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "router" in proc.stderr and "nope" in proc.stderr
    for name in ("sticky-hash", "round_robin", "consistent_hash", "least_outstanding", "cache_aware", "llm_d",
                 "dynamo_kv"):
        assert name in proc.stderr
    proc = _gateway_cli("--router", "cache_aware", "--router-option", "cache_thresold=0.5")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "router_options" in proc.stderr and "cache_threshold" in proc.stderr
    proc = _gateway_cli("--router", "round_robin", "--router-option", "x")
    assert proc.returncode == 2 and "--router-option" in proc.stderr


@pytest.mark.parametrize("scope", ["deployment", "replica"])
def test_scope_replica_gives_each_upstream_its_own_budget(scope):
    """Two upstreams of 1,000 tokens, the budgeter (0.75 C): two 604-token sessions hashed to the
    same upstream fit the deployment's 1,500 but not that upstream's 750, so with scope replica the
    second waits there, while a session hashed to the other upstream goes at once."""
    from loadgen.gateway.upstream_choice import sticky_hash

    def keys_on(index: int, n: int) -> list[str]:
        return [k for k in (f"k{i}" for i in range(100)) if sticky_hash("h:" + k, 2) == index][:n]

    async def main():
        ups = [await Upstream().start(), await Upstream().start()]
        async with running_gateway([u.url for u in ups], pool_tokens=2000, controller="budgeter",
                                   scope=scope) as gw, aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            (a, b), (c,) = keys_on(0, 2), keys_on(1, 1)
            assert (await post(http, url, completion(600, 4), a))[0] == 200
            second = asyncio.ensure_future(post(http, url, completion(600, 4, first=3), b))
            if scope == "replica":
                await wait_until(lambda: len(gw.gate.waiting_new) == 1)
                assert (await post(http, url, completion(600, 4, first=5), c))[0] == 200  # its own upstream's budget
                assert not second.done() and gw.gate.limit() == 1500.0 and gw.gate.pool_tokens == 2000
                await post(http, url, completion(610, 4), a, headers={"x-dynamo-session-final": "true"})
            assert (await asyncio.wait_for(second, 2.0))[0] == 200
            assert len(ups[0].requests) == (3 if scope == "replica" else 2)  # b went where it was routed
        for up in ups:
            await up.stop()

    asyncio.run(main())
