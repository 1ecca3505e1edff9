"""Real headless Chromium for tests of web pages, driven over the DevTools protocol (a websocket
on loopback, with aiohttp's client: no browser-automation dependency).

``load_page(url)`` opens a page and reports what a user would meet: console errors and
uncaught exceptions, and every image with whether it decoded. Chromium is found on PATH
(Debian's package ``chromium``); ``require_chromium()`` fails under CI (CI=true: .ci/run installs
it) and skips with the reason elsewhere."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from typing import Iterator, Optional

import pytest

from tests.servers import free_port

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> Optional[str]:
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


def require_chromium() -> str:
    path = find_chromium()
    if path:
        return path
    reason = f"no Chromium on PATH (looked for {', '.join(CANDIDATES)}): apt-get install chromium"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI must test web pages in a real browser (.ci/run installs it)")
    pytest.skip(reason)


@contextmanager
def chromium(binary: str) -> Iterator[str]:
    """A headless Chromium with its DevTools endpoint on a free loopback port; yields its URL."""
    port = free_port()
    profile = tempfile.mkdtemp(prefix="loadgen-chromium-")
    proc = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                             "--disable-dev-shm-usage", f"--remote-debugging-port={port}",
                             "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{base}/json/version", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Chromium did not start (exit code {proc.poll()})") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


async def _load(devtools: str, url: str, screenshot: Optional[str], timeout_s: float) -> dict:
    import aiohttp

    target = json.loads(urllib.request.urlopen(
        urllib.request.Request(f"{devtools}/json/new?about:blank", method="PUT"), timeout=10).read())
    ids = itertools.count(1)
    errors: list[str] = []
    loaded = asyncio.Event()
    pending: dict[int, asyncio.Future] = {}
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            async def reader() -> None:
                async for msg in ws:
                    data = json.loads(msg.data)
                    if "id" in data and data["id"] in pending:
                        pending.pop(data["id"]).set_result(data)
                    method = data.get("method")
                    params = data.get("params", {})
                    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                        errors.append(" ".join(str(a.get("value", a.get("description"))) for a in params["args"]))
                    elif method == "Runtime.exceptionThrown":
                        errors.append(params["exceptionDetails"].get("text", "exception"))
                    elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                        errors.append(params["entry"].get("text", ""))
                    elif method == "Page.loadEventFired":
                        loaded.set()

            async def call(method: str, **params) -> dict:
                i = next(ids)
                pending[i] = asyncio.get_running_loop().create_future()
                await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
                reply = await asyncio.wait_for(pending[i], timeout_s)
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

            task = asyncio.create_task(reader())
            try:
                for domain in ("Page", "Runtime", "Log"):
                    await call(f"{domain}.enable")
                await call("Page.navigate", url=url)
                await asyncio.wait_for(loaded.wait(), timeout_s)
                probe = ("JSON.stringify({title: document.title, images: Array.from(document.images).map(i => "
                         "({alt: i.alt, complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})), "
                         "order: Array.from(document.querySelectorAll('h1, h2, #warnings, #no-warnings, pre'))"
                         ".map(e => e.id || e.tagName + ':' + e.textContent.slice(0, 40)), "
                         "external: Array.from(document.querySelectorAll('[src], [href]')).map(e => "
                         "e.getAttribute('src') || e.getAttribute('href')).filter(u => !u.startsWith('data:'))})")
                result = await call("Runtime.evaluate", expression=probe, returnByValue=True)
                page = json.loads(result["result"]["value"])
                if screenshot:
                    import base64

                    shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=False)
                    with open(screenshot, "wb") as f:
                        f.write(base64.b64decode(shot["data"]))
            finally:
                task.cancel()
    return {**page, "console_errors": errors}


def load_page(binary: str, url: str, screenshot: Optional[str] = None, timeout_s: float = 60.0) -> dict:
    """Open ``url`` in a fresh headless Chromium: {"title", "images": [{alt, complete, width,
    height}], "order": [headings, warnings, pre blocks in page order], "external": [URLs the page
    loads from elsewhere], "console_errors": [...]}; a PNG screenshot of the top when asked."""
    with chromium(binary) as devtools:
        return asyncio.run(_load(devtools, url, screenshot, timeout_s))
