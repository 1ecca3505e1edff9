"""The gateway decides as the in-process gate does: the same calls, the same answers, the same admissions.

A simulated run records every call its gate gets (arrivals and turn boundaries with their demand,
completions with their latency, ends) and every admission, in order. The same sequence is then
played over HTTP: each arrival or turn a request with that demand (a token-id prompt and
max_tokens), each completion the release of that request's response by the engine double, each
session's last request marked x-dynamo-session-final; the proxy's clock reads the recorded times.
The proxy's gate must see the same calls and make the same admissions, policy by policy.
"""

import asyncio

import aiohttp
import orjson
import pytest

import loadgen.core.runner as core_runner
import loadgen.gateway.proxy as gateway_proxy
from loadgen.core.clock import WallClock
from loadgen.core.gateway import Gateway
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict
from tests.gateway.doubles import Upstream, gateway_url, running_gateway, wait_until


class RecordingGateway(Gateway):
    """Every call and its answer, and every admission; session ids as strings (the proxy's keys
    are the X-Session-ID values, prefixed ``h:``)."""

    logs: list = []

    def __init__(self, *args, **kwargs) -> None:
        self.log = []
        RecordingGateway.logs.append(self.log)
        super().__init__(*args, **kwargs)

    def arrive(self, session, demand_tokens):
        wait = super().arrive(session, demand_tokens)
        self.log.append(("arrive", self.clock.now(), _sid(session), demand_tokens, wait is None))
        return wait

    def before_turn(self, session, demand_tokens):
        wait = super().before_turn(session, demand_tokens)
        self.log.append(("turn", self.clock.now(), _sid(session), demand_tokens, wait is None))
        return wait

    def turn_completed(self, session, latency_s):
        self.log.append(("completed", self.clock.now(), _sid(session), round(latency_s, 9)))
        super().turn_completed(session, latency_s)

    def session_ended(self, session):
        self.log.append(("ended", self.clock.now(), _sid(session)))
        super().session_ended(session)

    def _activate(self, session, demand_tokens):
        self.log.append(("activate", _sid(session)))
        super()._activate(session, demand_tokens)


def _sid(session) -> str:
    return str(session).removeprefix("h:")


POOL_TOKENS = 30_000
CONTROLLERS = [{"name": "budgeter"}, {"name": "session-cap", "params": {"k": 4, "k_hi": 5}},
               {"name": "adaptive-cap"}, {"name": "aimd", "params": {"initial_k": 2, "update_interval_s": 30.0,
                                                                    "latency_threshold_s": 0.5, "max_k": 3}}]


def recorded_run(tmp_path, controller: dict) -> list:
    data = make_spec_dict(duration_s=400, seeds=[7])
    data["engine"]["pool_tokens"] = POOL_TOKENS
    data["workload"]["arrival_rate_per_s"] = 0.15
    data["arms"] = [{"name": "a", "controller": controller}]
    RecordingGateway.logs = []
    original = core_runner.Gateway
    core_runner.Gateway = RecordingGateway
    try:
        run_simulated(parse_spec(data), RunKey("a", 7), tmp_path)
    finally:
        core_runner.Gateway = original
    return RecordingGateway.logs[0]


async def replay(log: list, controller: dict) -> list:
    """Play ``log``'s calls through a proxy; its gate's own log."""
    now = [0.0]
    last_turn = {}  # of each session that ended in the run (the others were cut by its end)
    for i, entry in enumerate(log):
        if entry[0] in ("arrive", "turn"):
            last_turn[entry[2]] = i
    ended = {entry[2] for entry in log if entry[0] == "ended"}
    up = await Upstream().start()
    up.hold = True
    RecordingGateway.logs = []
    original = gateway_proxy.Gateway
    gateway_proxy.Gateway = RecordingGateway
    try:
        async with running_gateway([up.url], pool_tokens=POOL_TOKENS, controller=controller["name"],
                                   controller_options=controller.get("params", {}), idle_timeout_s=1e9) as gw, \
                aiohttp.ClientSession() as http:
            gw.reset(WallClock(time_source=lambda: now[0]))
            proxy_log = RecordingGateway.logs[-1]
            pending = {}
            for i, entry in enumerate(log):
                kind = entry[0]
                if kind == "activate" or kind == "ended":
                    continue  # consequences, not calls: the proxy must make them itself
                now[0] = entry[1]
                sid = entry[2]
                num_calls = sum(e[0] not in ("activate", "ended") for e in proxy_log)
                if kind in ("arrive", "turn"):
                    demand = entry[3]
                    body = orjson.dumps({"prompt": [1] * (demand - 1), "max_tokens": 1, "stream": True})
                    headers = {"X-Session-ID": sid}
                    if last_turn[sid] == i and sid in ended:
                        headers["x-dynamo-session-final"] = "true"
                    pending[sid] = asyncio.ensure_future(http.post(gateway_url(gw) + "/v1/completions", data=body,
                                                                   headers=headers))
                else:  # completed: the engine answers that session's request
                    await wait_until(lambda: sid in up.held_by)
                    up.held_by.pop(sid).set()
                    resp = await pending.pop(sid)
                    assert resp.status == 200
                    await resp.read()
                await wait_until(lambda: sum(e[0] not in ("activate", "ended") for e in proxy_log) == num_calls + 1)
            calls = list(proxy_log)  # before the clients still waiting at the run's end hang up
            for request in pending.values():
                request.cancel()
            return calls
    finally:
        gateway_proxy.Gateway = original
        await up.stop()


@pytest.mark.parametrize("controller", CONTROLLERS, ids=[c["name"] for c in CONTROLLERS])
def test_the_proxy_makes_the_in_process_gates_decisions_on_a_recorded_run(tmp_path, controller):
    log = recorded_run(tmp_path, controller)
    waits = sum(1 for e in log if e[0] in ("arrive", "turn") and not e[4])
    assert waits >= 5 and sum(e[0] == "arrive" for e in log) >= 20  # the run parks: decisions to get right
    proxy_log = asyncio.run(replay(log, controller))
    assert proxy_log == log
