"""Faults at the gateway: nothing lost, nothing stuck, the admission always given back."""

import asyncio
import os
import signal
import subprocess
import sys

import aiohttp
import orjson
import pytest

from tests.gateway.doubles import Upstream, client_request_counts, gateway_url, running_gateway, wait_until
from tests.gateway.test_proxy import completion, post, run
from tests.servers import free_port


async def raw_exchange(port: int, request: bytes, close_after_s=None, read_limit=None) -> bytes:
    """Send raw bytes, read until the gateway closes (or ``close_after_s``, then hang up)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    data = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), close_after_s) if close_after_s else \
                await reader.read(65536)
            if not chunk:
                break
            data += chunk
            if read_limit and len(data) >= read_limit:
                break
    except asyncio.TimeoutError:
        pass
    writer.close()
    return data


def head(body: bytes, session: str = "s", path: str = "/v1/completions", length=None) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nX-Session-ID: {session}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode() + body


def test_an_upstream_that_dies_mid_stream_ends_the_clients_stream_with_the_error_and_frees_the_session():
    async def main():
        up = await Upstream().start()
        up.die_after = 2
        async with running_gateway([up.url]) as gw:
            data = await raw_exchange(gw.port, head(completion(10, 8)))
            assert data.count(b'"token_ids"') == 2 and b"upstream failed mid-response" in data
            assert not data.endswith(b"0\r\n\r\n")  # the chunked body is cut short: every client sees a failure
            assert gw.gate.num_admitted == 0 and not gw.sessions
            async with aiohttp.ClientSession() as http:  # the gateway goes on serving
                up.die_after = None
                assert (await post(http, gateway_url(gw), completion(10), "t"))[0] == 200
                async with http.get(gateway_url(gw) + "/metrics") as resp:
                    text = (await resp.read()).decode()
            # the upstream's failure, counted as such: not a client that hung up
            assert f'loadgen_gateway_upstream_errors_total{{upstream="{up.url}"}} 1.0' in text
            assert 'loadgen_gateway_sessions_ended_total{how="failed"} 1.0' in text
            assert 'how="client_gone"' not in text
        await up.stop()

    run(main())


def test_an_upstream_that_is_down_gets_a_quick_502():
    async def main():
        async with running_gateway([f"http://127.0.0.1:{free_port()}"]) as gw, aiohttp.ClientSession() as http:
            status, _, body = await asyncio.wait_for(post(http, gateway_url(gw), completion(5), "a"), 5.0)
            assert status == 502 and b"cannot connect to upstream" in body
            assert gw.gate.num_admitted == 0 and not gw.sessions

    run(main())


def test_a_client_that_hangs_up_while_parked_leaves_the_queue_and_nothing_goes_upstream():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], pool_tokens=1000, controller="budgeter") as gw, \
                aiohttp.ClientSession() as http:
            await post(http, gateway_url(gw), completion(700), "a")
            waiting = asyncio.ensure_future(raw_exchange(gw.port, head(completion(500, first=3), "b"),
                                                         close_after_s=0.2))
            await wait_until(lambda: len(gw.gate.waiting_new) == 1)
            await waiting  # hung up
            await wait_until(lambda: not gw.gate.waiting_new)
            assert list(gw.sessions) == ["h:a"] and len(up.requests) == 1
            assert gw.metrics.abandoned._value.get() == 1
        await up.stop()

    run(main())


def test_a_client_that_hangs_up_mid_stream_aborts_the_upstream_request_and_frees_the_session():
    async def main():
        up = await Upstream().start()
        up.chunk_delay_s = 0.02
        async with running_gateway([up.url]) as gw:
            data = await raw_exchange(gw.port, head(completion(10, 200)), read_limit=200)
            assert b"token_ids" in data
            await wait_until(lambda: up.num_cut == 1 and gw.gate.num_admitted == 0 and not gw.sessions)
            assert gw.num_in_flight == 0
        await up.stop()

    run(main())


def test_a_malformed_body_is_400_and_an_oversized_one_413_without_touching_the_gate():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], max_body_bytes=10_000) as gw, aiohttp.ClientSession() as http:
            for body in (b"not json", b"[1, 2]"):
                status, _, text = await post(http, gateway_url(gw), body, "a")
                assert status == 400 and b"gateway_error" in text
            # 10 MB announced, a little sent: refused at the head, the rest never read
            data = await raw_exchange(gw.port, head(b"x" * 100, length=10_000_000))
            assert data.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in data
            assert not up.requests and not gw.sessions and gw.gate.num_admitted == 0
            assert (await post(http, gateway_url(gw), completion(3), "a"))[0] == 200
        await up.stop()

    run(main())


def test_a_slow_client_pauses_the_upstream_so_the_gateway_holds_a_bounded_buffer():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url]) as gw:
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(b"GET /big?mib=64 HTTP/1.1\r\nHost: x\r\n\r\n")
            got, peak = 0, 0
            while got < 64 * 2**20:
                chunk = await reader.read(2**16)
                if not chunk:
                    break
                got += len(chunk)
                peak = max([peak] + [c.transport.get_write_buffer_size() for c in gw.connections])
                await asyncio.sleep(0.0005)
            writer.close()
            assert got >= 64 * 2**20 and peak < 4 * 2**20  # 64 MiB through, never more than a few MiB held
        await up.stop()

    run(main())


def start_gateway_process(upstream: str, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "gateway", "--upstream", upstream,
                             "--pool-tokens", "1000", "--listen", f"127.0.0.1:{port}", "--quiet", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return proc, port


async def wait_serving(port: int, proc) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError("the gateway did not start")


@pytest.mark.parametrize("deadline_s", [30.0, 0.3])
def test_sigterm_drains_requests_in_flight_up_to_the_deadline(tmp_path, deadline_s):
    async def main():
        up = await Upstream().start()
        up.chunk_delay_s = 0.01  # a 1.5 s stream
        config = tmp_path / "gateway.yaml"
        config.write_text(f"drain_timeout_s: {deadline_s}\n")
        proc, port = start_gateway_process(up.url, "--config", str(config))
        try:
            await wait_serving(port, proc)
            streaming = asyncio.ensure_future(raw_exchange(port, head(completion(10, 150))))
            await wait_until(lambda: len(up.requests) == 1)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.1)
            with pytest.raises(OSError):  # no new connections while draining
                await asyncio.open_connection("127.0.0.1", port)
            data = await streaming
            rc = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 10)
            assert rc == 0
            err = proc.stderr.read().decode()
            if deadline_s > 10:
                assert data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and "drained" in err
            else:
                assert b"[DONE]" not in data and "drain deadline reached: 1 request(s) cut" in err
        finally:
            if proc.poll() is None:
                proc.kill()
        await up.stop()

    run(main())


def test_a_bad_config_exits_2_naming_the_field_without_a_traceback(tmp_path):
    bad = tmp_path / "g.yaml"
    bad.write_text("upstreams: [http://127.0.0.1:1]\nidle_timeout_s: -3\nmax_park_s: soon\n")
    for args in (["--config", str(bad)], ["--upstream", "http://127.0.0.1:1", "--router", "magic"],
                 ["--upstream", "http://127.0.0.1:1", "--controller", "nope"],
                 ["--upstream", "http://127.0.0.1:1", "--scope", "replica"]):
        proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "gateway", *args], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    out = subprocess.run([sys.executable, "-m", "loadgen.cli", "gateway", "--config", str(bad)], capture_output=True,
                         text=True, timeout=60).stderr
    assert "idle_timeout_s:" in out and "max_park_s:" in out


class OneShotUpstream:
    """Answers one request per connection and closes the connection, unanswered, when a second
    request comes on it, without having said so (no Connection: close): the race of an engine's
    idle keep-alive timeout with the gateway reusing the connection."""

    def __init__(self) -> None:
        self.num_answered = 0
        self.num_posts = 0  # POST heads read, answered or not

    async def start(self) -> "OneShotUpstream":
        async def serve(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            body = b'{"ok":true}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(body), b"" if head.startswith(b"HEAD") else body))
            self.num_answered += head.startswith((b"GET /v1", b"HEAD /v1"))
            self.num_posts += head.startswith(b"POST ")
            await reader.readexactly(int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                                     if b"content-length:" in head.lower() else 0)
            head = await reader.readuntil(b"\r\n\r\n")  # read, and left unanswered
            self.num_posts += head.startswith(b"POST ")
            writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self


def test_a_pooled_connection_the_engine_closed_is_retried_on_a_fresh_one_and_head_has_no_body():
    async def main():
        up = await OneShotUpstream().start()
        async with running_gateway([up.url]) as gw, aiohttp.ClientSession() as http:
            for _ in range(3):  # each after the first finds the connection of the one before closed on it
                async with http.get(gateway_url(gw) + "/v1/models") as resp:
                    assert resp.status == 200 and await resp.read() == b'{"ok":true}'
            async with http.head(gateway_url(gw) + "/v1/models") as resp:
                assert resp.status == 200 and resp.headers["Content-Length"] == "11"
            async with http.get(gateway_url(gw) + "/v1/models") as resp:  # the connection is still in step
                assert await resp.read() == b'{"ok":true}'
            assert up.num_answered == 5
        up.server.close()

    run(main())


def test_a_client_that_expects_100_continue_gets_it_before_sending_its_body():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url]) as gw:
            body = completion(400, 2, stream=False)
            reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
            writer.write(head(body, length=len(body))[:-len(body)].replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0) == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2.0)).startswith(b"HTTP/1.1 200 OK")
            writer.close()
        await up.stop()

    run(main())


def test_the_request_timeout_cuts_a_silent_upstream_never_one_that_streams_on():
    async def main():
        up = await Upstream().start()
        async with running_gateway([up.url], request_timeout_s=0.3) as gw, aiohttp.ClientSession() as http:
            up.chunk_delay_s = 0.1  # 8 tokens over 0.8 s: longer than the timeout, never silent that long
            status, _, body = await post(http, gateway_url(gw), completion(10, 8), "a")
            assert status == 200 and body.count(b'"token_ids"') == 8 and b"[DONE]" in body
            up.chunk_delay_s = 0.5  # silent longer than the timeout after the first token
            data = await raw_exchange(gw.port, head(completion(10, 8), session="b"))
            assert data.count(b'"token_ids"') == 1 and b"sent nothing for 0.3 s mid-response" in data
        await up.stop()

    run(main())


def test_a_post_the_engine_read_on_a_stale_connection_is_never_sent_twice():
    """The engine read the turn and closed the connection without an answer (a crash mid-prefill,
    or its keep-alive timeout racing the request): the turn fails with 502 and is counted as the
    upstream's error, never re-sent; a connection idle past max_idle_s is not reused at all."""
    async def main():
        up = await OneShotUpstream().start()
        async with running_gateway([up.url]) as gw, aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            assert (await post(http, url, completion(10, stream=False), "a"))[0] == 200
            assert (await post(http, url, completion(10, stream=False), "b"))[0] == 502
            assert up.num_posts == 2  # b was read once, and not sent again
            gw.pool.max_idle_s = 0.05
            assert (await post(http, url, completion(10, stream=False), "c"))[0] == 200
            await asyncio.sleep(0.1)  # idle past max_idle_s: d goes on a fresh connection
            assert (await post(http, url, completion(10, stream=False), "d"))[0] == 200
            async with http.get(url + "/metrics") as resp:
                assert f'loadgen_gateway_upstream_errors_total{{upstream="{up.url}"}} 1.0' in (await resp.read()).decode()
        up.server.close()

    run(main())


