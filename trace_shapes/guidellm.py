"""GuideLLM's multi-turn synthetic data with sub-agent ``branches`` (vllm-project/guidellm v0.7.3-12,
commit ee7a774: its multi-turn guide, ``guides/multiturn`` in its docs, the ``BranchSpec`` of
``src/guidellm/data/deserializers/synthetic.py`` and the history edges of
``src/guidellm/scheduler/schemas/conversation.py``): one
``synthetic_text`` data config a row (a JSON document or JSONL), read as the tree every
conversation it generates has:

* the main chain: ``turns`` turns of ``prompt_tokens`` new tokens each (``first_prompt_tokens`` /
  ``first_output_tokens`` for turn 0), ``output_tokens`` generated, the history accumulating
  (GuideLLM's ``full`` edges); a prefix of ``prefix_tokens`` (``prefix_count`` 1) starts the first
  prompt and is shared by every conversation of the config; ``delay`` (s, GuideLLM's requeue delay
  of a main turn) before the next main turn and before the first turn of a branch it spawns;
* a branch ``{at_turn, turns, merge_after (1), first_prompt_tokens, first_output_tokens}`` spawns
  after main turn ``at_turn`` with a fresh context (a ``new`` edge), runs its turns with the main
  sizes, and merges into main turn ``at_turn + merge_after``, which waits for every branch merging
  there and receives each branch's last request and response (a ``last`` edge: that turn's
  prompt and output tokens).

GuideLLM draws sizes from a distribution when ``*_stdev`` is set; this loader reads fixed sizes only
and refuses those, as it refuses several prefixes drawn at random and tool-call turns (which add
injected turns); ``*_min`` / ``*_max`` clamp the fixed size as they clamp GuideLLM's draws.
"""

from __future__ import annotations

from typing import Optional

from .records import RecordedSession
from .rows import LoaderOptions, Row, RowSource
from .tree import SPAWN, Branch, Child, RecordedTree, Tree

SIZES = ("prompt_tokens", "output_tokens", "first_prompt_tokens", "first_output_tokens")
CONFIG_KEYS = ({"kind", "turns", "branches", "prefix_tokens", "prefix_count", "prefix_buckets", "delay",
                "tool_call_turns", "server_tool_call_turns", "tools"}
               | {f"{s}{suffix}" for s in SIZES + ("delay", "tool_response_tokens") for suffix in ("", "_stdev", "_min", "_max")})
BRANCH_KEYS = {"at_turn", "turns", "agent_id", "merge_after"} | {f"{s}{suffix}" for s in SIZES[2:]
                                                                  for suffix in ("", "_stdev", "_min", "_max")}


def _size(row: Row, obj: dict, name: str, where: str, fallback: Optional[int]) -> Optional[int]:
    """The fixed size ``name`` of ``obj`` clamped by its _min/_max, else ``fallback``."""
    if obj.get(f"{name}_stdev") is not None:
        raise row.error(f"{where}{name}_stdev", "GuideLLM draws these sizes at random; this loader reads fixed "
                                                "sizes (drop the _stdev)")
    if obj.get(name) is None:
        return fallback
    value = row.integer(obj[name], f"{where}{name}", minimum=1)
    low, high = obj.get(f"{name}_min"), obj.get(f"{name}_max")
    if low is not None:
        value = max(value, row.integer(low, f"{where}{name}_min", minimum=1))
    if high is not None:
        value = min(value, row.integer(high, f"{where}{name}_max", minimum=1))
    return value


def _unknown(row: Row, obj: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known)
    if unknown:
        raise row.error(f"{where}{unknown[0]}", "not a field of GuideLLM's synthetic_text config this loader knows")


def _prefix_tokens(row: Row, data: dict) -> int:
    if data.get("prefix_buckets"):
        buckets = row.listing(data["prefix_buckets"], "prefix_buckets")
        if len(buckets) != 1 or row.mapping(buckets[0], "prefix_buckets[0]").get("prefix_count", 1) != 1:
            raise row.error("prefix_buckets", "several prefixes are drawn at random per conversation; this loader "
                                              "reads one prefix (one bucket, prefix_count 1)")
        return row.integer(buckets[0].get("prefix_tokens") or 0, "prefix_buckets[0].prefix_tokens")
    if (data.get("prefix_count") or 1) != 1:
        raise row.error("prefix_count", "several prefixes are drawn at random per conversation; this loader reads one")
    return row.integer(data.get("prefix_tokens") or 0, "prefix_tokens")


