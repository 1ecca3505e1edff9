"""Session contexts as text, built to exact token lengths: chat messages or a completions text.

A chat session's context is what an agent framework keeps: a system message (the shared system
prompt), the task as a user message, then per turn the assistant's returned content and a tool
message with the tool's output, appended turn by turn, so the server's prefix cache sees a
growing prefix. A text-completions session is the same as one growing text (system prompt, task,
returned text, tool text) for servers that refuse token-id prompts.

Lengths are exact: every turn's prompt (the chat template applied to the messages, then
tokenized; or the text tokenized) has exactly the planned number of tokens, the number the same
spec sends to the simulated engine. The text we write is made of words that are one token each
(``single_token_words``, or the common words the server's /tokenize confirms), and each
message we write is fitted by counting the whole prompt with the tokenizer, so the template's
own tokens and the re-tokenized returned text are absorbed by the message we write next (the
tool message; the task for the first prompt). The system message alone is fitted to the shared
prefix's length, so every session of a run starts with the same prefix of exactly that length.

Re-tokenization drift: the server generated token ids G after the previous prompt P; the next
prompt re-tokenizes the returned text. ``drift_tokens`` is the number of tokens of P + G that the
next prompt does not start with (0: the server's cache holds the next prompt's whole prefix; -1:
unknown, the server returned no ids). docs/chat.md says more.
"""

from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import orjson

from trace_shapes import SessionShape

from ..core.workload import Stream, rng_for
from .tokenizer import Encoded, Segments, TokenizerError, common_prefix

MIN_FILLER_WORDS = 16
# random word indices drawn per written message beyond its planned length: room for the fit to
# write more words than planned when the template or the returned text takes fewer tokens
SPARE_WORDS = 64


class Messages(list):
    """A chat context's message list with its JSON array kept: a turn's request encodes only the
    messages appended since the previous turn's (by identity), not the whole conversation (the
    list only grows; each turn's is a new one)."""

    __slots__ = ("_json",)

    def __init__(self, messages: Sequence[dict] = (), earlier: Optional["Messages"] = None) -> None:
        super().__init__(messages)
        if earlier is not None and 0 < len(earlier) <= len(self) and all(map(operator.is_, earlier, self)):
            new = self[len(earlier):]
            self._json = earlier._json if not new else earlier._json[:-1] + b"," + orjson.dumps(new)[1:]
        else:
            self._json = orjson.dumps(list(self))

    def json(self) -> bytes:
        """The messages as a JSON array, the same bytes as ``orjson.dumps(list(self))``."""
        return self._json


