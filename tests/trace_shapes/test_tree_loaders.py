"""The session-tree loaders (AIPerf dag_jsonl, WEKA sub-agent traces, GuideLLM branches, the generic tree
format) on small handmade files written from the formats' documentation; malformed files named by
line and field; the CLI and a spec's trace source."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import SpecError, parse_spec
from tests.conftest import make_spec_dict
from trace_shapes import FORK, SPAWN, LoaderOptions, TraceFormatError, load_trees

TREES = Path(__file__).parent / "fixtures" / "trees"


@pytest.fixture
def word_tokenizer(tmp_path) -> str:
    """One token a whitespace-separated word."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def _nodes(loaded):
    return {t.node.session_id: t for tree in loaded.trees for _, _, t in tree.walk()}


def _error(tmp_path, lines, format, options=None, name="bad.jsonl") -> TraceFormatError:
    path = tmp_path / name
    path.write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n" for line in lines))
    with pytest.raises(TraceFormatError) as info:
        load_trees(path, format, options)
    return info.value


# ---------------------------------------------------------------- tree (generic)
def test_the_tree_format_reads_spawns_forks_joins_and_parallel_calls():
    loaded = load_trees(TREES / "tree.jsonl", "tree")
    orch, linear = loaded.trees
    assert loaded.num_branching() == 1 and linear.is_linear()
    spawn, fork = orch.branches
    assert (spawn.mode, spawn.after_turn, spawn.join_turn, [c.start_delay_s for c in spawn.children]) == \
        (SPAWN, 0, 1, [0.1, 0.2])
    assert (fork.mode, fork.join_turn) == (FORK, None)
    assert orch.inherited_tokens() == {(1, 0): 4400 + 100}
    assert orch.parallel[0].tail_tokens == (120, 90) and orch.parallel[0].output_tokens == (40, 30)
    worker = spawn.children[0].tree.node
    assert (worker.session_id, worker.prompt_tokens, worker.gaps_s, worker.model) == ("orch.0.0", (1800, 2400), (1.0,), "m1")


def test_the_tree_formats_errors_name_the_line_and_field(tmp_path):
    good = {"calls": [[100, 10, None]]}
    err = _error(tmp_path, [good, {"calls": [[100, 10, None]], "branches": [{"after_call": 0, "mode": "clone",
                                                                             "children": [good]}]}], "tree")
    assert (err.row, err.field) == (2, "branches[0].mode") and "expected one of ['spawn', 'fork']" in str(err)
    fork = {"calls": [[100, 10, None], [200, 5, 1.0]],
            "branches": [{"after_call": 0, "mode": "fork", "children": [{"calls": [[50, 5, None]]}]}]}
    err = _error(tmp_path, [good, good, fork], "tree")
    assert (err.row, err.field) == (3, "branches") and "inherits 110 tokens, but its child's first prompt is 50" in str(err)
    deep = {"calls": [[100, 10, None]], "branches": [{"after_call": 0, "mode": "spawn",
                                                     "children": [{"calls": [[10, "x", None]]}]}]}
    err = _error(tmp_path, [deep], "tree")
    assert (err.row, err.field) == (1, "branches[0].children[0].calls[0][1]")
    err = _error(tmp_path, [good, "{not json\n"], "tree")
    assert err.row == 2 and "not valid JSON" in str(err)


