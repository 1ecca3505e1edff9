"""notebooks/compare_controllers.ipynb runs top to bottom on a small results directory."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from loadgen import run_experiment, run_keys
from loadgen.core.spec import parse_spec
from tests.conftest import make_spec_dict

NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "compare_controllers.ipynb"


def _small_controller_experiment(out: Path) -> None:
    data = make_spec_dict()
    data["seeds"] = [1]
    data["workload"]["arrival_rate_per_s"] = 0.1
    burst = [{"kind": "burst", "extra_rate_factor": 3.0, "start_s": 0, "duration_s": 120}]
    data["arms"] = [
        {"name": "none", "triggers": burst, "controller": {"name": "none", "start_s": 120}},
        {"name": "cap", "triggers": burst, "controller": {"name": "session-cap", "params": {"k": 2, "k_hi": 3},
                                                          "start_s": 120}},
        {"name": "budgeter", "triggers": burst, "controller": {"name": "budgeter", "start_s": 120}},
    ]
    spec = parse_spec(data)
    run_experiment(spec, out, run_keys(spec))


def test_notebook_compares_the_arms_of_a_results_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    _small_controller_experiment(results)
    monkeypatch.setenv("LOADGEN_RESULTS", str(results))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()

    text = "".join(out.get("text", "") for cell in nb.cells for out in cell.get("outputs", []))
    assert "tiny: 3 runs in arms ['none', 'cap', 'budgeter']" in text
    assert "Recovery: experiment tiny" in text and "Paired outcomes: experiment tiny" in text
    assert "cap-s1" in text and "session-cap" in text
    images = [out for cell in nb.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) == 5
    # the latency and interval tables are DataFrames: one row per arm, one per (arm, metric)
    html = [out["data"]["text/html"] for cell in nb.cells for out in cell.get("outputs", [])
            if "text/html" in out.get("data", {})]
    assert len(html) == 2 and "TTFT p90 s" in html[0] and "budgeter" in html[0]
    assert "95% low" in html[1] and "tasks finished" in html[1] and "against none:" in text


def test_notebook_shows_only_the_chosen_arms_and_names_a_missing_directory(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    results = tmp_path / "results"
    _small_controller_experiment(results)
    monkeypatch.setenv("LOADGEN_RESULTS", str(results))
    monkeypatch.setenv("LOADGEN_ARMS", "none,budgeter")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    html = [out["data"]["text/html"] for cell in nb.cells for out in cell.get("outputs", [])
            if "text/html" in out.get("data", {})]
    assert "budgeter" in html[0] and "session-cap" not in html[0]

    monkeypatch.setenv("LOADGEN_RESULTS", str(tmp_path / "nowhere"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.raises(Exception) as failed:
        NotebookClient(nb, timeout=120, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    assert "ResultsError" in str(failed.value) and "nowhere: does not exist" in str(failed.value)


def test_the_notebook_says_how_to_start_it_with_loadgen_results() -> None:
    import json

    intro = "".join(json.loads(NOTEBOOK.read_text())["cells"][0]["source"])
    assert "LOADGEN_RESULTS=$PWD/results/recovery .venv/bin/jupyter lab notebooks/compare_controllers.ipynb" in intro
    assert "loadgen run examples/recovery.yaml --out results/recovery" in intro
