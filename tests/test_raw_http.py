"""The driver's fast paths: the raw HTTP/1.1 transport against a scripted socket server, the
batched SSE parse and the incrementally encoded token-id prompts, each against what it replaces."""

import asyncio
import socket
import struct

import numpy as np
import orjson
import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.core.session import TokenIds
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient
from loadgen.live.transport import AiohttpTransport, HttpStatusError, TransportError
from loadgen.live.raw_http import RawHttpTransport

SSE_BODY = (b'data: {"choices":[{"index":0,"text":"a","token_ids":[11]}]}\n\n'
            b'data: {"choices":[{"index":0,"text":"[DONE]","token_ids":[12]}]}\n\n'
            b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,'
            b'"prompt_tokens_details":{"cached_tokens":2}}}\n\n'
            b"data: [DONE]\n\n")


def chunked(body: bytes, sizes) -> bytes:
    """``body`` in HTTP/1.1 chunks of the given sizes (the rest in one last chunk)."""
    out, pos = [], 0
    for size in list(sizes) + [len(body)]:
        piece = body[pos:pos + size]
        if piece:
            out.append(b"%x\r\n" % len(piece) + piece + b"\r\n")
        pos += len(piece)
    return b"".join(out) + b"0\r\n\r\n"


class ScriptedServer:
    """A socket server answering each request with the next scripted reply, written in pieces
    (``writes``: how many bytes per write, so a response reaches the client split anywhere)."""

    def __init__(self, replies) -> None:
        self.replies = list(replies)
        self.connections = 0
        self.requests: list[bytes] = []

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader, writer) -> None:
        self.connections += 1
        try:
            while self.replies:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int([line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")][0])
                self.requests.append(head + await reader.readexactly(length))
                reply, writes, then = self.replies.pop(0)
                if reply is None:  # the request read, nothing answered: the server closed the connection
                    break
                pos = 0
                for size in writes + [len(reply)]:
                    writer.write(reply[pos:pos + size])
                    await writer.drain()
                    await asyncio.sleep(0)
                    pos += size
                if then == "close":
                    break
                if then == "reset":  # an RST, not a FIN: the connection was cut, not ended
                    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                               struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    break
                if then == "hang":
                    await asyncio.sleep(3600)
                if isinstance(then, float):  # a keep-alive timeout: idle this long, then closed
                    await asyncio.sleep(then)
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        self.server.close()


def response(status: str, body: bytes, headers: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\n{headers}".encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def chunked_response(body: bytes, sizes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + \
        chunked(body, sizes)


async def lines_of(transport, url) -> list[bytes]:
    out = []
    async for batch in transport.stream_lines(url + "/v1/completions", b'{"x":1}', {"A": "b"}, 5.0):
        out.extend(batch)
    return out


EXPECTED_LINES = SSE_BODY.split(b"\n")[:-1]


@pytest.mark.parametrize("framing", ["length", "chunked", "chunked-split", "close"])
def test_a_stream_arrives_as_the_same_lines_however_it_is_framed_and_split(framing):
    """The raw transport hands over the same lines as the body holds, whether it comes with a
    Content-Length, in chunks cut mid-line and mid-size-line, or until the server closes."""
    if framing == "length":
        reply = (response("200 OK", SSE_BODY), [7, 30, 1], "keep")
    elif framing == "chunked":
        reply = (chunked_response(SSE_BODY, [40, 40]), [], "keep")
    elif framing == "chunked-split":
        data = chunked_response(SSE_BODY, [1, 13, 60, 2])
        reply = (data, [data.index(b"\r\n\r\n") + 5, 1, 1, 9, 3, 17, 2, 1], "keep")
    else:
        reply = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + SSE_BODY, [50], "close")

    async def main():
        server = ScriptedServer([reply])
        url = await server.start()
        transport = RawHttpTransport()
        try:
            lines = await lines_of(transport, url)
        finally:
            await transport.close()
            await server.close()
        assert lines == EXPECTED_LINES
        assert server.requests[0].startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"\r\nA: b\r\n" in server.requests[0] and server.requests[0].endswith(b'{"x":1}')

    asyncio.run(main())


def test_keep_alive_connections_are_reused_and_a_closed_one_is_replaced():
    async def main():
        server = ScriptedServer([(response("200 OK", SSE_BODY), [], "keep"),
                                 (chunked_response(SSE_BODY, [9]), [], "keep"),
                                 (response("200 OK", b"pong", "Connection: close\r\n"), [], "close"),
                                 (response("200 OK", b"again"), [], "keep")])
        url = await server.start()
        transport = RawHttpTransport()
        try:
            assert await lines_of(transport, url) == EXPECTED_LINES
            assert await lines_of(transport, url) == EXPECTED_LINES
            assert await transport.request("GET", url + "/metrics", None, {}, 5.0) == (200, b"pong")
            assert server.connections == 1  # three requests, one connection
            assert await transport.request("GET", url + "/metrics", None, {}, 5.0) == (200, b"again")
            assert server.connections == 2  # the server said close: a new one
        finally:
            await transport.close()
            await server.close()

    asyncio.run(main())


def test_errors_are_the_seams_errors():
    """HTTP >= 400 with its body, a connection cut mid-body, a refused port, a server that never
    finishes: HttpStatusError or TransportError, as the aiohttp transport raises them."""
    async def main():
        server = ScriptedServer([(response("500 Internal Server Error", b"engine exploded"), [], "keep"),
                                 (response("200 OK", SSE_BODY)[:-40], [], "close"),
                                 (response("200 OK", SSE_BODY)[:60], [], "hang")])
        url = await server.start()
        transport = RawHttpTransport()
        try:
            with pytest.raises(HttpStatusError) as status:
                await lines_of(transport, url)
            assert status.value.status == 500 and status.value.body == "engine exploded"
            with pytest.raises(TransportError, match="ServerDisconnectedError"):
                await lines_of(transport, url)
            batches = []
            with pytest.raises(TransportError, match=r"timeout after 0.3 s"):
                async for batch in transport.stream_lines(url + "/v1/completions", b"{}", {}, 0.3):
                    batches.append(batch)
            with pytest.raises(TransportError, match="ClientConnectorError"):
                port = int(url.rsplit(":", 1)[1])
                await server.close()
                await server.server.wait_closed()
                await transport.request("GET", f"http://127.0.0.1:{port}/health", None, {}, 5.0)
        finally:
            await transport.close()

    asyncio.run(main())


def test_https_goes_through_the_fallback_transport():
    class Recording:
        def __init__(self):
            self.urls = []

        async def request(self, method, url, body, headers, timeout_s):
            self.urls.append(url)
            return 200, b"{}"

        async def close(self):
            pass

    fallback = Recording()
    transport = RawHttpTransport(fallback=fallback)
    assert asyncio.run(transport.request("GET", "https://example.invalid/v1/models", None, {}, 1.0)) == (200, b"{}")
    assert fallback.urls == ["https://example.invalid/v1/models"]


@pytest.mark.parametrize("transport_kind", ["raw", "aiohttp"])
def test_a_turn_records_the_same_result_through_either_transport(transport_kind):
    """The same stream (one batch holding a text token "[DONE]" and the final [DONE]) gives the
    same TurnResult through the raw transport as through aiohttp."""
    async def main():
        server = ScriptedServer([(chunked_response(SSE_BODY, [5, 70]), [], "keep")])
        url = await server.start()
        transport = RawHttpTransport() if transport_kind == "raw" else AiohttpTransport()
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=url, model="m"), transport)
        try:
            result = await client.generate(TurnRequest(1, 0, 3, 2, token_ids=TokenIds([5, 6, 7])))
        finally:
            await client.close()
            await server.close()
        body = orjson.loads(server.requests[0].split(b"\r\n\r\n", 1)[1])
        assert body["prompt"] == [5, 6, 7] and body["model"] == "m" and body["max_tokens"] == 2
        assert result.error is None
        assert (result.prompt_tokens, result.cached_tokens, result.output_tokens) == (3, 2, 2)
        assert result.output_token_ids == [11, 12] and result.output_text == "a[DONE]"

    asyncio.run(main())


