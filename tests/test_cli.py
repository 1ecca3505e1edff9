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


def test_seeds_asked_for_run_and_a_mistyped_arm_or_folder_is_a_clear_error(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "res"
    # the spec's seeds are a default: a seed asked for runs, and its runs record it
    proc = _loadgen("run", str(spec), "--out", str(out), "--seeds", "77", "--arms", "base", "--quiet",
                    "--no-figures")
    assert proc.returncode == 0, proc.stderr
    info = json.loads((out / "runs" / "base-s77" / "run.json").read_text())
    assert info["seed"] == 77 and info["spec"]["seeds"] == [77] and info["status"] == "completed"
    proc = _loadgen("run", str(spec), "--out", str(out), "--arms", "base,brust")
    assert proc.returncode == 2 and "--arms: no arm 'brust'; the spec's arms: base, burst" in proc.stderr
    proc = _loadgen("report", str(out / "runs" / "base-s77"))
    assert proc.returncode == 2
    assert f"is one run's folder; its results directory is {out}: `loadgen report {out}`" in proc.stderr
    proc = _loadgen("report", str(tmp_path / "nothing-here"))
    assert proc.returncode == 2 and "nothing-here: does not exist" in proc.stderr


def test_validate_and_cost_fit():
    proc = _loadgen("validate", "examples/paired-burst.yaml")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == "examples/paired-burst.yaml: ok: experiment 'paired-burst', 2 arms x 12 seeds, 90 min per run\n"
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


def _run_ids(out):
    return sorted(p.name for p in (out / "runs").iterdir())


def test_run_refuses_a_directory_of_another_spec_unless_forced(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "res"
    assert _loadgen("run", str(spec), "--out", str(out), "--seeds", "1", "--quiet", "--no-figures").returncode == 0
    # more seeds and one arm of the same spec go into the same directory
    proc = _loadgen("run", str(spec), "--out", str(out), "--seeds", "2", "--arms", "base", "--quiet", "--no-figures")
    assert proc.returncode == 0, proc.stderr
    assert _run_ids(out) == ["base-s1", "base-s2", "burst-s1"]

    data = make_spec_dict()
    data["workload"]["arrival_rate_per_s"] = 0.05
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(data))
    before = (out / "runs" / "base-s1" / "turns.parquet").read_bytes()
    proc = _loadgen("run", str(changed), "--out", str(out), "--seeds", "1", "--quiet", "--no-figures")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "workload.arrival_rate_per_s (0.03 vs 0.05)" in proc.stderr and "--force-new-spec" in proc.stderr
    assert (out / "runs" / "base-s1" / "turns.parquet").read_bytes() == before  # refused: nothing touched

    proc = _loadgen("run", str(changed), "--out", str(out), "--seeds", "1", "--quiet", "--no-figures",
                    "--force-new-spec")
    assert proc.returncode == 0, proc.stderr
    assert f"moved the runs of the previous spec to {out / 'previous-1'}/" in proc.stderr
    assert _run_ids(out) == ["base-s1", "burst-s1"] and _run_ids(out / "previous-1") == ["base-s1", "base-s2", "burst-s1"]
    assert (out / "runs" / "base-s1" / "turns.parquet").read_bytes() != before
    summary = json.loads((out / "summary.json").read_text())
    assert {r["run_id"] for r in summary["runs"]} == {"base-s1", "burst-s1"}
    # the old runs are still a results directory of their own
    assert _loadgen("report", str(out / "previous-1"), "--no-figures").returncode == 0


def test_report_refuses_to_pair_runs_of_different_specs(tmp_path):
    for name, rate in (("a", 0.03), ("b", 0.05)):
        data = make_spec_dict()
        data["workload"]["arrival_rate_per_s"] = rate
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
        proc = _loadgen("run", str(tmp_path / f"{name}.yaml"), "--out", str(tmp_path / name), "--seeds", "1",
                        "--arms", "base" if name == "a" else "burst", "--quiet", "--no-report")
        assert proc.returncode == 0, proc.stderr
    # a run copied by hand from another experiment's directory
    (tmp_path / "b" / "runs" / "burst-s1").rename(tmp_path / "a" / "runs" / "burst-s1")
    proc = _loadgen("report", str(tmp_path / "a"), "--no-figures")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "runs of different specs cannot share one paired table: base-s1 and burst-s1 differ in " \
           "workload.arrival_rate_per_s (0.03 vs 0.05)" in proc.stderr
    assert "Paired outcomes" not in proc.stdout and not (tmp_path / "a" / "summary.json").exists()


def test_report_lists_a_run_with_a_corrupt_parquet_file_and_goes_on(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "res"
    assert _loadgen("run", str(spec), "--out", str(out), "--quiet", "--no-report").returncode == 0
    (out / "runs" / "burst-s2" / "samples.parquet").write_bytes(b"PAR1 truncated by a full disk")
    proc = _loadgen("report", str(out), "--no-figures")
    # exit code 1, as for a failed run: the table is there, but without every run
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "unreadable runs (not counted): burst-s2" in proc.stdout
    assert "unreadable run burst-s2" in proc.stderr and "samples.parquet" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(r["run_id"] for r in summary["runs"]) == ["base-s1", "base-s2", "burst-s1"]
    (entry,) = summary["unreadable_runs"]
    assert entry["run_id"] == "burst-s2" and "runs/burst-s2/samples.parquet: malformed samples.parquet" in entry["error"]
    assert summary["pairs"]["comparisons"][0]["n_pairs"] == 1

    # rows of a run that died mid-way, in a part file that is corrupt: listed, not merged, not fatal
    parts = out / "runs" / "base-s1" / ".parts"
    parts.mkdir()
    (parts / "turns-00001.arrow").write_bytes(b"junk")
    proc = _loadgen("report", str(out), "--no-figures")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "unreadable runs (not counted): base-s1, burst-s2" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run_id"] for r in summary["runs"]] == ["base-s2", "burst-s1"]
    assert "rows that cannot be merged into the run's tables (turns-00001.arrow)" in summary["unreadable_runs"][0]["error"]
