"""A small HTTP/1.1 client on asyncio's protocol layer: the driver's transport for ``http://`` endpoints.

Why not aiohttp for every turn: profiled in benchmarks/bench_driver.py (py-spy, driver pinned to
one core against a zero-time server), aiohttp's per-request machinery (request and response
objects, timers, tracing hooks, the stream reader) took ~45% of the driver's CPU per streamed
turn, more than the turn's own work. A streamed completion needs little of it: one keep-alive
connection per in-flight request, a request written in one ``write``, and the response body
(``Content-Length``, chunked, or until close) handed over as it arrives, a batch of complete
lines per network read. ``https://`` URLs go through aiohttp (``loadgen.live.http_client``).

What real servers send and this client must take: interim 1xx responses before the final one
(skipped, RFC 9110 15.2), chunk extensions and trailers (not body, RFC 9112 7.1), a body that
ends with the connection (a clean close ends it; a reset is a cut, an error), and idle
keep-alive connections the server closes (uvicorn after 5 s): they leave the pool when their
close arrives, and a request on a reused connection that the server closed before answering a
byte is sent once more on a fresh connection.

The error surface is the ``Transport`` seam's: a refused or reset connection, a response cut
short or a malformed one is a ``TransportError``; a request not done within ``timeout_s`` (the
whole request, as aiohttp's total timeout) is ``TransportError("timeout after X s")``; a stream
answered with status >= 400 raises ``HttpStatusError`` with the body.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional
from urllib.parse import urlsplit


class TransportError(Exception):
    """The request did not complete: connection refused/reset, timeout, bad stream (also raised
    by http_client's transports, which import it from here)."""


class HttpStatusError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


_HEAD_END = b"\r\n\r\n"
MAX_HEAD_BYTES = 64 * 1024


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one request at a time; parses the response as bytes arrive.
    ``on_idle_lost`` is called when the server closes it while it waits in the pool."""

    def __init__(self, on_idle_lost=None) -> None:
        self.transport: Optional[asyncio.Transport] = None
        self.closed = False
        self.busy = False
        self.reused = False  # it served an earlier request: the server may have closed it meanwhile
        self.on_idle_lost = on_idle_lost
        self._reset()

    def _reset(self) -> None:
        self.buf = b""
        self.num_received_bytes = 0  # of this request's response, interim responses included
        self.status = 0
        self.head_done = False
        self.done = False
        self.keep_alive = True
        self.mode = ""  # "length" | "chunked" | "close"
        self.remaining = 0  # bytes left of the body ("length") or of the current chunk ("chunked")
        self.chunk_trailer = False  # after the last chunk: skipping trailers up to the empty line
        self.pieces: list[bytes] = []  # body bytes not yet taken by the reader
        self.error: Optional[Exception] = None
        self.timed_out = False
        self.waiter: Optional[asyncio.Future] = None
        self.keep_headers: frozenset = frozenset()  # response headers the reader asked for (lower case)
        self.kept_headers: dict = {}

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.busy:  # bytes nobody asked for: the connection cannot be trusted any more
            self.closed = True
            self.transport.close()
            return
        self.num_received_bytes += len(data)
        self.buf = self.buf + data if self.buf else data
        try:
            self._parse()
        except ValueError as exc:
            self.error = TransportError(f"ClientResponseError: malformed response ({exc})")
            self.closed = True
            self.transport.close()
        self._wake()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.closed = True
        if not self.busy and self.on_idle_lost is not None:
            self.on_idle_lost(self)
        if self.busy and not self.done and self.error is None:
            if self.head_done and self.mode == "close" and exc is None:
                self.done = True  # a body that ends with the connection (a reset is a cut, not an end)
            else:
                self.error = TransportError("ServerDisconnectedError: Server disconnected"
                                            + (f" ({exc})" if exc else ""))
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------ the response
    def _parse(self) -> None:
        while not self.head_done:
            end = self.buf.find(_HEAD_END)
            if end < 0:
                if len(self.buf) > MAX_HEAD_BYTES:
                    raise ValueError("response head over 64 KiB")
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            self.buf = self.buf[end + 4:]
            parts = head[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
                raise ValueError(f"status line {head[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                continue  # an interim response (100 Continue, 103 Early Hints): the final one follows
            self.status = status
            length = None
            chunked = False
            connection = ""
            for line in head[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "transfer-encoding":
                    chunked = "chunked" in value.lower()
                elif name == "connection":
                    connection = value.strip().lower()
                elif name in self.keep_headers:
                    self.kept_headers[name] = value.strip()
            self.keep_alive = connection != "close" and parts[0] != "HTTP/1.0" or connection == "keep-alive"
            self.head_done = True
            if chunked:
                self.mode = "chunked"
            elif length is not None:
                self.mode, self.remaining = "length", length
            elif self.status in (101, 204, 304):
                self.mode, self.remaining = "length", 0
            else:
                self.mode, self.keep_alive = "close", False
        if self.mode == "length":
            if self.buf:
                take = self.buf[:self.remaining]
                self.buf = self.buf[len(take):]
                self.remaining -= len(take)
                if take:
                    self.pieces.append(take)
            if self.remaining == 0:
                self._finish()
        elif self.mode == "chunked":
            self._parse_chunks()
        elif self.buf:  # "close": everything until the server closes
            self.pieces.append(self.buf)
            self.buf = b""

    def _parse_chunks(self) -> None:
        buf = self.buf
        pos = 0
        while True:
            if self.chunk_trailer:  # trailers (usually none), then the empty line
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                line_empty = end == pos
                pos = end + 2
                if line_empty:
                    self.buf = buf[pos:]
                    self._finish()
                    return
                continue
            if self.remaining > 0:
                take = buf[pos:pos + self.remaining]
                if not take:
                    break
                self.pieces.append(take)
                pos += len(take)
                self.remaining -= len(take)
                if self.remaining:
                    break
                self.remaining = -2  # the CRLF after the chunk's data
            if self.remaining == -2:
                if len(buf) - pos < 2:
                    break
                if buf[pos:pos + 2] != b"\r\n":
                    raise ValueError("chunk not followed by CRLF")
                pos += 2
                self.remaining = 0
            end = buf.find(b"\r\n", pos)
            if end < 0:
                if len(buf) - pos > 1024:
                    raise ValueError("chunk size line over 1 KiB")
                break
            size = int(buf[pos:end].split(b";", 1)[0].strip() or b"x", 16)
            pos = end + 2
            if size == 0:
                self.chunk_trailer = True
            else:
                self.remaining = size
        self.buf = buf[pos:]

    def _finish(self) -> None:
        self.done = True
        if self.buf:  # bytes past the response: not a connection to reuse
            self.keep_alive = False

    # ------------------------------------------------------------ the reader's side
    async def wait(self) -> None:
        """Until something new arrived (head, body bytes, the end, an error)."""
        if self.error is not None:
            raise self.error
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None
        if self.error is not None:
            raise self.error

    def take(self) -> bytes:
        pieces, self.pieces = self.pieces, []
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class RawHttpTransport:
    """``Transport`` over plain HTTP/1.1 with a pool of keep-alive connections per host;
    ``https://`` URLs are passed to ``fallback`` (an ``AiohttpTransport``)."""

    def __init__(self, max_connections: int = 4096, fallback=None) -> None:
        self.max_connections = max_connections
        self.fallback = fallback
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._slots: Optional[asyncio.Semaphore] = None
        self._open: set[_Connection] = set()
        self._targets: dict[str, tuple[str, int, str, str]] = {}
        self.num_closed_while_idle = 0  # connections the server closed in the pool (keep-alive timeouts)
        self.num_resent = 0  # requests sent again on a fresh connection after a reused one closed unanswered

    def _target(self, url: str) -> tuple[str, int, str, str]:
        """(host, port, path, Host header) of an http:// URL, cached: sessions ask the same few."""
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            host = parts.hostname or "localhost"
            port = parts.port or 80
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            target = (host, port, path, parts.netloc)
            if len(self._targets) < 1024:
                self._targets[url] = target
        return target

    @property
    def num_open_connections(self) -> int:
        """Connections held, busy or idle in the pool (closed ones leave it at once)."""
        return len(self._open)

    def _idle_connection(self, host: str, port: int) -> Optional[_Connection]:
        idle = self._idle.get((host, port))
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been closed by the server
            if not conn.closed and not conn.transport.is_closing():
                return conn
            self._forget(conn)
        return None

    def _forget(self, conn: _Connection) -> None:
        """Drop a connection the server closed while it was idle (a keep-alive timeout)."""
        if conn not in self._open:  # released and closed already (not pooled)
            return
        self.num_closed_while_idle += 1
        self._open.discard(conn)
        for idle in self._idle.values():
            if conn in idle:
                idle.remove(conn)

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: _Connection(self._forget), host, port)
        except OSError as exc:
            raise TransportError(f"ClientConnectorError: Cannot connect to host {host}:{port} ({exc})") from None
        self._open.add(conn)
        return conn

    def _release(self, host: str, port: int, conn: _Connection) -> None:
        conn.busy = False
        if conn.done and conn.keep_alive and not conn.closed and conn.error is None:
            conn._reset()
            conn.reused = True
            self._idle.setdefault((host, port), []).append(conn)
        else:
            conn.closed = True
            if conn.transport is not None:
                conn.transport.close()
            self._open.discard(conn)

    async def _send(self, method: str, url: str, body: Optional[bytes], headers: dict, timeout_s: float,
                    fresh: bool = False, keep_headers: frozenset = frozenset(),
                    ) -> tuple[_Connection, tuple[str, int], asyncio.TimerHandle]:
        host, port, path, netloc = self._target(url)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        await self._slots.acquire()
        try:
            conn = ((None if fresh else self._idle_connection(host, port))
                    or await asyncio.wait_for(self._connect(host, port), timeout_s))
        except asyncio.TimeoutError:
            self._slots.release()
            raise TransportError(f"timeout after {timeout_s:g} s") from None
        except BaseException:
            self._slots.release()
            raise
        conn.busy = True
        # set before the loop runs again: no byte of this answer is parsed yet
        conn.keep_headers, conn.kept_headers = keep_headers, {}
        head = [f"{method} {path} HTTP/1.1\r\nHost: {netloc}\r\n"]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n")
        head.append(f"Content-Length: {len(body) if body else 0}\r\n\r\n")
        data = "".join(head).encode("latin-1")
        conn.transport.write(data + body if body else data)

        def timed_out() -> None:
            if not conn.done and conn.error is None:
                conn.timed_out = True
                conn.error = TransportError(f"timeout after {timeout_s:g} s")
                conn.closed = True
                conn.transport.abort()
                conn._wake()

        timer = asyncio.get_running_loop().call_later(timeout_s, timed_out)
        return conn, (host, port), timer

    def _done_with(self, conn: _Connection, key: tuple[str, int], timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self._release(key[0], key[1], conn)
        self._slots.release()

    async def _answered(self, method: str, url: str, body: Optional[bytes], headers: dict, timeout_s: float,
                        keep_headers: frozenset = frozenset(),
                        ) -> tuple[_Connection, tuple[str, int], asyncio.TimerHandle]:
        """A request sent and its response head read. On a reused connection that the server
        closed before a byte came back (its keep-alive timeout raced the request), sent once
        more on a fresh connection, as HTTP clients do; the timeout covers both tries."""
        started = asyncio.get_running_loop().time()
        conn, key, timer = await self._send(method, url, body, headers, timeout_s, keep_headers=keep_headers)
        try:
            while not conn.head_done:
                await conn.wait()
            return conn, key, timer
        except BaseException as exc:  # cancelled too: the connection and its slot are given back
            unanswered = (isinstance(exc, TransportError) and conn.reused and conn.num_received_bytes == 0
                          and conn.closed and not conn.timed_out)
            self._done_with(conn, key, timer)
            if not unanswered:
                raise
        self.num_resent += 1
        left_s = timeout_s - (asyncio.get_running_loop().time() - started)
        if left_s <= 0:
            raise TransportError(f"timeout after {timeout_s:g} s")
        conn, key, timer = await self._send(method, url, body, headers, left_s, fresh=True, keep_headers=keep_headers)
        try:
            while not conn.head_done:
                await conn.wait()
        except BaseException:
            self._done_with(conn, key, timer)
            raise
        return conn, key, timer

    async def request(self, method: str, url: str, body: Optional[bytes], headers: dict,
                      timeout_s: float) -> tuple[int, bytes]:
        if not url.startswith("http://"):
            return await self.fallback.request(method, url, body, headers, timeout_s)
        conn, key, timer = await self._answered(method, url, body, headers, timeout_s)
        try:
            while not conn.done:
                await conn.wait()
            return conn.status, conn.take()
        finally:
            self._done_with(conn, key, timer)

    async def stream_lines(self, url: str, body: bytes, headers: dict, timeout_s: float,
                           response_headers: Optional[dict] = None) -> AsyncIterator[list[bytes]]:
        """``response_headers``: {name: None, ...} gets those response headers' values (a router's
        replica, a gateway's wait)."""
        if not url.startswith("http://"):
            async for batch in self.fallback.stream_lines(url, body, headers, timeout_s, response_headers):
                yield batch
            return
        keep = frozenset(name.lower() for name in response_headers) if response_headers else frozenset()
        conn, key, timer = await self._answered("POST", url, body, headers, timeout_s, keep)
        try:
            if response_headers:
                for name in response_headers:
                    response_headers[name] = conn.kept_headers.get(name.lower())
            if conn.status >= 400:
                while not conn.done:
                    await conn.wait()
                raise HttpStatusError(conn.status, conn.take().decode(errors="replace"))
            # one batch per network read, as AiohttpTransport.stream_lines
            pending = b""
            while True:
                if conn.pieces:
                    data = conn.take()
                    pending = pending + data if pending else data
                    if b"\n" in data:
                        *lines, pending = pending.split(b"\n")
                        yield lines
                if conn.done:
                    break
                await conn.wait()
            if pending:
                yield [pending]
        finally:
            self._done_with(conn, key, timer)

    async def close(self) -> None:
        for conn in list(self._open):
            if conn.transport is not None:
                conn.transport.close()
        self._open.clear()
        self._idle.clear()
        if self.fallback is not None:
            await self.fallback.close()
