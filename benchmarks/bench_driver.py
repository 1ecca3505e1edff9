"""How fast the live driver is: loadgen against a zero-service-time serve-sim over real HTTP.

    taskset -c 0 python benchmarks/bench_driver.py [--json OUT]

The endpoint (benchmarks/zero_server.py, or ``--server serve-sim`` for serve-sim with
``--zero-cost``) runs pinned to core 1 and the driver to core 0 (the taskset above).
Measures, per the issue:
* sustained streamed turns/s of closed-loop sessions (think time 0, ~1K-token prompts,
  32 streamed output tokens), steady-state window only;
* arrival lateness p50/p99 at 200 turns/s (1-turn sessions on a Poisson schedule): when the
  first request was sent minus when the schedule said;
* driver CPU seconds per turn.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadgen.live.runner import run_live  # noqa: E402
from loadgen.core.runner import RunKey  # noqa: E402
from loadgen.core.spec import parse_spec  # noqa: E402
from loadgen.core.workload import plan_sessions  # noqa: E402
from tests.servers import start_server as start_and_wait  # noqa: E402


def start_server(port: int, kind: str) -> subprocess.Popen:
    if kind == "serve-sim":
        cmd = [sys.executable, "-m", "loadgen.cli", "serve-sim", "--zero-cost", "--port", str(port),
               "--pool-tokens", "4000000"]
    else:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "zero_server.py"), "--port", str(port)]
    if os.cpu_count() and os.cpu_count() > 1:
        cmd = ["taskset", "-c", "1"] + cmd
    return start_and_wait(cmd, f"http://127.0.0.1:{port}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)


ENGINE: dict = {}  # engine fields of every spec (--api chat: api and tokenizer)
TRANSPORT = None  # --transport aiohttp: the aiohttp transport instead of the raw HTTP client


def spec(url: str, **workload) -> dict:
    return {"experiment": "driver-bench", "seeds": [1], "engine": {"kind": "openai", "url": url,
                                                                  "flush_before_run": False, **ENGINE},
            "recording": {"flush_interval_s": 5}, **workload}


def transport():
    if TRANSPORT == "aiohttp":
        from loadgen.live.transport import AiohttpTransport
        return AiohttpTransport()
    return None


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def throughput(url: str, out: Path, num_sessions: int = 256, duration_s: float = 20.0) -> dict:
    # sessions long enough that none ends inside the run at 10K turns/s (contexts grow 32 tokens a turn)
    data = spec(url, duration_s=duration_s, workload={
        "arrival_rate_per_s": num_sessions / 1.0,
        "sessions": {"kind": "synthetic", "system_prompt_tokens": 200, "task_tokens": 800, "num_turns": 5000,
                     "output_tokens": 32, "tool_tokens": 0, "think_time_mean_s": 0.0}},
        arms=[{"name": "closed", "triggers": [{"kind": "rate_change", "at_s": 1.0, "arrival_rate_per_s": 0.0}]}])
    s = parse_spec(data)
    c0, t0 = cpu_s(), time.perf_counter()
    run_live(s, RunKey("closed", 1), out, transport=transport())
    cpu, wall = cpu_s() - c0, time.perf_counter() - t0
    t = pq.read_table(out / "runs" / "closed-s1" / "turns.parquet").to_pydict()
    fin = np.array([f for f, e in zip(t["finish_s"], t["error"]) if e is None])
    lo, hi = 5.0, duration_s - 2.0
    steady = ((fin >= lo) & (fin < hi)).sum() / (hi - lo)
    return {"sessions": num_sessions, "turns": int(len(fin)), "errors": int(sum(e is not None for e in t["error"])),
            "steady_turns_per_s": float(steady), "driver_cpu_s_per_turn": cpu / max(1, len(fin)),
            "wall_s": wall}


def lateness(url: str, out: Path, rate: float = 200.0, duration_s: float = 20.0) -> dict:
    data = spec(url, duration_s=duration_s, workload={
        "arrival_rate_per_s": rate,
        "sessions": {"kind": "synthetic", "system_prompt_tokens": 200, "task_tokens": 800, "num_turns": 1,
                     "output_tokens": 32, "tool_tokens": 0, "think_time_mean_s": 0.0}},
        arms=[{"name": "open"}])
    s = parse_spec(data)
    c0 = cpu_s()
    run_live(s, RunKey("open", 1), out, transport=transport())
    cpu = cpu_s() - c0
    scheduled = {p.session_id: p.arrival_s for p in plan_sessions(s, s.arm("open"), 1)}
    t = pq.read_table(out / "runs" / "open-s1" / "turns.parquet").to_pydict()
    late = np.array([a - scheduled[sid] for sid, a in zip(t["session_id"], t["admit_s"])])
    return {"rate_per_s": rate, "turns": int(len(late)), "lateness_p50_ms": float(np.percentile(late, 50) * 1e3),
            "lateness_p99_ms": float(np.percentile(late, 99) * 1e3), "lateness_max_ms": float(late.max() * 1e3),
            "driver_cpu_s_per_turn": cpu / max(1, len(late))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--server", choices=["zero", "serve-sim"], default="zero",
                        help="the raw zero-time mock (default) or serve-sim with zero step cost")
    parser.add_argument("--api", choices=["completions", "chat"], default="completions",
                        help="chat: message lists built to exact lengths with a local tokenizer")
    parser.add_argument("--tokenizer", help="for --api chat: a tokenizer directory (default: one built here, "
                        "32000 made-up words and a ChatML template, no download)")
    parser.add_argument("--transport", choices=["raw", "aiohttp"], default="raw",
                        help="the HTTP client: the raw HTTP/1.1 one (default) or aiohttp (before it)")
    parser.add_argument("--sessions", type=int, default=256, help="closed-loop sessions (the concurrency)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of the closed-loop run")
    parser.add_argument("--skip-lateness", action="store_true")
    parser.add_argument("--url", help="drive this running endpoint instead of starting one (bench_peers.py)")
    parser.add_argument("--json")
    args = parser.parse_args()
    global TRANSPORT
    TRANSPORT = args.transport
    proc = None if args.url else start_server(args.port, args.server)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if args.api == "chat":
                tokenizer = args.tokenizer
                if tokenizer is None:
                    from tests.live.small_tokenizer import build_tokenizer
                    tokenizer = str(build_tokenizer(Path(tmp) / "tok", vocab_size=32000))
                ENGINE.update(api="chat", tokenizer=tokenizer)
            results = {"api": args.api, "transport": args.transport,
                       "throughput": throughput(url, Path(tmp) / "a", args.sessions, args.duration)}
            if not args.skip_lateness:
                results["lateness"] = lateness(url, Path(tmp) / "b")
    finally:
        if proc is not None:
            proc.kill()
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
