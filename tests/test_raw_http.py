"""The driver's fast paths: the raw HTTP/1.1 transport against a scripted socket server, the
batched SSE parse and the incrementally encoded token-id prompts, each against what it replaces."""

import asyncio

import numpy as np
import orjson
import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.core.session import TokenIds
from loadgen.live.http_client import (AiohttpTransport, EndpointOptions, HttpStatusError, OpenAIEngineClient,
                                      TransportError)
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
                pos = 0
                for size in writes + [len(reply)]:
                    writer.write(reply[pos:pos + size])
                    await writer.drain()
                    await asyncio.sleep(0)
                    pos += size
                if then == "close":
                    break
                if then == "hang":
                    await asyncio.sleep(3600)
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


def test_token_ids_json_is_the_whole_lists_encoding_as_it_grows():
    rng = np.random.default_rng(3)
    ids = TokenIds(rng.integers(1, 30000, size=50).tolist())
    for step in range(30):
        assert ids.json() == orjson.dumps(list(ids))
        ids.extend(rng.integers(1, 30000, size=int(rng.integers(0, 40))).tolist())
    del ids[10:]  # shrunk (sessions never do): encoded afresh
    assert ids.json() == orjson.dumps(list(ids))
    assert TokenIds().json() == b"[]"
