"""`loadgen map` end to end on a tiny grid: a real subprocess, real files."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import yaml

from loadgen.analysis.outcomes import run_outcome
from loadgen.analysis.runs import load_run
from loadgen.core.runner import RunKey, run_simulated
from loadgen.map.grid import MapPoint, map_job, point_spec
from loadgen.map.run import run_point
from tests.conftest import make_spec, make_spec_dict

TINY_GRID = ["--rates", "0.02,0.05", "--trigger-factors", "0,2", "--seeds", "1-2", "--horizon-h", "0.25",
             "--bisect-steps", "1"]


def _loadgen(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True)


def test_a_tiny_map_end_to_end_then_a_rerun_only_redraws(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "map"
    proc = _loadgen("map", str(spec), "--out", str(out), *TINY_GRID, "--quiet")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "map.json").read_text())
    assert summary["num_runs"]["grid"] == 2 * 2 * 2 * 2 and summary["num_failed"] == 0
    cells = summary["cells"]
    assert {(c["controller"], c["rate_per_s"], c["trigger_factor"]) for c in cells} == {
        (c, r, f) for c in ("none", "budgeter") for r in (0.02, 0.05) for f in (0.0, 2.0)}
    assert all(c["n"] == 2 and c["p_low"] <= c["p"] <= c["p_high"] for c in cells)
    assert summary["bounds"]["drain_rate_per_s"] > 0 and summary["bounds"]["healthy_rate_per_s"] > 0
    assert "highest rate shown safe: P(degraded) < 10% by the 95% upper bound" in proc.stdout and proc.stdout.strip() == summary["report"]
    table = pq.read_table(out / "outcomes.parquet")
    grid_rows = [r for r in table.to_pylist() if r["phase"] == "grid"]
    assert len(grid_rows) == 16 and all(r["status"] == "completed" for r in grid_rows)
    # the table agrees with the cells it summarizes
    for c in cells:
        flags = [r["persistently_degraded"] for r in grid_rows if (r["controller"], r["rate_per_s"],
                                                                   r["trigger_factor"]) == (c["controller"],
                                                                                            c["rate_per_s"],
                                                                                            c["trigger_factor"])]
        assert sum(flags) == c["num_degraded"]
    assert (out / "figures" / "phase-diagram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "figures" / "controller-budgeter.png").is_file()

    map_bytes, table_bytes = (out / "map.json").read_bytes(), (out / "outcomes.parquet").read_bytes()
    proc = _loadgen("map", str(spec), "--out", str(out), *TINY_GRID, "--quiet", "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert "the map is complete: nothing to run" in proc.stderr
    assert (out / "map.json").read_bytes() == map_bytes
    assert (out / "outcomes.parquet").read_bytes() == table_bytes

    # one process or two: the same bytes (rows are sorted, every run owns its generators)
    one = tmp_path / "one-worker"
    proc = _loadgen("map", str(spec), "--out", str(one), *TINY_GRID, "--quiet", "--no-figures", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert (one / "map.json").read_bytes() == map_bytes
    assert (one / "outcomes.parquet").read_bytes() == table_bytes


def test_bad_map_input_is_an_error_naming_the_option(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("map", str(spec), "--out", str(tmp_path / "m"), "--rates", "0.05:0.02:0.01")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {spec}: --rates: range '0.05:0.02:0.01' needs start <= stop")
    proc = _loadgen("map", str(spec), "--out", str(tmp_path / "m"), "--controllers", "none,fancy")
    assert proc.returncode == 2 and "--controllers: unknown ['fancy']" in proc.stderr
    no_burst = tmp_path / "no-burst.yaml"
    no_burst.write_text(yaml.safe_dump(make_spec_dict(arms=[{"name": "base"}])))
    proc = _loadgen("map", str(no_burst), "--out", str(tmp_path / "m"), "--trigger-factors", "0,1")
    assert proc.returncode == 2 and "no arm of the spec has a `kind: burst` trigger" in proc.stderr
    assert not (tmp_path / "m").exists()


def test_a_map_point_has_the_outcome_of_the_same_run_written_to_disk(tmp_path):
    job = map_job(make_spec(), None, [2.0])
    point = MapPoint("none", 0.05, 2.0, 3, 600.0)
    row = run_point(job, point)
    run_simulated(point_spec(job, point), RunKey("map", 3), tmp_path)
    on_disk = run_outcome(load_run(tmp_path / "runs" / "map-s3"))
    for name in ("persistently_degraded", "hit_ratio_last10min", "sessions_in_system_last5min", "turns_completed",
                 "sessions_completed", "turns_per_s_last10min"):
        assert row[name] == on_disk[name], name
