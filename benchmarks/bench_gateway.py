"""What the gateway costs: added latency and streamed requests/s per core, beside no proxy and nginx.

    python benchmarks/bench_gateway.py [--duration-s 6] [--concurrency 64] [--json OUT]

All in one run, against benchmarks/zero_server.py (every completion answered at once with
``--tokens`` streamed SSE chunks and a usage chunk):
* ``direct``: the client talks to the zero-time server;
* ``gateway``: ``loadgen gateway`` in front of it, the budgeter deciding every request (a pool
  large enough that nobody waits: the decisions are made and cost what they cost);
* ``nginx``: nginx (the Debian package) as a plain reverse proxy, one worker, keep-alive upstream,
  ``proxy_buffering off`` (skipped when nginx is not installed).
Each proxy is pinned to core 0; the server and the client to the other cores. Per target:
* added latency: the median (and p99) of 2,000 requests sent one at a time, send to last byte,
  minus the direct median;
* throughput: ``--concurrency`` closed-loop streams for ``--duration-s``; req/s, and req/s per
  proxy core (completed requests / the proxy process's CPU seconds), which is what one core of the
  proxy sustains whether or not the client kept it busy.
Every session sends X-Session-ID: the gateway tracks ``--concurrency`` sessions as a deployment would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.live.raw_http import RawHttpTransport  # noqa: E402
from tests.servers import free_port, start_server  # noqa: E402

NGINX_CONF = """worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy; fastcgi_temp_path {tmp}/fcgi;
  uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 512; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def pinned(cmd: list[str], cores: str) -> list[str]:
    return (["taskset", "-c", cores] + cmd) if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else cmd


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children (nginx's worker is a child)."""
    total = 0.0
    pids = [pid]
    try:
        pids += [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def one_request(transport, url: str, body: bytes, headers: dict) -> float:
    start = time.perf_counter()
    num_done = 0
    async for batch in transport.stream_lines(url, body, headers, 30.0):
        num_done += sum(line == b"data: [DONE]" for line in batch)
    if num_done != 1:
        raise RuntimeError(f"{url}: a response without its end")
    return time.perf_counter() - start


async def measure(base: str, tokens: int, concurrency: int, duration_s: float, proxy_pid) -> dict:
    url = base + "/v1/completions"
    body = orjson.dumps({"model": "zero", "prompt": list(range(1, 513)), "max_tokens": tokens, "stream": True})
    transport = RawHttpTransport()
    headers = {"Content-Type": "application/json", "X-Session-ID": "latency"}
    for _ in range(200):  # warm up: connections, caches
        await one_request(transport, url, body, headers)
    latencies = sorted([await one_request(transport, url, body, headers) for _ in range(2000)])
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + duration_s
    done = [0]

    async def stream(i: int) -> None:
        h = {"Content-Type": "application/json", "X-Session-ID": f"s{i}"}
        while loop.time() < stop_at:
            await one_request(transport, url, body, h)
            done[0] += 1

    cpu_before = cpu_s(proxy_pid) if proxy_pid else None
    started = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    wall_s = time.perf_counter() - started
    proxy_cpu_s = cpu_s(proxy_pid) - cpu_before if proxy_pid else None
    await transport.close()
    return {"latency_p50_ms": 1e3 * latencies[len(latencies) // 2],
            "latency_p99_ms": 1e3 * latencies[int(0.99 * len(latencies))],
            "requests_per_s": done[0] / wall_s,
            "proxy_cpu_share": proxy_cpu_s / wall_s if proxy_pid else None,
            "requests_per_proxy_core_s": done[0] / proxy_cpu_s if proxy_pid and proxy_cpu_s else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32, help="streamed chunks per response")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    others = f"1-{os.cpu_count() - 1}" if (os.cpu_count() or 1) > 1 else "0"
    procs = []
    results = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    try:
        zero_port = free_port()
        procs.append(start_server(pinned([sys.executable, str(ROOT / "benchmarks" / "zero_server.py"), "--port",
                                          str(zero_port)], others), f"http://127.0.0.1:{zero_port}",
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        targets = [("direct", f"http://127.0.0.1:{zero_port}", None)]
        gw_port = free_port()
        gw = start_server(pinned([sys.executable, "-m", "loadgen.cli", "gateway", "--upstream",
                                  f"http://127.0.0.1:{zero_port}", "--listen", f"127.0.0.1:{gw_port}", "--controller",
                                  "budgeter", "--pool-tokens", "1000000000", "--quiet"], "0"),
                          f"http://127.0.0.1:{gw_port}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          cwd=ROOT)
        procs.append(gw)
        targets.append(("gateway", f"http://127.0.0.1:{gw_port}", gw.pid))
        if shutil.which("nginx"):
            ng_port = free_port()
            (tmp / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp, upstream=zero_port, port=ng_port))
            ng = start_server(pinned(["nginx", "-c", str(tmp / "nginx.conf"), "-p", str(tmp)], "0"),
                              f"http://127.0.0.1:{ng_port}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(ng)
            targets.append(("nginx", f"http://127.0.0.1:{ng_port}", ng.pid))
        else:
            print("nginx not installed: its row is skipped (apt-get install -y nginx)", file=sys.stderr)
        os.sched_setaffinity(0, {int(c) for c in others.split("-")[-1:]} if others != "0" else {0})
        for name, base, pid in targets:
            results[name] = asyncio.run(measure(base, args.tokens, args.concurrency, args.duration_s, pid))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    direct = results["direct"]["latency_p50_ms"]
    print(f"{'target':8s} {'p50 ms':>8s} {'added':>8s} {'p99 ms':>8s} {'req/s':>8s} {'proxy cpu':>9s} "
          f"{'req/s per proxy core':>20s}")
    for name, r in results.items():
        r["added_latency_p50_ms"] = r["latency_p50_ms"] - direct
        share = "-" if r["proxy_cpu_share"] is None else f"{r['proxy_cpu_share']:.2f}"
        per_core = "-" if r["requests_per_proxy_core_s"] is None else f"{r['requests_per_proxy_core_s']:.0f}"
        print(f"{name:8s} {r['latency_p50_ms']:8.3f} {r['added_latency_p50_ms']:8.3f} {r['latency_p99_ms']:8.3f} "
              f"{r['requests_per_s']:8.0f} {share:>9s} {per_core:>20s}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
