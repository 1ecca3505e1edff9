"""Replaying recorded trees (trace_shapes/tree_replay.py): the linear treatments per session, and
what truncation does to branches and joins."""

from __future__ import annotations

import numpy as np
import pytest

from trace_shapes import FORK, SPAWN, Branch, Child, Tree
from trace_shapes.records import RecordedSession
from trace_shapes.replay import ExponentialGaps, ReplayOptions
from trace_shapes.tree_replay import build_tree_replay, replay_tree


def _rec(sid, prompts, outputs, gaps):
    return RecordedSession(sid, "m", tuple(prompts), tuple(outputs), tuple(gaps))


def _tree():
    fork = Tree(_rec("f", [1150, 1400], [50, 50], [None]))  # recorded as inheriting 1100 + its own 50
    spawn = Tree(_rec("s", [300, 500], [40, 40], [1.0]))
    late = Tree(_rec("l", [200], [10], []))
    root = _rec("r", [1000, 1300, 1700], [100, 100, 100], [2.0, 3.0])
    return Tree(root, (Branch(0, FORK, (Child(fork, None),), join_turn=1),
                       Branch(0, SPAWN, (Child(spawn, 0.5),), join_turn=2),
                       Branch(1, SPAWN, (Child(late, 0.0),))))


def test_every_session_gets_the_linear_treatments_and_its_own_gap_stream():
    tree = replay_tree(_tree(), ReplayOptions(truncate_at_tokens=10_000), ExponentialGaps(1.0),
                       np.random.default_rng(0))
    assert tree.node.prompt_tokens(2) == 1700 and tree.node.think_s == (2.0, 3.0)
    fork = tree.branches[0].children[0]
    assert fork.start_delay_s == 0.0 and fork.result_tokens == 0  # unrecorded delay: at once; no results
    assert fork.tree.node.initial_tokens == 1150 and fork.tree.node.think_s[0] > 0  # drawn from the fallback
    again = replay_tree(_tree(), ReplayOptions(truncate_at_tokens=10_000), ExponentialGaps(1.0),
                        np.random.default_rng(0))
    assert again == tree


def test_truncation_drops_later_branches_and_turns_a_cut_join_into_a_background_branch():
    # the root keeps its first two calls (1300 + 100 fits 1450, 1700 + 100 does not)
    tree = replay_tree(_tree(), ReplayOptions(truncate_at_tokens=1450), ExponentialGaps(1.0),
                       np.random.default_rng(0))
    assert tree.node.num_turns == 2
    modes = [(b.after_turn, b.mode, b.join_turn) for b in tree.branches]
    # the spawn joined at call 2 (cut) runs in the background; the fork's child fits (1400 + 50)
    assert modes == [(0, FORK, 1), (0, SPAWN, None), (1, SPAWN, None)]
    assert tree.branches[0].children[0].tree.node.num_turns == 2
    # cut before call 1: the branch after it never starts, the fork's child keeps its first call
    tree = replay_tree(_tree(), ReplayOptions(truncate_at_tokens=1399), ExponentialGaps(1.0),
                       np.random.default_rng(0))
    assert tree.node.num_turns == 1
    assert [(b.after_turn, b.join_turn) for b in tree.branches] == [(0, None), (0, None)]
    assert tree.branches[0].children[0].tree.node.num_turns == 1


def test_a_fork_child_is_raised_to_what_it_inherits():
    fork = Tree(_rec("f", [1050], [50], []))  # shorter than the parent's context after call 0 as replayed
    root = _rec("r", [1000, 900], [100, 100], [1.0])  # call 1 shrinks: raised to 1100 (append-only)
    tree = replay_tree(Tree(root, (Branch(1, FORK, (Child(fork, 0.0),)),)), ReplayOptions(10_000), None,
                       np.random.default_rng(0))
    assert tree.node.prompt_tokens(1) == 1100
    assert tree.branches[0].children[0].tree.node.initial_tokens == 1200  # 1100 + 100 inherited


def test_a_pool_of_trees_keeps_trees_whose_root_fits_and_their_parallel_calls_before_the_cut():
    from trace_shapes import ParallelCalls

    fits = _tree()
    too_long = Tree(_rec("big", [50_000], [10], []))
    replay = build_tree_replay([fits, too_long], ReplayOptions(10_000), ExponentialGaps(1.0))
    assert replay.trees == (fits,) and replay.stats.num_dropped_sessions == 1
    parallel = Tree(_rec("p", [100, 300], [10, 10], [1.0]), (),
                    (ParallelCalls(0, (5,), (5,)), ParallelCalls(1, (7,), (7,))))
    tree = replay_tree(parallel, ReplayOptions(200), None, np.random.default_rng(0))
    assert [p.turn for p in tree.parallel] == [0]  # call 1 (300 + 10) is cut, its calls with it
