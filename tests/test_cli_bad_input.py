"""Bad input, as a user types it: a message naming the field or flag and what is expected, exit
code 2, no Python traceback, and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from loadgen.analysis import ResultsError, load_results
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict


def _loadgen(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True, cwd=cwd)


def _spec_file(tmp_path, name="spec.yaml", **overrides):
    data = make_spec_dict(**overrides)
    if "duration_min" in overrides:
        del data["duration_s"]
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def _refused(proc, *expected):
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()
    assert error and error[0].startswith("error: "), proc.stderr
    for text in expected:
        assert text in proc.stderr, proc.stderr


@pytest.mark.parametrize("flags,expected", [
    (["--seeds", "5-1"], "--seeds: seed range '5-1' runs backwards: expected LOW-HIGH with LOW <= HIGH, e.g. 1-5"),
    (["--seeds", "abc"], "--seeds: cannot read seeds 'abc': expected whole numbers >= 0, e.g. 501-512 or 1,2,3"),
    (["--seeds=-3"], "--seeds: seed -3 is negative: seeds are whole numbers >= 0"),
    (["--endpoint", "localhost:8000"],
     "--endpoint: 'localhost:8000' has no scheme: expected a URL like http://localhost:8000"),
    (["--endpoint", "http://127.0.0.1:99999"], "--endpoint: 'http://127.0.0.1:99999': the port is not a number"),
    (["--time-scale", "20"], "--time-scale applies to live runs only (with --endpoint URL, or a spec whose engine "
                             "is kind openai)"),
    (["--pool-tokens", "131072"], "--pool-tokens applies to live runs only"),
    (["--pool-tokens", "0", "--endpoint", "http://127.0.0.1:8000"], "--pool-tokens must be a number of tokens > 0"),
    (["--cost-model", "nosuch-preset"], "--cost-model: cost model file nosuch-preset: cannot read JSON"),
    (["--cost-model", "vllm-cpu-tiny-qwen3", "--endpoint", "http://127.0.0.1:8000"],
     "--cost-model applies to simulated runs; --endpoint runs engine kind 'openai'"),
])
def test_bad_run_flags_are_refused_before_anything_runs(tmp_path, flags, expected):
    spec = _spec_file(tmp_path)
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "res"), "--quiet", *flags)
    _refused(proc, expected)
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("overrides,expected", [
    ({"seeds": [2.7]}, "seeds: seed 2.7 is not a whole number: expected whole numbers >= 0"),
    ({"seeds": [4, -1]}, "seeds: seed -1 is negative: seeds are whole numbers >= 0"),
    ({"seeds": [True]}, "seeds: seed true is not a whole number"),
    ({"duration_min": True}, "duration_min: expected a number of minutes, got true"),
    ({"duration_s": True}, "duration_s: expected a number, got true"),
    # a duration given in minutes is named in minutes, though the spec holds it in seconds
    ({"duration_min": 0}, "duration_min: Input should be greater than 0"),
    ({"arms": [{"name": "burst", "triggers": [{"kind": "burst", "start_min": 1, "duration_min": 0,
                                               "extra_rate_factor": 2}]}]},
     "arms[0].triggers[0].duration_min: Input should be greater than 0"),
    ({"engine": {"kind": "openai", "url": "localhost:8000"}},
     "engine.url: 'localhost:8000' has no scheme: expected a URL like http://localhost:8000"),
    ({"engine": {"kind": "openai", "url": "http://r:8000", "session_header": "X Session"}},
     "engine.session_header: 'X Session' is not an HTTP header name"),
    ({"engine": {"kind": "openai", "url": "http://r:8000", "metrics_urls": ["http://a:8000", "b:8000"]}},
     "engine.metrics_urls: [1]: 'b:8000' has no scheme: expected a URL like http://b:8000"),
    ({"engine": {"kind": "openai", "url": "http://r:8000", "metrics_urls": []}},
     "engine.metrics_urls: an empty list: give the replicas' base URLs, or leave metrics_urls out"),
    ({"engine": {"kind": "sim", "offload": {"cpu_tokens": 900000, "vllm_version": "latest"}}},
     "engine.offload.vllm_version: a vLLM version like 0.11 or 0.12.0 is expected, got 'latest'"),
    ({"engine": {"kind": "sim", "offload": {"cpu_tokens": 900000, "link": "both"}}}, "engine.offload.link"),
    ({"engine": {"kind": "sim", "flavor": "sglang", "sglang": {"overlap_schedule": "maybe"}}},
     "engine.sglang.overlap_schedule"),
    ({"engine": {"kind": "sim", "flavor": "sglang", "cost_model": {
        "t0_s": 0.005, "a_s_per_token": 0, "b_s_per_token2": 0, "g_s_per_token": 0, "hidden_cpu_s": 0.01}}},
     "hidden_cpu_s: expected a number from 0 to t0_s"),
])
def test_bad_spec_values_name_the_field_and_what_is_expected(tmp_path, overrides, expected):
    spec = _spec_file(tmp_path, "bad.yaml", **overrides)
    proc = _loadgen("run", str(spec), "--out", str(tmp_path / "res"), "--quiet")
    _refused(proc, "bad.yaml: invalid spec", expected)
    assert not (tmp_path / "res").exists()
    _refused(_loadgen("validate", str(spec)), expected)


def test_a_boolean_is_not_taken_for_a_number_anywhere_in_a_spec(tmp_path):
    data = make_spec_dict()
    data["workload"]["sessions"]["num_turns"] = True
    data["arms"][1]["triggers"][0] = {"kind": "burst", "extra_rate_factor": 2.0, "start_min": True, "duration_s": 60}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    proc = _loadgen("validate", str(tmp_path / "bad.yaml"))
    _refused(proc, "workload.sessions.num_turns: expected a number, got true",
             "arms[1].triggers[0].start_min: expected a number of minutes, got true")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/"])
def test_an_endpoint_given_with_v1_is_accepted_as_its_base_url(url):
    spec = parse_spec(make_spec_dict(engine={"kind": "openai", "url": url}))
    assert spec.engine.url == "http://127.0.0.1:8000"
    prefixed = parse_spec(make_spec_dict(engine={"kind": "openai", "url": "https://gw.example/openai/v1/"}))
    assert prefixed.engine.url == "https://gw.example/openai"


def test_shapes_describe_refuses_a_negative_truncation():
    _refused(_loadgen("shapes", "describe", "swebench", "--truncate-at", "-5"),
             "--truncate-at must be a positive number of tokens, got -5")
    _refused(_loadgen("shapes", "describe", "swebench", "--over", "0"),
             "--over must be a positive number of tokens, got 0")


def test_validate_reads_every_file_the_spec_names(tmp_path):
    spec = _spec_file(tmp_path, engine={"kind": "sim", "pool_tokens": 160_000, "cost_model": "cost.json"})
    _refused(_loadgen("validate", str(spec)),
             f"engine.cost_model: no such file: {tmp_path / 'cost.json'} (expected a cost.json")
    (tmp_path / "cost.json").write_text('{"t0_s": 0.01,')
    _refused(_loadgen("validate", str(spec)), f"engine.cost_model: {tmp_path / 'cost.json'}: not a cost model")
    (tmp_path / "cost.json").write_text('{"t0": 0.01}')
    _refused(_loadgen("validate", str(spec)), "engine.cost_model", "unknown cost-model fields ['t0']")
    # a model names every coefficient: a missing one is not filled with a default
    (tmp_path / "cost.json").write_text(json.dumps({"t0_s": 0.01}))
    _refused(_loadgen("validate", str(spec)), "engine.cost_model",
             "missing cost-model coefficients ['a_s_per_token', 'b_s_per_token2', 'g_s_per_token']")
    (tmp_path / "cost.json").write_text(json.dumps({"t0_s": 0.01, "a_s_per_token": "fast", "b_s_per_token2": 0,
                                                    "g_s_per_token": -1}))
    _refused(_loadgen("validate", str(spec)), "engine.cost_model", "a_s_per_token", "a finite number >= 0")
    (tmp_path / "cost.json").write_text(json.dumps({"t0_s": 0.01, "a_s_per_token": 5e-5, "b_s_per_token2": 3e-9,
                                                    "g_s_per_token": 5e-8}))
    proc = _loadgen("validate", str(spec))
    assert proc.returncode == 0 and "spec.yaml: ok" in proc.stdout, proc.stderr
    inline = _spec_file(tmp_path, "inline.yaml", engine={"kind": "sim", "pool_tokens": 160_000,
                                                          "cost_model": {"t0_s": 0.01, "a_s_per_token": 5e-5}})
    _refused(_loadgen("validate", str(inline)), "cost_model",
             "missing cost-model coefficients ['b_s_per_token2', 'g_s_per_token']")

    launched = _spec_file(tmp_path, "launched.yaml", engine={
        "kind": "serve_sim", "num_gpus": 0, "simulator": {"pool_tokens": 160_000, "cost_model": "missing.json"}})
    _refused(_loadgen("validate", str(launched)), "engine.simulator.cost_model: no such file")

    trace = _spec_file(tmp_path, "trace.yaml")
    data = yaml.safe_load(trace.read_text())
    data["workload"]["sessions"] = {"kind": "trace_file", "path": "calls.jsonl", "format": "shapes"}
    trace.write_text(yaml.safe_dump(data))
    _refused(_loadgen("validate", str(trace)), "workload.sessions.path: no such file:", "calls.jsonl")
    (tmp_path / "calls.jsonl").write_text("not json\n")
    _refused(_loadgen("validate", str(trace)), "workload.sessions:", "calls.jsonl: row 1: not valid JSON")


def test_a_notebook_gets_the_error_loadgen_report_prints(tmp_path):
    missing = tmp_path / "no-results"
    proc = _loadgen("report", str(missing))
    _refused(proc)
    with pytest.raises(ResultsError) as info:
        load_results(missing)
    assert proc.stderr.strip() == f"error: {info.value}"
    assert f"{missing}: does not exist; run `loadgen run SPEC --out {missing}` first" in str(info.value)
    (tmp_path / "not-results").mkdir()
    with pytest.raises(ResultsError, match="is not a results directory \\(no runs/ folder\\)"):
        load_results(tmp_path / "not-results")


def test_calibrate_needs_an_output_or_a_model_to_check_before_it_connects(tmp_path):
    _refused(_loadgen("calibrate", "--endpoint", "http://127.0.0.1:9"), "give --out (the cost.json to write), "
                                                                        "--check COST_MODEL, or both")
    _refused(_loadgen("calibrate", "--endpoint", "http://127.0.0.1:9", "--check", str(tmp_path / "none.json")),
             "--check: cost model file", "(or a preset: ")


def test_a_calibrated_cost_model_goes_into_the_runs_spec(tmp_path):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"t0_s": 0.002, "a_s_per_token": 2e-5, "b_s_per_token2": 1e-9,
                                "g_s_per_token": 1e-7, "name": "measured"}))
    proc = _loadgen("run", str(_spec_file(tmp_path)), "--out", str(tmp_path / "res"), "--quiet", "--no-report",
                    "--cost-model", str(cost))
    assert proc.returncode == 0, proc.stderr
    recorded = yaml.safe_load((tmp_path / "res" / "spec.yaml").read_text())
    assert recorded["engine"]["cost_model"] == json.loads(cost.read_text())


# one representative mistake per subcommand; argparse's own usage errors are included
EVERY_SUBCOMMAND = {
    "run": ["run", "{spec}", "--out", "{tmp}/r", "--seeds", "9-2"],
    "sweep": ["sweep", "{tmp}/missing.yaml", "--out", "{tmp}/s"],
    "serve-sim": ["serve-sim", "--time-scale", "0"],
    "report": ["report", "{tmp}/nothing"],
    "calibrate": ["calibrate", "--endpoint", "127.0.0.1:8000", "--out", "{tmp}/cost.json"],
    "compare": ["compare", "{tmp}/a", "{tmp}/b"],
    "validate": ["validate", "{tmp}/bad.yaml"],
    "cost-fit": ["cost-fit", "--bogus"],
    "shapes describe": ["shapes", "describe", "{tmp}/no-such-trace.jsonl"],
}


@pytest.mark.parametrize("name", sorted(EVERY_SUBCOMMAND))
def test_no_subcommand_prints_a_traceback_for_a_users_mistake(tmp_path, name):
    spec = _spec_file(tmp_path)
    _spec_file(tmp_path, "bad.yaml", seeds="abc")
    args = [a.format(spec=spec, tmp=tmp_path) for a in EVERY_SUBCOMMAND[name]]
    proc = _loadgen(*args)
    assert proc.returncode == 2, (name, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.strip(), (name, proc.stderr)


@pytest.mark.parametrize("flag, value, expected", [
    ("--repeats", "0", "--repeats must be >= 1"),
    ("--max-num-batched-tokens", "0", "--max-num-batched-tokens must be >= 1"),
    ("--max-num-batched-tokens", "-8", "--max-num-batched-tokens must be >= 1"),
    ("--time-scale", "0", "--time-scale must be a number > 0"),
    ("--time-scale", "nan", "--time-scale must be a number > 0"),
    ("--tolerance", "-0.1", "--tolerance must be a number >= 0"),
])
def test_calibrate_refuses_its_bad_flags_before_it_measures_anything(tmp_path, flag, value, expected):
    # no server listens there: the flag is checked before any request
    proc = _loadgen("calibrate", "--endpoint", "http://127.0.0.1:9", "--out", str(tmp_path / "cost.json"),
                    flag, value)
    _refused(proc, expected)
    assert not (tmp_path / "cost.json").exists()


@pytest.fixture
def html_server():
    """A web server that answers every GET with an HTML page and 200 (not an API server)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<!doctype html><html><body>Welcome to nginx!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_an_endpoint_that_answers_html_is_named_with_what_came_back(tmp_path, html_server):
    expected = f"{html_server}/v1/models answered HTTP 200 with text/HTML, not the JSON model list"
    _refused(_loadgen("calibrate", "--endpoint", html_server, "--out", str(tmp_path / "cost.json")), expected,
             "Welcome to nginx!")
    proc = _loadgen("run", str(_spec_file(tmp_path)), "--endpoint", html_server, "--out", str(tmp_path / "res"),
                    "--quiet")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and expected in proc.stderr, proc.stderr


@pytest.mark.parametrize("flags, expected", [
    (["--cost-model", "nope"], "error: --cost-model: unknown cost-model preset 'nope'; valid presets: ["),
    (["--offload-cpu-tokens", "-5"], "error: --offload-cpu-tokens: Input should be greater than 0\n"),
])
def test_serve_sim_names_a_bad_flag_without_the_validators_text(flags, expected):
    proc = _loadgen("serve-sim", *flags)
    _refused(proc, expected)
    assert "pydantic" not in proc.stderr and "validation error" not in proc.stderr
