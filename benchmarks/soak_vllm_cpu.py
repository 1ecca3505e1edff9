"""The driver's soak against the real CPU vLLM: a closed loop whose think times mostly exceed
vLLM's 5 s keep-alive, so the server closes idle connections under the driver all run long.

    python benchmarks/soak_vllm_cpu.py [--duration-s 600] [--url URL] [--json OUT]

Starts the tests' tiny random-weight Qwen3 on vLLM's CPU build (tests/live/vllm_cpu.py; the
cached vllm-cpu venv) unless ``--url`` names a running one, runs tests/live/soak.py for
``--duration-s`` of wall time and prints its figures: turns lost, failed, retried, truncated;
open connections (the pool, and the driver's sockets in /proc/net/tcp) against the peak of
requests in flight; resident memory after the first third and after; the driver's lateness.
The bounded 150 s version is the `vllm`-marked test in tests/live/test_vllm_cpu.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.live.soak import describe, soak  # noqa: E402
from tests.live.vllm_cpu import VllmServer, tiny_model_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--think-time-mean-s", type=float, default=15.0)
    parser.add_argument("--url", help="a running vLLM (started with the flags of tests/live/vllm_cpu.py)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.url:
            figures = soak(args.url, args.duration_s, Path(tmp) / "out", args.think_time_mean_s)
        else:
            with VllmServer(tiny_model_dir(Path(tmp) / "model"), num_blocks=1152, max_model_len=16384) as server:
                figures = soak(server.url, args.duration_s, Path(tmp) / "out", args.think_time_mean_s)
    print(describe(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
