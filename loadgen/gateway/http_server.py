"""The gateway's client side: HTTP/1.1 on asyncio's protocol layer, one request at a time per connection.

A request's head and body are read (the body up to ``max_body_bytes``: larger ones get 413 before
they are read), then handed to the proxy as a ``Request``; the response is written as it comes,
with the upstream's length or chunked. A connection that closes sets ``lost`` (a parked request
leaves its queue, a streamed one aborts its upstream request). Writes past the transport's
buffer limit pause the upstream's reads (``on_pause``/``on_resume``): memory per request stays
bounded however slowly a client reads.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Optional

import orjson

MAX_HEAD_BYTES = 64 * 1024
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
           408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
           429: "Too Many Requests", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
           502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}


def error_body(status: int, message: str) -> bytes:
    """The gateway's own error answers, shaped as OpenAI's (and vLLM's) error responses."""
    return orjson.dumps({"error": {"message": message, "type": "gateway_error", "code": status}})


class Request:
    __slots__ = ("method", "target", "path", "headers", "header_list", "body", "keep_alive")

    def __init__(self, method: str, target: str, header_list: list[tuple[str, str]], body: bytes,
                 keep_alive: bool) -> None:
        self.method = method
        self.target = target
        self.path = target.split("?", 1)[0]
        self.header_list = header_list
        self.headers = {name.lower(): value for name, value in header_list}
        self.body = body
        self.keep_alive = keep_alive


class ClientConnection(asyncio.Protocol):
    def __init__(self, handler: Callable[[Request, "ClientConnection"], Awaitable[None]], max_body_bytes: int,
                 connections: set, on_refused: Optional[Callable[[int], None]] = None) -> None:
        self.handler = handler
        self.on_refused = on_refused  # a request refused before it could be read (its status)
        self.max_body_bytes = max_body_bytes
        self.connections = connections
        self.transport: Optional[asyncio.Transport] = None
        self.buf = b""
        self.busy = False
        self.closed = False
        self.lost: Optional[asyncio.Future] = None
        self.on_pause: Optional[Callable[[], None]] = None
        self.on_resume: Optional[Callable[[], None]] = None
        self.on_lost: Optional[Callable[[], None]] = None
        self._chunked = False
        self._keep_alive = True
        self._head: Optional[tuple] = None  # (method, target, headers, keep_alive, length) of a body in transit
        # the request being handled: the status sent (0: none yet), whether the gateway wrote the
        # response itself, whether it was sent whole, and a failure the handler named
        self.sent_status = 0
        self.own_response = False
        self.complete = False
        self.failure: Optional[str] = None

    # ------------------------------------------------------------ asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.lost = asyncio.get_running_loop().create_future()
        transport.set_write_buffer_limits(high=256 * 1024)
        self.connections.add(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.connections.discard(self)
        if not self.lost.done():
            self.lost.set_result(None)
        if self.on_lost is not None:  # a request in flight: abort it upstream
            self.on_lost()

    def pause_writing(self) -> None:
        if self.on_pause is not None:
            self.on_pause()

    def resume_writing(self) -> None:
        if self.on_resume is not None:
            self.on_resume()

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        if not self.busy:
            self._parse()
        elif len(self.buf) > MAX_HEAD_BYTES + self.max_body_bytes:
            self.transport.pause_reading()  # a client pipelining ahead: read on when this request is done

    # ------------------------------------------------------------ requests
    def _parse(self) -> None:
        if self._head is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD_BYTES:
                    self.refuse(431, "request head over 64 KiB")
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            self.buf = self.buf[end + 4:]
            parts = lines[0].split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
                self.refuse(400, "malformed request line")
                return
            header_list = []
            length = 0
            connection = expect = ""
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if not sep:
                    self.refuse(400, "malformed header line")
                    return
                name, value = name.strip(), value.strip()
                lower = name.lower()
                if lower == "content-length":
                    if not value.isdigit():
                        self.refuse(400, "malformed Content-Length")
                        return
                    length = int(value)
                elif lower == "transfer-encoding":
                    self.refuse(411, "chunked request bodies are not accepted: send Content-Length")
                    return
                elif lower == "connection":
                    connection = value.lower()
                elif lower == "expect":
                    expect = value.lower()
                header_list.append((name, value))
            if length > self.max_body_bytes:
                self.refuse(413, f"request body of {length} bytes, over the gateway's max_body_bytes "
                                 f"({self.max_body_bytes})")
                return
            if expect == "100-continue" and len(self.buf) < length:  # curl waits a second for it otherwise
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            keep_alive = connection != "close" and (parts[2] != "HTTP/1.0" or connection == "keep-alive")
            self._head = (parts[0], parts[1], header_list, keep_alive, length)
        method, target, header_list, keep_alive, length = self._head
        if len(self.buf) < length:
            return
        body, self.buf = self.buf[:length], self.buf[length:]
        self._head = None
        self.busy = True
        self._keep_alive = keep_alive
        self.sent_status, self.own_response, self.complete, self.failure = 0, False, False, None
        task = asyncio.get_running_loop().create_task(self.handler(Request(method, target, header_list, body,
                                                                           keep_alive), self))
        task.add_done_callback(self._request_done)

    def _request_done(self, task: asyncio.Task) -> None:
        self.busy = False
        self.on_pause = self.on_resume = self.on_lost = None
        if not task.cancelled() and task.exception() is not None and not self.closed:
            self.transport.abort()  # a bug in a handler: never leave the client waiting
            raise task.exception()
        if self.closed:
            return
        if not self._keep_alive:
            self.transport.close()
            return
        self.transport.resume_reading()
        if self.buf:
            self._parse()

    # ------------------------------------------------------------ responses
    def start(self, status: int, headers: list[tuple[str, str]], length: Optional[int]) -> None:
        """Send the head; ``length`` None: the body follows chunked."""
        out = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\n"]
        for name, value in headers:
            out.append(f"{name}: {value}\r\n")
        self._chunked = length is None
        self.sent_status = status
        out.append("Transfer-Encoding: chunked\r\n" if length is None else f"Content-Length: {length}\r\n")
        if not self._keep_alive:
            out.append("Connection: close\r\n")
        out.append("\r\n")
        if not self.closed:
            self.transport.write("".join(out).encode("latin-1"))

    def write(self, data: bytes) -> None:
        if self.closed or not data:
            return
        if self._chunked:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.transport.write(data)

    def finish(self) -> None:
        if self.closed:
            return
        if self._chunked:
            self.transport.write(b"0\r\n\r\n")
        self.complete = True

    def respond(self, status: int, body: bytes, content_type: str = "application/json",
                headers: tuple = ()) -> None:
        self.start(status, [("Content-Type", content_type), *headers], len(body))
        self.write(body)
        self.own_response, self.complete = True, not self.closed

    def refuse(self, status: int, message: str) -> None:
        """Answer a request that could not be read, and close (the rest of the stream is unreadable)."""
        self._keep_alive = False
        if self.on_refused is not None:
            self.on_refused(status)
        self.respond(status, error_body(status, message))
        self.transport.close()
        self.closed = True