# ---------------------------------------------------------------- AIPerf dag_jsonl
def test_dag_jsonl_forks_inherit_the_history_and_spawns_start_fresh(word_tokenizer):
    loaded = load_trees(TREES / "dag.jsonl", "dag_jsonl", LoaderOptions(tokenizer=word_tokenizer))
    nodes = _nodes(loaded)
    assert [t.node.session_id for t in loaded.trees] == ["root", "solo"]  # roots: named by no other line
    root = nodes["root"]
    # system 5 words + user 5; then + output 20 + 4 words; + 10 + 3; + 30 + 1 (history with the responses)
    assert root.node.prompt_tokens == (10, 34, 47, 78) and root.node.gaps_s == (0.5, 0.0, 0.0)
    spawn, fork = root.branches
    assert (spawn.mode, spawn.after_turn, spawn.join_turn) == (SPAWN, 0, 2)  # join_at: 2
    assert (fork.mode, fork.after_turn, fork.join_turn) == (FORK, 2, None)  # background: nobody waits
    assert [c.start_delay_s for c in spawn.children] == [0.1, 0.0]  # the child's first delay (ms)
    assert nodes["root/worker-a"].node.prompt_tokens == (7, 7 + 15 + 2)  # a fresh history
    assert nodes["root/critic"].node.prompt_tokens == (47 + 30 + 3,)  # the parent's turn 2 and its response
    # system prompts: shared by the sessions with the same text; a fork keeps its parent's
    assert nodes["root/worker-a"].shared_prefix() == nodes["root/worker-b"].shared_prefix()
    assert nodes["root/worker-a"].shared_prefix()[0] == 4
    assert nodes["root/critic"].shared_prefix() == root.shared_prefix() != nodes["root/worker-a"].shared_prefix()


def _turn(text="hello there", **extra):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 4, **extra}


@pytest.mark.parametrize("lines, row, field, message", [
    ([{"session_id": "a", "turns": [_turn(), _turn()]}, {"session_id": "a", "turns": [_turn()]}],
     2, "session_id", "'a' already appeared on line 1"),
    ([{"session_id": "a", "turns": [_turn(spawns=["ghost"])]}], 1, "turns[0].spawns", "names 'ghost'"),
    ([{"session_id": "a", "turns": [_turn(forks=["b"]), _turn()]}, {"session_id": "b", "turns": [_turn()]}],
     1, "turns[0].forks", "must be on the last turn (1)"),
    ([{"session_id": "a", "turns": [_turn(spawns=[{"children": ["b"], "join_at": 0}]), _turn()]},
      {"session_id": "b", "turns": [_turn()]}], 1, "turns[0].spawns[0].join_at", "must lie in (0, 2)"),
    ([{"session_id": "a", "turns": [{"messages": [{"role": "user", "content": "x"}], "max_token": 3}]}],
     1, "turns[0].max_token", "not a dag_jsonl turn field"),
    ([{"session_id": "a", "turns": [_turn()]}, {"session_id": "b", "turns": [{"messages": [{"role": "user"}]}]}],
     2, "turns[0].max_tokens", "missing"),
    ([{"session_id": "a", "turns": [_turn()]}, {"session_id": "o", "orchestrator": True, "spawns": ["a"]}],
     2, "orchestrator", "not read as trees"),
    ([{"session_id": "a", "turns": [_turn(forks=["c"])]}, {"session_id": "b", "turns": [_turn(forks=["c"])]},
      {"session_id": "c", "turns": [_turn()]}], 2, "turns[0].forks", "already forked by 'a'"),
    ([{"session_id": "a", "turns": [_turn(), {"messages": [{"role": "system", "content": "be brief"}], "max_tokens": 2}]}],
     1, "turns[1].messages[0].role", "only read at the start of a first turn"),
    ([{"session_id": "r", "turns": [_turn(spawns=["a"])]}, {"session_id": "a", "turns": [_turn(spawns=["b"])]},
      {"session_id": "b", "turns": [_turn(spawns=["a"])]}], 2, "session_id", "cycle: r -> a -> b -> a"),
])
def test_dag_jsonl_errors_name_the_line_and_field(tmp_path, word_tokenizer, lines, row, field, message):
    err = _error(tmp_path, lines, "dag_jsonl", LoaderOptions(tokenizer=word_tokenizer))
    assert (err.row, err.field) == (row, field) and message in str(err), str(err)


def test_dag_jsonl_without_a_tokenizer_counts_words_as_serve_sim_does_and_says_so(word_tokenizer):
    # the same counts as a one-token-a-word tokenizer gives, and a note where the user reads it
    loaded = load_trees(TREES / "dag.jsonl", "dag_jsonl")
    assert _nodes(loaded)["root"].node.prompt_tokens == (10, 34, 47, 78)
    assert any(note.startswith("no tokenizer given: text is counted one token per whitespace-separated word")
               for note in loaded.notes)
    with_tokenizer = load_trees(TREES / "dag.jsonl", "dag_jsonl", LoaderOptions(tokenizer=word_tokenizer))
    assert not any("no tokenizer given" in note for note in with_tokenizer.notes)


