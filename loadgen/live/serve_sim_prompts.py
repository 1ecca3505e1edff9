"""How serve-sim maps requests onto the simulated engine's streams and makes their output text.

``PromptMapper`` places token-id prompts onto (prefix stream, own stream) by chained block hashes
(serve-sim's vLLM flavour with the CPU offload tier); ``text_to_ids`` and ``WordTokenizer`` turn
text into token ids without ``--tokenizer``; ``TextOutput`` makes generated text that re-tokenizes
to exactly the ids the engine generated.
"""

from __future__ import annotations

import itertools
from typing import Optional

from .tokenizer import SPECIAL_TOKENS, LocalTokenizer, render_simple, single_token_words


class PromptMapper:
    """Token-id prompts onto (prefix stream, own stream) by chained block hashes."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._block_owner: dict[int, tuple[int, int]] = {}  # chained hash -> (stream id, block index)
        self._stream_blocks: dict[int, int] = {}  # stream id -> blocks recorded
        self._busy: set[int] = set()
        # streams whose last request was aborted: the engine may hold blocks past the recorded
        # ones whose content only the aborted request had, so only a prompt of exactly the
        # recorded blocks (the client's retry) may continue them
        self._aborted: set[int] = set()
        self._ids = itertools.count()

    def chained_hashes(self, token_ids: list[int]) -> list[int]:
        bs = self.block_size
        out = []
        h = 0
        for j in range(len(token_ids) // bs):
            h = hash((h, tuple(token_ids[j * bs:(j + 1) * bs])))
            out.append(h)
        return out

    def map(self, token_ids: list[int], prefix_tokens: int) -> tuple[Optional[tuple], int, int]:
        """(prefix key or None, prefix tokens used, own stream id); the stream is busy until
        ``record`` or ``release``."""
        hashes = self.chained_hashes(token_ids)
        prefix_blocks = prefix_tokens // self.block_size if prefix_tokens else 0
        prefix_blocks = min(prefix_blocks, len(hashes))
        prefix_key = ("prefix", hashes[prefix_blocks - 1]) if prefix_blocks else None
        stream = None
        for j in range(len(hashes) - 1, prefix_blocks - 1, -1):
            owner = self._block_owner.get(hashes[j])
            if owner is not None:
                sid, index = owner
                if (index == j and self._stream_blocks.get(sid) == j + 1 and sid not in self._busy
                        and (sid not in self._aborted or j + 1 == len(hashes))):
                    stream = sid
                break
        if stream is None:
            stream = next(self._ids)
            self._stream_blocks[stream] = prefix_blocks
        self._busy.add(stream)
        return prefix_key, prefix_blocks * self.block_size, stream

    def release(self, stream: int) -> None:
        self._busy.discard(stream)

    def record(self, stream: int, hashes: list[int]) -> None:
        """After a turn: the stream's content now covers these blocks (prompt + output)."""
        start = self._stream_blocks.get(stream, 0)
        for j in range(start, len(hashes)):
            self._block_owner[hashes[j]] = (stream, j)
        self._stream_blocks[stream] = max(start, len(hashes))
        self._busy.discard(stream)
        self._aborted.discard(stream)

    def aborted(self, stream: int, prompt_hashes: list[int]) -> None:
        """The stream's request was aborted: it holds at least what its prompt held (the engine
        keeps the hashes of the blocks it computed), maybe more; free again."""
        self.record(stream, prompt_hashes)
        self._aborted.add(stream)


def text_to_ids(text: str, vocab: int = 30000) -> list[int]:
    """A stand-in tokenizer for text prompts: one token per whitespace-separated word."""
    return [hash(word) % (vocab - 1) + 1 for word in text.split()]


class WordTokenizer:
    """serve-sim's tokenizer without ``--tokenizer``: one token per whitespace-separated word
    (``text_to_ids``), chat messages in the simple ChatML template (loadgen/live/tokenizer.py)."""

    def encode_text(self, text: str) -> list[int]:
        return text_to_ids(text)

    encode_plain = encode_text

    def encode_chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
        text = render_simple(messages, add_generation_prompt)
        for special in SPECIAL_TOKENS:  # a token of their own, as a real tokenizer keeps them
            text = text.replace(special, f" {special} ")
        return text_to_ids(text)


class TextOutput:
    """Generated text that re-tokenizes to exactly the ids the engine generated: words of one token
    each (the tokenizer's, or ``t<n>`` words without one), so a client that sends the text back
    (chat, text prompts) continues its stream. A real model's text may not (docs/chat.md#drift)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.words = (single_token_words(tokenizer) if isinstance(tokenizer, LocalTokenizer)
                      else [f"t{i}" for i in range(1, 30000)])

    def make(self, rng, n: int, chat: bool) -> tuple[list[int], list[str]]:
        """(ids, text pieces, one per token): chat content starts without a space (it follows the
        template's newline); a completion continues its prompt, so every word has its space."""
        words = [self.words[i] for i in rng.integers(0, len(self.words), size=n).tolist()]
        pieces = [w if chat and i == 0 else " " + w for i, w in enumerate(words)]
        ids = self.tokenizer.encode_plain("".join(pieces))
        if len(ids) != n:  # a tokenizer that merges across words: the count still is what was asked
            ids = (ids + [ids[-1] if ids else 1] * n)[:n]
        return ids, pieces
