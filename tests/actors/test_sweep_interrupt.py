"""Ctrl-C in `loadgen sweep`: a real subprocess (its own local Ray cluster) sent SIGINT mid-sweep.

Every run that had not ended must say ``interrupted`` in its run.json, nothing prints a
traceback, and the next sweep runs exactly those runs and leaves the completed ones alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from actors.sweep import run_sweep
from loadgen.core.runner import INTERRUPTED, run_keys
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

pytestmark = pytest.mark.ray

# 6 simulated runs of several hours each on a 2-CPU cluster: when the first ends, others wait
SPEC = dict(duration_s=6 * 3600, seeds=[1, 2, 3])
WAIT_LIMIT_S = 240


def test_ctrl_c_marks_unfinished_runs_interrupted_and_the_next_sweep_runs_just_those(ray_local, tmp_path):
    data = make_spec_dict(**SPEC)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "sweep", str(spec_path), "--out", str(out),
                             "--no-report"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    try:
        for line in proc.stderr:  # one line per run that ended: "<run_id>: <status>, N turns"
            lines.append(line)
            if ": completed," in line:
                proc.send_signal(signal.SIGINT)
                break
        _, rest = proc.communicate(timeout=WAIT_LIMIT_S)
    finally:
        proc.kill()
    stderr = "".join(lines) + rest
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted: runs that ended are on disk" in stderr

    spec = parse_spec(data)
    keys = run_keys(spec)
    infos = {key.run_id: json.loads((out / "runs" / key.run_id / "run.json").read_text()) for key in keys}
    completed = {run_id for run_id, info in infos.items() if info["status"] == "completed"}
    interrupted = {run_id for run_id, info in infos.items() if info["status"] == "interrupted"}
    assert completed and interrupted and completed | interrupted == set(infos), infos
    assert all(infos[run_id]["error"] == INTERRUPTED and infos[run_id]["spec"]["seeds"] == [infos[run_id]["seed"]]
               for run_id in interrupted)
    kept = {run_id: (out / "runs" / run_id / "turns.parquet").read_bytes() for run_id in completed}

    ran = []
    results = run_sweep(spec, out, keys, spec_dir=tmp_path, on_run_done=lambda key, info: ran.append(key.run_id))
    assert sorted(ran) == sorted(interrupted)
    assert {r["status"] for r in results} == {"completed"}
    assert all((out / "runs" / run_id / "turns.parquet").read_bytes() == content for run_id, content in kept.items())
