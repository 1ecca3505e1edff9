"""Live-path fixtures: a real serve-sim process on loopback, and a fault-injecting proxy."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from tests.servers import ThreadedProxy, free_port, start_server


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


class FaultProxy(ThreadedProxy):
    """Forwards to ``upstream``; every ``every``-th /v1/completions fails with ``mode``:
    ``500`` (an HTTP 500) or ``hang`` (never answers)."""

    def __init__(self, upstream: str, mode: str, every: int) -> None:
        self.upstream = upstream
        self.mode = mode
        self.every = every
        self.num_completions = 0
        self.num_faults = 0
        super().__init__()

    async def route(self, request):
        from aiohttp import web

        if request.path == "/v1/completions":
            self.num_completions += 1
            if self.num_completions > 3 and self.num_completions % self.every == 0:  # spare the preflight
                self.num_faults += 1
                if self.mode == "500":
                    return web.Response(status=500, text="injected failure")
                await asyncio.sleep(3600)
        return self.upstream