class PromptBuilder:
    """One per client: the tokenizer (local or the server's), the API, the words text is made of,
    and the shared system prompts (fitted once per run, identical in every session)."""

    def __init__(self, counter: Any, api: str) -> None:
        if api not in ("chat", "completions"):
            raise ValueError(f"api must be chat or completions, got {api!r}")
        self.counter = counter
        self.api = api
        self.words: list[str] = []
        self._system: dict[tuple, tuple[Any, list[int], Optional[Encoded]]] = {}
        # the template's tokens around a session's first user message, and around an appended
        # turn, as the last fit found them: the next fit's first guess, usually exact (one count)
        self.start_overhead: Optional[int] = None
        self.turn_overhead = 0

    async def prepare(self) -> None:
        self.words = list(await self.counter.filler_words())
        if len(self.words) < MIN_FILLER_WORDS:
            raise TokenizerError(f"the tokenizer has {len(self.words)} words that are one token each (at least "
                                 f"{MIN_FILLER_WORDS} are needed to write prompts of exact lengths)")

    def text(self, indices: Sequence[int], n: int) -> str:
        words = self.words
        m = len(words)
        return " ".join([words[i % m] for i in indices[:n]])

    async def count(self, content: Any, add_generation_prompt: bool = True, hint: Optional[Encoded] = None
                    ) -> tuple[Sequence[int], Optional[Encoded]]:
        """The content's token ids, and a hint that makes counting its continuation cheap."""
        if self.api == "chat":
            return await self.counter.chat_ids_from(content, add_generation_prompt, hint)
        return await self.counter.text_ids(content), None

    async def fit(self, make, target: int, guess: int, n_max: int, add_generation_prompt: bool = True,
                  hint: Optional[Encoded] = None) -> tuple[Any, Sequence[int], Optional[Encoded], int]:
        """The content ``make(n)`` (n words, 0..n_max) that counts ``target`` tokens, with its ids,
        its hint and n; when no n does (a template longer than the target), the closest, shorter
        first. The content returned is the one counted (the next count's hint refers to it)."""
        n = min(max(guess, 0), n_max)
        tried: dict[int, tuple[Any, Sequence[int], Optional[Encoded]]] = {}
        for _ in range(8):
            content = make(n)
            ids, new_hint = await self.count(content, add_generation_prompt, hint)
            tried[n] = (content, ids, new_hint)
            diff = target - len(ids)
            if diff == 0:
                return content, ids, new_hint, n
            nxt = min(max(n + diff, 0), n_max)
            if nxt in tried:
                break
            n = nxt
        n = min(tried, key=lambda k: (abs(len(tried[k][1]) - target), len(tried[k][1])))
        return (*tried[n], n)

    async def system(self, shape: SessionShape, run_key: tuple[int, str]) -> tuple[Any, list[int], Optional[Encoded]]:
        """The run's shared system prompt (a message, or the text) fitted to its token length, its
        ids, and the hint that counts a prompt starting with it from there."""
        seed, arm = run_key
        key = (seed, arm, shape.prefix_key, shape.shared_prefix_tokens)
        if key not in self._system:
            target = shape.shared_prefix_tokens
            rng = rng_for(Stream.SHARED_PREFIX_TOKENS, seed, arm, shape.prefix_key, target)
            indices = rng.integers(0, 1 << 30, size=target + SPARE_WORDS).tolist()
            if self.api == "chat":
                def make(n):
                    return [{"role": "system", "content": self.text(indices, n)}]
            else:
                def make(n):
                    return self.text(indices, n)
            content, ids, hint, _ = await self.fit(make, target, target - 5, len(indices), add_generation_prompt=False)
            self._system[key] = (content, ids, hint)
        return self._system[key]

    def session(self, shape: SessionShape, run_key: tuple[int, str], session_id: int) -> "TextContext":
        return TextContext(self, shape, run_key, session_id)


