"""What a pool of session trees looks like: fan-out, depth, tree sizes, joins, parallel calls and the
share of tokens in shared prefixes (``loadgen shapes describe`` on a tree format or preset)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from .describe import _fmt, _row, _share, describe_sessions, distribution, recorded_lines
from .tree import FORK, RecordedTree

REPLAY_NOTE = ("trees replay as trees, in the simulator and live against an endpoint "
               "(docs/trace-shapes.md#running-trees), each session with the linear replay's treatments")


def _tokens_share(part: int, whole: int) -> str:
    return f"{part:,} of {whole:,} ({100 * part / whole:.1f}%)" if whole else f"{part:,} of 0"


def shared_prefix_tokens(trees: Sequence[RecordedTree]) -> dict[str, int]:
    """Tokens of the sessions' prompts that another session sends too, by cause.

    A session's first prompt starts with what it shares: a fork's whole inherited context, else a
    cross-session prefix whose key another session of the pool also starts with (a shared system
    prompt; a key only one session has is shared with nobody here). Every later call of the session
    re-sends that prefix; a parallel call shares its turn's whole prompt with the turn's own call."""
    key_counts = Counter(t.shared_prefix()[1] for tree in trees for _, _, t in tree.walk() if t.shared_prefix()[1])
    totals = {"first_call": 0, "first_call_shared": 0, "all_calls": 0, "all_calls_shared": 0,
              "fork": 0, "prefix": 0, "parallel": 0}
    for tree in trees:
        inherited = tree.inherited_tokens()
        for _, path, t in tree.walk():
            n = t.num_turns()
            prompts = [t.prompt_tokens(k) for k in range(n)]
            prefix_tokens, key = t.shared_prefix()
            prefix = prefix_tokens if key and key_counts[key] > 1 else 0
            fork = inherited.get(path, 0)
            shared = max(fork, prefix)
            cause = "fork" if fork >= prefix else "prefix"
            parallel = sum(len(p.tail_tokens) * prompts[p.turn] for p in t.parallel)
            totals["first_call"] += prompts[0]
            totals["first_call_shared"] += shared
            totals["all_calls"] += sum(prompts) + parallel + sum(sum(p.tail_tokens) for p in t.parallel)
            totals["all_calls_shared"] += shared * n + parallel
            totals[cause] += shared * n
            totals["parallel"] += parallel
    return totals


def describe_trees(trees: Sequence[RecordedTree], truncate_at_tokens: int, over_tokens: Sequence[int] = (38_000,),
                   name: str = "") -> dict[str, Any]:
    walks = [list(tree.walk()) for tree in trees]
    branches = [b for walk in walks for _, _, t in walk for b in t.branches]
    parallel = [p for walk in walks for _, _, t in walk for p in t.parallel]
    sessions = [t.node for walk in walks for _, _, t in walk]
    return {
        "name": name,
        "trees": {
            "num_trees": len(trees),
            "num_sessions": len(sessions),
            "num_branching_trees": sum(any(not t.is_linear() for _, _, t in walk) for walk in walks),
            "sessions_per_tree": distribution([len(walk) for walk in walks]),
            "depth": distribution([max(d for d, _, _ in walk) for walk in walks]),
            "fan_out": distribution([len(b.children) for b in branches]),
            "branches_by_mode": dict(Counter(b.mode for b in branches)),
            "joins": {"all": sum(b.join_turn is not None and b.wait_for is None for b in branches),
                      "some": sum(b.wait_for is not None for b in branches),
                      "none": sum(b.join_turn is None for b in branches)},
            "calls_per_parallel_turn": distribution([1 + len(p.tail_tokens) for p in parallel]),
            "shared_prefix_tokens": shared_prefix_tokens(trees),
        },
        "recorded": describe_sessions(sessions, truncate_at_tokens, over_tokens, name)["recorded"],
    }


def format_tree_description(description: dict[str, Any], notes: Optional[Sequence[str]] = None) -> str:
    trees, rec = description["trees"], description["recorded"]
    models = ", ".join(f"{m} {n}" for m, n in rec["models"].items())
    shared = trees["shared_prefix_tokens"]
    modes = trees["branches_by_mode"]
    joins = trees["joins"]
    lines = [f"{description['name']}: {trees['num_trees']} session trees, {trees['num_sessions']} sessions ({models})"]
    lines += [f"  note: {note}" for note in notes or ()]
    lines += [
        "trees:",
        f"  trees that branch: {_share(trees['num_branching_trees'], trees['num_trees'])}",
        _row("sessions per tree", trees["sessions_per_tree"]),
        _row("depth", trees["depth"]),
        _row("fan-out per branch", trees["fan_out"]),
        f"  branches: {modes.get('spawn', 0)} spawn, {modes.get(FORK, 0)} fork; joins: {joins['all']} wait for all, "
        f"{joins['some']} for some, {joins['none']} nobody waits",
        _row("calls per parallel turn", trees["calls_per_parallel_turn"]),
        f"  first calls' tokens in shared prefixes: {_tokens_share(shared['first_call_shared'], shared['first_call'])}",
        f"  all prompt tokens in shared prefixes: {_tokens_share(shared['all_calls_shared'], shared['all_calls'])} "
        f"(fork-inherited {_fmt(shared['fork'], '')}, cross-session prefixes {_fmt(shared['prefix'], '')}, "
        f"parallel calls {_fmt(shared['parallel'], '')})",
        "recorded (every session of every tree):",
        *recorded_lines(rec),
        f"  note: {REPLAY_NOTE}",
    ]
    return "\n".join(lines)
