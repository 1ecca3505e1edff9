"""`loadgen run --workers N`: simulated runs and figures over N processes write the same bytes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from loadgen.core.run_pool import run_pooled
from tests.conftest import make_spec_dict


def _loadgen(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_one_worker_and_two_workers_write_identical_bytes(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict(seeds=[1, 2, 3])))
    written = {}
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        proc = _loadgen("run", str(spec), "--out", str(out), "--quiet", "--workers", workers)
        assert proc.returncode == 0, proc.stderr
        written[workers] = _files(out)
    assert any(name.startswith("figures/") for name in written["1"])
    assert len([n for n in written["1"] if n.endswith("turns.parquet")]) == 6
    assert written["1"] == written["2"]


def test_bad_workers_is_a_clear_error(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "out"), "--workers", "0")
    assert proc.returncode == 2
    assert "--workers must be >= 1, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def _square(x: int) -> int:
    return x * x


def test_pooled_results_come_back_for_every_key_and_starts_are_told():
    started = []
    done = {key: result for key, result, _ in run_pooled(_square, list(range(7)), 3, started.append)}
    assert done == {k: k * k for k in range(7)}
    assert sorted(started) == list(range(7))


def _fails(x: int) -> int:
    raise ValueError(f"bad key {x}")


def test_an_exception_escaping_the_work_is_raised_in_the_parent():
    try:
        list(run_pooled(_fails, [1, 2], 2))
    except RuntimeError as exc:
        assert "bad key" in str(exc)
    else:
        raise AssertionError("the worker's exception was lost")


def _dies_on_two(x: int) -> int:
    if x == 2:
        os._exit(3)  # what an out-of-memory kill looks like from here: no exception, no result
    return x


def test_a_worker_that_dies_gives_its_key_the_lost_result_and_the_others_finish():
    lost = []
    done = {key: result for key, result, _ in run_pooled(
        _dies_on_two, [1, 2, 3, 4], 2, on_lost=lambda key, code: lost.append((key, code)) or "lost")}
    assert done == {1: 1, 2: "lost", 3: 3, 4: 4}
    assert lost == [(2, 3)]


def test_a_run_whose_worker_dies_is_recorded_failed_and_the_experiment_goes_on(tmp_path, monkeypatch):
    import loadgen.experiment as experiment
    from loadgen import run_keys
    from loadgen.core.spec import parse_spec

    spec = parse_spec(make_spec_dict(seeds=[1, 2]))
    real = experiment._simulate_one

    def dies_in_burst_s1(spec, out_dir, spec_dir, key):
        if key.run_id == "burst-s1":
            (out_dir / "runs" / key.run_id).mkdir(parents=True)
            (out_dir / "runs" / key.run_id / "run.json").write_text('{"run_id": "burst-s1", "status": "running"}')
            os._exit(9)
        return real(spec, out_dir, spec_dir, key)

    monkeypatch.setattr(experiment, "_simulate_one", dies_in_burst_s1)
    results = experiment.run_experiment(spec, tmp_path, run_keys(spec), num_workers=2)
    assert [r["status"] for r in results] == ["completed", "failed", "completed", "completed"]
    recorded = json.loads((tmp_path / "runs" / "burst-s1" / "run.json").read_text())
    assert recorded["status"] == "failed" and "worker process died (exit code 9)" in recorded["error"]
