"""A simulated spec run against an endpoint: the endpoint given the way OpenAI clients are configured
(base URL + /v1) is the same server, and the spec's pool is checked against the endpoint's."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import yaml

from tests.conftest import make_spec_dict


def test_run_with_an_endpoint_ending_in_v1_sends_requests_to_the_base_url(tmp_path, serve_sim_factory):
    server = serve_sim_factory(120.0, "--pool-tokens", "160000")  # the spec's pool
    data = make_spec_dict(duration_s=240, seeds=[3])
    data["arms"] = [{"name": "base"}]
    (tmp_path / "live.yaml").write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(tmp_path / "live.yaml"), "--out",
                           str(tmp_path / "out"), "--endpoint", server.url + "/v1/", "--time-scale", "120",
                           "--quiet", "--no-report"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "out" / "runs" / "base-s3"
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "completed" and info["spec"]["engine"]["url"] == server.url
    errors = pq.read_table(run_dir / "turns.parquet").column("error").to_pylist()
    assert len(errors) > 10 and errors == [None] * len(errors)  # no /v1/v1/completions 404s


def test_a_spec_sized_for_another_pool_is_refused_until_the_pool_is_chosen(tmp_path, serve_sim_factory):
    server = serve_sim_factory(120.0)  # 400,000 tokens; the spec simulates 160,000
    data = make_spec_dict(duration_s=120, seeds=[3])
    data["arms"] = [{"name": "base"}]
    (tmp_path / "live.yaml").write_text(yaml.safe_dump(data))

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(tmp_path / "live.yaml"), "--out",
                               str(tmp_path / "out"), "--endpoint", server.url, "--time-scale", "120", "--quiet",
                               "--no-report", *extra], capture_output=True, text=True, timeout=120)

    refused = run()
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "engine.pool_tokens" in refused.stderr and "160000-token" in refused.stderr
    assert "--pool-tokens 400000" in refused.stderr
    assert not (tmp_path / "out" / "runs").exists()
    chosen = run("--pool-tokens", "400000")
    assert chosen.returncode == 0, chosen.stderr
    info = json.loads((tmp_path / "out" / "runs" / "base-s3" / "run.json").read_text())
    assert info["pool_tokens"] == 400_000
