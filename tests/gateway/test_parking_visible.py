"""A run through the gateway shows the proxy's park time where its users look: turns.parquet's
gateway wait and sessions.parquet's admissions and parks, the latency table, summary.json."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import yaml

from tests.conftest import make_spec_dict
from tests.live.conftest import ServeSim


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
    assert len(waited) == gw["parks"]["waiting"] == gw["admissions"]["admitted"] > 3
    assert max(waited) > 5.0
    first_waits = [w for k, w in zip(turns["turn_index"], turns["gateway_wait_s"]) if k == 0 and w > 0]
    assert sorted(first_waits) == sorted(waited)  # a first turn's gateway wait is its session's admission
    assert sum(sessions["num_parks"]) == gw["parks"]["parked"] == 0  # session-cap holds arrivals only
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    (row,) = summary["latency_by_arm"]
    assert row["gateway_wait_s"]["p99"] > 5.0 and row["turns_held"] == len(waited)
    table = next(line for line in proc.stdout.splitlines() if line.startswith("capped "))
    assert " 0ms " not in table, proc.stdout
