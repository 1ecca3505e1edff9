"""A soak of the live driver against a real server whose keep-alive timeout is shorter than the
agents' think times: the server closes idle connections under the driver all run long.

``soak(url, duration_s, out_dir)`` runs one closed-loop live run and watches it from a thread
once a second: the driver's open connections (its pool, and its sockets to the server in
/proc/net/tcp), its resident memory, and afterwards every turn and session. Used by the bounded
`vllm`-marked test (tests/live/test_vllm_cpu.py) and by the longer run of benchmarks/soak_vllm_cpu.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Optional

import pyarrow.parquet as pq

from loadgen.analysis.attempts import attempt_outcome
from loadgen.core.runner import RunKey
from loadgen.core.spec import parse_spec
from loadgen.live.transport import AiohttpTransport
from loadgen.live.raw_http import RawHttpTransport
from loadgen.live.runner import run_live

# vLLM's uvicorn closes a keep-alive connection idle this long (VLLM_HTTP_TIMEOUT_KEEP_ALIVE's
# default, vllm/entrypoints/launchers/api_server/entry.py in vLLM 0.32)
VLLM_KEEP_ALIVE_S = 5.0
# The soak's bound on the driver's timer lateness (p99): a tenth of the keep-alive, so that no
# think gap's side of the keep-alive is the driver's doing. The run's own lag flag (5% of the
# median turn, loadgen/core/lateness.py) is reported beside it: a bound for time-scaled runs,
# which a shared CPU running vLLM beside the driver does not always meet.
SOAK_LATENESS_BOUND_S = VLLM_KEEP_ALIVE_S / 10


def soak_spec(url: str, duration_s: float, think_time_mean_s: float = 15.0):
    """Sessions of 6 short turns whose think times (exponential) mostly exceed the keep-alive."""
    return parse_spec({
        "experiment": "soak", "duration_s": duration_s, "seeds": [1],
        "engine": {"kind": "openai", "url": url, "request_timeout_s": 120.0,
                   "retry": {"max_attempts": 3, "backoff_s": 1.0}},
        "workload": {"arrival_rate_per_s": 0.15, "sessions": {
            "kind": "synthetic", "num_turns": 6, "system_prompt_tokens": 1024, "task_tokens": 1024,
            "output_tokens": 16, "tool_tokens": 256, "think_time_mean_s": think_time_mean_s}},
        "arms": [{"name": "base"}],
    })


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _sockets_to(port: int) -> int:
    """This machine's TCP sockets whose remote end is ``port`` (the driver's side of its
    connections to the server) that are held open: ESTABLISHED, or CLOSE_WAIT (the server
    closed it and the driver has not: a leak if it stays)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] in ("01", "08"):
                count += 1
    return count


def _peak_in_flight(rows: list[dict]) -> int:
    """The most attempts in flight at once (sent, not yet finished), from the turns' rows."""
    events = sorted([(r["submitted_s"], 1) for r in rows] + [(r["finish_s"], -1) for r in rows])
    peak = level = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


