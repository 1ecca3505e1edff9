"""``loadgen run --replicates R``: the twin's step jitter drawn per (seed, arm, replicate), and
P(persistently degraded) per seed from the replicates."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

JITTERED = {"t0_s": 0.0047581690710813114, "a_s_per_token": 5.581950821694808e-05,
            "b_s_per_token2": 3.2058731149544043e-09, "g_s_per_token": 6.059118819781442e-08,
            "name": "jittered", "step_jitter_sigma": 0.2}


def _spec(**engine):
    data = make_spec_dict(duration_s=300, seeds=[1])
    data["engine"] = {**data["engine"], **engine}
    return parse_spec(data)


def _turns(out, key):
    return pq.read_table(out / "runs" / key.run_id / "turns.parquet").to_pydict()


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_replicated_runs_are_deterministic_per_seed_and_replicate(tmp_path, flavor):
    spec = _spec(cost_model=JITTERED, flavor=flavor)
    key = RunKey("base", 1)
    runs = {}
    for name, replicate in (("a", 0), ("b", 0), ("c", 1)):
        run_simulated(spec, key, tmp_path / name, replicate=replicate)
        runs[name] = _turns(tmp_path / name, key)
    assert runs["a"] == runs["b"]  # the same (seed, replicate): the same run, bit for bit
    assert runs["a"]["finish_s"] != runs["c"]["finish_s"]  # another jitter draw: other step times
    assert len(runs["a"]["finish_s"]) > 10


def test_without_jitter_the_run_is_what_it_was(tmp_path):
    """sigma 0 draws nothing: the model without the key and with sigma 0 give one run."""
    key = RunKey("base", 1)
    plain = {k: v for k, v in JITTERED.items() if k != "step_jitter_sigma"}
    run_simulated(_spec(cost_model=plain), key, tmp_path / "plain")
    run_simulated(_spec(cost_model={**plain, "step_jitter_sigma": 0.0}), key, tmp_path / "zero", replicate=3)
    assert _turns(tmp_path / "plain", key) == _turns(tmp_path / "zero", key)


def _loadgen(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True)


def test_run_replicates_reports_the_probability_of_degradation_per_seed(tmp_path):
    data = make_spec_dict(duration_s=300, seeds=[1, 2])
    data["engine"] = {**data["engine"], "cost_model": JITTERED}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "res"), "--quiet", "--no-report", "--replicates", "3")
    assert proc.returncode == 0, proc.stderr
    table = json.loads((tmp_path / "res" / "replicates.json").read_text())
    assert table["num_replicates"] == 3 and set(table["runs"]) == {"base-s1", "burst-s1", "base-s2", "burst-s2"}
    for row in table["runs"].values():
        assert len(row["degraded"]) == 3 and row["p_degraded"] == sum(row["degraded"]) / 3
    assert (tmp_path / "res" / "replicates" / "r2" / "runs" / "burst-s2" / "run.json").is_file()
    assert "P(persistently degraded) over 3 step-jitter replicates" in proc.stdout


def test_replicates_of_a_model_without_jitter_are_refused(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "res"), "--replicates", "4")
    assert proc.returncode == 2 and "the cost model has no step jitter" in proc.stderr, proc.stderr


def test_replicates_over_workers_are_the_same_bytes_as_one_after_another(tmp_path):
    data = make_spec_dict(duration_s=300, seeds=[1])
    data["engine"] = {**data["engine"], "cost_model": JITTERED}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    outs = {}
    for workers in ("1", "2"):
        out = outs[workers] = tmp_path / f"w{workers}"
        proc = _loadgen("run", str(spec), "--out", str(out), "--quiet", "--no-report", "--replicates", "3",
                        "--workers", workers)
        assert proc.returncode == 0, proc.stderr
    files = sorted(p.relative_to(outs["1"]) for p in (outs["1"] / "replicates").rglob("*.parquet"))
    assert len(files) >= 4  # two runs x two replicates, turns at least
    for rel in [*files, "replicates.json"]:
        assert (outs["1"] / rel).read_bytes() == (outs["2"] / rel).read_bytes(), rel


def test_replicates_of_seeds_run_in_batches_add_up_and_resume_skips_the_done_ones(tmp_path):
    data = make_spec_dict(duration_s=300, seeds=[1, 2])
    data["engine"] = {**data["engine"], "cost_model": JITTERED}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "res"
    for seed in ("1", "2"):
        proc = _loadgen("run", str(spec), "--out", str(out), "--no-report", "--replicates", "3", "--seeds", seed)
        assert proc.returncode == 0, proc.stderr
        # one progress line for the 4 replicate runs (2 arms x replicates 1 and 2), not a line each
        (line,) = [ln for ln in proc.stderr.splitlines() if "replicate" in ln]
        assert line.startswith("replicates") and "4/4" in line, proc.stderr
    table = json.loads((out / "replicates.json").read_text())
    assert set(table["runs"]) == {"base-s1", "burst-s1", "base-s2", "burst-s2"}  # the first batch kept
    assert all(len(row["final_window_only"]) == 3 for row in table["runs"].values())
    before = (out / "replicates" / "r2" / "runs" / "base-s1" / "turns.parquet").stat().st_mtime_ns
    proc = _loadgen("run", str(spec), "--out", str(out), "--no-report", "--replicates", "3", "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "0/0" in next(ln for ln in proc.stderr.splitlines() if ln.startswith("replicates"))  # none ran again
    assert (out / "replicates" / "r2" / "runs" / "base-s1" / "turns.parquet").stat().st_mtime_ns == before
    assert json.loads((out / "replicates.json").read_text()) == table
    # another R into the same directory would mix probabilities over different counts
    proc = _loadgen("run", str(spec), "--out", str(out), "--no-report", "--replicates", "4", "--seeds", "1")
    assert proc.returncode == 2 and "holds 3 replicates per run" in proc.stderr and "--replicates 3" in proc.stderr


def test_the_replicates_listing_names_runs_degraded_only_in_their_final_window_as_the_paired_table_does():
    from loadgen.replicates import format_replicates

    summary = {"num_replicates": 2, "runs": {
        "burst-s503": {"degraded": [True, True], "final_window_only": [True, False], "p_degraded": 1.0},
        "burst-s504": {"degraded": [True, True], "final_window_only": [False, False], "p_degraded": 1.0},
        "burst-s505": {"degraded": [False, True], "p_degraded": 0.5}}}  # written before final_window_only
    lines = format_replicates(summary).splitlines()
    assert lines[1].split()[1:3] == ["1.00", "degraded"]
    assert "(1 of 2 only in the final window: 'final' in the paired table)" in lines[1]
    assert lines[2].endswith("1.00  degraded") and lines[3].endswith("0.50  borderline")
