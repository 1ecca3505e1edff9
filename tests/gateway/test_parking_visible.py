"""A run through the gateway shows the proxy's park time where its users look: turns.parquet's
gateway wait and sessions.parquet's admissions and parks, the latency table, summary.json."""

import json
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import make_spec_dict
from tests.live.conftest import ServeSim
from tests.servers import free_port, start_server


def test_the_proxys_park_time_is_each_turns_gateway_wait(tmp_path):
    data = make_spec_dict(seeds=[1], time_scale=60.0, workload={
        "arrival_rate_per_s": 0.05,
        "sessions": {"kind": "synthetic", "num_turns": 4, "task_tokens": 2000, "output_tokens": 50,
                     "tool_tokens": 300, "think_time_mean_s": 3.0}})
    data["arms"] = [{"name": "capped", "controller": {"name": "session-cap", "params": {"k": 1, "k_hi": 1}}}]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    server = ServeSim(60.0, "--pool-tokens", "160000")  # the spec's pool
    try:
        proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--endpoint", server.url,
                               "--via-gateway", "--out", str(tmp_path / "out"), "--no-figures"],
                              capture_output=True, text=True, timeout=300)
    finally:
        server.kill()
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "runs" / "capped-s1"
    gw = json.loads((run_dir / "run.json").read_text())["gateway"]
    assert gw["parks"]["waiting"] > 3  # one session at a time: arrivals queued at the proxy
    sessions = pq.read_table(run_dir / "sessions.parquet").to_pydict()
    turns = pq.read_table(run_dir / "turns.parquet").to_pydict()
    # the proxy's waits are the sessions' admissions and the turns' gateway waits (its clock, run seconds)
    waited = [f - a for a, f in zip(sessions["arrival_s"], sessions["first_admit_s"]) if f is not None and f - a > 0]
    # every admission after a wait is a session's recorded wait, but for a session whose first turn was
    # still out when the run ended: its answer, and so its wait, never came back
    first_turn_out_at_end = sum(1 for n in sessions["turns_completed"] if n == 0)
    assert gw["parks"]["waiting"] == gw["admissions"]["admitted"] > 3
    assert len(waited) <= gw["admissions"]["admitted"] <= len(waited) + first_turn_out_at_end
    assert max(waited) > 5.0
    first_waits = [w for k, w in zip(turns["turn_index"], turns["gateway_wait_s"]) if k == 0 and w > 0]
    # a first turn's gateway wait is its session's admission (arrival + wait - arrival: to the float)
    assert sorted(first_waits) == pytest.approx(sorted(waited), rel=1e-12, abs=1e-9)
    # measured finely, not in whole milliseconds of the loop's clock (60 ms of run time here): on
    # that clock a request held until another's answer ended in the same loop turn was held 0 s
    ticks = [w / 0.060 for w in first_waits]
    assert any(abs(t - round(t)) > 1e-6 for t in ticks), first_waits
    assert sum(sessions["num_parks"]) == gw["parks"]["parked"] == 0  # session-cap holds arrivals only
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (row,) = summary["latency_by_arm"]
    assert row["gateway_wait_s"]["p99"] > 5.0 and row["turns_held"] == len(waited)
    table = next(line for line in proc.stdout.splitlines() if line.startswith("capped "))
    assert " 0ms " not in table, proc.stdout


def test_a_run_through_a_gateway_of_its_own_needs_only_the_url_and_starts_its_clock(tmp_path):
    """`loadgen gateway` started on its own, well before the run: the run tells it when it starts,
    so the limit switches on at the run's minute 5 (control_start_s), not the gateway's."""
    data = make_spec_dict(seeds=[1], workload={
        "arrival_rate_per_s": 0.05,
        "sessions": {"kind": "synthetic", "num_turns": 4, "task_tokens": 2000, "output_tokens": 50,
                     "tool_tokens": 300, "think_time_mean_s": 3.0}})
    data["arms"] = [{"name": "through"}]  # the run's own gate: none; the gateway's: session-cap from minute 5
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    server = ServeSim(60.0, "--pool-tokens", "160000")
    port = free_port()
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump({
        "upstreams": [server.url], "controller": "session-cap", "controller_options": {"k": 1, "k_hi": 1},
        "control_start_s": 300, "time_scale": 60.0, "listen": f"127.0.0.1:{port}"}))
    url = f"http://127.0.0.1:{port}"
    gateway = start_server([sys.executable, "-m", "loadgen.cli", "gateway", "--config", str(tmp_path / "gateway.yaml")],
                           url, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3.0)  # 180 s of the gateway's clock: without the run's start, control would be on at its 120 s
        wrong = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--endpoint", url,
                                "--time-scale", "30", "--out", str(tmp_path / "wrong"), "--quiet"],
                               capture_output=True, text=True, timeout=120)
        assert wrong.returncode == 2 and "loadgen gateway whose clock runs at time_scale 60" in wrong.stderr
        proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--endpoint", url,
                               "--time-scale", "60", "--out", str(tmp_path / "out"), "--no-figures", "--quiet"],
                              capture_output=True, text=True, timeout=300)
    finally:
        gateway.kill()
        gateway.wait()
        server.kill()
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "out" / "runs" / "through-s1"
    assert json.loads((run_dir / "run.json").read_text())["endpoint_gateway_started"] is True
    turns = pq.read_table(run_dir / "turns.parquet").to_pydict()
    held = [r for r, w in zip(turns["ready_s"], turns["gateway_wait_s"]) if w > 0]
    assert len(held) > 3 and min(held) > 295.0, sorted(held)[:5]
