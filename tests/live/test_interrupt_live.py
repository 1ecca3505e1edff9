"""Ctrl-C in `loadgen run --endpoint` against serve-sim: the live run under way is cancelled by
asyncio.run, closes its files and says ``interrupted`` in its run.json (not ``running`` forever)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import yaml

from loadgen.core.runner import INTERRUPTED
from tests.conftest import make_spec_dict

TIME_SCALE = 20.0  # the 600 s spec takes 30 s of wall time per run: the signal lands mid-run
RUN_FOR_S = 3.0  # wall seconds the run goes before Ctrl-C: samples and turns recorded by then
WAIT_LIMIT_S = 60.0


def test_ctrl_c_marks_the_live_run_interrupted_and_keeps_its_rows(tmp_path, serve_sim_factory):
    server = serve_sim_factory(TIME_SCALE, "--pool-tokens", "160000")
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--out", str(out), "--endpoint",
                             server.url, "--time-scale", str(TIME_SCALE), "--no-report", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = out / "runs" / "base-s1"
    try:
        deadline = time.monotonic() + WAIT_LIMIT_S
        while True:  # until the first run has begun (after the preflight)
            try:
                if json.loads((run_dir / "run.json").read_text())["status"] == "running":
                    break
            except (OSError, ValueError):
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        time.sleep(RUN_FOR_S)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=WAIT_LIMIT_S)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr
    info = json.loads((run_dir / "run.json").read_text())
    assert (info["status"], info["error"]) == ("interrupted", INTERRUPTED)
    assert sorted(p.name for p in (out / "runs").iterdir()) == ["base-s1"]
    samples = pq.read_table(run_dir / "samples.parquet").to_pydict()
    assert 0 < len(samples["t_s"]) < 61 and max(samples["t_s"]) < 600  # recorded up to the interruption
