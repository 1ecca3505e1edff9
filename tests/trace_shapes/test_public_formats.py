"""Mooncake, AIPerf multi-turn, the generic calls format and Hugging Face datasets: each loader on
small files in the formats' documented fields, malformed rows named, replay through a spec."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import SpecError, parse_spec
from tests.conftest import make_spec_dict
from trace_shapes import (LoaderOptions, RecordedSession, ReplayOptions, TraceFormatError, build_replay, load_hf,
                          load_trace)

FIXTURES = Path(__file__).parent / "fixtures"


def _by_id(trace) -> dict[str, RecordedSession]:
    return {s.session_id: s for s in trace.sessions}


# ---------------------------------------------------------------- mooncake
def test_mooncake_requests_chain_into_sessions_by_block_hashes():
    trace = load_trace(FIXTURES / "mooncake.jsonl", "mooncake")
    sessions = _by_id(trace)
    assert list(sessions) == ["row1", "row2", "row4", "row6"]
    # rows 3 and 5 extend row 1's and row 3's full blocks ([0, 1], [0, 1, 5]) and its response
    a = sessions["row1"]
    assert (a.prompt_tokens, a.output_tokens, a.gaps_s) == ((1300, 1700, 2200), (200, 100, 30), (3.0, 6.0))
    # block 0 is every session's (the system prompt); row 6 forks row 3 (already continued by row 5),
    # so it starts a session sharing [0, 1, 5] with session row1, whose first prompt shares [0, 1] with it
    assert (a.shared_prefix_tokens, a.prefix_key) == (1024, "1")
    assert (sessions["row2"].shared_prefix_tokens, sessions["row2"].prefix_key) == (512, "0")
    assert (sessions["row4"].prompt_tokens, sessions["row4"].prefix_key) == ((800,), "0")
    assert (sessions["row6"].shared_prefix_tokens, sessions["row6"].prefix_key) == (1536, "5")
    notes = "\n".join(trace.notes)
    for needle in ("6 requests without session_id chained by block hashes into 4 sessions",
                   "4 of 4 sessions start with a prefix other sessions send too: 3 distinct shared prefixes",
                   "2 prefix blocks are shared by several distinct prefixes (nested sharing): replay sends 3 extra",
                   "1 blocks of later turns are also sent by other sessions", "1 requests extend an earlier request",
                   "intervals between request starts"):
        assert needle in notes, needle


def test_mooncake_session_ids_and_delays():
    trace = load_trace(FIXTURES / "mooncake_sessions.jsonl", "mooncake")
    sessions = _by_id(trace)
    a, b = sessions["conv-a"], sessions["conv-b"]
    assert (a.prompt_tokens, a.output_tokens, a.gaps_s) == ((1100, 1500), (40, 20), (2.5,))  # delay, not timestamps
    assert (a.shared_prefix_tokens, a.prefix_key) == (b.shared_prefix_tokens, b.prefix_key) == (1024, "11")
    assert not any("request starts" in note for note in trace.notes)


def test_mooncake_prefixes_reach_the_replayed_shapes():
    trace = load_trace(FIXTURES / "mooncake.jsonl", "mooncake")
    replay = build_replay(trace.sessions, ReplayOptions(38_000))
    shapes = {replay.pool[i].session_id: replay.make(i, np.random.default_rng(0)) for i in range(len(replay.pool))}
    assert (shapes["row2"].shared_prefix_tokens, shapes["row2"].prefix_key) == (512, "system:0")
    assert shapes["row4"].prefix_key == shapes["row2"].prefix_key != shapes["row1"].prefix_key
    # a trace that records nothing shared keeps the option's one-for-all system prompt
    plain = build_replay([RecordedSession("x", "m", (900,), (5,), ())], ReplayOptions(38_000, shared_prefix_tokens=100))
    assert plain.make(0, np.random.default_rng(0)).shared_prefix_tokens == 100


def _error(tmp_path, rows: list, format: str, options=None) -> TraceFormatError:
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(TraceFormatError) as info:
        load_trace(path, format, options)
    assert str(path) in str(info.value)
    return info.value


def test_malformed_mooncake_rows_are_named(tmp_path):
    good = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}
    err = _error(tmp_path, [good, {"timestamp": 1, "output_length": 5}], "mooncake")
    assert (err.row, err.field) == (2, "input_length") and "missing" in str(err)
    err = _error(tmp_path, [{**good, "hash_ids": [0, 1, 2]}], "mooncake")
    assert err.field == "hash_ids" and "3 block hashes for 600 tokens: at most 2 blocks of 512" in str(err)
    err = _error(tmp_path, [{**good, "hash_ids": [0, "x"]}], "mooncake")
    assert err.field == "hash_ids[1]"
    err = _error(tmp_path, [good, {**good, "session_id": "s", "delay": -4}], "mooncake")
    assert (err.row, err.field) == (2, "delay") and ">= 0" in str(err)


# ---------------------------------------------------------------- aiperf
@pytest.fixture
def word_tokenizer(tmp_path) -> str:
    """One token a whitespace-separated word: counts a test can do by hand."""
    tokenizers = pytest.importorskip("tokenizers")
    words = "You are a terse assistant . what is kv cache ? and prefix caching hello".split()
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(words))}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def test_aiperf_turns_accumulate_history_with_the_responses(word_tokenizer):
    trace = load_trace(FIXTURES / "aiperf.jsonl", "aiperf", LoaderOptions(tokenizer=word_tokenizer))
    sessions = _by_id(trace)
    chat = sessions["chat-1"]
    # system 6 words, sent before every turn; turn inputs 6 and 4 words; outputs 20 and 30
    assert (chat.prompt_tokens, chat.output_tokens, chat.gaps_s) == ((12, 6 + 6 + 20 + 4), (20, 30), (1.5,))
    hello = sessions["chat-2"]
    assert hello.prompt_tokens == (7,) and hello.shared_prefix_tokens == chat.shared_prefix_tokens == 6
    assert hello.prefix_key == chat.prefix_key is not None  # the same system text: one shared prefix
    agent = sessions["agent-1"]  # mooncake_trace session rows: input_length is what each turn adds
    assert (agent.prompt_tokens, agent.output_tokens) == ((300, 300 + 40 + 150, 490 + 20 + 50), (40, 20, 10))
    assert agent.gaps_s == (0.2, None) and agent.shared_prefix_tokens is None  # a timestamp after delays: unknown
    assert any("system prompts" in note for note in trace.notes)


def test_aiperf_rows_that_cannot_be_counted_are_named(tmp_path, word_tokenizer):
    trace = load_trace(_write(tmp_path, [{"session_id": "s", "turns": [{"text": "hello you", "output_length": 3}]}]),
                       "aiperf")  # no tokenizer: one token a word, as serve-sim counts, and a note says so
    assert trace.sessions[0].prompt_tokens == (2,) and any("no tokenizer given" in n for n in trace.notes)
    options = LoaderOptions(tokenizer=word_tokenizer)
    err = _error(tmp_path, [{"session_id": "s", "turns": [{"text": "hello"}]}], "aiperf", options)
    assert err.field == "turns[0].output_length" and "default_output_tokens" in str(err)
    assert load_trace(_write(tmp_path, [{"turns": [{"text": "hello"}]}]), "aiperf",
                      LoaderOptions(word_tokenizer, default_output_tokens=8)).sessions[0].output_tokens == (8,)
    err = _error(tmp_path, [{"session_id": "s", "turns": [{"texts": ["a", "b"], "output_length": 3}]}], "aiperf", options)
    assert err.field == "turns[0].texts" and "client-side batch" in str(err)
    err = _error(tmp_path, [{"session_id": "s", "input_length": 10, "output_length": 3, "delay": 5, "timestamp": 9}],
                 "aiperf")
    assert err.field == "delay" and "cannot be set together" in str(err)
    err = _error(tmp_path, [{"session_id": "s", "messages": [{"role": "user", "content": "x"}]}], "aiperf")
    assert err.field == "messages"
    with pytest.raises(TraceFormatError, match="tokenizer: no such file"):
        load_trace(FIXTURES / "aiperf.jsonl", "aiperf", LoaderOptions(tokenizer=str(tmp_path / "none.json")))


def _write(tmp_path, rows: list, name: str = "rows.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


# ---------------------------------------------------------------- calls
def test_calls_whole_context_or_appended_input(tmp_path):
    rows = [{"session_id": "w", "turn_index": 1, "input_tokens": 700, "output_tokens": 10, "gap_s": 0.4},
            {"session_id": "w", "turn_index": 0, "input_tokens": 500, "output_tokens": 50, "model": "m"},
            {"session_id": "d", "new_input_tokens": 100, "output_tokens": 20, "timestamp_s": 10},
            {"session_id": "d", "new_input_tokens": 30, "output_tokens": 5, "timestamp_s": 12.5}]
    trace = load_trace(_write(tmp_path, rows), "calls")
    sessions = _by_id(trace)
    assert sessions["w"] == RecordedSession("w", "m", (500, 700), (50, 10), (0.4,))
    assert sessions["d"] == RecordedSession("d", "unknown", (100, 150), (20, 5), (2.5,))
    assert any("1 gaps are intervals between call starts" in note for note in trace.notes)
    err = _error(tmp_path, [{"session_id": "d", "output_tokens": 3}], "calls")
    assert err.field == "input_tokens" and "new_input_tokens" in str(err)


# ---------------------------------------------------------------- Hugging Face datasets
@pytest.fixture
def hf_dataset(tmp_path) -> Path:
    datasets = pytest.importorskip("datasets")
    table = {"conversation": ["c1", "c1", "c1", "c2"], "turn": [0, 1, 2, 0], "prompt_len": [900, 1300, 1800, 600],
             "completion_len": [100, 200, 50, 40], "think_s": [None, 2.0, 3.0, None]}
    path = tmp_path / "agent-calls"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(table)}).save_to_disk(str(path))
    return path


COLUMNS = {"session_id": "conversation", "turn_index": "turn", "input_tokens": "prompt_len",
           "output_tokens": "completion_len", "gap_s": "think_s"}


def test_hf_dataset_from_a_local_directory_through_renamed_columns(hf_dataset):
    trace = load_hf(str(hf_dataset), "calls", "train", columns=COLUMNS)
    sessions = _by_id(trace)
    assert trace.path == f"hf:{hf_dataset}[train]" and trace.num_rows == 4
    assert sessions["c1"] == RecordedSession("c1", "unknown", (900, 1300, 1800), (100, 200, 50), (2.0, 3.0))
    assert sessions["c2"].prompt_tokens == (600,)


def test_hf_dataset_errors_name_the_dataset_row_and_column(hf_dataset, monkeypatch):
    bad = {**COLUMNS, "input_tokens": "think_s"}  # a null in row 1
    with pytest.raises(TraceFormatError) as info:
        load_hf(str(hf_dataset), "calls", "train", columns=bad)
    assert f"hf:{hf_dataset}[train]: row 1: field \"input_tokens (column 'think_s')\"" in str(info.value)
    with pytest.raises(TraceFormatError, match=r"columns: no column\(s\) \['nope'\]"):
        load_hf(str(hf_dataset), "calls", "train", columns={**COLUMNS, "session_id": "nope"})
    with pytest.raises(TraceFormatError, match=r"split: no split 'test'; splits: \['train'\]"):
        load_hf(str(hf_dataset), "calls", "test", columns=COLUMNS)
    # a Hub name not in the local cache is refused, never downloaded
    monkeypatch.setenv("HF_HOME", str(hf_dataset.parent / "empty-hf-home"))
    with pytest.raises(TraceFormatError, match="offline: only a local path or the local datasets cache"):
        load_hf("some-org/some-agent-trace", "calls")


# ---------------------------------------------------------------- through a spec
def _spec(sessions: dict, **overrides):
    data = make_spec_dict(**overrides)
    data["engine"]["pool_tokens"] = 400_000
    data["workload"]["sessions"] = sessions
    return parse_spec(data)


def test_mooncake_replay_shares_the_traces_prefixes_in_a_simulated_run(tmp_path):
    spec = _spec({"kind": "trace_file", "path": str(FIXTURES / "mooncake.jsonl"), "format": "mooncake"},
                 duration_s=900)
    info = run_simulated(spec, RunKey("base", 1), tmp_path)
    assert info["status"] == "completed"
    turns = pq.read_table(tmp_path / "runs" / "base-s1" / "turns.parquet").to_pylist()
    first = sorted((t for t in turns if t["turn_index"] == 0 and t["error"] is None), key=lambda t: t["admit_s"])
    # initial context -> the prefix it shares in the trace (row1's [0, 1], row6's [0, 1, 5], block 0)
    shared = {1300: 1024, 1900: 1536, 1100: 512, 800: 512}
    seen_prefixes = set()
    for turn in first:
        prefix = shared[turn["prompt_tokens"]]
        key = (prefix, turn["prompt_tokens"] if prefix != 512 else 0)
        if key in seen_prefixes:  # a later session with this prefix finds it cached
            assert turn["cached_tokens"] >= prefix, turn
        seen_prefixes.add(key)
    assert len(first) > len(seen_prefixes)
    later = [t for t in turns if t["turn_index"] == 2]
    assert later and all(t["prompt_tokens"] == 2200 and t["cached_tokens"] >= 1700 for t in later)


def test_hf_dataset_kind_replays_in_a_simulated_run(tmp_path, hf_dataset):
    sessions = {"kind": "hf_dataset", "source": {"hf": str(hf_dataset), "split": "train", "columns": COLUMNS}}
    spec = _spec(sessions, duration_s=600)
    info = run_simulated(spec, RunKey("base", 1), tmp_path)
    assert info["status"] == "completed"
    turns = pq.read_table(tmp_path / "runs" / "base-s1" / "turns.parquet").to_pylist()
    assert {t["session_kind"] for t in turns} == {"hf"}
    assert {t["prompt_tokens"] for t in turns} <= {900, 1300, 1800, 600}
    with pytest.raises(SpecError, match="workload.sessions.*no column"):
        _spec({**sessions, "source": {"hf": str(hf_dataset), "columns": {**COLUMNS, "turn_index": "round"}}})


def test_shapes_describe_reads_each_new_format(tmp_path, hf_dataset):
    def describe(*args):
        return subprocess.run([sys.executable, "-m", "loadgen.cli", "shapes", "describe", *args],
                              capture_output=True, text=True)

    proc = describe(str(FIXTURES / "mooncake.jsonl"), "--format", "mooncake")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{FIXTURES / 'mooncake.jsonl'}: 4 sessions") and "chained by block hashes" in proc.stdout
    proc = describe(str(FIXTURES / "aiperf.jsonl"), "--format", "aiperf")
    assert proc.returncode == 0 and "note: no tokenizer given: text is counted one token per" in proc.stdout
    columns = [arg for field, column in COLUMNS.items() for arg in ("--column", f"{field}={column}")]
    proc = describe(str(hf_dataset), *columns, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["recorded"]["num_sessions"] == 2
    proc = describe(str(hf_dataset), "--column", "session_id")
    assert proc.returncode == 2 and "--column expects FIELD=COLUMN" in proc.stderr
