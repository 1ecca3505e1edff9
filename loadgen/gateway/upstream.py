"""The gateway's upstream side: keep-alive HTTP/1.1 connections to each engine, responses relayed as they arrive.

A response's head and body bytes go to a ``Sink`` (the proxy's relay to its client) straight
from ``data_received``: no task or queue per chunk, nothing buffered beyond one network read.
The sink can pause the connection's reads while its client is slow (``pause``/``resume``).
Failures reach the sink as ``error(message)``: a refused connection, a reset, a response cut
short, a malformed head, a timeout. A connection reused from the pool that the engine had
closed in the meantime (nothing received yet) is retried once on a fresh one for an idempotent
method only: a POST the engine may have read before it closed (a crash mid-prefill) is never sent
twice. A connection idle for longer than ``MAX_IDLE_S`` is not reused at all, so that the race
with an engine's keep-alive timeout (5 s in vLLM's and SGLang's uvicorn) is rare.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Protocol
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_IDLE_S = 4.0  # below the engines' 5 s keep-alive timeout
# methods that may be sent twice (RFC 9110 9.2.2): the only ones re-sent on a stale connection
IDEMPOTENT_PREFIXES = (b"GET ", b"HEAD ", b"OPTIONS ", b"PUT ", b"DELETE ")


class Sink(Protocol):
    conn: Optional["UpstreamConnection"]

    def head(self, status: int, headers: list[tuple[str, str]], length: Optional[int]) -> None: ...

    def body(self, data: bytes) -> None: ...

    def end(self) -> None: ...

    def error(self, message: str) -> None: ...


class UpstreamConnection(asyncio.Protocol):
    def __init__(self, pool: "UpstreamPool", key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: Optional[asyncio.Transport] = None
        self.sink: Optional[Sink] = None
        self.closed = False
        self.received = False
        self._buf = b""
        self._mode = ""  # "", "length", "chunked", "close"
        self._remaining = 0
        self._keep_alive = True
        self._timer: Optional[asyncio.TimerHandle] = None
        self._last_data_s = 0.0  # when the last bytes of the response came (the timeout is per silence)
        self.idle_since_s = 0.0  # when it went back to the pool
        self._retry: Optional[tuple] = None
        self._head_only = False

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.sink is None:
            return
        if self._mode == "close":
            self._end()
        elif not self.received and self._retry is not None:  # a stale pooled connection
            args, self._retry = self._retry, None
            sink, self.sink = self.sink, None
            self._cancel_timer()
            self.pool.loop.create_task(self.pool.send(*args, sink=sink, retried=True))
        else:
            self._fail("the upstream closed the connection mid-response" if self.received
                       else "the upstream closed the connection before answering")

    def data_received(self, data: bytes) -> None:
        if self.sink is None:  # nothing asked: a connection not to trust
            self.transport.close()
            return
        self.received = True
        self._last_data_s = self.pool.loop.time()
        self._buf = self._buf + data if self._buf else data
        try:
            self._parse()
        except ValueError as exc:
            self._fail(f"malformed response from the upstream ({exc})")
            self.transport.abort()

    # ------------------------------------------------------------ the response
    def _parse(self) -> None:
        if not self._mode:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise ValueError("response head over 64 KiB")
                return
            lines = self._buf[:end].decode("latin-1").split("\r\n")
            self._buf = self._buf[end + 4:]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ValueError(f"status line {lines[0][:80]!r}")
            status = int(parts[1])
            headers = []
            length: Optional[int] = None
            chunked = False
            connection = ""
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip(), value.strip()
                lower = name.lower()
                if lower == "content-length":
                    length = int(value)
                elif lower == "transfer-encoding":
                    chunked = "chunked" in value.lower()
                elif lower == "connection":
                    connection = value.lower()
                elif lower != "keep-alive":
                    headers.append((name, value))
            self._keep_alive = connection != "close" and parts[0] != "HTTP/1.0"
            if self._head_only:  # a HEAD's answer states the length of a body it does not send
                self._mode, self._remaining, length = "length", 0, length or 0
            elif chunked:
                self._mode, self._remaining, length = "chunked", 0, None
            elif length is not None:
                self._mode, self._remaining = "length", length
            elif 100 <= status < 200 or status in (204, 304):
                self._mode, self._remaining, length = "length", 0, 0
            else:
                self._mode, self._keep_alive = "close", False
            self.sink.head(status, headers, length)
            if self.sink is None:  # the sink gave up at the head
                return
        if self._mode == "length":
            if self._buf:
                data, self._buf = self._buf[:self._remaining], self._buf[self._remaining:]
                self._remaining -= len(data)
                self.sink.body(data)
            if self._remaining == 0 and self.sink is not None:
                self._end()
        elif self._mode == "chunked":
            self._parse_chunked()
        elif self._buf:
            data, self._buf = self._buf, b""
            self.sink.body(data)

    def _parse_chunked(self) -> None:
        # _remaining: bytes of the current chunk still to come; -1: its CRLF; -2: the trailers
        buf, pos, n = self._buf, 0, len(self._buf)
        out = []
        while pos < n:
            if self._remaining > 0:
                take = buf[pos:pos + self._remaining]
                out.append(take)
                pos += len(take)
                self._remaining -= len(take)
                if self._remaining == 0:
                    self._remaining = -1
                continue
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                if n - pos > 4096:
                    raise ValueError("chunk framing line over 4 KiB")
                break
            line = buf[pos:nl]
            pos = nl + 2
            if self._remaining == -1:
                if line:
                    raise ValueError("chunk data not followed by CRLF")
                self._remaining = 0
            elif self._remaining == -2:
                if not line:  # the end of the trailers: the response is complete
                    self._buf = buf[pos:]
                    if out:
                        self.sink.body(b"".join(out))
                    self._end()
                    return
            else:
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                self._remaining = size if size else -2
        self._buf = buf[pos:]
        if out:
            self.sink.body(out[0] if len(out) == 1 else b"".join(out))

    def _end(self) -> None:
        sink, self.sink = self.sink, None
        self._cancel_timer()
        reusable = self._keep_alive and not self.closed and not self._buf
        self.pool.release(self, reusable)
        sink.end()

    def _fail(self, message: str) -> None:
        sink, self.sink = self.sink, None
        self._cancel_timer()
        self.pool.release(self, False)
        if sink is not None:
            sink.error(message)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------ the gateway's side
    def start(self, data: bytes, sink: Sink, timeout_s: float, retry: Optional[tuple]) -> None:
        self.sink = sink
        sink.conn = self  # the relay pauses, resumes or aborts whichever connection carries it
        self.received = False
        self._mode, self._buf, self._remaining, self._keep_alive = "", b"", 0, True
        self._retry = retry
        self._head_only = data.startswith(b"HEAD ")
        self._timer = self.pool.loop.call_later(timeout_s, self.timed_out, timeout_s)
        self.transport.write(data)

    def timed_out(self, timeout_s: float) -> None:
        """The timeout is on silence, not on the whole response: a response that streams on is
        never cut, one that stops for ``timeout_s`` is."""
        self._timer = None
        if self.received:
            silent_s = self.pool.loop.time() - self._last_data_s
            if silent_s < timeout_s:
                self._timer = self.pool.loop.call_later(timeout_s - silent_s, self.timed_out, timeout_s)
                return
            self._fail(f"the upstream sent nothing for {timeout_s:g} s mid-response")
        else:
            self._fail(f"the upstream did not answer within {timeout_s:g} s")
        self.transport.abort()

    def abort(self) -> None:
        """The client went away: drop the upstream request (the engine sees its connection close)."""
        self.sink = None
        self._cancel_timer()
        self.pool.release(self, False)
        self.transport.abort()

    def pause(self) -> None:
        if not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if not self.closed:
            self.transport.resume_reading()


class UpstreamPool:
    """Idle keep-alive connections per upstream, opened on demand."""

    def __init__(self, urls: list[str], connect_timeout_s: float = 5.0) -> None:
        self.loop = asyncio.get_running_loop()
        self.targets = []
        for url in urls:
            parts = urlsplit(url)
            self.targets.append((parts.hostname, parts.port or 80, parts.netloc, parts.path.rstrip("/")))
        self.connect_timeout_s = connect_timeout_s
        self.max_idle_s = MAX_IDLE_S
        self._idle: dict[tuple[str, int], list[UpstreamConnection]] = {}
        self._open: set[UpstreamConnection] = set()

    def request_bytes(self, index: int, method: str, target: str, headers: list[tuple[str, str]],
                      body: bytes) -> bytes:
        host, port, netloc, prefix = self.targets[index]
        out = [f"{method} {prefix}{target} HTTP/1.1\r\nHost: {netloc}\r\n"]
        for name, value in headers:
            out.append(f"{name}: {value}\r\n")
        out.append(f"Content-Length: {len(body)}\r\n\r\n" if body or method in ("POST", "PUT", "PATCH") else "\r\n")
        return "".join(out).encode("latin-1") + body

    async def send(self, index: int, data: bytes, timeout_s: float, *, sink: Sink,
                   retried: bool = False) -> Optional[UpstreamConnection]:
        """Start one request (``data``: its bytes, from ``request_bytes``); the response goes to
        ``sink``. Returns the connection (to pause, resume or abort), or None when the upstream
        could not be reached (``sink.error`` has been told)."""
        host, port = self.targets[index][:2]
        key = (host, port)
        idle = self._idle.get(key)
        conn = None
        now_s = self.loop.time()
        while idle:
            conn = idle.pop()
            if not conn.closed and now_s - conn.idle_since_s <= self.max_idle_s:
                break
            self.release(conn, False)  # closed by the engine, or idle long enough that it may be soon
            conn = None
        reused = conn is not None
        if conn is None:
            try:
                _, conn = await asyncio.wait_for(
                    self.loop.create_connection(lambda: UpstreamConnection(self, key), host, port),
                    self.connect_timeout_s)
            except (OSError, asyncio.TimeoutError) as exc:
                sink.error(f"cannot connect to upstream {host}:{port} ({type(exc).__name__}: {exc})")
                return None
            self._open.add(conn)
        resend = reused and not retried and data.startswith(IDEMPOTENT_PREFIXES)
        conn.start(data, sink, timeout_s, (index, data, timeout_s) if resend else None)
        return conn

    def release(self, conn: UpstreamConnection, reusable: bool) -> None:
        if reusable:
            conn.idle_since_s = self.loop.time()
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.closed = True
            self._open.discard(conn)
            if conn.transport is not None:
                conn.transport.close()

    def close(self) -> None:
        for conn in list(self._open):
            conn.transport.abort()
        self._open.clear()
        self._idle.clear()
