"""Chat and text contexts of exact token lengths (loadgen/live/chat.py) on a tokenizer built here."""

import asyncio
import json

import orjson
import pytest

from loadgen.core.engines import TurnResult
from loadgen.live.chat import PromptBuilder
from loadgen.live.tokenizer import LocalTokenizer, TokenizerError, render_simple
from tests.live.small_tokenizer import build_tokenizer
from trace_shapes import SessionShape

pytest.importorskip("tokenizers")


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=3000)


def shape(initial=600, prefix=200, outputs=(12, 12, 12, 12), tools=(90, 300, 40)):
    return SessionShape("synthetic", initial, outputs, tools, (1.0,) * len(tools), shared_prefix_tokens=prefix)


def result(text, ids):
    return TurnResult(0.0, 0.0, 0.0, 0, 0, len(ids or ()), output_token_ids=ids, output_text=text)


def served_output(tok, n, seed):
    """What a server returns: ``n`` generated words and their ids, as the content of a message."""
    words = [w for w in tok.vocab() if w.isalpha() and w.islower() and len(w) >= 4][seed:seed + n]
    text = " ".join(words)
    return text, tok.encode_plain(text)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_every_prompt_has_exactly_the_planned_tokens_and_the_context_only_grows(tok_dir, api):
    tok = LocalTokenizer(tok_dir)
    builder = PromptBuilder(tok, api)
    run(builder.prepare())
    s = shape()
    ctx = builder.session(s, (1, "base"), 7)
    run(ctx.start())
    count = (lambda c: len(tok.encode_chat(c))) if api == "chat" else (lambda c: len(tok.encode_text(c)))
    planned = s.initial_tokens
    assert count(ctx.content) == planned
    previous = ctx.prompt_ids
    for k, tool in enumerate(s.growth_tokens):
        text, ids = served_output(tok, s.output_tokens[k], 50 * k)
        if api == "completions":
            text = " " + text  # a completion continues its prompt
        run(ctx.extend(result(text, ids), s.output_tokens[k], tool))
        planned += s.output_tokens[k] + tool
        assert count(ctx.content) == planned == len(ctx.prompt_ids)
        if api == "chat":  # the request's JSON, kept turn by turn, is the whole list's
            assert ctx.content.json() == orjson.dumps(list(ctx.content))
        if api == "chat":  # counted from the previous prompt's encoding: the same ids as encoding it all
            assert ctx.prompt_ids == tok.encode_chat(ctx.content)
        # append-only: the new prompt starts with the old one and the generated ids (no drift here)
        assert ctx.prompt_ids[:len(previous) + len(ids)] == previous + ids and ctx.drift_tokens == 0
        previous = ctx.prompt_ids
    if api == "chat":
        roles = [m["role"] for m in ctx.content]
        assert roles == ["system", "user"] + ["assistant", "tool"] * len(s.growth_tokens)


def test_every_session_of_a_run_starts_with_the_same_system_prompt_of_its_exact_length(tok_dir):
    tok = LocalTokenizer(tok_dir)
    builder = PromptBuilder(tok, "chat")
    run(builder.prepare())
    a, b = builder.session(shape(), (1, "base"), 1), builder.session(shape(), (1, "base"), 2)
    other_run = PromptBuilder(tok, "chat")
    run(other_run.prepare())
    c = other_run.session(shape(), (2, "base"), 1)
    for ctx in (a, b, c):
        run(ctx.start())
    assert a.content[0] == b.content[0] and a.content[1] != b.content[1]
    assert len(tok.encode_chat(a.content[:1], add_generation_prompt=False)) == 200
    assert a.prompt_ids[:200] == b.prompt_ids[:200] and a.prompt_ids[200:] != b.prompt_ids[200:]
    assert c.content[0] != a.content[0]  # another seed: another system prompt (no hits across runs)
    # deterministic: the same run key builds the same bytes
    again = PromptBuilder(tok, "chat")
    run(again.prepare())
    d = again.session(shape(), (1, "base"), 1)
    run(d.start())
    assert json.dumps(d.content) == json.dumps(a.content)


