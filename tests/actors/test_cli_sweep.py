"""What `loadgen run` and `loadgen sweep` say about engines they cannot run (no cluster started)."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.conftest import make_spec_dict


def _loadgen(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True)


def test_run_sends_a_launched_engine_to_sweep(tmp_path):
    spec = tmp_path / "vllm.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict(engine={"kind": "vllm", "model": "Qwen/Qwen3-8B"})))
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "loadgen sweep" in proc.stderr


def test_sweep_refuses_a_shared_endpoint_before_starting_a_cluster(tmp_path):
    spec = tmp_path / "openai.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict(engine={"kind": "openai", "url": "http://127.0.0.1:1"})))
    proc = _loadgen("sweep", str(spec), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "loadgen run --endpoint" in proc.stderr
    assert not (tmp_path / "out").exists()