def test_a_drain_answers_every_request_parked_streaming_or_departing():
    """SIGTERM's drain with 50 requests waiting for admission, 10 streaming and 10 sessions between
    turns: the waiting get 503 + Retry-After at once, the streaming finish, and a departing
    session's next turn gets 503 and gives its admission back. No request is left without a status."""
    async def main():
        up = await Upstream().start()
        up.chunk_delay_s = 0.01  # a 0.6 s stream
        async with running_gateway([up.url], controller="session-cap", controller_options={"k": 20, "k_hi": 20},
                                   retry_after_s=3) as gw, aiohttp.ClientSession() as http:
            url = gateway_url(gw)
            for i in range(10):  # admitted, between turns
                assert (await post(http, url, completion(10), f"d{i}"))[0] == 200
            departing = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(10)]
            streaming = [asyncio.ensure_future(raw_exchange(gw.port, head(completion(10, 60), f"s{i}")))
                         for i in range(10)]
            await wait_until(lambda: gw.gate.num_admitted == 20 and len(up.requests) == 20)
            waiting = [asyncio.ensure_future(post(http, url, completion(10), f"w{i}")) for i in range(50)]
            await wait_until(lambda: len(gw.gate.waiting_new) == 50)
            drained = asyncio.ensure_future(gw.drain(10.0))
            answers = await asyncio.wait_for(asyncio.gather(*waiting), 1.0)  # at once, not at the deadline
            assert all(status == 503 and headers["Retry-After"] == "3" for status, headers, _ in answers)
            for i, (reader, writer) in enumerate(departing):  # the departing sessions' next turns
                writer.write(head(completion(12), f"d{i}"))
                data = await asyncio.wait_for(reader.read(), 2.0)
                assert data.startswith(b"HTTP/1.1 503") and b"Retry-After: 3" in data
                writer.close()
            assert gw.gate.num_admitted == 10  # only the streaming sessions hold admissions now
            assert await drained is True
            for done in streaming:
                data = await done
                assert b"[DONE]" in data and data.endswith(b"0\r\n\r\n")
            assert gw.drain_counts == {"refused_held": 50, "refused_unanswered": 0, "cut_streaming": 0}
            assert len(up.requests) == 20  # nothing of the refused went upstream
        await up.stop()

    run(main())


