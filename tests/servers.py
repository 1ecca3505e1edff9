"""Start a server process and wait until it answers: the one helper for tests and benchmarks."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time
import urllib.request
from typing import Callable, Optional


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout_s: float = 30.0, proc: Optional[subprocess.Popen] = None,
               path: str = "/health", poll_s: float = 0.1, describe: Callable[[], str] = lambda: "") -> None:
    """Poll ``url + path`` until it answers 200. Raises RuntimeError at once when ``proc`` exits
    first, TimeoutError after ``timeout_s``; ``describe()`` adds context (a log tail) to either."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode} before answering {path}"
                               + describe())
        try:
            with urllib.request.urlopen(url + path, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(poll_s)
    raise TimeoutError(f"{url}{path} did not answer within {timeout_s:.0f} s" + describe())


def start_server(cmd: list[str], url: str, timeout_s: float = 30.0, path: str = "/health", **popen) -> subprocess.Popen:
    """Popen ``cmd`` and wait until ``url + path`` answers; the process is killed if it never does."""
    proc = subprocess.Popen(cmd, **popen)
    try:
        wait_ready(url, timeout_s, proc, path)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


class _OwnLoopServer:
    """A server on a free loopback port, served by ``_run`` on its own thread and event loop;
    ``_run`` sets ``_ready`` once it listens."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(10), "the proxy did not start"

    def _run(self) -> None:
        raise NotImplementedError


class ThreadedProxy(_OwnLoopServer):
    """An aiohttp server on its own thread and event loop that forwards requests, streamed, to an
    upstream. Subclasses decide per request in ``route``: return the upstream base URL to forward
    to, or a response to answer with themselves. ``close()`` stops it."""

    async def route(self, request):
        raise NotImplementedError

    def _run(self) -> None:
        from aiohttp import ClientSession, web

        async def handle(request: web.Request) -> web.StreamResponse:
            upstream = await self.route(request)
            if not isinstance(upstream, str):
                return upstream
            body = await request.read()
            async with ClientSession() as session:
                async with session.request(request.method, upstream + request.path_qs, data=body,
                                           headers={k: v for k, v in request.headers.items()
                                                    if k.lower() not in ("host", "content-length")}) as up:
                    resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
                    try:
                        await resp.prepare(request)
                        async for chunk in up.content.iter_any():
                            await resp.write(chunk)
                        await resp.write_eof()
                    except ConnectionResetError:  # the client hung up (a timeout, or the run ended mid-turn)
                        pass
                    return resp

        async def main() -> None:
            app = web.Application(client_max_size=64 * 2**20)
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await asyncio.Event().wait()

        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(main())
        except RuntimeError:  # close() stopped the loop
            pass

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


class FaultInjectingProxy(_OwnLoopServer):
    """A raw HTTP/1.1 proxy on its own thread and event loop that does to responses what real
    servers and proxies do, one fault per request as ``fault_for(path, n)`` says (n counts the
    requests to that path, from 1; None: no fault). It forwards each request to ``upstream``,
    reads the whole response, and writes it back chunked, with the fault:

    * ``interim``: 100 Continue and 103 Early Hints before the final response;
    * ``slow_headers``: the response head dribbled a few bytes at a time;
    * ``chunk_extensions``: ``;name=value`` on every chunk size and trailer fields at the end;
    * ``reset_mid_body``: half the body, then a reset (RST);
    * ``half_then_hang``: half the body, then nothing, the connection left open.

    Connections are kept alive between requests and closed after ``idle_close_s`` without one,
    as uvicorn's keep-alive timeout does (None: never). Counts what it did, for the tests."""

    FAULTS = ("interim", "slow_headers", "chunk_extensions", "reset_mid_body", "half_then_hang")

    def __init__(self, upstream: str, fault_for: Callable[[str, int], Optional[str]] = lambda path, n: None,
                 idle_close_s: Optional[float] = None) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.fault_for = fault_for
        self.idle_close_s = idle_close_s
        self.num_requests: dict[str, int] = {}
        self.faults: list[tuple[str, int, str]] = []  # (path, n, fault) as injected
        self.num_connections = 0
        self.num_idle_closes = 0
        super().__init__()

    def _run(self) -> None:
        async def main() -> None:
            self._main = asyncio.current_task()
            await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            self._ready.set()
            await asyncio.Event().wait()

        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(main())
        except (RuntimeError, asyncio.CancelledError):  # close() stopped the loop
            pass

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t not in (asyncio.current_task(), self._main)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_close_s)
                except asyncio.TimeoutError:
                    self.num_idle_closes += 1
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = [line for line in lines[1:] if line]
                length = next((int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length")), 0)
                body = await reader.readexactly(length)
                n = self.num_requests[path] = self.num_requests.get(path, 0) + 1
                fault = self.fault_for(path, n)
                if fault is not None:
                    self.faults.append((path, n, fault))
                status_line, response_headers, response_body = await self._forward(method, path, headers, body)
                if not await self._answer(writer, fault, status_line, response_headers, response_body):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _forward(self, method: str, path: str, headers: list[str], body: bytes) -> tuple[str, list[str], bytes]:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        kept = [h for h in headers if h.split(":", 1)[0].strip().lower() not in ("connection", "content-length")]
        up_writer.write((f"{method} {path} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in kept)
                         + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1") + body)
        data = await up_reader.read(-1)
        up_writer.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        framing = {h.split(":", 1)[0].strip().lower(): h.split(":", 1)[1].strip() for h in lines[1:] if ":" in h}
        if "chunked" in framing.get("transfer-encoding", "").lower():
            rest = _dechunk(rest)
        kept = [h for h in lines[1:] if h.split(":", 1)[0].strip().lower()
                not in ("transfer-encoding", "content-length", "connection")]
        return lines[0], kept, rest

    async def _answer(self, writer: asyncio.StreamWriter, fault: Optional[str], status_line: str,
                      headers: list[str], body: bytes) -> bool:
        """Write the response with ``fault``; False when the connection is done with."""
        import socket
        import struct

        head = (status_line + "\r\n" + "".join(h + "\r\n" for h in headers) + "Transfer-Encoding: chunked\r\n"
                + ("Trailer: X-Checksum\r\n" if fault == "chunk_extensions" else "") + "\r\n").encode("latin-1")
        if fault == "interim":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
        if fault == "slow_headers":
            for i in range(0, len(head), 7):
                writer.write(head[i:i + 7])
                await writer.drain()
                await asyncio.sleep(0.01)
        else:
            writer.write(head)
        ext = b";ext=1;q=\"a;b\"" if fault == "chunk_extensions" else b""
        pieces = [body[i:i + 97] for i in range(0, len(body), 97)]
        cut = len(pieces) // 2 if fault in ("reset_mid_body", "half_then_hang") else len(pieces)
        for piece in pieces[:cut]:
            writer.write(b"%x%s\r\n%s\r\n" % (len(piece), ext, piece))
            await writer.drain()
        if fault == "reset_mid_body":
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if fault == "half_then_hang":
            await asyncio.sleep(3600)
            return False
        writer.write(b"0%s\r\n%s\r\n" % (ext, b"X-Checksum: 1\r\nX-More: 2\r\n" if ext else b""))
        await writer.drain()
        return True

    def close(self) -> None:
        """Stop serving: every connection it holds is closed (a hanging one too)."""
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)


def _dechunk(data: bytes) -> bytes:
    out, pos = [], 0
    while True:
        end = data.index(b"\r\n", pos)
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(data[end + 2:end + 2 + size])
        pos = end + 2 + size + 2
