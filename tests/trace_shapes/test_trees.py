"""Session trees: the data model's context arithmetic and checks, and the synthetic tree presets'
determinism and keyed per-session streams."""

import dataclasses

import numpy as np
import pytest

from trace_shapes import (FORK, SPAWN, Branch, Child, OrchestratorWorkers, ParallelCalls, ParallelTools,
                          SessionShape, SyntheticSessions, Tree, TreeSearch, node_stream, tree_preset)
from trace_shapes.tree_presets import TREE_PRESETS


def _shape(initial=1000, outputs=(100, 100, 100), growth=(50, 50), shared=0, key="system"):
    return SessionShape("t", initial, outputs, growth, (1.0,) * len(growth), shared, key)


def _worker(result_tokens, initial=400):
    return Child(Tree(_shape(initial, (20,), ())), 0.5, result_tokens)


# ---------------------------------------------------------------- the data model
def test_a_join_appends_the_awaited_childrens_results_to_the_parents_context():
    parent = Tree(_shape(), (Branch(0, SPAWN, (_worker(30), _worker(70)), join_turn=1),))
    # turn 1: 1000 + 100 + 50 tool tokens + 30 + 70 results; turn 2 keeps them
    assert [parent.prompt_tokens(k) for k in range(3)] == [1000, 1250, 1400]
    # a quorum join (first one of two) appends the result of the child that ended; by default its largest
    quorum = Tree(_shape(), (Branch(0, SPAWN, (_worker(30), _worker(70)), join_turn=1, wait_for=1),))
    assert quorum.prompt_tokens(1, ended={0: [0]}) == 1180 and quorum.prompt_tokens(1) == 1220


def test_a_fork_inherits_the_parents_whole_context_after_its_turn():
    fork_child = Child(Tree(_shape(initial=1250 + 40, outputs=(10,), growth=())))
    tree = Tree(_shape(), (Branch(1, FORK, (fork_child,)),))
    assert tree.inherited_tokens() == {(0, 0): 1150 + 100}  # turn 1's prompt and its response
    assert tree.depth() == 1 and tree.num_sessions() == 2
    short = Child(Tree(_shape(initial=1190, outputs=(10,), growth=())))
    with pytest.raises(ValueError, match="inherits 1250 tokens, but its child's first prompt is 1190"):
        Tree(_shape(), (Branch(1, FORK, (short,)),))


@pytest.mark.parametrize("make, message", [
    (lambda: Branch(0, "clone", (_worker(1),)), "mode must be one of"),
    (lambda: Branch(0, SPAWN, ()), "at least one child"),
    (lambda: Branch(0, SPAWN, (_worker(1),), wait_for=1), "wait_for needs a join_turn"),
    (lambda: Branch(0, SPAWN, (_worker(1),), join_turn=1, wait_for=2), r"wait_for must lie in \[1, 1\]"),
    (lambda: Tree(_shape(), (Branch(3, SPAWN, (_worker(1),)),)), "the session has 3 turns"),
    (lambda: Tree(_shape(), (Branch(1, SPAWN, (_worker(1),), join_turn=1),)), r"join_turn 1 must lie in \(1, 3\)"),
    (lambda: Tree(_shape(), (), (ParallelCalls(0, (5,), (1,)), ParallelCalls(0, (5,), (1,)))), "must be distinct"),
    (lambda: ParallelCalls(0, (5, 6), (1,)), "as many tails as outputs"),
])
def test_a_tree_that_does_not_hold_together_is_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_drawn_tree_reads_as_recorded_sessions_with_its_joins_in_the_prompts():
    tree = Tree(_shape(shared=200), (Branch(0, SPAWN, (_worker(30), _worker(70)), join_turn=1),),
                (ParallelCalls(2, (5, 6), (7, 8)),))
    recorded = tree.as_recorded("t1")
    assert recorded.node.prompt_tokens == (1000, 1250, 1400) and recorded.node.gaps_s == (1.0, 1.0)
    assert [p for _, p, _ in recorded.walk()] == [(), (0, 0), (0, 1)]
    assert recorded.branches[0].children[1].tree.node.session_id == "t1.0.1"
    assert recorded.parallel == tree.parallel and recorded.shared_prefix() == (200, "system")


# ---------------------------------------------------------------- presets and their streams
def _trees(model, seed, n=20):
    return [model.make(np.random.default_rng(stream)) for stream in np.random.SeedSequence(seed).spawn(n)]


@pytest.mark.parametrize("name", sorted(TREE_PRESETS))
def test_the_same_seed_gives_the_same_trees_and_another_seed_others(name):
    model = tree_preset(name)
    assert _trees(model, 7) == _trees(model, 7)
    assert _trees(model, 7) != _trees(model, 8)


