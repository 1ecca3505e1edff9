"""Loaders of the shipped shapes and of users' own traces, on hand-made fixtures in the documented formats."""

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trace_shapes import RecordedSession, TraceFormatError, load_swebench, load_trace

FIXTURES = Path(__file__).parent / "fixtures"


def _sessions(name: str, format: str) -> dict[str, RecordedSession]:
    return {s.session_id: s for s in load_trace(FIXTURES / name, format).sessions}


def test_shapes_format_keeps_every_call_and_null_gaps():
    sessions = _sessions("shapes.jsonl", "shapes")
    assert sessions["s-a"] == RecordedSession("s-a", "m1", (1000, 1300, 1340, 1500), (100, 50, 20, 10),
                                              (0.5, None, 2.0))
    assert sessions["s-b"].gaps_s == (1.0, 1.5) and sessions["s-c"].num_calls == 1


def test_tracelab_rounds_become_sessions_with_tool_and_human_gaps():
    trace = load_trace(FIXTURES / "tracelab.jsonl", "tracelab")
    sessions = {s.session_id: s for s in trace.sessions}
    a = sessions["A"]
    # round 1 listed first in the file; its repeat (99999 tokens) is dropped; prefix + append = 21000
    assert a.prompt_tokens == (20000, 21000, 21500) and a.output_tokens == (500, 300, 100)
    # 1.5 s: round 0 ends 10:00:06.0, round 1's last tool result lands 10:00:07.5;
    # 60 s: round 1 ends 10:00:10, the user writes again at 10:01:10
    assert a.gaps_s == (1.5, 60.0)
    assert sessions["C"].gaps_s == (None,) and sessions["C"].model == "unknown"
    assert any("repeat" in note for note in trace.notes)


def test_copilot_calls_of_all_turns_are_one_stream():
    trace = load_trace(FIXTURES / "copilot.jsonl", "copilot")
    sessions = {s.session_id: s for s in trace.sessions}
    cp1 = sessions["cp1"]
    assert cp1.prompt_tokens == (8000, 8700, 9500) and cp1.output_tokens == (200, 100, 300)
    assert cp1.gaps_s == pytest.approx((0.5, 56.5))  # 00:00:02.5 - 00:00:02; 00:01:00 - 00:00:03.5
    cp2 = sessions["cp2"]  # calls listed out of order, the second starts inside the first
    assert cp2.prompt_tokens == (500, 600) and cp2.gaps_s == (0.0,)
    assert "cp3" not in sessions and len(trace.notes) == 2


def test_bailian_requests_chain_to_their_root():
    trace = load_trace(FIXTURES / "bailian.jsonl", "bailian")
    sessions = {s.session_id: s for s in trace.sessions}
    assert sessions["1"].prompt_tokens == (500, 800, 1100) and sessions["1"].gaps_s == (4.5, 5.5)
    assert sessions["2"].num_calls == 1 and sessions["5"].num_calls == 1  # 5's parent 99 is not in the file
    assert any("missing" in note for note in trace.notes)


@pytest.mark.parametrize("name,format", [("shapes.jsonl", "shapes"), ("tracelab.jsonl", "tracelab"),
                                         ("copilot.jsonl", "copilot"), ("bailian.jsonl", "bailian")])
def test_gzip_and_parquet_read_like_jsonl(tmp_path, name, format):
    rows = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines() if line.strip()]
    gz = tmp_path / f"{name}.gz"
    with gzip.open(gz, "wt") as out:
        out.write("\n".join(json.dumps(r) for r in rows))
    parquet = tmp_path / name.replace(".jsonl", ".parquet")
    columns = dict.fromkeys(key for row in rows for key in row)  # every row's keys (from_pylist reads the first's)
    pq.write_table(pa.Table.from_pydict({key: [row.get(key) for row in rows] for key in columns}), parquet)
    expected = load_trace(FIXTURES / name, format).sessions
    assert load_trace(gz, format).sessions == expected
    assert load_trace(parquet, format).sessions == expected


def _error(tmp_path, text: str, format: str, name: str = "bad.jsonl") -> TraceFormatError:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, format)
    assert str(path) in str(info.value)
    return info.value


def test_malformed_rows_name_file_row_and_field(tmp_path):
    good = json.dumps({"calls": [[10, 1, 0.0]]})
    err = _error(tmp_path, good + "\n" + json.dumps({"calls": [[10, 1, 0.0], ["x", 1, 0.5]]}) + "\n", "shapes")
    assert (err.row, err.field) == (2, "calls[1][0]") and "expected an integer >= 1, got 'x'" in str(err)
    err = _error(tmp_path, good + "\n{not json\n", "shapes")
    assert err.row == 2 and "not valid JSON" in str(err)
    err = _error(tmp_path, json.dumps({"calls": [[10, 1, 0.0], [20, 1, -3]]}), "shapes")
    assert err.field == "calls[1][2]" and ">= 0" in str(err)
    err = _error(tmp_path, json.dumps({"calls": []}), "shapes")
    assert err.field == "calls" and "at least one call" in str(err)
    err = _error(tmp_path, "[1, 2]\n", "shapes")
    assert err.row == 1 and "expected an object" in str(err)


def test_malformed_rows_of_public_formats(tmp_path):
    round0 = {"session_id": "A", "round_index": 0, "input_tokens_total": 100}
    err = _error(tmp_path, json.dumps(round0), "tracelab")
    assert (err.row, err.field) == (1, "output_tokens") and "missing" in str(err)
    bad_time = {**round0, "output_tokens": 5, "timing_events": [{"event_type": "text", "timestamp": "yesterday"}]}
    err = _error(tmp_path, json.dumps(bad_time), "tracelab")
    assert err.field == "timing_events[0].timestamp" and "ISO-8601" in str(err)
    call = {"timestamp": "2026-06-01T00:00:00Z", "duration_ms": 10, "tokens": {"prompt": 0, "completion": 1}}
    err = _error(tmp_path, json.dumps({"session_id": "s", "turns": [{"llm_calls": [call]}]}), "copilot")
    assert err.field == "turns[0].llm_calls[0].tokens.prompt"
    loop = [{"chat_id": 1, "parent_chat_id": 2, "timestamp": 0, "input_length": 5, "output_length": 1},
            {"chat_id": 2, "parent_chat_id": 1, "timestamp": 1, "input_length": 5, "output_length": 1}]
    err = _error(tmp_path, "\n".join(json.dumps(r) for r in loop), "bailian")
    assert err.field == "parent_chat_id" and "loops" in str(err)


def test_unreadable_files(tmp_path):
    err = _error(tmp_path, "", "shapes")
    assert "no sessions" in str(err)
    err = _error(tmp_path, "plain text, not gzip", "shapes", name="bad.jsonl.gz")
    assert "gzip" in str(err)
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "missing.jsonl", "shapes")
    with pytest.raises(ValueError, match="unknown trace format 'sharegpt'"):
        load_trace(FIXTURES / "shapes.jsonl", "sharegpt")


def test_shipped_swebench_shapes():
    trace = load_swebench()
    assert len(trace.sessions) == 609
    models = sorted({s.model for s in trace.sessions})
    assert models == ["deepseek/deepseek-chat", "deepseek/deepseek-reasoner", "google/gemini-3-pro-preview"]
    # data/README.md: only the deepseek rows record tool gaps
    gemini = [s for s in trace.sessions if s.model.startswith("google/")]
    assert len(gemini) == 500 and all(g is None for s in gemini for g in s.gaps_s)
    assert all(g is not None for s in trace.sessions if s.model.startswith("deepseek/") for g in s.gaps_s)