# ---------------------------------------------------------------- WEKA
def test_weka_subagents_are_spawned_by_one_request_and_joined_by_the_next():
    loaded = load_trees(TREES / "weka.json", "weka")
    (tree,) = loaded.trees
    assert tree.node.prompt_tokens == (300, 360, 900) and tree.node.model == "opus"
    waited, background = tree.branches
    assert (waited.after_turn, waited.join_turn, len(waited.children)) == (1, 2, 2)
    assert (background.join_turn, background.children[0].tree.node.session_id) == (None, "conv-1/a3")  # async
    # a sub-agent starts at its t minus the spawning response's end (5.0 + 1.0)
    assert [c.start_delay_s for c in waited.children] == [0.5, 1.0] and background.children[0].start_delay_s == 1.5
    # the joining request's gap runs from the last sub-agent's end (7.0 + 12 s), not its think_time (14 s)
    assert tree.node.gaps_s == (3.0, 21.0 - 19.0)
    a1 = waited.children[0].tree.node
    assert (a1.prompt_tokens, a1.gaps_s, a1.model) == ((200, 260), (2.0,), "haiku")
    # shared prefix: tools + system in full 64-token blocks, named by the hash of the last one
    assert tree.shared_prefix() == (128, "weka:conv-1:2")
    assert a1.prefix_key == waited.children[1].tree.node.prefix_key == "weka:conv-1:21"


def test_weka_reads_one_trace_a_line_too_and_names_errors(tmp_path):
    trace = json.loads((TREES / "weka.json").read_text())
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(trace) + "\n" + json.dumps({**trace, "id": "conv-2"}) + "\n")
    assert [t.node.session_id for t in load_trees(path, "weka").trees] == ["conv-1", "conv-2"]
    bad = json.loads(json.dumps(trace))
    bad["requests"][2]["requests"][1]["out"] = -3
    err = _error(tmp_path, [trace, bad], "weka")
    assert (err.row, err.field) == (2, "requests[2].requests[1].out") and ">= 0" in str(err)
    early = {**trace, "requests": [trace["requests"][2]] + trace["requests"]}
    err = _error(tmp_path, [early], "weka")
    assert (err.row, err.field) == (1, "requests[0].type") and "before the conversation's first request" in str(err)
    err = _error(tmp_path, ['{"id": "x",\n', '  "requests": [}\n'], "weka", name="broken.json")
    assert err.row == 2 and "not valid JSON" in str(err)


# ---------------------------------------------------------------- GuideLLM
def test_guidellm_branches_spawn_fresh_and_merge_their_last_turn_later():
    loaded = load_trees(TREES / "guidellm.jsonl", "guidellm")
    tree, plain = loaded.trees
    assert plain.is_linear() and plain.node.prompt_tokens == (80, 80 + 10 + 80)
    # prefix 50 + 100 a turn + 20 out; turn 3 receives branches 0 and 1 (merge_after 2): 100+20 and 300+20
    assert tree.node.prompt_tokens == (150, 270, 390, 410 + 440 + 100, 950 + 20 + 120 + 100)
    assert tree.node.gaps_s == (2.0,) * 4 and tree.shared_prefix()[0] == 50
    first, second = tree.branches
    assert (first.after_turn, first.join_turn, len(first.children)) == (1, 3, 2)
    assert (second.after_turn, second.join_turn) == (3, 4)
    assert [c.start_delay_s for c in first.children] == [2.0, 2.0]  # the spawning main turn's delay
    assert first.children[0].tree.node.prompt_tokens == (100, 220)  # a fresh context, no prefix
    assert first.children[1].tree.node.prompt_tokens == (300,)  # first_prompt_tokens


