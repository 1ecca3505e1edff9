"""Ctrl-C in `loadgen sweep`: a real subprocess (its own local Ray cluster) sent SIGINT mid-sweep.

Every run that had not ended must say ``interrupted`` in its run.json, nothing prints a
traceback, and the next sweep runs exactly those runs and leaves the completed ones alone."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys

import pyarrow.parquet as pq
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


def test_ctrl_c_during_live_runs_stops_their_sessions_and_keeps_their_rows(ray_local, tmp_path):
    """The same Ctrl-C in a sweep of launched engines (serve-sim at 60x, a pair per seed, both pairs
    at once on the 4 fake GPUs): asyncio.run cancels the sweep, every run stops its sessions and
    closes its files before the actors go, and each run says interrupted."""
    data = make_spec_dict(engine={"kind": "serve_sim", "simulator": {"pool_tokens": 160_000}}, time_scale=60.0)
    spec = parse_spec(data)
    keys = run_keys(spec)

    def interrupt_soon(start) -> None:
        # a few seconds in (a few simulated minutes): rows recorded, no run near its end
        if start.key.run_id == "base-s1":
            asyncio.get_running_loop().call_later(3.0, signal.raise_signal, signal.SIGINT)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path, keys, on_run_start=interrupt_soon)
    for key in keys:
        run_dir = tmp_path / "runs" / key.run_id
        info = json.loads((run_dir / "run.json").read_text())
        assert (info["status"], info["error"]) == ("interrupted", INTERRUPTED)
        assert not (run_dir / ".parts").exists()  # the recorder closed: parts merged
        samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
        assert 0 < len(samples["t_s"]) < 61  # sampled from t = 0, stopped before the 600 s end
        assert max(samples["sessions_arrived_total"]) > 0
