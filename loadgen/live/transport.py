"""The one seam to the network behind the live engine client.

``Transport`` has two calls, ``request`` and ``stream_lines``. ``AiohttpTransport`` pools
keep-alive connections (https://, and the raw client's fallback); ``MockTransport`` is the test
double at this seam: it answers from a handler function, like httpx's MockTransport.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Protocol

import orjson

# TransportError (the request did not complete: connection refused/reset, timeout, bad stream) and
# HttpStatusError live with the raw HTTP transport, which raises them too
from .raw_http import HttpStatusError, TransportError

__all__ = ["AiohttpTransport", "HttpStatusError", "MockResponse", "MockTransport", "Transport", "TransportError"]


class Transport(Protocol):
    async def request(self, method: str, url: str, body: Optional[bytes], headers: dict,
                      timeout_s: float) -> tuple[int, bytes]: ...

    def stream_lines(self, url: str, body: bytes, headers: dict, timeout_s: float,
                     response_headers: Optional[dict] = None) -> AsyncIterator[list[bytes]]:
        """A streamed POST's response as batches of complete lines, a batch per network read;
        ``response_headers`` ({name: None, ...}) gets those headers' values (None: not sent)
        before the first batch."""

    async def close(self) -> None: ...


class AiohttpTransport:
    """aiohttp with one pooled session (measured fastest behind this seam; see benchmarks/)."""

    def __init__(self, max_connections: int = 4096) -> None:
        self.max_connections = max_connections
        self._session = None

    def _get(self):
        if self._session is None:
            import aiohttp

            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300,
                                             enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(connector=connector, json_serialize=lambda o: orjson.dumps(o).decode())
        return self._session

    async def request(self, method, url, body, headers, timeout_s):
        import aiohttp

        try:
            async with self._get().request(method, url, data=body, headers=headers,
                                           timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                return resp.status, await resp.read()
        except asyncio.TimeoutError:
            raise TransportError(f"timeout after {timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None

    async def stream_lines(self, url, body, headers, timeout_s, response_headers=None):
        import aiohttp

        try:
            async with self._get().post(url, data=body, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if response_headers:
                    for name in response_headers:
                        response_headers[name] = resp.headers.get(name)
                if resp.status >= 400:
                    raise HttpStatusError(resp.status, (await resp.read()).decode(errors="replace"))
                # one await per network read, not per line: aiohttp's readline costs ~4 us a line
                # and a streamed turn has two lines per token
                pending = b""
                async for data in resp.content.iter_any():
                    pending += data
                    if b"\n" in data:
                        *lines, pending = pending.split(b"\n")
                        yield lines
                if pending:
                    yield [pending]
        except asyncio.TimeoutError:
            raise TransportError(f"timeout after {timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass
class MockResponse:
    status: int = 200
    json: Any = None
    text: str = ""
    lines: list = field(default_factory=list)  # SSE lines (bytes or str) for streamed requests
    headers: dict = field(default_factory=dict)  # response headers of a streamed request
    delay_s: float = 0.0


class MockTransport:
    """Test double at the transport seam: ``handler(method, path, json_body) -> MockResponse``."""

    def __init__(self, handler: Callable[[str, str, Any], Awaitable[MockResponse] | MockResponse]) -> None:
        self.handler = handler
        self.calls: list[tuple[str, str, Any, dict]] = []

    async def _respond(self, method, url, body, headers) -> MockResponse:
        path = "/" + url.split("://", 1)[-1].split("/", 1)[-1]
        payload = orjson.loads(body) if body else None
        self.calls.append((method, path, payload, dict(headers)))
        resp = self.handler(method, path, payload)
        if asyncio.iscoroutine(resp):
            resp = await resp
        if isinstance(resp, Exception):
            raise resp
        if resp.delay_s:
            await asyncio.sleep(resp.delay_s)
        return resp

    async def _respond_within(self, method, url, body, headers, timeout_s) -> MockResponse:
        try:
            return await asyncio.wait_for(self._respond(method, url, body, headers), timeout_s)
        except asyncio.TimeoutError:
            raise TransportError(f"timeout after {timeout_s:g} s") from None

    async def request(self, method, url, body, headers, timeout_s):
        resp = await self._respond_within(method, url, body, headers, timeout_s)
        data = orjson.dumps(resp.json) if resp.json is not None else resp.text.encode()
        return resp.status, data

    async def stream_lines(self, url, body, headers, timeout_s, response_headers=None):
        resp = await self._respond_within("POST", url, body, headers, timeout_s)
        if response_headers:
            sent = {k.lower(): v for k, v in resp.headers.items()}
            for name in response_headers:
                response_headers[name] = sent.get(name.lower())
        if resp.status >= 400:
            raise HttpStatusError(resp.status, resp.text or orjson.dumps(resp.json).decode())
        for line in resp.lines:  # one line per batch: every token arrives separately
            yield [line if isinstance(line, bytes) else line.encode()]

    async def close(self) -> None:
        pass