def test_at_the_drain_deadline_an_unanswered_request_gets_503_and_only_a_stream_is_cut():
    async def main():
        up = await Upstream().start()
        up.chunk_delay_s = 0.1  # a 6 s stream
        async with running_gateway([up.url], retry_after_s=3) as gw:
            streaming = [asyncio.ensure_future(raw_exchange(gw.port, head(completion(10, 60), f"s{i}")))
                         for i in range(3)]
            await wait_until(lambda: len(up.requests) == 3)
            up.hold = True  # these the engine never answers
            unanswered = [asyncio.ensure_future(raw_exchange(gw.port, head(completion(10, 4), f"h{i}")))
                          for i in range(4)]
            await wait_until(lambda: len(up.held) == 4)
            assert await gw.drain(0.3) is False
            for done in streaming:
                data = await done
                assert data.startswith(b"HTTP/1.1 200") and b"[DONE]" not in data  # a status, then cut
            for done in unanswered:
                data = await done
                assert data.startswith(b"HTTP/1.1 503") and b"Retry-After: 3" in data
            assert gw.drain_counts == {"refused_held": 0, "refused_unanswered": 4, "cut_streaming": 3}
            await wait_until(lambda: client_request_counts(gw) == {("cut", "200"): 3, ("refused", "503"): 4})
            up.release()
        await up.stop()

    run(main())
