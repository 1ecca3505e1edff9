"""Where ThunderAgent's router deadlocked: 2,000 concurrent closed-loop sessions through the gateway,
parking active, against the zero-time server. Nothing hangs, every request is answered once, the
gate is empty at the end, and the gateway's memory does not grow with the requests it served."""

import asyncio
import random
import subprocess
import sys
import urllib.request

import orjson

from loadgen.live.raw_http import RawHttpTransport, TransportError
from tests.servers import free_port, start_server

NUM_SESSIONS = 2000
LOAD_S = 8.0  # new sessions start for this long; then every session finishes its last turn
NUM_TURNS = 4
POOL_TOKENS = 300_000  # the budgeter admits ~0.75 C: about half of the sessions' demand


def rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return orjson.loads(resp.read())


async def closed_loop(url: str, gateway_pid: int) -> dict:
    transport = RawHttpTransport(max_connections=NUM_SESSIONS + 10)
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + LOAD_S
    counts = {"sent": 0, "ok": 0, "errors": [], "sessions": 0}
    rss = []

    async def agent(slot: int) -> None:
        rng = random.Random(slot)
        incarnation = 0
        while loop.time() < stop_at:
            incarnation += 1
            counts["sessions"] += 1
            sid = f"{slot}.{incarnation}"
            context = rng.randint(100, 200)
            for turn in range(NUM_TURNS):
                headers = {"Content-Type": "application/json", "X-Session-ID": sid}
                if turn == NUM_TURNS - 1:
                    headers["x-dynamo-session-final"] = "1"
                body = orjson.dumps({"prompt": [slot % 1000 + 1] * context, "max_tokens": 4, "stream": True})
                counts["sent"] += 1
                events = []
                try:
                    async for batch in transport.stream_lines(url + "/v1/completions", body, headers, 60.0):
                        events += [line for line in batch if line.startswith(b"data:")]
                except TransportError as exc:
                    counts["errors"].append(str(exc))
                    break
                if events.count(b"data: [DONE]") != 1 or sum(b'"usage"' in e for e in events) != 1:
                    counts["errors"].append(f"a response with {len(events)} events")
                    break
                counts["ok"] += 1
                context += 4 + rng.randint(10, 60)
                await asyncio.sleep(rng.uniform(0.0, 0.3))

    async def sample_memory() -> None:
        while True:
            rss.append(rss_bytes(gateway_pid))
            await asyncio.sleep(0.5)

    sampler = asyncio.ensure_future(sample_memory())
    await asyncio.wait_for(asyncio.gather(*(agent(i) for i in range(NUM_SESSIONS))), LOAD_S + 120)
    sampler.cancel()
    await transport.close()
    counts["rss"] = rss
    return counts


def test_two_thousand_closed_loop_sessions_with_parking_end_with_nothing_lost_or_stuck():
    zero_port, gw_port = free_port(), free_port()
    zero = start_server([sys.executable, "benchmarks/zero_server.py", "--port", str(zero_port)],
                        f"http://127.0.0.1:{zero_port}")
    gw_url = f"http://127.0.0.1:{gw_port}"
    gateway = start_server([sys.executable, "-m", "loadgen.cli", "gateway", "--upstream", f"http://127.0.0.1:{zero_port}",
                            "--listen", f"127.0.0.1:{gw_port}", "--controller", "budgeter",
                            "--pool-tokens", str(POOL_TOKENS), "--quiet"], gw_url,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        counts = asyncio.run(closed_loop(gw_url, gateway.pid))
        status = get_json(gw_url + "/status")
        metrics = urllib.request.urlopen(gw_url + "/metrics", timeout=10).read().decode()
    finally:
        gateway.terminate()
        zero.kill()
        gateway.wait(30)
        zero.wait()
    assert counts["errors"] == [] and counts["ok"] == counts["sent"] >= 2 * NUM_SESSIONS
    # parking happened, and every admission was given back
    value = lambda name: sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()  # noqa: E731
                             if line.startswith(name) and not line.startswith("#"))
    assert value("loadgen_gateway_parks_total") > NUM_SESSIONS / 4
    assert status["active_sessions"] == status["parked_sessions"] == status["waiting_sessions"] == 0
    assert status["demand_tokens"] == 0 and status["known_sessions"] == 0 and status["in_flight_requests"] == 0
    # each request went upstream once: no duplicates, none lost
    assert value("loadgen_gateway_upstream_requests_total") == counts["sent"]
    assert value('loadgen_gateway_sessions_ended_total{how="final"}') == counts["sessions"]
    # memory flat: what the gateway holds after the first half of the load is what it holds at the end
    rss = counts["rss"]
    half = rss[len(rss) // 2]
    assert rss[-1] - half < 30 * 2**20, [r // 2**20 for r in rss]
