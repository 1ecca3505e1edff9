"""An endpoint given the way OpenAI clients are configured (base URL + /v1) is the same server."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import yaml

from tests.conftest import make_spec_dict


def test_run_with_an_endpoint_ending_in_v1_sends_requests_to_the_base_url(tmp_path, serve_sim_factory):
    server = serve_sim_factory(120.0)
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