def soak(url: str, duration_s: float, out_dir: Path, think_time_mean_s: float = 15.0,
         every_s: float = 1.0) -> dict:
    """One soak run; its figures (see the module docstring)."""
    spec = soak_spec(url, duration_s, think_time_mean_s)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    transport = RawHttpTransport(fallback=AiohttpTransport())
    watched: list[tuple[float, int, int, int]] = []  # (t, pool connections, sockets, RSS)
    stop = threading.Event()

    def watch() -> None:
        start = time.monotonic()
        while not stop.wait(every_s):
            watched.append((time.monotonic() - start, transport.num_open_connections, _sockets_to(port), _rss_bytes()))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        info = run_live(spec, RunKey("base", 1), out_dir, transport=transport)
    finally:
        stop.set()
        watcher.join()
    sockets_after_run = _sockets_to(port)  # the run over, its client closed: none left open
    run_dir = Path(out_dir) / "runs" / "base-s1"
    turns = pq.read_table(run_dir / "turns.parquet")
    sessions = pq.read_table(run_dir / "sessions.parquet").to_pylist()
    rows = turns.to_pylist()
    # a session's turns are 0, 1, ... with none missing: a turn sent and never recorded is lost
    by_session: dict[int, list[int]] = {}
    for r in rows:
        if r["error"] is None:
            by_session.setdefault(r["session_id"], []).append(r["turn_index"])
    gaps_s = _think_gaps_s(rows)
    third = max(1, len(watched) // 3)
    rss = [w[3] for w in watched]
    return {
        "status": info["status"], "duration_s": duration_s, "lagging": info["lagging"], "lag": info["lag"],
        "num_turns": sum(r["error"] is None for r in rows), **attempt_outcome(turns),
        "sessions_arrived": info["counts"]["sessions_arrived"], "sessions_completed": info["counts"]["sessions_completed"],
        "sessions_crashed": info["counts"]["sessions_crashed"],
        "sessions_with_a_missing_turn": sum(sorted(ks) != list(range(len(ks))) for ks in by_session.values()),
        "sessions_ended_with_error": sum(s["status"] == "error" for s in sessions),
        "think_gaps": len(gaps_s), "think_gaps_over_keep_alive": sum(g > VLLM_KEEP_ALIVE_S for g in gaps_s),
        "peak_requests_in_flight": _peak_in_flight(rows),
        "pool_connections_max": max((w[1] for w in watched), default=0),
        "sockets_max": max((w[2] for w in watched), default=0),
        "sockets_after_run": sockets_after_run,
        "closed_by_server_while_idle": transport.num_closed_while_idle, "resent_on_fresh_connection": transport.num_resent,
        "rss_mb_after_first_third": rss[third - 1] / 2**20 if rss else None,
        "rss_mb_max_after_first_third": max(rss[third - 1:]) / 2**20 if rss else None,
        "rss_mb_at_end": rss[-1] / 2**20 if rss else None,
    }


def _think_gaps_s(rows: list[dict]) -> list[float]:
    """Per session, the time from a turn's finish to the next turn's first attempt: when the
    session's connection sat idle."""
    finish: dict[tuple[int, int], float] = {}
    for r in rows:
        if r["error"] is None:
            finish[(r["session_id"], r["turn_index"])] = r["finish_s"]
    return [r["submitted_s"] - finish[(r["session_id"], r["turn_index"] - 1)] for r in rows
            if r["attempt"] == 1 and (r["session_id"], r["turn_index"] - 1) in finish]


def describe(figures: dict) -> str:
    f = figures
    return (f"{f['duration_s']:g} s soak: {f['num_turns']} turns, {f['turns_retried']} retried, {f['turns_failed']} "
            f"failed, {f['turns_truncated']} truncated, {f['sessions_with_a_missing_turn']} sessions missing a turn; "
            f"{f['think_gaps_over_keep_alive']}/{f['think_gaps']} think gaps over the {VLLM_KEEP_ALIVE_S:g} s keep-alive, "
            f"{f['closed_by_server_while_idle']} connections closed by the server while idle, "
            f"{f['resent_on_fresh_connection']} requests resent; connections max {f['pool_connections_max']} "
            f"(sockets {f['sockets_max']}, {f['sockets_after_run']} after the run) for a peak of {f['peak_requests_in_flight']} "
            f"requests in flight; RSS {f['rss_mb_after_first_third']:.1f} MB after the first third, max "
            f"{f['rss_mb_max_after_first_third']:.1f} MB after it, {f['rss_mb_at_end']:.1f} MB at the end; "
            f"lagging {f['lagging']} ({_lateness(f['lag'])})")


def _lateness(lag) -> str:
    if not isinstance(lag, dict) or lag.get("p99_s") is None:
        return "no lateness measured"
    return (f"the {lag['source']}'s timers p99 {lag['p99_s'] * 1000:.1f} ms late, bound {lag['bound_s'] * 1000:.1f} ms "
            f"= 5% of the median turn {lag['median_turn_s']:.3f} s")