def test_drift_counts_the_generated_tokens_the_next_prompt_does_not_reproduce(tok_dir):
    tok = LocalTokenizer(tok_dir)
    builder = PromptBuilder(tok, "chat")
    run(builder.prepare())
    ctx = builder.session(shape(), (1, "base"), 3)
    run(ctx.start())
    text, ids = served_output(tok, 12, 0)
    # the server generated 12 ids, but its 10th was a special token its text leaves out: the
    # re-tokenized content matches the first 9 and then differs
    generated = ids[:9] + [tok.encode_plain("<|im_end|>")[0]] + ids[9:11]
    run(ctx.extend(result(" ".join(text.split()[:11]), generated), 12, 90))
    assert ctx.drift_tokens == 3
    assert len(tok.encode_chat(ctx.content)) == 600 + 12 + 90  # the tool message absorbed the difference
    run(ctx.extend(result("words", None), 12, 300))  # a server that returns no ids: drift unknown
    assert ctx.drift_tokens == -1


def test_a_template_longer_than_the_plan_is_the_closest_length_not_an_error(tok_dir):
    tok = LocalTokenizer(tok_dir)
    builder = PromptBuilder(tok, "chat")
    run(builder.prepare())
    # ChatML around one user message and the generation prompt: 5 tokens before any content
    tiny = SessionShape("synthetic", 4, (4,), (), (), shared_prefix_tokens=0)
    ctx = builder.session(tiny, (1, "base"), 1)
    run(ctx.start())
    assert ctx.content[-1]["content"] == "" and len(ctx.prompt_ids) == 5


def test_a_tokenizer_without_special_tokens_counts_every_prompt_from_the_start(tmp_path):
    """No special added tokens: no place where an earlier encoding can be cut and reused, so
    each prompt is encoded whole, still to its planned length (not max() of nothing)."""
    tok = LocalTokenizer(build_tokenizer(tmp_path, vocab_size=3000, special_tokens=False))
    builder = PromptBuilder(tok, "chat")
    run(builder.prepare())
    s = shape()
    ctx = builder.session(s, (1, "base"), 3)
    run(ctx.start())
    planned = s.initial_tokens
    assert len(tok.encode_chat(ctx.content)) == planned
    for k, tool in enumerate(s.growth_tokens):
        text, ids = served_output(tok, s.output_tokens[k], 50 * k)
        run(ctx.extend(result(text, ids), s.output_tokens[k], tool))
        planned += s.output_tokens[k] + tool
        assert len(tok.encode_chat(ctx.content)) == planned == len(ctx.prompt_ids)


def test_without_a_template_the_simple_chatml_is_applied(tmp_path):
    tok = LocalTokenizer(build_tokenizer(tmp_path, vocab_size=500, template=None))
    messages = [{"role": "user", "content": "baba"}]
    assert tok.template_source == "simple" and tok.render(messages) == render_simple(messages)


def test_bad_tokenizer_paths_are_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer.json"):
        LocalTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not a Hugging Face tokenizer.json"):
        LocalTokenizer(tmp_path / "tokenizer.json")


# a template that looks at the whole list: the number of messages opens the prompt
WHOLE_LIST_TEMPLATE = ("{{ messages|length }} {% for message in messages %}<|im_start|>{{ message.role }}\n"
                       "{{ message.content }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template,by_turn", [(None, True), (WHOLE_LIST_TEMPLATE, False)])
def test_a_count_from_the_last_prompt_is_the_count_of_the_whole_prompt(tmp_path, template, by_turn):
    """A count renders only the new turn when the template renders turn by turn, and the whole
    list when it does not; either way the ids are those of rendering and encoding it all."""
    directory = build_tokenizer(tmp_path / "tok", vocab_size=3000, **({"template": template} if template else {}))
    tok = LocalTokenizer(directory)
    assert tok.template_source == "tokenizer_config" and tok.renders_by_turn is by_turn
    builder = PromptBuilder(tok, "chat")
    run(builder.prepare())
    ctx = builder.session(shape(outputs=(12,) * 6, tools=(90, 300, 40, 7, 120)), (1, "base"), 3)
    run(ctx.start())
    for k in range(5):
        text, ids = served_output(tok, 12, 40 * k)
        run(ctx.extend(result(text, ids), 12, 50))
        assert ctx.prompt_ids == tok.encode_chat(ctx.content)
        assert ctx._hint.text == tok.render(ctx.content)
