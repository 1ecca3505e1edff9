"""Counting a text prompt's tokens as the server will: a local Hugging Face tokenizer or the
server's own ``/tokenize``.

A chat request's prompt is the model's chat template applied to the message list, then
tokenized; a text completion's prompt is the text tokenized with the tokenizer's special tokens
(vLLM adds a BOS where the model wants one). Both counters here do exactly that:

* ``LocalTokenizer``: the ``tokenizers`` library (the optional extra ``chat``) on a
  ``tokenizer.json`` file or a model directory holding one. The chat template is the model's,
  from ``tokenizer_config.json`` (``chat_template``), rendered with ``jinja2`` as transformers
  renders it; without a template there, or without jinja2 installed, it is ``SIMPLE_CHAT_TEMPLATE``
  (ChatML), which is also what serve-sim applies (docs/chat.md#chat-template).
* ``ServerTokenizer``: vLLM's ``POST /tokenize``, which takes ``messages`` (template applied by
  the server) or a ``prompt``, and answers the token ids.

Both answer token ids, not only counts: the ids are what re-tokenization drift is measured on
(loadgen/live/chat.py).
"""

from __future__ import annotations

import bisect
import itertools
import json
import operator
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional, Sequence

# ChatML: what serve-sim applies, and the fallback when a model directory has no template (or
# jinja2 is missing). Written here in Jinja for the docs; ``render_simple`` is the same in Python.
SIMPLE_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>")


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used; the message names the file and what to do."""


def render_simple(messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
    """``SIMPLE_CHAT_TEMPLATE`` rendered without jinja2."""
    parts = [f"<|im_start|>{m['role']}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _import_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise TokenizerError("a local tokenizer needs the `tokenizers` library: pip install 'agent-loadgen[chat]'") \
            from None
    return tokenizers


class LocalTokenizer:
    """A Hugging Face tokenizer on this machine, with the model's chat template for counting."""

    def __init__(self, path: str | Path) -> None:
        tokenizers = _import_tokenizers()
        path = Path(path).expanduser()
        directory = path if path.is_dir() else path.parent
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerError(f"{path}: no tokenizer.json there (expected a tokenizer.json file or a model "
                                 "directory holding one)")
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises its own Exception type for a malformed file
            raise TokenizerError(f"{file}: not a Hugging Face tokenizer.json ({exc})") from None
        self.path = file
        config = _read_config(directory / "tokenizer_config.json")
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.template_source = "simple"  # docs/chat.md#chat-template
        self._template = None
        template = _pick_template(config.get("chat_template"))
        if template is None and (directory / "chat_template.jinja").is_file():
            template = (directory / "chat_template.jinja").read_text()
        if template is not None:
            try:
                self._template = _compile(template)
                self.template_source = "tokenizer_config"
            except ImportError:
                self.template_source = "simple (jinja2 not installed: pip install 'agent-loadgen[chat]')"
            except Exception as exc:
                raise TokenizerError(f"{directory / 'tokenizer_config.json'}: chat_template does not compile "
                                     f"({exc})") from None

    # ------------------------------------------------------------ rendering and encoding
    def render(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            return render_simple(messages, add_generation_prompt)
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token, eos_token=self.eos_token, tools=None)

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        # as vLLM does: the rendered template already holds whatever BOS the model wants
        return self._tok.encode(self.render(messages, add_generation_prompt), add_special_tokens=False).ids

    def encode_chat_from(self, messages: Sequence[dict], add_generation_prompt: bool, hint: Optional["Encoded"]
                         ) -> tuple["Segments", "Encoded"]:
        """``encode_chat`` reusing the encoding of an earlier prompt of the same conversation
        (``hint``, as returned): only the text after the last special token the two renderings
        share is encoded again. Exact, because a tokenizer splits its special tokens out before
        anything else, so no token spans one; a context of 40K tokens then costs its new turn's
        text, not 40K tokens, per count. When the hint's messages open this list unchanged and
        the template renders turn by turn (``renders_by_turn``), only the new messages are
        rendered too. Returns (ids, the hint for the next call); the hint keeps ``messages``, which
        the caller does not change afterwards."""
        text, bare_len, head_text = self._render_from(messages, add_generation_prompt, hint)
        if hint is not None:
            cut = self._shared_cut(text, hint.text)
            if cut > 0:
                j = hint.starts.count_below(cut)
                enc = self._tok.encode(text[cut:], add_special_tokens=False)
                ids = hint.ids.head(j).plus(enc.ids)
                starts = hint.starts.head(j).plus([cut + start for start, _ in enc.offsets])
                return ids, Encoded(messages, text, bare_len, ids, starts, head_text)
        enc = self._tok.encode(text, add_special_tokens=False)
        ids = Segments.of(enc.ids)
        return ids, Encoded(messages, text, bare_len, ids, Segments.of([start for start, _ in enc.offsets]), head_text)

    def _render_from(self, messages: Sequence[dict], add_generation_prompt: bool, hint: Optional["Encoded"]
                     ) -> tuple[str, int, Optional[str]]:
        """The rendered prompt, the length of its part without the generation prompt, and the
        first HEAD_MESSAGES rendered alone when rendered turn by turn."""
        suffix = self._generation_suffix() if add_generation_prompt else ""
        old = hint.messages if hint is not None else ()
        if (HEAD_MESSAGES <= len(old) < len(messages) and self.renders_by_turn
                and [m.get("role") for m in messages[:HEAD_MESSAGES]] == HEAD_ROLES
                and all(map(operator.is_, old, messages))):
            head = messages[:HEAD_MESSAGES]
            head_text = hint.head_text if hint.head_text is not None else self.render(head, False)
            with_new = self.render([*head, *messages[len(old):]], False)
            bare = hint.text[:hint.bare_len] + with_new[len(head_text):]
            return bare + suffix, len(bare), head_text
        text = self.render(messages, add_generation_prompt)
        return text, len(text) - len(suffix) if text.endswith(suffix) else len(text), None

    def _generation_suffix(self) -> str:
        if not hasattr(self, "_gen_suffix"):
            probe = _PROBE_CONVERSATION[:HEAD_MESSAGES]
            bare, full = self.render(probe, False), self.render(probe, True)
            self._gen_suffix = full[len(bare):] if full.startswith(bare) else ""
        return self._gen_suffix

    @property
    def renders_by_turn(self) -> bool:
        """Whether the template renders a conversation as its first messages' rendering followed
        by each appended turn's own (ChatML and most templates do): checked once on a probe
        conversation like our sessions' (system, user, then assistant and tool turns), rendering
        the turns after the first two messages as if they followed those two directly, and the
        generation prompt as a fixed suffix. A template that renders otherwise (one that looks at
        the whole list, say) is rendered whole every time."""
        if not hasattr(self, "_by_turn"):
            self._by_turn = self._check_renders_by_turn()
        return self._by_turn

    def _check_renders_by_turn(self) -> bool:
        try:
            m = _PROBE_CONVERSATION
            suffix = self._generation_suffix()
            head = m[:HEAD_MESSAGES]
            head_text = self.render(head, False)
            for k in range(HEAD_MESSAGES, len(m) + 1):
                bare = self.render(m[:k], False)
                if self.render(m[:k], True) != bare + suffix:
                    return False
                for j in range(HEAD_MESSAGES, k):  # from any earlier prompt of the conversation
                    with_new = self.render([*head, *m[j:k]], False)
                    if not with_new.startswith(head_text) or \
                            self.render(m[:j], False) + with_new[len(head_text):] != bare:
                        return False
            return True
        except Exception:  # a template that refuses the probe's roles: render whole
            return False

    def _shared_cut(self, text: str, old: str) -> int:
        """The last position where a special token starts in ``old`` up to which ``text`` is the same."""
        specials = self._specials
        if not specials:  # a tokenizer without special tokens: nowhere an encoding may be cut
            return 0
        end = len(old)
        while end > 0:
            cut = max(old.rfind(special, 0, end) for special in specials)
            if cut <= 0:
                return 0
            if text.startswith(old[:cut]):
                return cut
            end = cut
        return 0

    @property
    def _specials(self) -> list[str]:
        if not hasattr(self, "_special_texts"):
            self._special_texts = [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]
        return self._special_texts

    def encode_text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def encode_plain(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=False)

    # ------------------------------------------------------------ the counter interface
    async def chat_ids(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode_chat(messages, add_generation_prompt)

    async def chat_ids_from(self, messages: Sequence[dict], add_generation_prompt: bool, hint: Optional["Encoded"]
                            ) -> tuple["Segments", Optional["Encoded"]]:
        return self.encode_chat_from(messages, add_generation_prompt, hint)

    async def text_ids(self, text: str) -> list[int]:
        return self.encode_text(text)

    async def filler_words(self) -> list[str]:
        return single_token_words(self)

    def describe(self) -> dict:
        return {"tokenizer": str(self.path), "chat_template": self.template_source}


# A count renders only new messages after these first ones (the system prompt and the task)
HEAD_MESSAGES = 2
HEAD_ROLES = ["system", "user"]
_PROBE_CONVERSATION = (
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Fix the failing test."},
    {"role": "assistant", "content": "Reading the test file."},
    {"role": "tool", "content": "def test_x(): assert f() == 2"},
    {"role": "assistant", "content": "Changing f to return 2."},
    {"role": "tool", "content": "1 passed"},
)


class Segments:
    """Token ids (or their first characters) held as the pieces they were encoded in. A prompt
    counted from an earlier one of its conversation shares that one's pieces up to the cut, so a
    count costs its new text, not a copy of the whole context; comparing two prompts that share
    pieces skips what they share (by identity)."""

    __slots__ = ("parts", "ends")

    def __init__(self, parts: tuple = (), ends: tuple = ()) -> None:
        self.parts = parts  # lists, never changed once here
        self.ends = ends  # each part's end in the whole

    @classmethod
    def of(cls, values: Sequence[int]) -> "Segments":
        return values if isinstance(values, Segments) else cls((list(values),), (len(values),))

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __iter__(self):
        return itertools.chain.from_iterable(self.parts)

    def head(self, n: int) -> "Segments":
        """The first ``n``."""
        k = bisect.bisect_left(self.ends, n)
        if k == len(self.parts):
            return self
        begin = self.ends[k - 1] if k else 0
        if n == begin:
            return Segments(self.parts[:k], self.ends[:k])
        return Segments((*self.parts[:k], self.parts[k][:n - begin]), (*self.ends[:k], n))

    def plus(self, values: list) -> "Segments":
        if not values:
            return self
        return Segments((*self.parts, values), (*self.ends, len(self) + len(values)))

    def count_below(self, x: int) -> int:
        """How many values are below ``x``, for increasing values (bisect_left over the whole);
        the parts are walked from the end, where a conversation's cut lies."""
        for k in range(len(self.parts) - 1, -1, -1):
            part = self.parts[k]
            if part and part[0] < x:
                return (self.ends[k - 1] if k else 0) + bisect.bisect_left(part, x)
        return 0


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading values ``a`` and ``b`` share: the parts two Segments share are skipped,
    the rest compared as lists (list slices compare at C speed; the usual answer, all of the
    shorter, takes one comparison)."""
    skipped = 0
    if isinstance(a, Segments) and isinstance(b, Segments):
        k = 0
        while k < min(len(a.parts), len(b.parts)) and a.parts[k] is b.parts[k]:
            k += 1
        skipped = a.ends[k - 1] if k else 0
        a, b = list(itertools.chain.from_iterable(a.parts[k:])), list(itertools.chain.from_iterable(b.parts[k:]))
    else:
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return skipped + n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return skipped + lo


class Encoded:
    """A rendered and encoded chat prompt: what the next count of the same conversation reuses."""

    __slots__ = ("messages", "text", "bare_len", "ids", "starts", "head_text")

    def __init__(self, messages: list, text: str, bare_len: int, ids: Segments, starts: Segments,
                 head_text: Optional[str] = None) -> None:
        self.messages = messages  # the message dicts rendered (compared by identity)
        self.text = text  # the rendered prompt
        self.bare_len = bare_len  # its length without the generation prompt
        self.ids = ids
        self.starts = starts  # each token's first character in ``text``
        self.head_text = head_text  # the first HEAD_MESSAGES rendered alone, once rendered by turn


def _read_config(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: not valid JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older configs
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _pick_template(value: Any) -> Optional[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


def _compile(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # transformers renders chat templates in an immutable sandbox with these settings and helpers
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=False)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def single_token_words(tok: LocalTokenizer, limit: int = 1024) -> list[str]:
    """Words of the vocabulary that are one token each wherever they stand in a space-separated
    text (first, or after a space): prompt text built from them has exactly as many tokens as
    words, so it is sized exactly and its prefix never changes as it grows."""
    candidates = []
    for token, _id in sorted(tok.vocab().items(), key=lambda kv: kv[1]):
        word = tok.decode([_id]).strip()
        if 2 <= len(word) <= 12 and word.isascii() and word.isalpha() and word not in candidates:
            candidates.append(word)
        if len(candidates) >= 4 * limit:
            break
    words = [w for w in candidates if len(tok.encode_plain(w)) == 1 and len(tok.encode_plain(f"{w} {w}")) == 2]
    return words[:limit]


# Common English words: one token each (after a space) in every LLM vocabulary we know of.
# The server path keeps those its /tokenize confirms.
COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but have an "
    "had they you were their one all we can her has there been if more when will would who so no out up "
    "into do than only other new some could time these two may then first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well "
    "down should because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while last might us "
    "great old year off come since against go came right used take three states himself few house use "
    "during without again place around however home small found thought went say part once general high "
    "upon school every don does got united left number course war until always away something fact though "
    "water less public put think almost hand enough far took head yet government system better set told "
    "nothing night end why called didn eyes find going look asked later knew point next program city give "
    "group toward young days let room president side social present given several order national second "
    "possible rather per face among form important often things looked early white case john become large "
    "big need four within felt along children saw best church ever least power development light thing "
    "seemed family interest want members mind country area others done turned although open problem sense").split()


class ServerTokenizer:
    """The server's ``POST /tokenize`` (vLLM): ``messages`` with the chat template applied by the
    server, or a ``prompt``. ``post(path, payload)`` is the client's JSON call."""

    def __init__(self, post: Callable[[str, dict], Awaitable[Any]], model: Optional[str]) -> None:
        self._post = post
        self.model = model

    async def chat_ids(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
        data = await self._post("/tokenize", {"model": self.model, "messages": list(messages),
                                              "add_generation_prompt": add_generation_prompt})
        return _tokens(data)

    async def chat_ids_from(self, messages: Sequence[dict], add_generation_prompt: bool, hint: Optional["Encoded"]
                            ) -> tuple[list[int], Optional["Encoded"]]:
        return await self.chat_ids(messages, add_generation_prompt), None  # the server counts it all

    async def text_ids(self, text: str) -> list[int]:
        data = await self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": True})
        return _tokens(data)

    async def filler_words(self) -> list[str]:
        # differences of counts, so whatever the server adds around a prompt (a BOS) cancels out
        joined = " ".join(COMMON_WORDS)
        if len(await self.text_ids(f"{joined} {joined}")) - len(await self.text_ids(joined)) == len(COMMON_WORDS):
            return list(COMMON_WORDS)
        words = []
        for w in COMMON_WORDS:  # one at a time: keep those that are one token after a space
            if len(await self.text_ids(f"{w} {w} {w}")) - len(await self.text_ids(w)) == 2:
                words.append(w)
        return words

    def describe(self) -> dict:
        return {"tokenizer": "server /tokenize", "chat_template": "server"}


def _tokens(data: Any) -> list[int]:
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), list):
        raise TokenizerError(f"/tokenize answered {str(data)[:200]!r}: expected {{'tokens': [...]}}")
    return [int(t) for t in data["tokens"]]
