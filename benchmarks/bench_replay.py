"""How on time a live trace replay sends: a Mooncake-format trace at 100 requests/s replayed open
loop against a zero-service-time server over real HTTP.

    taskset -c 0 python benchmarks/bench_replay.py [--rate 100] [--duration 20] [--json OUT]

The server (benchmarks/zero_server.py, or ``--server serve-sim`` for serve-sim with
``--zero-cost``) is pinned to core 1, the driver to core 0 (the taskset above). The trace: one
request every 1/rate s, ~1K-token prompts whose first block is one of 8 shared prefixes
(``hash_ids``), 32 output tokens. Reports each request's send lateness (its send minus its
recorded time: loadgen/analysis/serving.py ``send_lateness_s``): p50, p99, max; the target is
p99 < 2 ms at 100 requests/s on two cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_driver import start_server  # noqa: E402
from loadgen.analysis.runs import load_run  # noqa: E402
from loadgen.analysis.serving import send_lateness_s  # noqa: E402
from loadgen.core.runner import RunKey  # noqa: E402
from loadgen.core.spec import parse_spec  # noqa: E402
from loadgen.live.runner import run_live  # noqa: E402


def write_trace(path: Path, rate: float, duration_s: float) -> int:
    n = int(rate * duration_s)
    with path.open("w") as f:
        for k in range(n):
            f.write(json.dumps({"timestamp": round(k * 1000.0 / rate, 3), "input_length": 1000, "output_length": 32,
                                "hash_ids": [k % 8, 1000 + k]}) + "\n")
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=18766)
    parser.add_argument("--server", choices=["zero", "serve-sim"], default="zero")
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second of the trace")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of trace")
    parser.add_argument("--json")
    args = parser.parse_args()
    proc = start_server(args.port, args.server)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / "trace.jsonl"
            n = write_trace(trace, args.rate, args.duration)
            spec = parse_spec({"experiment": "replay-bench", "seeds": [1],
                               "engine": {"kind": "openai", "url": f"http://127.0.0.1:{args.port}",
                                          "flush_before_run": False},
                               "workload": {"replay": {"path": str(trace), "format": "mooncake"}},
                               "recording": {"flush_interval_s": 5}, "arms": [{"name": "replay"}]})
            info = run_live(spec, RunKey("replay", 1), Path(tmp) / "out")
            late_ms = send_lateness_s(load_run(Path(tmp) / "out" / "runs" / "replay-s1")) * 1e3
    finally:
        proc.kill()
    results = {"rate_per_s": args.rate, "requests": n, "completed": info["counts"]["sessions_completed"],
               "send_lateness_p50_ms": float(np.percentile(late_ms, 50)),
               "send_lateness_p99_ms": float(np.percentile(late_ms, 99)),
               "send_lateness_max_ms": float(late_ms.max())}
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
