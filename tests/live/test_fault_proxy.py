"""What real servers and proxies do to responses, injected between the driver and a real
serve-sim process (tests/servers.py FaultInjectingProxy): each fault ends in a recorded, correct
outcome, a turn with every token it asked for or a failed attempt of the right cause that the
session retries."""

import asyncio

import pyarrow.parquet as pq
import pytest

from loadgen.analysis.attempts import attempt_outcome, failure_cause
from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.core.runner import RunKey
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.live.raw_http import RawHttpTransport
from loadgen.live.runner import run_live
from tests.live.test_live_serve_sim import live_spec
from tests.servers import FaultInjectingProxy

PROMPT = [(i * 7919) % 29989 + 1 for i in range(600)]
OUTCOME = {"interim": None, "slow_headers": None, "chunk_extensions": None,
           "reset_mid_body": "disconnected", "half_then_hang": "timeout"}


def completions_fault(fault):
    """``fault`` on the second /v1/completions request, the first one clean."""
    return lambda path, n: fault if path == "/v1/completions" and n == 2 else None


@pytest.mark.parametrize("fault", FaultInjectingProxy.FAULTS)
def test_each_fault_ends_in_the_whole_turn_or_a_failure_of_its_cause(serve_sim_factory, fault):
    server = serve_sim_factory(30.0)
    proxy = FaultInjectingProxy(server.url, completions_fault(fault))

    async def go():
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=proxy.url, model="sim", request_timeout_s=1.5),
                                    RawHttpTransport())
        try:
            clean = await client.generate(TurnRequest(1, 0, len(PROMPT), 24, token_ids=PROMPT))
            faulted = await client.generate(TurnRequest(1, 0, len(PROMPT), 24, token_ids=PROMPT))
            after = await client.generate(TurnRequest(1, 0, len(PROMPT), 24, token_ids=PROMPT))
        finally:
            await client.close()
        return clean, faulted, after

    try:
        clean, faulted, after = asyncio.run(go())
    finally:
        proxy.close()
    assert proxy.faults == [("/v1/completions", 2, fault)]
    assert clean.error is None and len(clean.output_token_ids) == clean.output_tokens == 24
    if OUTCOME[fault] is None:  # a response as the server meant it: the same turn as without the fault
        assert faulted.error is None, faulted.error
        assert len(faulted.output_token_ids) == faulted.output_tokens == 24
        assert faulted.prompt_tokens == after.prompt_tokens == len(PROMPT)
        assert len(faulted.inter_token_gaps_s) <= 23
    else:
        assert faulted.error is not None and failure_cause(faulted.error) == OUTCOME[fault], faulted.error
    # the connection the fault spoiled is not reused: the next request goes through whole
    assert after.error is None and after.output_tokens == 24


def test_connections_the_server_closes_while_idle_are_dropped_and_no_request_is_lost(serve_sim_factory):
    """Think times longer than the server's keep-alive: every idle connection is closed under
    the driver; no request fails and the pool holds none of them."""
    server = serve_sim_factory(30.0)
    proxy = FaultInjectingProxy(server.url, idle_close_s=0.1)

    async def go():
        transport = RawHttpTransport()
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=proxy.url, model="sim"), transport)
        results, held = [], []
        try:
            for _ in range(8):
                results.append(await client.generate(TurnRequest(1, 0, len(PROMPT), 4, token_ids=PROMPT)))
                await asyncio.sleep(0.25)
                held.append(transport.num_open_connections)
        finally:
            await client.close()
        return results, held

    try:
        results, held = asyncio.run(go())
    finally:
        proxy.close()
    assert all(r.error is None and r.output_tokens == 4 for r in results)
    assert held == [0] * 8 and proxy.num_idle_closes == 8 and proxy.num_connections == 8


def test_a_live_run_through_every_fault_retries_each_failed_attempt_and_records_why(tmp_path, serve_sim_factory):
    """A closed-loop run whose completions meet every fault in turn (and idle connections closed
    by the server): each failed attempt is a row of its cause, its turn is retried and succeeds
    with every token it asked for, and the summary counts them."""
    server = serve_sim_factory(30.0)
    faults = FaultInjectingProxy.FAULTS

    def fault_for(path, n):  # the preflight's three probes spared; then every 4th completion
        return faults[(n // 4) % len(faults)] if path == "/v1/completions" and n > 3 and n % 4 == 0 else None

    proxy = FaultInjectingProxy(server.url, fault_for, idle_close_s=1.0)
    try:
        _, spec = live_spec(proxy.url, request_timeout_s=2.0, retry={"max_attempts": 3, "backoff_s": 0.3})
        info = run_live(spec, RunKey("base", 3), tmp_path)
    finally:
        proxy.close()
    assert info["status"] == "completed"
    injected = {f for _, _, f in proxy.faults}
    assert injected == set(faults), injected
    t = pq.read_table(tmp_path / "runs" / "base-s3" / "turns.parquet")
    rows = t.to_pylist()
    failed = [r for r in rows if r["error"] is not None]
    assert {failure_cause(r["error"]) for r in failed} == {"disconnected", "timeout"}
    for r in failed:  # retried: the same turn's next attempt follows, from the same ready time
        retry = [x for x in rows if (x["session_id"], x["turn_index"], x["attempt"])
                 == (r["session_id"], r["turn_index"], r["attempt"] + 1)]
        assert retry and retry[0]["ready_s"] == r["ready_s"] and retry[0]["submitted_s"] > r["finish_s"]
    ok = [r for r in rows if r["error"] is None]
    assert all(r["output_tokens"] == r["planned_output_tokens"] for r in ok)  # nothing truncated
    outcome = attempt_outcome(t)
    assert outcome["turns_failed"] == 0 and outcome["turns_truncated"] == 0
    # a turn may meet two faults in a row: retried turns count turns, failed attempts count rows
    assert outcome["turns_retried"] == len({(r["session_id"], r["turn_index"]) for r in failed})
    assert sum(outcome["failed_attempts_by_cause"].values()) == len(failed)