class TextContext:
    """One session's context as chat messages or text; the session-side surface of
    ``loadgen.core.session.TokenContext`` (``start``, ``extend``, ``content``, ``drift_tokens``)."""

    ids = None  # no token-id prompt: ``content`` is sent

    def __init__(self, builder: PromptBuilder, shape: SessionShape, run_key: tuple[int, str], session_id: int) -> None:
        self.builder = builder
        self.shape = shape
        self.run_key = run_key
        seed, arm = run_key
        self._rng = rng_for(Stream.SESSION_TOKENS, seed, arm, session_id)
        self._drawn: list[int] = []
        self._num_used = 0
        self.chat = builder.api == "chat"
        self.messages = Messages()
        self.text = ""
        self._ids = Segments()  # the current prompt's token ids as counted
        self.planned_tokens = shape.initial_tokens
        self.drift_tokens = 0  # of the previous turn's prompt + output, what this prompt does not start with
        self._hint: Optional[Encoded] = None  # the current prompt's encoding, to count the next one from
        self._head: Optional[tuple] = None  # a fork's first content (``fork``), else the system prompt

    @property
    def content(self) -> Any:
        return self.messages if self.chat else self.text

    @property
    def prompt_ids(self) -> list[int]:
        """The current prompt's token ids, as counted."""
        return list(self._ids)

    def _indices(self, n: int) -> list[int]:
        """``n`` + SPARE_WORDS random word indices, from draws made a block at a time (a call to
        the generator costs more than the few dozen words a turn usually writes)."""
        n += SPARE_WORDS
        if len(self._drawn) - self._num_used < n:
            self._drawn = self._drawn[self._num_used:] + self._rng.integers(0, 1 << 30, size=max(n, 1024)).tolist()
            self._num_used = 0
        self._num_used += n
        return self._drawn[self._num_used - n:self._num_used]

    def fork_head(self, returned: Optional[str] = None) -> tuple:
        """What a fork of this context begins with (loadgen/core/tree_runtime.py): the prompt as
        sent and, after a turn (``returned``: the text the server returned), that text as the
        assistant's, so a server's prefix cache holds the fork's whole head; with its hint."""
        if returned is None:
            return (self.messages if self.chat else self.text), self._hint
        if self.chat:
            return Messages([*self.messages, {"role": "assistant", "content": returned}], self.messages), self._hint
        return self.text + returned, self._hint

    def fork(self, head: tuple, head_tokens: int) -> None:
        """Begin with ``head`` (another context's ``fork_head``, about ``head_tokens`` tokens)
        instead of the system prompt: ``start`` then writes this session's own first message after it."""
        self._head = (*head, head_tokens)

    async def start(self) -> None:
        if self._head is not None:
            await self._start_forked()
            return
        b = self.builder
        shape = self.shape
        head: Any = [] if self.chat else ""
        head_ids: list[int] = []
        head_hint = None
        if shape.shared_prefix_tokens:
            head, head_ids, head_hint = await b.system(shape, self.run_key)
        indices = self._indices(shape.initial_tokens - shape.shared_prefix_tokens)
        if self.chat:
            def make(n):
                return [*head, {"role": "user", "content": b.text(indices, n)}]
        else:
            def make(n):
                return (head + " " if head else "") + b.text(indices, n)
        task = shape.initial_tokens - shape.shared_prefix_tokens
        guess = task - 8 if b.start_overhead is None else shape.initial_tokens - len(head_ids) - b.start_overhead
        content, ids, self._hint, n = await b.fit(make, shape.initial_tokens, guess, len(indices), hint=head_hint)
        self._ids = Segments.of(ids)
        b.start_overhead = len(ids) - len(head_ids) - n
        if self.chat:
            self.messages = Messages(content)
        else:
            self.text = content

    async def _start_forked(self) -> None:
        """The parent's messages (or text) as the fork's head, then a user message (or text) of
        this session's own words, fitted so the first prompt has the planned length."""
        b = self.builder
        head, hint, head_tokens = self._head
        own = max(self.shape.initial_tokens - head_tokens, 0)
        indices = self._indices(own)
        if self.chat:
            def make(n):
                return [*head, {"role": "user", "content": b.text(indices, n)}]
        else:
            def make(n):
                return head + " " + b.text(indices, n)
        content, ids, self._hint, _ = await b.fit(make, self.shape.initial_tokens, own, len(indices), hint=hint)
        self._ids = Segments.of(ids)
        if self.chat:
            self.messages = Messages(content, head)
        else:
            self.text = content

    async def extend(self, result: Any, num_output: int, num_tool: int) -> None:
        """After a turn: append the returned content and a tool output sized so the next prompt has
        the planned length (the previous plan + output + tool tokens); measure the drift."""
        b = self.builder
        returned = result.output_text
        if returned is None:  # a server that streamed no text: stand-in words of the output's length
            returned = (" " if not self.chat else "") + b.text(self._indices(num_output), num_output)
        self.planned_tokens += num_output + num_tool
        indices = self._indices(num_tool + num_output)
        if self.chat:
            base = [*self.messages, {"role": "assistant", "content": returned}]

            def make(n):
                return [*base, {"role": "tool", "content": b.text(indices, n)}]
        else:
            base_text = self.text + returned

            def make(n):
                return base_text + " " + b.text(indices, n)
        before = self._ids
        content, ids, self._hint, n = await b.fit(make, self.planned_tokens, num_tool - b.turn_overhead,
                                                  len(indices), hint=self._hint)
        b.turn_overhead = len(ids) - len(before) - num_output - n
        generated = result.output_token_ids
        if generated is None:
            self.drift_tokens = -1
        else:
            old = before.plus(list(generated))
            self.drift_tokens = len(old) - common_prefix(old, Segments.of(ids))
        self._ids = Segments.of(ids)
        if self.chat:
            self.messages = Messages(content, self.messages)
        else:
            self.text = content


async def probe_content(builder: PromptBuilder, num_tokens: int) -> tuple[Any, int]:
    """A prompt of about ``num_tokens`` tokens for the preflight's repeated probe, and its count."""
    indices = list(range(num_tokens))
    text = builder.text(indices, num_tokens)
    content = [{"role": "user", "content": text}] if builder.api == "chat" else text
    return content, len((await builder.count(content))[0])
