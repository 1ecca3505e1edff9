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


class ThreadedProxy:
    """An aiohttp server on its own thread and event loop that forwards requests, streamed, to an
    upstream. Subclasses decide per request in ``route``: return the upstream base URL to forward
    to, or a response to answer with themselves. ``close()`` stops it."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self._ready.wait(10), "the proxy did not start"

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