@pytest.mark.parametrize("config, field, message", [
    ({"prompt_tokens": 10, "output_tokens": 5, "turns": 3, "branches": [{"at_turn": 1, "turns": 1, "merge_after": 2}]},
     "branches[0].merge_after", "must be less than turns 3"),
    ({"prompt_tokens": 10, "prompt_tokens_stdev": 3, "output_tokens": 5}, "prompt_tokens_stdev", "fixed sizes"),
    ({"prompt_tokens": 10, "output_tokens": 5, "prefix_tokens": 20, "prefix_count": 4}, "prefix_count", "at random"),
    ({"prompt_tokens": 10, "output_tokens": 5, "tool_call_turns": 2}, "tool_call_turns", "injected turns"),
    ({"prompt_tokens": 10, "output_tokens": 5, "branchez": []}, "branchez", "not a field"),
    ({"prompt_tokens": 10, "turns": 2}, "output_tokens", "missing"),
])
def test_guidellm_errors_name_the_row_and_field(tmp_path, config, field, message):
    err = _error(tmp_path, [{"prompt_tokens": 10, "output_tokens": 5}, config], "guidellm")
    assert (err.row, err.field) == (2, field) and message in str(err), str(err)


# ---------------------------------------------------------------- the CLI and a spec's trace source
def _loadgen(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True)


