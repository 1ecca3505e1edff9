"""`loadgen run --workers N`: simulated runs and figures over N processes write the same bytes."""

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
