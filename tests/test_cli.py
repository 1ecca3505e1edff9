"""The command line as a user drives it: a real subprocess, real files."""

import json
import subprocess
import sys

import yaml

from tests.conftest import make_spec_dict


def _loadgen(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_run_then_report_writes_the_documented_layout(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "res"
    proc = _loadgen("run", str(spec), "--out", str(out), "--seeds", "2", "--quiet")
    assert proc.returncode == 0, proc.stderr
    for run_id in ("base-s2", "burst-s2"):
        for name in ("turns.parquet", "samples.parquet", "run.json"):
            assert (out / "runs" / run_id / name).is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run_id"] for r in summary["runs"]} == {"base-s2", "burst-s2"}
    fields = {"run_id", "experiment", "arm", "seed", "duration_s", "hit_ratio_last10min",
              "sessions_in_system_last5min", "persistently_degraded", "turns_completed",
              "sessions_completed", "turns_per_s_last10min"}
    assert all(fields <= set(r) for r in summary["runs"])
    assert summary["pairs"]["baseline_arm"] == "base"
    assert "Paired outcomes" in proc.stdout
    assert (out / "figures" / "pair-s2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (out / "summary.json").unlink()
    proc = _loadgen("report", str(out), "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "summary.json").read_text()) == summary


def test_bad_spec_fails_before_running_and_names_the_field(tmp_path):
    data = make_spec_dict()
    data["workload"]["arrival_rate_per_s"] = -0.5
    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(data))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "res"))
    assert proc.returncode == 2
    assert "bad.yaml" in proc.stderr and "workload.arrival_rate_per_s" in proc.stderr
    assert not (tmp_path / "res").exists()


def test_unknown_seed_and_missing_results_are_clear_errors(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "res"), "--seeds", "77")
    assert proc.returncode == 2 and "seeds [77]" in proc.stderr
    proc = _loadgen("report", str(tmp_path / "nothing-here"))
    assert proc.returncode == 2 and "nothing-here: does not exist" in proc.stderr


def test_validate_and_cost_fit():
    proc = _loadgen("validate", "examples/paired-burst.yaml")
    assert proc.returncode == 0 and "24" not in proc.stderr and "2 arms x 12 seeds" in proc.stdout
    proc = _loadgen("cost-fit")
    assert proc.returncode == 0 and "t0=" in proc.stdout and "cold prefill 20K" in proc.stdout


def test_report_prints_the_recovery_table_only_with_control(tmp_path):
    data = make_spec_dict()
    data["arms"][1]["controller"] = {"name": "budgeter", "start_s": 300}
    spec = tmp_path / "ctl.yaml"
    spec.write_text(yaml.safe_dump(data))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "ctl"), "--seeds", "1", "--quiet", "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert "Recovery: experiment tiny" in proc.stdout and "budgeter" in proc.stdout
    summary = json.loads((tmp_path / "ctl" / "summary.json").read_text())
    assert [row["arm"] for row in summary["recovery"]] == ["base", "burst"]

    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("run", str(plain), "--out", str(tmp_path / "plain"), "--seeds", "1", "--quiet", "--no-figures")
    assert proc.returncode == 0 and "Recovery" not in proc.stdout
