"""Start a server process and wait until it answers: the one helper for tests and benchmarks."""

from __future__ import annotations

import socket
import subprocess
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
