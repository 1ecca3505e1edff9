"""Which session a request belongs to, and how many KV tokens its next turn will hold.

A session is named by a header (the first of ``session_headers`` present), else by a fingerprint
of the conversation's start (docs/gateway.md#sessions has its failure cases):

* chat: the messages up to and including the first user message (system prompt and task);
* completions: the prompt's first ``fingerprint_tokens`` token ids (4x as many characters of a
  text prompt). A first prompt shorter than that is fingerprinted whole, and later prompts are
  matched against the lengths of such short starts, so the session is found again as it grows.

A session's demand d_s is what the in-process gateway uses: the new prompt's tokens plus its
output budget (``max_tokens``). A token-id prompt counts exactly; a text or chat prompt is
estimated from the session's last ``usage`` (the engine's own count of the previous prompt and
output), scaled by how much the request body grew, and never below that prompt plus its output
(an agent's next prompt holds both). A session's first text request uses the bytes per token
measured over every usage seen so far (4 to start with).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

import orjson

MAX_SHORT_STARTS = 64  # distinct short first-prompt lengths kept for fingerprint matching
DEFAULT_BYTES_PER_TOKEN = 4.0


@dataclass
class GatewaySession:
    """One session the gateway knows: admitted, or waiting in one of the gateway's queues."""

    key: str
    last_seen_s: float
    in_flight: int = 0
    admission: Any = None  # the future a parked (or new, waiting) session awaits; None when admitted
    prompt_tokens: Optional[int] = None  # the last usage
    completion_tokens: Optional[int] = None
    body_bytes: int = 0  # the last request body's size
    final: bool = False  # the client said this is its last turn (x-dynamo-session-final)
    ended: bool = False
    # session trees: the session that spawned or forked this one (x-dynamo-parent-session-id), the
    # children still running, and whether it counts as waiting for them at a join (between turns
    # with children running: the gateway cannot tell a join from think time)
    parent: Optional[str] = None
    children: Optional[set] = None
    joining: bool = False


def _digest(kind: bytes, data: bytes) -> str:
    return kind.decode() + ":" + hashlib.blake2b(data, digest_size=12).hexdigest()


class SessionIdentifier:
    def __init__(self, header_names: list[str], fingerprint_tokens: int) -> None:
        self.header_names = [h.lower() for h in header_names]
        self.fingerprint_tokens = fingerprint_tokens
        # short first prompts' lengths (ids, characters), most recent last
        self._short_starts: OrderedDict = OrderedDict()

    def from_headers(self, headers: dict[str, str]) -> Optional[str]:
        for name in self.header_names:
            value = headers.get(name)
            if value:
                return "h:" + value
        return None

    def fingerprint(self, body: dict, known: dict) -> str:
        """The session key of a request without a session header (``known``: the live sessions)."""
        messages = body.get("messages")
        if isinstance(messages, list):
            end = next((i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"),
                       len(messages) - 1)
            return _digest(b"c", orjson.dumps(messages[:end + 1]))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]  # a batch: its first prompt
        if isinstance(prompt, str):
            kind, limit = b"t", 4 * self.fingerprint_tokens
            encode = str.encode
        elif isinstance(prompt, list):
            kind, limit = b"p", self.fingerprint_tokens
            encode = orjson.dumps
        else:
            return _digest(b"x", orjson.dumps(prompt))
        for length in reversed(self._short_starts):
            if length[0] == kind and length[1] <= len(prompt):
                key = _digest(kind, encode(prompt[:length[1]]))
                if key in known:
                    return key
        if len(prompt) < limit:
            self._short_starts[(kind, len(prompt))] = None
            self._short_starts.move_to_end((kind, len(prompt)))
            if len(self._short_starts) > MAX_SHORT_STARTS:
                self._short_starts.popitem(last=False)
        return _digest(kind, encode(prompt[:limit]))


class DemandEstimator:
    """d_s of a request: its prompt's tokens (exact or estimated) plus its output budget."""

    def __init__(self, default_output_tokens: int) -> None:
        self.default_output_tokens = default_output_tokens
        self.bytes_per_token = DEFAULT_BYTES_PER_TOKEN

    def output_tokens(self, body: dict) -> int:
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return self.default_output_tokens

    def prompt_tokens(self, body: dict, body_bytes: int, session: GatewaySession) -> int:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt[:1]):
            return len(prompt)
        if session.prompt_tokens is not None and session.body_bytes:
            scaled = session.prompt_tokens * body_bytes / session.body_bytes
            return int(max(scaled, session.prompt_tokens + (session.completion_tokens or 0)))
        return int(body_bytes / self.bytes_per_token)

    def demand_tokens(self, body: dict, body_bytes: int, session: GatewaySession) -> int:
        return self.prompt_tokens(body, body_bytes, session) + self.output_tokens(body)

    def observe(self, session: GatewaySession, body_bytes: int, usage: dict, text: bool) -> None:
        """A turn's ``usage``: the session's counts for its next estimate, and (``text``: a text or
        chat prompt) the bytes per token a first request is estimated with."""
        prompt = usage.get("prompt_tokens")
        if not isinstance(prompt, int) or prompt <= 0:
            return
        completion = usage.get("completion_tokens")
        session.prompt_tokens = prompt
        session.completion_tokens = completion if isinstance(completion, int) else 0
        session.body_bytes = body_bytes
        if text:
            self.bytes_per_token += 0.05 * (body_bytes / prompt - self.bytes_per_token)
