"""End to end: `ray start --head`, then `ray job submit --working-dir . -- loadgen sweep ...`.

The head is our own process group (`ray start --block` in a new session), stopped by signalling
that group: `ray stop` would stop every Ray process on the machine, other people's included."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_spec_dict
from tests.servers import free_port, wait_ready

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _stop_head(head: subprocess.Popen) -> None:
    """SIGTERM the head's process group, then SIGKILL what is left of it: the raylet and GCS outlive
    `ray start` itself, and on a quick machine the whole group may already be gone."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(head.pid, sig)
        except ProcessLookupError:
            return
        try:
            head.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass


def test_ray_job_submit_runs_a_simulated_sweep(tmp_path):
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(make_spec_dict()))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    dashboard = free_port()
    temp_dir = tempfile.mkdtemp(prefix="lg-ray-")  # short: Ray's socket paths must fit 107 bytes
    log = open(tmp_path / "head.log", "w")
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", "--port", str(free_port()),
                             "--dashboard-port", str(dashboard), "--include-dashboard=true", "--num-cpus", "2",
                             # Another Ray instance on this machine (the session fixture's, a user's)
                             # holds the default agent ports; the job agent then never comes up.
                             *(arg for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                                                "--metrics-export-port", "--runtime-env-agent-port",
                                                "--ray-client-server-port")
                               for arg in (flag, str(free_port()))),
                             "--num-gpus", "0", "--object-store-memory", str(200 * 2**20), "--disable-usage-stats",
                             "--temp-dir", temp_dir],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=tmp_path)
    try:
        address = f"http://127.0.0.1:{dashboard}"
        wait_ready(address, 120.0, head, path="/api/version", poll_s=0.5)
        # The job agent comes up after the dashboard answers (on a busy machine, later), and on CI the
        # dashboard once closed the submitting connection without an answer: both are retried, each
        # try writing to its own folder so that a job the dropped request did start cannot mix in.
        for attempt in range(30):
            out = tmp_path / f"results-{attempt}"
            job = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir",
                                  str(REPO), "--", "loadgen", "sweep", str(spec_path), "--out", str(out),
                                  "--no-figures"],
                                 env=env, capture_output=True, text=True, timeout=300)
            said = job.stdout + job.stderr
            if job.returncode == 0 or not any(s in said for s in ("No available agent", "Connection aborted")):
                break
            time.sleep(3)
        assert job.returncode == 0, (job.stdout[-3000:] + job.stderr[-3000:]
                                     + "\nhead log:\n" + (tmp_path / "head.log").read_text()[-2000:])
    finally:
        _stop_head(head)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)
    statuses = {p.parent.name: json.loads(p.read_text())["status"] for p in out.glob("runs/*/run.json")}
    assert statuses == {"base-s1": "completed", "burst-s1": "completed", "base-s2": "completed",
                        "burst-s2": "completed"}
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run_id"] for r in summary["runs"]} == set(statuses)
    assert "persistently degraded" in job.stdout  # the sweep's report, printed by the job's driver
