"""`loadgen export`: the tables read back equal the Parquet rows; the llm-d reports validate
against llm-d-benchmark's published schema; the AIPerf records carry AIPerf's names."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from loadgen.analysis.export import read_turns_csv
from loadgen.cli import main
from tests.conftest import make_spec_dict

SCHEMA = Path(__file__).parent / "schemas" / "llmd_benchmark_report_v0_2_1.json"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(make_spec_dict()))
    out = tmp / "res"
    assert main(["run", str(spec), "--out", str(out), "--quiet", "--no-report"]) == 0
    return out


def _parquet_rows(out: Path) -> tuple[list[dict], object]:
    summary = json.loads((out / "summary.json").read_text())
    tables = [pq.read_table(out / "runs" / r["run_id"] / "turns.parquet") for r in summary["runs"]]
    return [row for t in tables for row in t.to_pylist()], tables[0].schema


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    return a == b


def test_csv_and_jsonl_turns_read_back_equal_the_parquet_rows(results):
    assert main(["export", str(results), "--format", "csv"]) == 0
    assert main(["export", str(results), "--format", "jsonl"]) == 0
    rows, schema = _parquet_rows(results)
    assert len(rows) > 100
    from_csv = read_turns_csv(results / "export" / "csv" / "turns.csv", schema).to_pylist()
    assert len(from_csv) == len(rows)
    assert all(_same(x[k], y[k]) for x, y in zip(from_csv, rows) for k in schema.names)
    lines = (results / "export" / "jsonl" / "turns.jsonl").read_text().splitlines()
    from_jsonl = [json.loads(line) for line in lines]
    assert list(from_jsonl[0]) == schema.names
    # JSON has no NaN: a NaN float is null
    nan_to_none = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in rows]
    assert from_jsonl == nan_to_none


def test_the_per_run_summary_exports_as_the_summary_says(results):
    summary = json.loads((results / "summary.json").read_text())
    runs = [json.loads(line) for line in (results / "export" / "jsonl" / "runs.jsonl").read_text().splitlines()]
    assert runs == summary["runs"]
    import csv

    with open(results / "export" / "csv" / "runs.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["run_id"] for r in table] == [r["run_id"] for r in summary["runs"]]
    assert [float(r["hit_ratio_last10min"]) for r in table] == [r["hit_ratio_last10min"] for r in summary["runs"]]


def test_llm_d_benchmark_reports_validate_against_the_published_schema(results):
    import jsonschema

    assert main(["export", str(results), "--format", "llm-d"]) == 0
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    paths = sorted((results / "export" / "llm-d").glob("*.benchmark_report.json"))
    assert [p.name for p in paths] == ["base-s1.benchmark_report.json", "base-s2.benchmark_report.json",
                                       "burst-s1.benchmark_report.json", "burst-s2.benchmark_report.json"]
    for path in paths:
        report = json.loads(path.read_text())
        errors = sorted(validator.iter_errors(report), key=str)
        assert not errors, [f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors][:5]
        turns = pq.read_table(results / "runs" / path.name.split(".")[0] / "turns.parquet")
        ok = np.array([e is None for e in turns.column("error").to_pylist()])
        aggregate = report["results"]["request_performance"]["aggregate"]
        assert aggregate["requests"]["total"] == turns.num_rows
        ttft = (turns.column("first_token_s").to_numpy() - turns.column("admit_s").to_numpy())[ok]
        assert aggregate["latency"]["time_to_first_token"]["p50"] == pytest.approx(float(np.quantile(ttft, 0.5)))
        assert aggregate["latency"]["time_to_first_token"]["units"] == "s"
    # a report the schema refuses (the check can fail)
    bad = {**report, "results": {"request_performance": {"aggregate": {"requests": {"total": -1}}}}}
    assert list(validator.iter_errors(bad))


def test_aiperf_profile_export_records_use_aiperf_names(results):
    assert main(["export", str(results), "--format", "aiperf"]) == 0
    path = results / "export" / "aiperf" / "burst-s1" / "profile_export.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    turns = pq.read_table(results / "runs" / "burst-s1" / "turns.parquet").to_pylist()
    assert len(records) == len(turns)
    aiperf_metrics = {"input_sequence_length", "time_to_first_token", "request_latency", "output_sequence_length",
                      "inter_token_latency", "error_isl"}
    for record, turn in zip(records, turns):
        assert set(record) == {"metadata", "metrics", "error"}
        assert set(record["metrics"]) <= aiperf_metrics
        assert record["metadata"]["turn_index"] == turn["turn_index"]
        assert record["metadata"]["request_start_ns"] == round(turn["admit_s"] * 1e9)
        if turn["error"] is None:
            ttft_ms = (turn["first_token_s"] - turn["admit_s"]) * 1e3
            assert record["metrics"]["time_to_first_token"] == {"value": pytest.approx(ttft_ms), "unit": "ms"}
            assert record["metrics"]["input_sequence_length"] == {"value": turn["prompt_tokens"], "unit": "tokens"}


def test_an_unknown_format_is_refused_naming_the_choices(results, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export", str(results), "--format", "xml"])
    assert exc.value.code == 2 and "invalid choice: 'xml'" in capsys.readouterr().err