@pytest.mark.parametrize("transport_kind", ["raw", "aiohttp"])
def test_a_gateways_wait_and_the_replica_are_read_from_the_response_head(transport_kind):
    """loadgen gateway's wait header becomes the turn's gateway_wait_s and the spec's replica
    header its replica, together, through either transport; a malformed wait reads as none."""
    async def main():
        head = ("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                "x-loadgen-gateway-wait-seconds: 2.500000\r\nX-Pod: pod-b\r\n")
        replies = [((head + f"Content-Length: {len(SSE_BODY)}\r\n\r\n").encode() + SSE_BODY, [], "keep"),
                   ((head.replace("2.500000", "soon") + f"Content-Length: {len(SSE_BODY)}\r\n\r\n").encode()
                    + SSE_BODY, [], "keep")]
        server = ScriptedServer(replies)
        url = await server.start()
        transport = RawHttpTransport() if transport_kind == "raw" else AiohttpTransport()
        client = OpenAIEngineClient(WallClock(), EndpointOptions(url=url, model="m", replica_header="X-Pod"),
                                    transport)
        try:
            first = await client.generate(TurnRequest(1, 0, 3, 2, token_ids=TokenIds([5, 6, 7])))
            second = await client.generate(TurnRequest(1, 1, 3, 2, token_ids=TokenIds([5, 6, 7])))
        finally:
            await client.close()
            await server.close()
        assert (first.gateway_wait_s, first.replica) == (2.5, 0)
        assert (second.gateway_wait_s, second.replica) == (0.0, 0)

    asyncio.run(main())


def test_token_ids_json_is_the_whole_lists_encoding_as_it_grows():
    rng = np.random.default_rng(3)
    ids = TokenIds(rng.integers(1, 30000, size=50).tolist())
    for step in range(30):
        assert ids.json() == orjson.dumps(list(ids))
        ids.extend(rng.integers(1, 30000, size=int(rng.integers(0, 40))).tolist())
    del ids[10:]  # shrunk (sessions never do): encoded afresh
    assert ids.json() == orjson.dumps(list(ids))
    assert TokenIds().json() == b"[]"


def run_against(replies, requests):
    """``requests(transport, url)`` against a ScriptedServer of ``replies``; returns the server."""
    async def main():
        server = ScriptedServer(replies)
        url = await server.start()
        transport = RawHttpTransport()
        try:
            await requests(transport, url)
        finally:
            await transport.close()
            await server.close()
        return server

    return asyncio.run(main())


def test_interim_1xx_responses_are_skipped_and_the_next_request_gets_its_own_response():
    """RFC 9110 15.2: a client must accept any 1xx before the final response. Taking a 100 or 103
    as the answer would hand the next request on the connection the previous response's body."""
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"

    async def requests(transport, url):
        assert await transport.request("GET", url + "/v1/models", None, {}, 5.0) == (200, b"first")
        assert await lines_of(transport, url) == EXPECTED_LINES
        assert await transport.request("GET", url + "/v1/models", None, {}, 5.0) == (200, b"third")

    server = run_against([(interim + response("200 OK", b"first"), [30, 5], "keep"),
                          (b"HTTP/1.1 100 Continue\r\n\r\n" + chunked_response(SSE_BODY, [20]), [10], "keep"),
                          (response("200 OK", b"third"), [], "keep")], requests)
    assert server.connections == 1  # the interim responses did not cost the connection


def test_a_reset_mid_body_of_a_read_until_close_response_is_an_error_not_a_short_body():
    """Without Content-Length or chunking the body ends when the server closes; a reset (RST)
    is not that end, it is a cut: the truncated body must not pass for the whole one."""
    cut = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"data":[{"id":"m"'

    async def requests(transport, url):
        with pytest.raises(TransportError, match="ServerDisconnectedError"):
            await transport.request("GET", url + "/v1/models", None, {}, 5.0)

    run_against([(cut, [], "reset")], requests)


def test_a_clean_close_ends_a_read_until_close_body():
    whole = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{"data":[]}'

    async def requests(transport, url):
        assert await transport.request("GET", url + "/v1/models", None, {}, 5.0) == (200, b'{"data":[]}')

    run_against([(whole, [8], "close")], requests)


def test_connections_the_server_closed_while_idle_leave_the_pool():
    """A server with a short keep-alive timeout (uvicorn's is 5 s) closes every idle connection:
    after many requests with think times between them, the pool holds none of those."""
    async def requests(transport, url):
        for i in range(12):
            assert await transport.request("GET", url + "/health", None, {}, 5.0) == (200, b"ok")
            await asyncio.sleep(0.06)  # past the server's 0.02 s keep-alive
        assert transport.num_open_connections == 0

    server = run_against([(response("200 OK", b"ok"), [], 0.02) for _ in range(12)], requests)
    assert server.connections == 12


@pytest.mark.parametrize("kind", ["request", "stream"])
def test_a_reused_connection_closed_before_any_answer_is_retried_once_on_a_fresh_one(kind):
    """The server closed the idle connection just as the request went out (nothing came back):
    the request goes once more on a new connection, as HTTP clients do. A fresh connection that
    closes unanswered is an error (no retry: the server really failed)."""
    async def requests(transport, url):
        assert await transport.request("GET", url + "/health", None, {}, 5.0) == (200, b"ok")
        if kind == "request":
            assert await transport.request("GET", url + "/health", None, {}, 5.0) == (200, b"again")
        else:
            assert await lines_of(transport, url) == EXPECTED_LINES
        with pytest.raises(TransportError, match="ServerDisconnectedError"):
            await transport.request("GET", url + "/health", None, {}, 5.0)

    again = response("200 OK", b"again") if kind == "request" else chunked_response(SSE_BODY, [7])
    server = run_against([(response("200 OK", b"ok"), [], "keep"), (None, [], "close"),
                          (again, [], "close"), (None, [], "close")], requests)
    assert server.connections == 3 and len(server.requests) == 4


def test_a_request_that_got_part_of_an_answer_is_not_retried():
    """Bytes came back, then the cut: the server acted on the request, so it is an error, not a retry."""
    async def requests(transport, url):
        assert await transport.request("GET", url + "/health", None, {}, 5.0) == (200, b"ok")
        with pytest.raises(TransportError, match="ServerDisconnectedError"):
            await transport.request("GET", url + "/health", None, {}, 5.0)

    server = run_against([(response("200 OK", b"ok"), [], "keep"),
                          (response("200 OK", b"partial")[:-3], [], "close"),
                          (response("200 OK", b"never"), [], "keep")], requests)
    assert len(server.requests) == 2


def test_chunk_extensions_and_trailers_are_not_part_of_the_body():
    """RFC 9112 7.1: a chunk size may carry ``;name=value`` extensions and the last chunk
    trailer fields; neither is body."""
    pieces = [SSE_BODY[:50], SSE_BODY[50:51], SSE_BODY[51:]]
    body = b"".join(b"%x;ext=%d;q=\"a;b\"\r\n" % (len(p), i) + p + b"\r\n" for i, p in enumerate(pieces))
    reply = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n" + body
             + b"0;last\r\nX-Checksum: abc\r\nX-More: 1\r\n\r\n")

    async def requests(transport, url):
        assert await lines_of(transport, url) == EXPECTED_LINES
        assert await transport.request("GET", url + "/health", None, {}, 5.0) == (200, b"next")

    server = run_against([(reply, [3, 60, 1, 1, 20], "keep"), (response("200 OK", b"next"), [], "keep")], requests)
    assert server.connections == 1
