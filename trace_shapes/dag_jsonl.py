"""AIPerf's ``dag_jsonl`` (ai-dynamo/aiperf at commit 05440a0: its DAG guide, ``benchmark-modes/dag``
in its docs, and the schema in ``src/aiperf/dataset/loader/dag_jsonl_models.py``): one conversation a line, ``session_id`` and
``turns[]``; a turn has ``messages`` (appended to the session's history, as AIPerf's default
``deltas_without_responses`` mode sends them: each request is every earlier turn's messages and
responses, then this turn's), ``max_tokens``, ``delay`` (ms before the turn), ``model``, ``tools``,
``extra``, and the structural ``forks`` and ``spawns``:

* ``forks``: FORK children inherit the parent's history after this turn, its response included.
  A bare id ends the parent there (only on its last turn); ``{"child", "background": true}`` lets
  the parent go on. Nobody waits for a fork.
* ``spawns``: SPAWN children start from an empty history. A bare id joins at the next turn;
  ``{"children": [...], "join_at": k}`` lets the parent run turns up to k - 1 and wait at turn k;
  a spawn on the last turn is fire-and-forget. AIPerf appends nothing from a child at the join
  (the parent's next turn carries its own messages), so the recorded prompts are as authored.

Conversations no other one names are roots, one tree each; a SPAWN target named by several
parents is a template instantiated under each. Text is counted with a local tokenizer (the
``tokenizers`` library, ``LoaderOptions.tokenizer``), else one token per word as serve-sim counts it
(a note says so), chat-template tokens not counted; a turn
without ``max_tokens`` takes ``LoaderOptions.default_output_tokens``. Leading ``system`` messages of
a root's or a spawn's first turn are a prefix shared by sessions with the same text.

Not read (refused, naming the line): ``orchestrator`` conversations (request-less roots AIPerf
re-fires on every iteration), ``pre_session_spawns`` (children started before the parent's first
request), ``context_mode: message_array_with_responses`` (turns that do not accumulate), and
message parts other than text.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable, Optional

from .aiperf import WORDS_NOTE, count_words, token_counter
from .records import RecordedSession
from .rows import LoaderOptions, Row, RowSource, TraceFormatError
from .tree import FORK, SPAWN, Branch, Child, RecordedTree, Tree

CONVERSATION_KEYS = {"session_id", "turns", "orchestrator", "spawns", "rounds", "think_time_ms", "think_time_sigma",
                     "think_time_min_ms", "think_time_max_ms", "context_mode", "pre_session_spawns"}
TURN_KEYS = {"messages", "model", "max_tokens", "tools", "extra", "forks", "spawns", "delay"}


@dataclass
class _Turn:
    input_tokens: int
    output_tokens: int
    delay_s: float
    model: Optional[str]
    system_text: Optional[str]
    system_tokens: int


@dataclass
class _Conversation:
    row: Row
    turns: list[_Turn]
    # per turn: [(mode, children, join_turn or None)]
    branches: list[list[tuple[str, list[str], Optional[int]]]] = field(default_factory=list)


class _Reader:
    def __init__(self, rows: RowSource, options: LoaderOptions) -> None:
        self.rows, self.options = rows, options
        self.count: Optional[Callable[[str], int]] = None
        self.notes: set[str] = set()

    def tokens(self, row: Row, text: str, where: str) -> int:
        if self.count is None:
            self.count = token_counter(self.options.tokenizer, self.rows.name)
            if self.count is None:
                self.count = count_words
                self.notes.add(WORDS_NOTE)
        return self.count(text)

    def message_text(self, row: Row, message: dict, where: str) -> str:
        content = message.get("content")
        if content is None:
            if message.get("tool_calls") is not None:
                self.notes.add("assistant messages holding only tool_calls are counted as their JSON text")
                return json.dumps(message["tool_calls"], separators=(",", ":"))
            return ""
        if isinstance(content, str):
            return content
        parts = []
        for j, part in enumerate(row.listing(content, f"{where}.content")):
            part = row.mapping(part, f"{where}.content[{j}]")
            if part.get("type") != "text":
                raise row.error(f"{where}.content[{j}]", f"a {part.get('type')!r} part is not text; only text "
                                                        f"parts are counted as tokens")
            parts.append(row.text(row.require(part, "text", f"{where}.content[{j}].text"), f"{where}.content[{j}].text"))
        return "".join(parts)

    def turn(self, row: Row, turn: dict, where: str, k: int) -> _Turn:
        unknown = sorted(set(turn) - TURN_KEYS)
        if unknown:
            raise row.error(f"{where}.{unknown[0]}", f"not a dag_jsonl turn field (fields: {sorted(TURN_KEYS)})")
        messages = row.listing(row.require(turn, "messages", f"{where}.messages"), f"{where}.messages")
        if not messages:
            raise row.error(f"{where}.messages", "a turn needs at least one message")
        tokens = system_tokens = 0
        system_parts: list[str] = []
        for m, message in enumerate(messages):
            at = f"{where}.messages[{m}]"
            message = row.mapping(message, at)
            role = row.require(message, "role", f"{at}.role")
            text = self.message_text(row, message, at)
            count = self.tokens(row, text, f"{at}.content") if text else 0
            tokens += count
            if role == "system":
                if k or len(system_parts) != m:  # AIPerf refuses them too: chat templates drop a later system
                    raise row.error(f"{at}.role", "a system message is only read at the start of a first turn")
                system_parts.append(text)
                system_tokens += count
        if turn.get("tools") is not None:
            self.notes.add("tool definitions are counted as the tokens of their JSON text")
            tokens += self.tokens(row, json.dumps(turn["tools"], separators=(",", ":")), f"{where}.tools")
        if turn.get("max_tokens") is not None:
            output = row.integer(turn["max_tokens"], f"{where}.max_tokens", minimum=1)
        elif self.options.default_output_tokens is not None:
            output = self.options.default_output_tokens
        else:
            raise row.error(f"{where}.max_tokens", "missing (give it per turn, or set default_output_tokens)")
        delay = row.number(turn.get("delay") or 0.0, f"{where}.delay", minimum=0.0) / 1000.0
        model = None if turn.get("model") is None else row.text(turn["model"], f"{where}.model")
        return _Turn(tokens, output, delay, model, "".join(system_parts) if system_parts else None, system_tokens)

    def branches(self, row: Row, turn: dict, where: str, k: int, n: int) -> list[tuple[str, list[str], Optional[int]]]:
        found = []
        foreground, background = [], []
        for j, entry in enumerate(row.listing(turn.get("forks") or [], f"{where}.forks")):
            if isinstance(entry, dict):
                child = row.text(row.require(entry, "child", f"{where}.forks[{j}].child"), f"{where}.forks[{j}].child")
                (background if entry.get("background") else foreground).append(child)
            else:
                foreground.append(row.text(entry, f"{where}.forks[{j}]"))
        if foreground and k != n - 1:
            raise row.error(f"{where}.forks", f"a fork without background: true ends its parent, so it must be on the "
                                              f"last turn ({n - 1})")
        found += [(FORK, group, None) for group in (foreground, background) if group]
        bare: list[str] = []
        for j, entry in enumerate(row.listing(turn.get("spawns") or [], f"{where}.spawns")):
            if isinstance(entry, dict):
                at = f"{where}.spawns[{j}]"
                children = [row.text(c, f"{at}.children") for c in row.listing(row.require(entry, "children",
                                                                                           f"{at}.children"),
                                                                               f"{at}.children")]
                if not children:
                    raise row.error(f"{at}.children", "a spawn needs at least one child")
                join = entry.get("join_at")
                if join is not None:
                    join = row.integer(join, f"{at}.join_at")
                    if not k < join < n:
                        raise row.error(f"{at}.join_at", f"must lie in ({k}, {n}) (after the spawning turn, within "
                                                         f"the conversation's {n} turns), got {join}")
                found.append((SPAWN, children, join if join is not None else (k + 1 if k + 1 < n else None)))
            else:
                bare.append(row.text(entry, f"{where}.spawns[{j}]"))
        if bare:
            found.append((SPAWN, bare, k + 1 if k + 1 < n else None))
        for _, group, _ in found:
            if len(set(group)) != len(group):
                raise row.error(where, f"a child appears twice among this turn's forks or spawns: {group}")
        return found

    def conversation(self, row: Row) -> tuple[str, _Conversation]:
        data = row.data
        unknown = sorted(set(data) - CONVERSATION_KEYS)
        if unknown:
            raise row.error(unknown[0], f"not a dag_jsonl conversation field (fields: {sorted(CONVERSATION_KEYS)})")
        session_id = row.text(row.require(data, "session_id", "session_id"), "session_id")
        if data.get("orchestrator"):
            raise row.error("orchestrator", "request-less orchestrator conversations (re-fired by AIPerf on every "
                                            "iteration) are not read as trees")
        if data.get("pre_session_spawns"):
            raise row.error("pre_session_spawns", "children started before the parent's first request are not read "
                                                  "(a child starts after a turn of its parent)")
        if data.get("context_mode") not in (None, "deltas_without_responses"):
            raise row.error("context_mode", f"{data['context_mode']!r}: only turns that accumulate the history "
                                            f"(deltas_without_responses, the default) are read")
        turns = row.listing(row.require(data, "turns", "turns"), "turns")
        if not turns:
            raise row.error("turns", "a conversation needs at least one turn")
        conversation = _Conversation(row, [])
        for k, turn in enumerate(turns):
            where = f"turns[{k}]"
            turn = row.mapping(turn, where)
            conversation.turns.append(self.turn(row, turn, where, k))
            conversation.branches.append(self.branches(row, turn, where, k, len(turns)))
        return session_id, conversation

    def read(self) -> tuple[list[RecordedTree], int, list[str]]:
        conversations: dict[str, _Conversation] = {}
        num_rows = 0
        for row in self.rows:
            num_rows += 1
            session_id, conversation = self.conversation(row)
            if session_id in conversations:
                raise row.error("session_id", f"{session_id!r} already appeared on line "
                                              f"{conversations[session_id].row.row_number}")
            conversations[session_id] = conversation
        fork_parent: dict[str, str] = {}
        named: set[str] = set()
        for session_id, conversation in conversations.items():
            for k, found in enumerate(conversation.branches):
                for mode, children, _ in found:
                    for child in children:
                        if child not in conversations:
                            raise conversation.row.error(f"turns[{k}].{mode}s", f"names {child!r}, which no line "
                                                                                f"of the file declares")
                        if mode == FORK:
                            if child in fork_parent:
                                raise conversation.row.error(f"turns[{k}].forks", f"{child!r} is already forked by "
                                                                                  f"{fork_parent[child]!r}: a fork "
                                                                                  f"has one parent")
                            fork_parent[child] = session_id
                            if conversations[child].turns[0].system_text is not None:
                                raise conversations[child].row.error(
                                    "turns[0].messages", "a fork continues its parent's history: its first turn "
                                                         "cannot start with a system message")
                        named.add(child)
        roots = [sid for sid in conversations if sid not in named]
        if not roots:
            raise TraceFormatError(self.rows.name, "every conversation is some other one's child (a cycle): no root")
        trees = [self.tree(conversations, sid, sid, None, ()) for sid in roots]
        notes = ["messages are appended to the history with the previous responses (AIPerf's "
                 "deltas_without_responses); chat template tokens are not counted", *sorted(self.notes)]
        return trees, num_rows, notes

    def tree(self, conversations: dict[str, _Conversation], session_id: str, name: str,
             fork_of: Optional[tuple[int, int, Optional[str]]], ancestors: tuple[str, ...]) -> RecordedTree:
        """The tree of ``session_id`` (``fork_of``: inherited tokens and the parent's shared prefix)."""
        conversation = conversations[session_id]
        row = conversation.row
        if session_id in ancestors:
            raise row.error("session_id", f"cycle: {' -> '.join(ancestors + (session_id,))}")
        first = conversation.turns[0]
        if fork_of is None:
            context, shared = 0, first.system_tokens
            key = hashlib.sha256(first.system_text.encode()).hexdigest()[:16] if first.system_text else None
        else:
            context, shared, key = fork_of
        prompts, outputs = [], []
        for turn in conversation.turns:
            context += turn.input_tokens
            prompts.append(context)
            outputs.append(turn.output_tokens)
            context += turn.output_tokens
        model = next((t.model for t in conversation.turns if t.model), "unknown")
        node = row.checked("turns", lambda: RecordedSession(
            name, model, tuple(prompts), tuple(outputs), tuple(t.delay_s for t in conversation.turns[1:]),
            shared_prefix_tokens=shared if key else None, prefix_key=key))
        branches = []
        for k, found in enumerate(conversation.branches):
            for mode, children, join in found:
                inherited = (prompts[k] + outputs[k], shared, key) if mode == FORK else None
                kids = tuple(Child(self.tree(conversations, child, f"{name}/{child}", inherited,
                                             ancestors + (session_id,)),
                                   conversations[child].turns[0].delay_s)
                             for child in children)
                branches.append(Branch(k, mode, kids, join_turn=join))
        return row.checked("turns", lambda: Tree(node, tuple(branches)))


def read_dag_jsonl(rows: RowSource, options: LoaderOptions) -> tuple[list[RecordedTree], int, list[str]]:
    return _Reader(rows, options).read()
