"""serve-sim when clients hang up mid-stream, over a real socket: each hang-up is counted and
logged in one line, never as a traceback (a hang-up is normal: a client timed out or stopped)."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request

NUM_HANGUPS = 4


def _hang_up_mid_stream(port: int, read_bytes: int) -> None:
    body = json.dumps({"model": "sim", "prompt": list(range(1, 200)), "max_tokens": 30000, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = 0
    while got < read_bytes:
        chunk = sock.recv(65536)
        assert chunk, "the server closed first"
        got += len(chunk)
    # a reset, as a client process that dies or times out leaves it
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _hangups_metric(url: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    (line,) = [ln for ln in text.splitlines() if ln.startswith("loadgen_serve_sim_client_hangups_total")]
    return float(line.split()[-1])


def test_client_hang_ups_mid_stream_are_counted_and_logged_in_one_line_each(serve_sim_factory):
    # zero-cost steps: every token is ready at once, so the reset lands while the server writes
    server = serve_sim_factory(1.0, "--zero-cost")
    for i in range(NUM_HANGUPS):
        _hang_up_mid_stream(server.port, 2000 + 30000 * i)
    deadline = time.monotonic() + 10
    while _hangups_metric(server.url) < NUM_HANGUPS and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _hangups_metric(server.url) == NUM_HANGUPS
    server.kill()
    log = server.proc.stdout.read().decode()
    assert "Traceback" not in log and "Error handling request" not in log, log
    lines = [ln for ln in log.splitlines() if "hung up" in ln]
    assert len(lines) == NUM_HANGUPS, log
    assert lines[-1].startswith("serve-sim: a client hung up mid-stream (cmpl-")
    assert lines[-1].endswith(f"{NUM_HANGUPS} hang-ups so far")