def test_shapes_describe_reports_tree_shapes():
    proc = _loadgen("shapes", "describe", str(TREES / "tree.jsonl"), "--format", "tree", "--json")
    assert proc.returncode == 0, proc.stderr
    trees = json.loads(proc.stdout)["trees"]
    assert (trees["num_trees"], trees["num_sessions"], trees["num_branching_trees"]) == (2, 5, 1)
    assert trees["fan_out"]["max"] == 2 and trees["depth"]["max"] == 1 and trees["sessions_per_tree"]["max"] == 4
    assert trees["joins"] == {"all": 1, "some": 0, "none": 1}
    shared = trees["shared_prefix_tokens"]
    # first calls: the workers' 1500-token prefix (the orchestrator's key is its own) and the fork's 4500
    assert (shared["first_call_shared"], shared["first_call"]) == (1500 + 1500 + 4500, 3000 + 1800 + 1700 + 4600 + 500)
    assert (shared["fork"], shared["prefix"], shared["parallel"]) == (4500, 1500 * 3, 2 * 4600)
    proc = _loadgen("shapes", "describe", "orchestrator-workers", "--num-sessions", "30", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("orchestrator-workers: 30 session trees") and "fan-out per branch" in proc.stdout
    # live replay of trees works (tests/live): the note must not send a user away from it
    assert "trees replay as trees, in the simulator and live against an endpoint" in proc.stdout
    assert "refused" not in proc.stdout
    again = _loadgen("shapes", "describe", "orchestrator-workers", "--num-sessions", "30", "--seed", "3")
    assert again.stdout == proc.stdout


def test_shapes_describe_names_a_malformed_tree_file_and_exits_2(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"calls": [[10, 1, null]]}\n{"calls": [[10, 1, null]], "branches": [{"after_call": 4, '
                   '"mode": "spawn", "children": [{"calls": [[5, 1, null]]}]}]}\n')
    proc = _loadgen("shapes", "describe", str(bad), "--format", "tree")
    assert proc.returncode == 2 and f"{bad}: row 2: field 'branches[0].after_call'" in proc.stderr
    assert "the session has 1 calls, got 4" in proc.stderr and "Traceback" not in proc.stderr


def _spec(path, format, **overrides):
    data = make_spec_dict(**overrides)
    data["workload"]["sessions"] = {"kind": "trace_file", "path": str(path), "format": format}
    return parse_spec(data)


def test_a_spec_runs_linear_sessions_of_a_tree_format(tmp_path):
    linear = tmp_path / "linear.jsonl"
    linear.write_text('{"calls": [[500, 20, null], [600, 30, 1.5]]}\n{"calls": [[400, 10, null]]}\n')
    spec = _spec(linear, "tree", duration_s=300)
    info = run_simulated(spec, RunKey("base", 1), tmp_path / "out")
    assert info["status"] == "completed"
    turns = pq.read_table(tmp_path / "out" / "runs" / "base-s1" / "turns.parquet").to_pylist()
    assert turns and {t["prompt_tokens"] for t in turns} <= {500, 600, 400}


def test_loadgen_validate_takes_trees_on_a_chat_endpoint_and_behind_the_gateway(tmp_path):
    data = make_spec_dict()
    data["engine"] = {"kind": "openai", "url": "http://127.0.0.1:9/v1", "model": "m", "api": "chat"}
    data["workload"]["sessions"] = {"kind": "trace_file", "path": str(TREES / "tree.jsonl"), "format": "tree"}
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(json.dumps(data))
    proc = _loadgen("validate", str(spec_path))
    assert proc.returncode == 0, proc.stderr  # a fork resends its parent's messages (loadgen/live/chat.py)
    data["engine"]["gateway"] = {}  # the proxy learns parents from x-dynamo-parent-session-id
    spec_path.write_text(json.dumps(data))
    proc = _loadgen("validate", str(spec_path))
    assert proc.returncode == 0, proc.stderr


def test_the_generic_tree_format_replays_branches_and_parallel_calls(tmp_path):
    spec = _spec(TREES / "tree.jsonl", "tree", duration_s=200, seeds=[1], arms=[{"name": "base"}],
                 workload={"arrival_rate_per_s": 0.02})
    run_simulated(spec, RunKey("base", 1), tmp_path)
    turns = pq.read_table(tmp_path / "runs/base-s1/turns.parquet").to_pandas()
    orch = load_trees(TREES / "tree.jsonl", "tree").trees[0]
    calls = turns[turns.session_kind.str.endswith("/call")]
    # the orchestrator's call 2 makes two more calls: its prompt (4600) plus tails 120 and 90
    assert set(calls.prompt_tokens) >= {4600 + 120, 4600 + 90}
    forked = turns[(turns.depth == 1) & (turns.prompt_tokens == 4600) & (turns.turn_index == 0)]
    assert len(forked) >= 1 and (forked.cached_tokens >= (orch.context_after(1) - 1) // 16 * 16 - 16).all()


def test_a_recorded_tree_replays_as_a_tree(tmp_path):
    """The WEKA sample: a root whose first request spawns two sub-agents, joined by its second,
    and one launched in the background; each sub-agent is a session of its own, started after
    the parent's response, and the joining request waits for the two."""
    spec = _spec(TREES / "weka.json", "weka", duration_s=200, seeds=[1], arms=[{"name": "base"}],
                 workload={"arrival_rate_per_s": 0.01})
    run_simulated(spec, RunKey("base", 1), tmp_path)
    turns = pq.read_table(tmp_path / "runs/base-s1/turns.parquet").to_pandas()
    sessions = pq.read_table(tmp_path / "runs/base-s1/sessions.parquet").to_pandas()
    root_id = int(sessions[sessions.depth == 0].session_id.iloc[0])
    tree = sessions[sessions.tree_id == root_id].set_index("session_id")
    assert len(tree) == 4 and (tree.status == "completed").all()
    root = turns[turns.session_id == root_id].set_index("turn_index")
    loaded = load_trees(TREES / "weka.json", "weka").trees[0]
    assert list(root.prompt_tokens) == list(loaded.node.prompt_tokens)
    joined = loaded.branches[0]
    kids = tree[tree.parent_session_id == root_id]
    first = turns[turns.turn_index == 0].set_index("session_id").ready_s
    spawned = kids[first[kids.index] < root.ready_s[joined.join_turn]]
    assert len(spawned) >= len(joined.children)
    awaited = sorted(spawned.finish_s)[:len(joined.children)]
    assert root.ready_s[joined.join_turn] >= max(awaited)
    # the joining request is marked, though a recorded join appends nothing (its prompt holds the
    # results), so the trees table has a hit ratio after joins
    assert root.joined_tokens[joined.join_turn] == 0 and bool(root.after_join[joined.join_turn])
    assert not root.after_join.drop(joined.join_turn).any()
    from loadgen.analysis.summary import summarize

    (row,) = summarize(tmp_path)["trees_by_arm"]
    after = turns[turns.after_join & turns.error.isna()]
    assert row["hit_ratio_after_join"] == after.cached_tokens.sum() / after.prompt_tokens.sum()
