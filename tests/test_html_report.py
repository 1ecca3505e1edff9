"""`loadgen report DIR --html` opened in real headless Chromium: the page loads with no console
error, every figure decodes, nothing is fetched from elsewhere, the warnings come first."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.cli import main
from tests.browser import load_page, require_chromium
from tests.conftest import make_spec_dict

SCREENSHOT = os.environ.get("LOADGEN_REPORT_SCREENSHOT")  # a path: keep a screenshot of the page's top


@pytest.fixture
def results_with_warnings(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "res"
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"]) == 0
    # what a live run that fell behind its time scale records (loadgen.live.runner)
    run_json = out / "runs" / "burst-s1" / "run.json"
    info = json.loads(run_json.read_text())
    info.update(lagging=True, lag={"p50_s": 0.02, "p99_s": 0.4, "max_s": 0.5, "bound_s": 0.1, "source": "server"})
    run_json.write_text(json.dumps(info))
    # a run whose table is damaged: listed as unreadable, left out of the tables
    broken = out / "runs" / "burst-s2"
    (broken / "turns.parquet").write_bytes(b"not parquet")
    return out


def test_the_html_report_loads_in_chromium_with_every_figure_decoded(results_with_warnings, tmp_path):
    binary = require_chromium()
    out = results_with_warnings
    assert main(["report", str(out), "--html"]) == 1  # the unreadable run makes the report exit 1
    page_path = out / "report.html"
    text = page_path.read_text()
    num_pngs = len(list((out / "figures").glob("*.png")))
    assert num_pngs >= 4 and text.count('src="data:image/png;base64,') == num_pngs
    page = load_page(binary, page_path.as_uri(), screenshot=SCREENSHOT)
    assert page["console_errors"] == []
    assert page["external"] == []  # self-contained: nothing beside the file is needed
    assert len(page["images"]) == num_pngs
    assert all(i["complete"] and i["width"] > 0 and i["height"] > 0 for i in page["images"]), page["images"]
    assert any(i["alt"] == "pair-s1.png" for i in page["images"])
    order = page["order"]
    assert order[0].startswith("H1:") and order[1] == "warnings"  # every warning before the first table
    assert order.index("warnings") < next(i for i, e in enumerate(order) if e.startswith("PRE:"))
    assert "run burst-s1 lagged" in text and "unreadable run burst-s2" in text
    assert "Paired outcomes: experiment tiny" in text and "Latency per arm" in text
    assert "experiment: tiny" in text  # the spec, at the end


def test_the_html_report_of_a_map_shows_its_phase_diagram(tmp_path):
    binary = require_chromium()
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp_path / "map"
    assert main(["map", str(spec), "--out", str(out), "--rates", "0.05", "--trigger-factors", "0,2", "--seeds", "1",
                 "--horizon-h", "0", "--bisect-steps", "0", "--quiet", "--no-figures", "--workers", "1"]) == 0
    assert main(["report", str(out), "--html"]) == 0
    page = load_page(binary, (out / "report.html").as_uri())
    assert page["console_errors"] == [] and page["external"] == []
    assert [i["alt"] for i in page["images"]][0] == "phase-diagram.png"
    assert all(i["complete"] and i["width"] > 0 for i in page["images"])
    assert "no-warnings" in page["order"]
    assert pq.read_table(out / "outcomes.parquet").num_rows == 4
    assert "budgets tried, admit/park" in (out / "report.html").read_text()


def test_every_kind_of_warning_is_listed(tmp_path):
    from loadgen.analysis.html_report import results_warnings

    runs = tmp_path / "runs"
    for run_id, info in {
        "a-s1": {"status": "failed", "error": "2 session(s) crashed (sessions.parquet status 'error' has the exception)",
                 "counts": {"sessions_crashed": 2}},
        "a-s2": {"status": "interrupted", "error": "stopped", "counts": {"sessions_crashed": 1}},
        "a-s3": {"status": "completed", "error": None, "lagging": True,
                 "lag": {"p99_s": 0.4, "bound_s": 0.1, "source": "driver"}},
        "a-s4": {"status": "completed", "error": None},
    }.items():
        (runs / run_id).mkdir(parents=True)
        (runs / run_id / "run.json").write_text(json.dumps({"run_id": run_id, **info}))
    warnings = results_warnings(tmp_path, {"unreadable_runs": [{"run_id": "a-s5", "error": "bad turns.parquet"}]})
    assert warnings == [
        "run a-s1 did not complete (status failed): 2 session(s) crashed (sessions.parquet status 'error' has the "
        "exception); left out of the tables",
        "run a-s2 did not complete (status interrupted): stopped; left out of the tables",
        "run a-s2: 1 session(s) crashed (sessions.parquet status 'error' has the exception)",
        "run a-s3 lagged: the driver's timers fired p99 0.4 s late (bound 0.1 s); its timings are not the spec's",
        "unreadable run a-s5 (left out of the tables): bad turns.parquet",
    ]
