"""Spec validation of the replayed-trace session kinds: every mistake is caught at spec load, by name."""

import json
from pathlib import Path
from typing import get_args

import pytest
import yaml

from loadgen.core.spec import SpecError, TraceFileSessionSpec, load_spec, parse_spec
from trace_shapes import FORMATS, TREE_FORMATS
from tests.conftest import make_spec_dict

FIXTURES = Path(__file__).parent / "trace_shapes" / "fixtures"


def _data(sessions: dict) -> dict:
    data = make_spec_dict()
    data["engine"]["pool_tokens"] = 400_000
    data["workload"]["sessions"] = sessions
    return data


def _error(sessions: dict, **engine) -> str:
    data = _data(sessions)
    data["engine"].update(engine)
    with pytest.raises(SpecError) as info:
        parse_spec(data, "my.yaml")
    return str(info.value)


def test_defaults_of_each_kind():
    swe = parse_spec(_data({"kind": "swebench"})).workload.sessions
    assert (swe.truncate_at_tokens, swe.system_prompt_tokens, swe.sampling, swe.gap_fallback.kind) == (
        38_000, 150, "without_replacement", "empirical")
    lab = parse_spec(_data({"kind": "tracelab_synthetic"})).workload.sessions
    assert lab.initial_context_median_tokens == 19_000 and lab.max_context_tokens() == 38_000


def test_the_spec_offers_every_loader_format():
    assert set(get_args(TraceFileSessionSpec.model_fields["format"].annotation)) == set(FORMATS) | set(TREE_FORMATS)


def test_missing_file_and_unknown_format_name_their_fields():
    msg = _error({"kind": "trace_file", "path": "/nowhere/trace.jsonl", "format": "shapes"})
    assert "my.yaml" in msg and "workload.sessions.path: no such file: /nowhere/trace.jsonl" in msg
    msg = _error({"kind": "trace_file", "path": str(FIXTURES / "shapes.jsonl"), "format": "sharegpt"})
    assert "workload.sessions.format" in msg and "'tracelab'" in msg


def test_malformed_row_fails_at_spec_load_naming_file_row_and_field(tmp_path):
    trace = tmp_path / "mine.jsonl"
    trace.write_text(json.dumps({"calls": [[100, 5, 0.0]]}) + "\n" + json.dumps({"calls": [[100, -5, 0.0]]}) + "\n")
    msg = _error({"kind": "trace_file", "path": str(trace), "format": "shapes"})
    assert f"{trace}: row 2: field 'calls[0][1]': expected an integer >= 0, got -5" in msg


def test_unknown_model_and_sessions_that_cannot_fit():
    msg = _error({"kind": "swebench", "models": ["gpt-9"]})
    assert "workload.sessions.models: no sessions of model(s) ['gpt-9']" in msg and "deepseek/deepseek-chat" in msg
    msg = _error({"kind": "swebench", "truncate_at_tokens": 1000})
    assert "no session fits truncate_at_tokens=1000" in msg
    msg = _error({"kind": "swebench", "truncate_at_tokens": 50_000})
    assert "sessions reach 50000 tokens of context, more than engine.max_model_len=40960" in msg
    msg = _error({"kind": "tracelab_synthetic"}, pool_tokens=32_000)
    assert "engine.pool_tokens=32000 is smaller than one session's context (38000 tokens)" in msg


def test_gap_fallback_needs_recorded_gaps_or_a_distribution(tmp_path):
    trace = tmp_path / "no-gaps.jsonl"
    trace.write_text(json.dumps({"calls": [[100, 5, 0.0], [120, 5, None]]}) + "\n")
    msg = _error({"kind": "trace_file", "path": str(trace), "format": "shapes"})
    assert "gap_fallback: the trace records no gaps to draw from" in msg
    spec = parse_spec(_data({"kind": "trace_file", "path": str(trace), "format": "shapes",
                             "gap_fallback": {"kind": "exponential", "mean_s": 0.3}}))
    assert spec.workload.sessions.gap_fallback.mean_s == 0.3
    msg = _error({"kind": "swebench", "gap_fallback": {"kind": "exponential"}})
    assert "workload.sessions.gap_fallback.mean_s: Field required" in msg


def test_relative_trace_paths_are_relative_to_the_spec(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rounds.jsonl").write_text((FIXTURES / "tracelab.jsonl").read_text())
    data = _data({"kind": "trace_file", "path": "traces/rounds.jsonl", "format": "tracelab",
                  "gap_fallback": {"kind": "exponential", "mean_s": 1.0}})
    spec_path = tmp_path / "exp.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    spec = load_spec(spec_path)
    assert spec.workload.sessions.path == str((tmp_path / "traces" / "rounds.jsonl").resolve())
