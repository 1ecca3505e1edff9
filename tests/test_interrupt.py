"""Ctrl-C in `loadgen run`: a real subprocess sent SIGINT mid-run, then run again.

The run under way must say ``interrupted`` in its run.json (not ``running`` forever, not
``failed``), the runs that ended stay as they are, nothing prints a traceback, and running the
command again completes the interrupted run with the files an uninterrupted run writes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from loadgen.core.runner import INTERRUPTED, RunKey, run_simulated
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

# a day of simulated traffic: a few seconds per run, so the signal lands while a run is under way
LONG_RUN = dict(duration_s=86_400, seeds=[1, 2])
POLL_S = 0.05
WAIT_LIMIT_S = 120.0


def _status(run_dir: Path):
    try:
        return json.loads((run_dir / "run.json").read_text())["status"]
    except (OSError, ValueError, KeyError):
        return None


def _wait_for_status(run_dir: Path, status: str, proc: subprocess.Popen) -> None:
    """Poll until ``run_dir``'s run.json says ``status`` (the run has begun); a guard, not a timing."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while _status(run_dir) != status:
        assert proc.poll() is None, f"loadgen exited with {proc.returncode} before {run_dir.name} began"
        assert time.monotonic() < deadline, f"{run_dir.name} never reached {status}"
        time.sleep(POLL_S)


def _interrupt_long_run(tmp_path: Path, workers: str, under_way: list[str],
                        num_days: int = 1) -> tuple[dict, list, Path, str, int]:
    """Start `loadgen run` on a long spec, send SIGINT (to it alone) once the runs ``under_way``
    have begun; (spec, args, out, stderr, exit code)."""
    data = make_spec_dict(**{**LONG_RUN, "duration_s": LONG_RUN["duration_s"] * num_days})
    spec_path = tmp_path / "long.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    args = [sys.executable, "-m", "loadgen.cli", "run", str(spec_path), "--out", str(out), "--no-report", "--quiet",
            "--workers", workers]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for run_id in under_way:
            _wait_for_status(out / "runs" / run_id, "running", proc)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=WAIT_LIMIT_S)
    finally:
        proc.kill()
    return data, args, out, stderr, proc.returncode


def test_ctrl_c_marks_the_run_under_way_interrupted_and_running_again_completes_it(tmp_path):
    # runs go seed-major: base-s1, burst-s1, base-s2, burst-s2; stop during the second
    data, args, out, stderr, returncode = _interrupt_long_run(tmp_path, "1", ["burst-s1"])
    assert returncode == 130
    assert "Traceback" not in stderr
    assert stderr.strip().startswith("interrupted: runs that ended are on disk")
    runs = out / "runs"
    assert _status(runs / "base-s1") == "completed"
    interrupted = json.loads((runs / "burst-s1" / "run.json").read_text())
    assert (interrupted["status"], interrupted["error"]) == ("interrupted", INTERRUPTED)
    assert sorted(p.name for p in runs.iterdir()) == ["base-s1", "burst-s1"]  # the rest never began

    again = subprocess.run([*args, "--seeds", "1"], capture_output=True, text=True, timeout=WAIT_LIMIT_S)
    assert again.returncode == 0, again.stderr
    assert _status(runs / "burst-s1") == "completed"
    # the rerun left nothing of the interrupted attempt behind: its files are an uninterrupted run's
    fresh = run_simulated(parse_spec(data), RunKey("burst", 1), tmp_path / "fresh")
    assert fresh["status"] == "completed"
    for name in ("turns.parquet", "sessions.parquet", "samples.parquet", "run.json"):
        assert (runs / "burst-s1" / name).read_bytes() == (tmp_path / "fresh" / "runs" / "burst-s1" / name).read_bytes()


def test_ctrl_c_with_two_workers_marks_both_runs_under_way_interrupted(tmp_path):
    # the first two runs start together, one per worker; the signal reaches the parent only. Four
    # days: the first run must still be under way when the second worker, started later, begins
    # its run (a day, ~3 s, was once over before a loaded machine's second worker got there)
    data, args, out, stderr, returncode = _interrupt_long_run(tmp_path, "2", ["base-s1", "burst-s1"], num_days=4)
    assert returncode == 130
    assert "Traceback" not in stderr
    runs = out / "runs"
    for run_id in ("base-s1", "burst-s1"):
        info = json.loads((runs / run_id / "run.json").read_text())
        assert (info["status"], info["error"]) == ("interrupted", INTERRUPTED)
    assert sorted(p.name for p in runs.iterdir()) == ["base-s1", "burst-s1"]  # the rest never began

    again = subprocess.run([*args, "--seeds", "1"], capture_output=True, text=True, timeout=WAIT_LIMIT_S)
    assert again.returncode == 0, again.stderr
    fresh = run_simulated(parse_spec(data), RunKey("base", 1), tmp_path / "fresh")
    assert fresh["status"] == "completed"
    for name in ("turns.parquet", "sessions.parquet", "samples.parquet", "run.json"):
        assert (runs / "base-s1" / name).read_bytes() == (tmp_path / "fresh" / "runs" / "base-s1" / name).read_bytes()
