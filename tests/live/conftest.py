"""Live-path fixtures: a real serve-sim process on loopback, and a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from tests.servers import free_port, start_server


class ServeSim:
    def __init__(self, time_scale: float, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = start_server([sys.executable, "-m", "loadgen.cli", "serve-sim", "--port", str(self.port),
                                  "--time-scale", str(time_scale), *extra], self.url,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve_sim_factory():
    servers = []

    def make(time_scale: float = 30.0, *extra: str) -> ServeSim:
        server = ServeSim(time_scale, *extra)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.kill()


class FaultProxy:
    """Forwards to ``upstream``; every ``every``-th /v1/completions fails with ``mode``:
    ``500`` (an HTTP 500) or ``hang`` (never answers)."""

    def __init__(self, upstream: str, mode: str, every: int) -> None:
        self.upstream = upstream
        self.mode = mode
        self.every = every
        self.num_completions = 0
        self.num_faults = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        from aiohttp import ClientSession, web

        async def handle(request: web.Request) -> web.StreamResponse:
            if request.path == "/v1/completions":
                self.num_completions += 1
                if self.num_completions > 3 and self.num_completions % self.every == 0:  # spare the preflight
                    self.num_faults += 1
                    if self.mode == "500":
                        return web.Response(status=500, text="injected failure")
                    await asyncio.sleep(3600)
            body = await request.read()
            async with ClientSession() as session:
                async with session.request(request.method, self.upstream + request.path_qs, data=body,
                                           headers={k: v for k, v in request.headers.items()
                                                    if k.lower() not in ("host", "content-length")}) as up:
                    resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
                    await resp.prepare(request)
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                    await resp.write_eof()
                    return resp

        async def main() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port).start()
            self._ready.set()
            await asyncio.Event().wait()

        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(main())
        except RuntimeError:
            pass

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
