"""What `loadgen run` and `loadgen sweep` say about engines, fleets and clusters they cannot use
(no cluster started, but for the last test)."""

from __future__ import annotations

import os
import socket
import json
import subprocess
import sys
import threading

import pytest
import yaml

from actors.cluster import ClusterUnreachable, check_answers
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict
from tests.servers import free_port


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


@pytest.mark.parametrize("fleets", ["-1", "0"])
def test_sweep_refuses_fewer_than_one_fleet_before_starting_a_cluster(tmp_path, fleets):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("sweep", str(spec), "--out", str(tmp_path / "out"), "--fleets", fleets)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: --fleets must be a number of session-fleet actors >= 1, got {fleets}"
    assert not (tmp_path / "out" / "runs").exists()


def test_sweep_to_an_address_where_nothing_listens_fails_at_once_naming_it(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    address = f"127.0.0.1:{free_port()}"  # bound and released: nothing listens there
    # ray.init alone would still be retrying this address minutes later; the limit is the 30 s
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "sweep", str(spec), "--out", str(tmp_path / "out"),
                           "--address", address], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: --address {address}: no Ray cluster answers there")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "runs").exists()


def test_ray_address_from_the_environment_is_named_as_such(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "sweep", str(spec), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "RAY_ADDRESS": address})
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: $RAY_ADDRESS {address}: no Ray cluster answers there")


@pytest.mark.parametrize("address", ["head-node", "10.0.0.5:port", "10.0.0.5:70000"])
def test_an_address_without_a_port_is_refused_saying_what_is_expected(address):
    with pytest.raises(ClusterUnreachable, match="expected the head node's host:port"):
        check_answers(address)


def test_something_that_listens_but_is_not_a_ray_head_is_refused():
    """A server that accepts the connection but answers no gRPC: told apart from a dead port."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_http1() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

        thread = threading.Thread(target=answer_http1)
        thread.start()
        with pytest.raises(ClusterUnreachable, match="not a Ray head"):
            check_answers(f"127.0.0.1:{port}")
        thread.join()


@pytest.mark.ray
def test_a_live_ray_head_answers_the_probe(ray_local):
    gcs = ray_local.get_runtime_context().gcs_address
    check_answers(gcs)  # the GCS's own address
    check_answers("127.0.0.1:" + gcs.rsplit(":", 1)[1])  # and on loopback, as a user types it


def test_sweep_refuses_a_directory_of_another_spec_before_starting_a_cluster(tmp_path):
    out = tmp_path / "out"
    run_dir = out / "runs" / "base-s1"
    run_dir.mkdir(parents=True)
    recorded = parse_spec(make_spec_dict(duration_s=900, seeds=[1])).model_dump(mode="json")
    (run_dir / "run.json").write_text(json.dumps({"run_id": "base-s1", "status": "completed", "spec": recorded}))
    spec = tmp_path / "sim.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    proc = _loadgen("sweep", str(spec), "--out", str(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "holds runs of another spec (e.g. base-s1)" in proc.stderr and "duration_s (900.0 vs 600.0)" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["runs"]  # nothing written, no cluster started