def _config_tree(row: Row, name: str, options: LoaderOptions) -> RecordedTree:
    data = row.data
    _unknown(row, data, CONFIG_KEYS, "")
    if data.get("kind", "synthetic_text") != "synthetic_text":
        raise row.error("kind", f"expected 'synthetic_text', got {data['kind']!r}")
    for field in ("tool_call_turns", "server_tool_call_turns"):
        if data.get(field):
            raise row.error(field, "tool-call turns insert injected turns; not read by this loader")
    if data.get("delay_stdev") is not None:
        raise row.error("delay_stdev", "GuideLLM draws delays at random; this loader reads a fixed delay")
    prompt = _size(row, data, "prompt_tokens", "", None)
    if prompt is None:
        raise row.error("prompt_tokens", "missing")
    output = _size(row, data, "output_tokens", "", options.default_output_tokens)
    if output is None:
        raise row.error("output_tokens", "missing (or set default_output_tokens)")
    first_prompt = _size(row, data, "first_prompt_tokens", "", prompt)
    first_output = _size(row, data, "first_output_tokens", "", output)
    num_turns = row.integer(data.get("turns", 1), "turns", minimum=1)
    delay = 0.0 if data.get("delay") is None else row.number(data["delay"], "delay", minimum=0.0)
    prefix = _prefix_tokens(row, data)
    merges: dict[tuple[int, int], list[tuple[RecordedTree, int]]] = {}
    for b, branch in enumerate(row.listing(data.get("branches") or [], "branches")):
        at = f"branches[{b}]."
        branch = row.mapping(branch, f"branches[{b}]")
        _unknown(row, branch, BRANCH_KEYS, at)
        after = row.integer(row.require(branch, "at_turn", f"{at}at_turn"), f"{at}at_turn")
        merge = after + row.integer(branch.get("merge_after", 1), f"{at}merge_after", minimum=1)
        if merge >= num_turns:
            raise row.error(f"{at}merge_after", f"at_turn {after} + merge_after = {merge} must be less than turns "
                                                f"{num_turns} (the merge turn must exist)")
        n = row.integer(row.require(branch, "turns", f"{at}turns"), f"{at}turns", minimum=1)
        sizes = [(_size(row, branch, "first_prompt_tokens", at, first_prompt),
                  _size(row, branch, "first_output_tokens", at, first_output))] + [(prompt, output)] * (n - 1)
        child = _chain(row, f"{name}/branch{b}", sizes, (0.0,) * (n - 1), 0)
        merges.setdefault((after, merge), []).append((child, sizes[-1][0] + sizes[-1][1]))
    sizes = [(first_prompt, first_output)] + [(prompt, output)] * (num_turns - 1)
    appended = [0] * num_turns  # what each main turn receives from the branches merging into it
    for (_, merge), children in merges.items():
        appended[merge] += sum(last for _, last in children)
    root = _chain(row, name, sizes, (delay,) * (num_turns - 1), prefix, appended)
    # GuideLLM holds a node back by the requeue delay of the parent that unlocks it: a branch's first
    # turn starts `delay` after main turn at_turn; a merge turn waits `delay` only when the main turn
    # before it ends after the branches (read here as `delay` after the later of them)
    branches = tuple(Branch(after, SPAWN, tuple(Child(child, delay) for child, _ in children), join_turn=merge)
                     for (after, merge), children in sorted(merges.items()))
    return row.checked("branches", lambda: Tree(root.node, branches))


def _chain(row: Row, name: str, sizes: list[tuple[int, int]], gaps: tuple[float, ...], prefix: int,
           appended: Optional[list[int]] = None) -> RecordedTree:
    """A linear conversation whose history accumulates: turn k sends every earlier prompt and output,
    what merged into it, then its own prompt."""
    prompts, context = [], prefix
    for k, (new, out) in enumerate(sizes):
        context += (appended[k] if appended else 0) + new
        prompts.append(context)
        context += out
    key = f"guidellm:{row.path}:{row.row_number}:prefix" if prefix else None
    node = row.checked("turns", lambda: RecordedSession(name, "unknown", tuple(prompts), tuple(o for _, o in sizes),
                                                        gaps, prefix if key else None, key))
    return Tree(node)


def read_guidellm(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedTree], int, list[str]]:
    trees, num_rows = [], 0
    for row in rows:
        num_rows += 1
        trees.append(_config_tree(row, f"guidellm:{row.row_number}", options))
    notes = ["each config is the tree of every conversation it generates (fixed sizes); a merge turn receives "
             "each branch's last request and response"]
    return trees, num_rows, notes
