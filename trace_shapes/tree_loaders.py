"""Read session trees from local files: AIPerf ``dag_jsonl``, WEKA agentic-coding traces with their
``subagent`` records, GuideLLM multi-turn ``branches`` and the generic ``tree`` format.

Every format becomes a list of :class:`Tree` of :class:`RecordedSession` (the whole context each call
sent, as recorded); a malformed file or row raises :class:`TraceFormatError` naming the file, the
row (1-based line, or the element of a one-document file) and the field.

``tree`` (generic; docs/trace-shapes.md#the-tree-format)
    One tree a row: ``calls`` = ``[[prompt_tokens, output_tokens, gap_s], ...]`` as in the
    ``shapes`` format (whole contexts; ``gap_s`` of call k >= 1 is the pause before it, null where
    not recorded), optional ``tree_id``, ``model``, ``shared_prefix_tokens`` with ``prefix_key``,
    ``branches`` = ``[{after_call, mode: spawn|fork, join_call, wait_for, children: [node...]}]``
    and ``parallel`` = ``[{call, calls: [[tail_tokens, output_tokens], ...]}]``; a child is a
    node with ``calls`` (and its own branches), plus ``start_delay_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from .dag_jsonl import read_dag_jsonl
from .guidellm import read_guidellm
from .records import RecordedSession
from .rows import FileRows, JsonDocumentRows, LoaderOptions, Row, RowSource, TraceFormatError
from .tree import MODES, RecordedTree, Branch, Child, ParallelCalls, Tree
from .weka import read_weka



@dataclass(frozen=True)
class LoadedTrees:
    """The session trees of one file, and what the loader had to do to read them."""

    path: str
    format: str
    trees: tuple[RecordedTree, ...]
    num_rows: int
    notes: tuple[str, ...] = ()

    def sessions(self) -> list[RecordedSession]:
        return [t.node for tree in self.trees for _, _, t in tree.walk()]

    def num_branching(self) -> int:
        """Trees with a branch or parallel calls anywhere (the ones a linear replay cannot run)."""
        return sum(any(not t.is_linear() for _, _, t in tree.walk()) for tree in self.trees)


# ---------------------------------------------------------------- the generic tree format
def _calls(row: Row, obj: dict, where: str) -> tuple[list[int], list[int], list[Optional[float]]]:
    calls = row.listing(row.require(obj, "calls", f"{where}calls"), f"{where}calls")
    if not calls:
        raise row.error(f"{where}calls", "a session needs at least one call")
    prompts, outputs, gaps = [], [], []
    for k, call in enumerate(calls):
        field = f"{where}calls[{k}]"
        call = row.listing(call, field)
        if len(call) != 3:
            raise row.error(field, f"expected [prompt_tokens, output_tokens, gap_s], got {call!r}")
        prompts.append(row.integer(call[0], f"{field}[0]", minimum=1))
        outputs.append(row.integer(call[1], f"{field}[1]"))
        if k:
            gaps.append(None if call[2] is None else row.number(call[2], f"{field}[2]", minimum=0.0))
    return prompts, outputs, gaps


def _tree_node(row: Row, obj: dict, where: str, session_id: str, model: str) -> RecordedTree:
    prompts, outputs, gaps = _calls(row, obj, where)
    shared = obj.get("shared_prefix_tokens")
    key = obj.get("prefix_key")
    if (shared is None) != (key is None):
        raise row.error(f"{where}prefix_key", "shared_prefix_tokens and prefix_key go together")
    node = row.checked(f"{where}shared_prefix_tokens", lambda: RecordedSession(
        session_id, row.text(obj.get("model") or model, f"{where}model"), tuple(prompts), tuple(outputs),
        tuple(gaps), None if shared is None else row.integer(shared, f"{where}shared_prefix_tokens"),
        None if key is None else row.text(key, f"{where}prefix_key")))
    branches = []
    for b, branch in enumerate(row.listing(obj.get("branches") or [], f"{where}branches")):
        at = f"{where}branches[{b}]."
        branch = row.mapping(branch, at[:-1])
        mode = row.require(branch, "mode", f"{at}mode")
        if mode not in MODES:
            raise row.error(f"{at}mode", f"expected one of {list(MODES)}, got {mode!r}")
        children = []
        for c, child in enumerate(row.listing(row.require(branch, "children", f"{at}children"), f"{at}children")):
            child_at = f"{at}children[{c}]."
            child = row.mapping(child, child_at[:-1])
            delay = child.get("start_delay_s")
            subtree = _tree_node(row, child, child_at, f"{session_id}.{b}.{c}", node.model)
            children.append(Child(subtree, None if delay is None else row.number(delay, f"{child_at}start_delay_s",
                                                                                   minimum=0.0)))
        after = row.integer(row.require(branch, "after_call", f"{at}after_call"), f"{at}after_call")
        if after >= len(prompts):
            raise row.error(f"{at}after_call", f"the session has {len(prompts)} calls, got {after}")
        join = branch.get("join_call")
        if join is not None and not after < row.integer(join, f"{at}join_call") < len(prompts):
            raise row.error(f"{at}join_call", f"must lie in ({after}, {len(prompts)}), got {join}")
        wait_for = branch.get("wait_for")
        branches.append(row.checked(at[:-1], lambda: Branch(
            after, mode, tuple(children), join,
            None if wait_for is None else row.integer(wait_for, f"{at}wait_for", minimum=1))))
    parallel = []
    for p, entry in enumerate(row.listing(obj.get("parallel") or [], f"{where}parallel")):
        at = f"{where}parallel[{p}]."
        entry = row.mapping(entry, at[:-1])
        pairs = [row.listing(pair, f"{at}calls[{j}]")
                 for j, pair in enumerate(row.listing(row.require(entry, "calls", f"{at}calls"), f"{at}calls"))]
        if any(len(pair) != 2 for pair in pairs):
            raise row.error(f"{at}calls", "expected [[tail_tokens, output_tokens], ...]")
        parallel.append(row.checked(at[:-1], lambda: ParallelCalls(
            row.integer(row.require(entry, "call", f"{at}call"), f"{at}call"),
            tuple(row.integer(pair[0], f"{at}calls[{j}][0]", minimum=1) for j, pair in enumerate(pairs)),
            tuple(row.integer(pair[1], f"{at}calls[{j}][1]", minimum=1) for j, pair in enumerate(pairs)))))
    return row.checked(where.rstrip(".") or "branches", lambda: Tree(node, tuple(branches), tuple(parallel)))


def read_tree(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedTree], int, list[str]]:
    trees, num_rows = [], 0
    for row in rows:
        num_rows += 1
        tree_id = row.text(row.data.get("tree_id") or f"{Path(rows.name).name}:{row.row_number}", "tree_id")
        trees.append(_tree_node(row, row.data, "", tree_id, "unknown"))
    return trees, num_rows, []


# ---------------------------------------------------------------- dispatch
TreeReader = Callable[[RowSource, LoaderOptions], tuple[list[RecordedTree], int, list[str]]]


TREE_FORMATS: dict[str, tuple[TreeReader, Callable[[Union[str, Path]], RowSource]]] = {
    "dag_jsonl": (read_dag_jsonl, FileRows),
    "weka": (read_weka, JsonDocumentRows),  # one trace a file (a JSON document), or one a line
    "guidellm": (read_guidellm, JsonDocumentRows),
    "tree": (read_tree, FileRows),
}


def load_trees(path: Union[str, Path], format: str, options: Optional[LoaderOptions] = None) -> LoadedTrees:
    """Every session tree of the file ``path`` read as ``format`` (one of :data:`TREE_FORMATS`)."""
    if format not in TREE_FORMATS:
        raise ValueError(f"unknown tree format {format!r}; formats: {sorted(TREE_FORMATS)}")
    reader, source = TREE_FORMATS[format]
    rows = source(path)
    trees, num_rows, notes = reader(rows, options or LoaderOptions())
    if not trees:
        raise TraceFormatError(rows.name, f"no session trees in {num_rows} rows")
    return LoadedTrees(rows.name, format, tuple(trees), num_rows, tuple(notes))