def _all_sessions(tree):
    return [t.node for _, _, t in tree.walk()]


def test_every_session_of_a_tree_draws_from_its_own_stream():
    # a tree's sessions with the same shape parameters: their draws (think times) all differ
    model = OrchestratorWorkers(spawn_probability=1.0, fan_out_mean=6, max_fan_out=6)
    tree = model.make(np.random.default_rng(3))
    thinks = [s.think_s for s in _all_sessions(tree) if s.think_s]
    assert len(thinks) > 10 and len(set(thinks)) == len(thinks)
    paths = [p for _, p, _ in tree.walk()]
    firsts = [node_stream(np.random.default_rng(3), p).random() for p in paths]
    assert len(set(firsts)) == len(paths)
    # the root draws from the generator it is given, as any session of an arrival stream does
    assert node_stream(np.random.default_rng(3), ()).random() == np.random.default_rng(3).random()


def test_a_childs_shape_depends_on_its_path_not_on_its_siblings():
    narrow = OrchestratorWorkers(spawn_probability=1.0, fan_out_mean=3, max_fan_out=3)
    wide = dataclasses.replace(narrow, fan_out_mean=5, max_fan_out=5)
    a, b = narrow.make(np.random.default_rng(11)), wide.make(np.random.default_rng(11))
    assert a.node == b.node  # the root's own turns do not depend on its fan-out
    assert [br.after_turn for br in a.branches] == [br.after_turn for br in b.branches]
    num_compared = 0
    for branch_a, branch_b in zip(a.branches, b.branches):  # fan-outs differ; the workers both have are the same
        common = min(len(branch_a.children), len(branch_b.children))
        assert branch_a.children[:common] == branch_b.children[:common]
        num_compared += common
    assert num_compared >= 3 and [len(br.children) for br in a.branches] != [len(br.children) for br in b.branches]


def test_paths_and_purposes_are_distinct_keys():
    rng = np.random.default_rng(5)
    draws = {(p, purpose): node_stream(rng, p, purpose).random()
             for p in [(0,), (0, 0), (0, 1), (1, 0), (0, 0, 0, 0), (0, 1, 0, 0)] for purpose in (0, 1)}
    assert len(set(draws.values())) == len(draws)


def test_orchestrator_workers_spawn_workers_over_a_shared_prefix_and_join_them():
    tree = OrchestratorWorkers(spawn_probability=1.0).make(np.random.default_rng(1))
    assert tree.branches and all(b.mode == SPAWN and b.join_turn == b.after_turn + 1 for b in tree.branches)
    workers = [c.tree for b in tree.branches for c in b.children]
    assert {w.shared_prefix() for w in workers} == {(1500, "worker-system")}
    assert all(c.result_tokens > 0 for b in tree.branches for c in b.children)
    quorum = OrchestratorWorkers(spawn_probability=1.0, wait_for_fraction=0.5).make(np.random.default_rng(1))
    assert all(b.wait_for == -(-len(b.children) // 2) for b in quorum.branches)
    deep = OrchestratorWorkers(max_depth=3, recurse_probability=1.0, fan_out_mean=2, max_fan_out=2)
    assert deep.make(np.random.default_rng(1)).depth() == 3


def test_tree_search_forks_keep_only_the_best_result():
    tree = TreeSearch().make(np.random.default_rng(2))
    (branch,) = tree.branches
    assert branch.mode == FORK and len(branch.children) == 3 and branch.join_turn == 1
    assert sum(c.result_tokens > 0 for c in branch.children) == 1
    inherited = tree.context_after(0)
    for child in branch.children:  # each branch's context starts with the root's, system prompt and all
        assert child.tree.prompt_tokens(0) > inherited and child.tree.shared_prefix() == (2000, "search-system")


def test_parallel_tools_turns_share_one_prompt_with_distinct_tails():
    tree = ParallelTools(parallel_probability=1.0).make(np.random.default_rng(4))
    assert not tree.branches and len(tree.parallel) == tree.num_turns()
    assert all(2 <= 1 + len(p.tail_tokens) <= 8 for p in tree.parallel)


def test_a_linear_session_is_the_same_as_before():
    # the linear workload's draws are untouched by the tree code: same generator, same shape
    shape = SyntheticSessions().make(np.random.default_rng(9))
    assert Tree(shape).is_linear() and Tree(shape).as_recorded("s").node.prompt_tokens == tuple(
        shape.prompt_tokens(k) for k in range(shape.num_turns))
