"""Session trees run in the simulator (loadgen/core/tree_runtime.py, tree_engines.py): children start
when their parent's turn ends, forks hit the parent's blocks, joins wait, runs are deterministic."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import yaml

from loadgen.core.recording import RunRecorder
from loadgen.core.runner import RunKey, run_simulated, simulate
from loadgen.core.tree_runtime import CHILD_ID_BASE, MAX_TREE_SESSIONS
from loadgen.core.workload import SessionPlan
from trace_shapes import FORK, SPAWN, Branch, Child, SessionShape, Tree

from .conftest import make_spec


def tree_spec(preset: str, flavor: str = "vllm", params: dict = None, **engine):
    return make_spec(
        duration_s=400, seeds=[3],
        engine={"kind": "sim", "flavor": flavor, "pool_tokens": engine.pop("pool_tokens", 2_000_000),
                "max_model_len": 200_000, **engine},
        workload={"arrival_rate_per_s": 0.02,
                  "sessions": {"kind": "tree", "preset": preset, "params": params or {}}},
        arms=[{"name": "base"}])


def run_tables(spec, seed: int = 3):
    recorder = RunRecorder(None, f"base-s{seed}", "base", seed, 60.0, tree_columns=True)
    simulate(spec, RunKey("base", seed), recorder)
    recorder.close()
    return {name: t.to_pandas() for name, t in recorder.tables().items()}


def _forks(turns):
    """(child's first turn row, the tokens it inherits) for every forked child: tree-search forks
    after the parent's turn 0, so it inherits that turn's prompt and output."""
    first = turns[(turns.turn_index == 0) & turns.parent_session_id.notna()]
    parents = turns[turns.turn_index == 0].set_index("session_id")
    out = []
    for _, row in first.iterrows():
        p = parents.loc[int(row.parent_session_id)]
        out.append((row, int(p.prompt_tokens + p.output_tokens)))
    return out


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_a_forks_first_turn_hits_the_parents_blocks(flavor):
    tables = run_tables(tree_spec("tree-search", flavor))
    forks = _forks(tables["turns"])
    assert len(forks) >= 6
    for row, inherited in forks:
        # the parent computed its prompt and all of its output but the last token
        low = (inherited - 1) // 16 * 16 if flavor == "vllm" else inherited - 1
        assert low <= row.cached_tokens <= inherited, (row.session_id, row.cached_tokens, inherited)


def test_spawned_workers_share_only_their_system_prompt():
    tables = run_tables(tree_spec("orchestrator-workers"))
    turns = tables["turns"]
    first = turns[(turns.turn_index == 0) & (turns.depth == 1)]
    assert len(first) >= 10
    # the worker system prompt (1500 tokens, 93 blocks of 16) once some worker has sent it; never more
    assert (first.cached_tokens <= 1488).all()
    assert (first.cached_tokens == 1488).mean() > 0.8


def run_hand_trees(plans, engine_config=None, policy=None, tree_policy="sessions", engine_factory=None):
    """Run ``plans`` (hand-made trees) until no event is left, on one simulated engine behind
    ``policy`` (a limit; none by default); the tables."""
    from controllers import make_policy
    from loadgen.core.clock import VirtualClock
    from loadgen.core.engines import SimEngineClient
    from loadgen.core.gateway import Gateway
    from loadgen.core.runner import _start_session
    from loadgen.core.session import RunEnv
    from loadgen.core.tree_engines import start_trees
    from loadgen.sim import EngineConfig

    from .sim.conftest import COST

    clock = VirtualClock()
    config = engine_config or EngineConfig(num_blocks=50_000)
    engine = engine_factory(clock) if engine_factory else SimEngineClient(clock, config, COST)
    recorder = RunRecorder(None, "hand", "base", 0, 1e9, tree_columns=True,
                           replica_columns=engine_factory is not None)
    env = RunEnv(clock, engine, Gateway(clock, policy or make_policy("none"), engine.pool_tokens), recorder)
    env.trees = start_trees(env, plans, lambda plan: _start_session(clock, plan, env), tree_policy)
    for plan in plans:
        clock.call_at(plan.arrival_s, _start_session, clock, plan, env)
    clock.run()
    recorder.close()
    return {name: t.to_pandas() for name, t in recorder.tables().items()}


def _shape(initial, num_turns, think_s=1.0, output=100, growth=200, shared=0, kind="hand"):
    return SessionShape(kind, initial, (output,) * num_turns, (growth,) * (num_turns - 1),
                        (think_s,) * (num_turns - 1), shared_prefix_tokens=shared)


def _spawn_tree(wait_for=None, start_delay_s=0.5):
    quick = Tree(_shape(1000, 1, shared=500))
    slow = Tree(_shape(1000, 3, think_s=20.0, shared=500))
    branch = Branch(0, SPAWN, (Child(quick, start_delay_s, 100), Child(slow, start_delay_s, 200)),
                    join_turn=1, wait_for=wait_for)
    return Tree(_shape(3000, 3, think_s=2.0, shared=500), (branch,))


@pytest.mark.parametrize("wait_for", [None, 1])
def test_a_join_waits_for_its_children_and_appends_their_results(wait_for):
    tree = _spawn_tree(wait_for)
    tables = run_hand_trees([SessionPlan(7, 1.0, tree.node, tree=tree)])
    turns, sessions = tables["turns"], tables["sessions"].set_index("session_id")
    root = turns[turns.session_id == 7].set_index("turn_index")
    quick, slow = CHILD_ID_BASE + 7 * MAX_TREE_SESSIONS + 1, CHILD_ID_BASE + 7 * MAX_TREE_SESSIONS + 2
    kids = turns[turns.session_id != 7].groupby("session_id")
    # the children start start_delay_s after the response of the turn that spawns them
    assert kids.ready_s.min()[quick] == pytest.approx(root.finish_s[0] + 0.5)
    assert kids.ready_s.min()[slow] == pytest.approx(root.finish_s[0] + 0.5)
    awaited = sessions.finish_s[slow] if wait_for is None else sessions.finish_s[quick]
    # the think time runs after the awaited children have ended
    assert root.ready_s[1] == pytest.approx(awaited + 2.0)
    appended = 300 if wait_for is None else 100
    assert root.prompt_tokens[1] == 3000 + 100 + 200 + appended
    assert list(root.joined_tokens) == [0, appended, 0]
    assert root.prompt_tokens[2] == root.prompt_tokens[1] + 300
    assert (sessions.status == "completed").all()
    assert sessions.tree_finish_s[7] == pytest.approx(sessions.finish_s.max())
    assert sessions.tree_num_sessions[7] == 3


def test_a_fork_hits_exactly_the_parents_computed_blocks_and_the_parent_hits_on():
    root_shape = _shape(3000, 3, think_s=30.0, shared=1000)
    inherited = 3000 + 100
    fork = Tree(_shape(inherited + 50, 2, shared=1000))
    tree = Tree(root_shape, (Branch(0, FORK, (Child(fork, 1.0), Child(fork, 1.0))),))
    tables = run_hand_trees([SessionPlan(0, 0.0, tree.node, tree=tree)])
    turns = tables["turns"].set_index(["session_id", "turn_index"])
    first = [CHILD_ID_BASE + 1, CHILD_ID_BASE + 2]
    for sid in first:  # the parent computed 3099 tokens: 193 full blocks of 16
        assert turns.cached_tokens[(sid, 0)] == (inherited - 1) // 16 * 16
    # the parent goes on from its own blocks after the cut (all its context but the new tokens)
    assert turns.cached_tokens[(0, 1)] == (inherited - 1) // 16 * 16


def test_same_spec_and_seed_give_the_same_tree_run():
    spec = tree_spec("orchestrator-workers", params={"start_delay_mean_s": 1.0, "wait_for_fraction": 0.7})
    a, b = run_tables(spec), run_tables(spec)
    for name in ("turns", "sessions"):
        assert a[name].equals(b[name])
    other = run_tables(spec, seed=4)
    assert not other["turns"].equals(a["turns"])


def test_tree_columns_and_tree_completion(tmp_path):
    spec = tree_spec("orchestrator-workers")
    run_simulated(spec, RunKey("base", 3), tmp_path)
    import pyarrow.parquet as pq

    turns = pq.read_table(tmp_path / "runs/base-s3/turns.parquet").to_pandas()
    sessions = pq.read_table(tmp_path / "runs/base-s3/sessions.parquet").to_pandas()
    roots = sessions[sessions.depth == 0]
    assert roots.parent_session_id.isna().all() and (roots.tree_id == roots.session_id).all()
    kids = sessions[sessions.depth > 0]
    assert (kids.session_id >= CHILD_ID_BASE).all() and kids.tree_num_sessions.isna().all()
    assert set(turns.tree_id) == set(roots.session_id)
    done = roots[roots.tree_finish_s.notna()]
    assert len(done) >= 3
    for _, root in done.iterrows():
        tree = sessions[sessions.tree_id == root.session_id]
        assert root.tree_num_sessions == len(tree)
        assert root.tree_finish_s == pytest.approx(tree.finish_s.max())
        assert (tree.status == "completed").all()
    # a tree still running at the end has no finish
    open_ = roots[roots.tree_finish_s.isna()]
    for _, root in open_.iterrows():
        assert (sessions[sessions.tree_id == root.session_id].status == "in_system").any()


def test_a_replayed_tree_files_sessions_keep_their_names_and_pandas_reads_parents_as_integers(tmp_path):
    import pandas as pd

    from tests.trace_shapes.test_tree_loaders import TREES

    spec = make_spec(duration_s=600, seeds=[1], arms=[{"name": "base"}],
                     workload={"arrival_rate_per_s": 0.05, "sessions": {
                         "kind": "trace_file", "path": str(TREES / "dag.jsonl"), "format": "dag_jsonl"}})
    run_simulated(spec, RunKey("base", 1), tmp_path)
    sessions = pd.read_parquet(tmp_path / "runs/base-s1/sessions.parquet")
    turns = pd.read_parquet(tmp_path / "runs/base-s1/turns.parquet")
    names = dict(zip(sessions.session_id, sessions.trace_session_id))
    roots = sessions[sessions.depth == 0]
    assert set(roots.trace_session_id) == {"root", "solo"}
    kids = sessions[sessions.depth == 1]
    assert set(kids.trace_session_id) == {"root/worker-a", "root/worker-b", "root/critic"}
    assert all(names[p] == "root" for p in kids.parent_session_id)  # a child's parent is named as the trace names it
    assert dict(zip(turns.session_id, turns.trace_session_id)) == names
    assert str(sessions.parent_session_id.dtype) == "Int64" and str(sessions.tree_num_sessions.dtype) == "Int32"
    assert roots.parent_session_id.isna().all() and (kids.parent_session_id == kids.tree_id).all()


def test_a_linear_run_writes_no_tree_columns(tmp_path):
    run_simulated(make_spec(seeds=[1], arms=[{"name": "base"}], duration_s=120), RunKey("base", 1), tmp_path)
    import pyarrow.parquet as pq

    assert "tree_id" not in pq.read_table(tmp_path / "runs/base-s1/turns.parquet").column_names
    assert "tree_id" not in pq.read_table(tmp_path / "runs/base-s1/sessions.parquet").column_names


@pytest.mark.parametrize("sessions, engine, message", [
    ({"kind": "tree", "preset": "parallel-tools", "params": {"max_calls": 0.5}}, {}, "params.max_calls: expected an integer"),
    ({"kind": "tree", "preset": "forest"}, {}, "unknown tree preset 'forest'"),
    ({"kind": "tree", "preset": "tree-search", "params": {"num_branches": 2.5}}, {}, "params.num_branches"),
    ({"kind": "tree", "preset": "orchestrator-workers", "params": {"worker": {"turns": 3}}}, {},
     "params.worker: unknown agent fields ['turns']"),
    ({"kind": "tree", "preset": "orchestrator-workers"}, {"offload": {"cpu_tokens": 100000}},
     "engine.offload: session trees are not modelled"),
])
def test_bad_tree_specs_exit_2_naming_the_field(tmp_path, sessions, engine, message):
    data = {"experiment": "t", "duration_s": 60, "seeds": [1],
            "engine": {"kind": "sim", "pool_tokens": 400_000, **engine},
            "workload": {"arrival_rate_per_s": 0.1, "sessions": sessions}, "arms": [{"name": "a"}]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("engine, message", [
    ({"kind": "serve_sim"}, "engine.kind: session trees replay live against an endpoint"),
])
def test_trees_refuse_the_live_paths_they_do_not_run_on(tmp_path, engine, message):
    data = {"experiment": "t", "duration_s": 60, "seeds": [1], "engine": engine,
            "workload": {"arrival_rate_per_s": 0.1, "sessions": {"kind": "tree", "preset": "tree-search"}},
            "arms": [{"name": "a"}]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def _fuzzed_trees(seed: int, num_trees: int = 14):
    """Trees of both runnable presets with wide fan-outs, quorums, recursion and delayed starts,
    arriving within a minute."""
    import numpy as np

    from loadgen.core.spec.trees import _build

    rng = np.random.default_rng(seed)
    plans = []
    for i in range(num_trees):
        if rng.random() < 0.7:
            model = _build("orchestrator-workers", {
                "fan_out_mean": float(rng.uniform(1, 8)), "wait_for_fraction": float(rng.choice([0.3, 0.6, 1.0])),
                "max_depth": int(rng.integers(1, 3)), "recurse_probability": float(rng.uniform(0, 0.5)),
                "start_delay_mean_s": float(rng.choice([0.0, 3.0])),
                "orchestrator": {"num_turns_mean": 4.0, "think_time_mean_s": 1.0},
                "worker": {"num_turns_mean": 3.0, "think_time_mean_s": 1.0}}, "")
        else:
            model = _build("tree-search", {"refork_probability": float(rng.uniform(0, 0.8))}, "")
        tree = model.make(np.random.default_rng([seed, i]))
        plans.append(SessionPlan(i, float(rng.uniform(0, 60)), tree.node, tree=tree))
    return plans


@pytest.mark.parametrize("tree_policy", ["sessions", "trees"])
@pytest.mark.parametrize("name", ["budgeter", "adaptive-cap", "admission-only", "aimd", "session-cap"])
def test_no_controller_deadlocks_a_fuzzed_family_of_trees(name, tree_policy):
    """Parents wait at joins holding their admission while their children queue: the gateway's
    liveness rule must still let every session of every tree end."""
    from controllers import make_policy
    from loadgen.sim import EngineConfig

    params = {"admission-only": {"k": 3}, "session-cap": {"k": 3, "k_hi": 4}, "aimd": {"initial_k": 2, "max_k": 4}}
    for seed in range(3):
        plans = _fuzzed_trees(seed)
        tables = run_hand_trees(plans, EngineConfig(num_blocks=120_000 // 16), make_policy(name, **params.get(name, {})),
                                tree_policy)
        sessions = tables["sessions"]
        expected = sum(p.tree.num_sessions() for p in plans)
        assert len(sessions) == expected, (seed, len(sessions), expected)
        assert (sessions.status != "in_system").all(), sessions.status.value_counts()
        assert sessions.tree_finish_s[sessions.depth == 0].notna().all()


def test_the_summary_reports_task_completion_and_the_hit_ratio_after_joins(tmp_path):
    import pyarrow.parquet as pq

    from loadgen.analysis.summary import summarize
    from loadgen.analysis.trees import format_trees_table

    spec = tree_spec("orchestrator-workers")
    run_simulated(spec, RunKey("base", 3), tmp_path)
    summary = summarize(tmp_path)
    (row,) = summary["trees_by_arm"]
    sessions = pq.read_table(tmp_path / "runs/base-s3/sessions.parquet").to_pandas()
    turns = pq.read_table(tmp_path / "runs/base-s3/turns.parquet").to_pandas()
    roots = sessions[sessions.depth == 0]
    done = (roots.tree_finish_s - roots.arrival_s).dropna().sort_values().tolist()
    assert (row["trees_arrived"], row["trees_ended"]) == (len(roots), len(done))
    assert row["task_s_p50"] == done[math.ceil(0.5 * len(done)) - 1]
    after = turns[(turns.joined_tokens > 0) & turns.error.isna()]
    assert len(after) > 5
    assert row["hit_ratio_after_join"] == pytest.approx(after.cached_tokens.sum() / after.prompt_tokens.sum())
    assert "hit after join" in format_trees_table(summary)
    linear = tmp_path / "linear"
    run_simulated(make_spec(seeds=[1], arms=[{"name": "base"}], duration_s=120), RunKey("base", 1), linear)
    assert "trees_by_arm" not in summarize(linear)


def test_parallel_calls_go_with_their_turn_fork_its_prompt_and_the_turn_waits_for_them():
    from trace_shapes import ParallelCalls

    tree = Tree(_shape(3000, 3, think_s=2.0, shared=500), (), (ParallelCalls(1, (40, 900), (30, 200)),))
    tables = run_hand_trees([SessionPlan(3, 0.0, tree.node, tree=tree)])
    turns = tables["turns"].set_index(["session_id", "turn_index"])
    root = turns.loc[3]
    calls = turns[turns.depth == 1].reset_index()
    assert sorted(calls.prompt_tokens - root.prompt_tokens[1]) == [40, 900]
    assert sorted(calls.planned_output_tokens) == [30, 200]
    assert (calls.ready_s == root.ready_s[1]).all() and (calls.parent_session_id == 3).all()
    # each call hits what the turn's own call holds of the shared prompt (all of it but the last block)
    assert (calls.cached_tokens >= root.cached_tokens[1]).all()
    assert (calls.cached_tokens >= (root.prompt_tokens[1] - 1) // 16 * 16 - 16).all()
    assert (calls.cacheable_prefix_tokens == root.prompt_tokens[1]).all()
    # the next turn's think time starts when the last call has ended
    assert root.ready_s[2] == pytest.approx(max(calls.finish_s.max(), root.finish_s[1]) + 2.0)
    assert root.prompt_tokens[2] == root.prompt_tokens[1] + 100 + 200  # the calls add nothing to the context


def test_the_html_report_of_a_tree_run_shows_its_tasks(tmp_path):
    from loadgen.analysis.html_report import write_results_html
    from loadgen.analysis.summary import summarize

    run_simulated(tree_spec("orchestrator-workers"), RunKey("base", 3), tmp_path)
    page = write_results_html(tmp_path, summarize(tmp_path), []).read_text()
    assert "<h2>Tasks (session trees)</h2>" in page and "hit after join" in page


def test_on_a_deployment_a_fork_away_from_its_parent_misses_by_routing():
    """MissLedger counts a fork's inherited tokens as held on its parent's replica: a child routed
    elsewhere misses them by routing, not as the workload's."""
    from routers import make_router

    from loadgen.core.clock import VirtualClock
    from loadgen.core.deployment import DeploymentClient
    from loadgen.core.engines import SimEngineClient
    from loadgen.sim import EngineConfig

    from .sim.conftest import COST

    fork = Tree(_shape(3100 + 50, 1, shared=1000))
    tree = Tree(_shape(3000, 2, think_s=30.0, shared=1000), (Branch(0, FORK, (Child(fork, 1.0), Child(fork, 1.0))),))
    def deployment(clock):
        replicas = [SimEngineClient(clock, EngineConfig(num_blocks=50_000), COST) for _ in range(2)]
        return DeploymentClient(replicas, make_router("round_robin"), 0, 16)

    tables = run_hand_trees([SessionPlan(0, 0.0, tree.node, tree=tree)], engine_factory=deployment)
    turns = tables["turns"].set_index(["session_id", "turn_index"])
    parent_replica = turns.replica[(0, 0)]
    for sid in (CHILD_ID_BASE + 1, CHILD_ID_BASE + 2):
        row = turns.loc[(sid, 0)]
        if row.replica == parent_replica:
            assert row.cached_tokens == (3100 - 1) // 16 * 16 and row.miss_routing_tokens == 0
        else:  # all it inherits sat on the parent's replica: a routing miss
            assert row.miss_routing_tokens == (3100 - 1) // 16 * 16 - row.cached_tokens > 0
    assert len(set(turns.replica[[(CHILD_ID_BASE + 1, 0), (CHILD_ID_BASE + 2, 0)]])) == 2


def test_tree_hit_ratios_count_the_turns_the_runs_hit_ratio_counts():
    """A turn the run does not count as successful (no finish time) is not in the tree ratios either."""
    import pyarrow as pa

    from loadgen.analysis.runs import RunData
    from loadgen.analysis.trees import trees_by_arm

    turns = pa.table({"session_id": [7, 7, 7, 7], "turn_index": [0, 1, 2, 3],
                      "error": [None, None, None, ""], "finish_s": [1.0, 2.0, float("nan"), 4.0],
                      "prompt_tokens": [100, 200, 300, 400], "cached_tokens": [0, 100, 300, 200],
                      "joined_tokens": [0, 50, 0, 0], "after_join": [False, True, False, False]})
    sessions = pa.table({"session_id": [7], "depth": [0], "arrival_s": [0.0], "tree_finish_s": [4.0],
                         "tree_num_sessions": [1], "tree_id": [7]})
    run = RunData(run_dir=None, run_json={"arm": "base"}, turns=turns, samples=None, sessions=sessions)
    (row,) = trees_by_arm([run], ["base"])
    assert row["hit_ratio_after_join"] == 100 / 200
    # turn 2 never finished; turn 3's empty error is a success, as success_mask reads it
    assert row["hit_ratio_other_turns"] == 200 / 400
