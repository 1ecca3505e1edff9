"""The HTTP client in chat mode against a test double at the transport seam."""

import asyncio

import pytest

from loadgen.core.clock import WallClock
from loadgen.core.engines import TurnRequest
from loadgen.live.http_client import EndpointOptions, OpenAIEngineClient, PreflightError
from loadgen.live.transport import MockResponse, MockTransport
from loadgen.live.tokenizer import LocalTokenizer
from tests.live.small_tokenizer import build_tokenizer
from tests.test_http_client import VLLM_METRICS, sse
from trace_shapes import SessionShape

pytest.importorskip("tokenizers")


def run(coro):
    return asyncio.run(coro)


def chat_stream(pieces, ids, prompt_tokens, cached=0):
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids)}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    chunks = [{"choices": [{"index": 0, "delta": {"content": p}, "token_ids": [t]}]} for p, t in zip(pieces, ids)]
    return sse(*chunks, {"choices": [], "usage": usage})


def chat_server(tok, tokenize=True):
    """A chat-only vLLM double: counts prompts with ``tok``, answers two words, reports the cache."""
    seen = {"n": 0}

    def handler(method, path, body):
        if path == "/v1/models":
            return MockResponse(json={"data": [{"id": "tiny", "max_model_len": 16384}]})
        if path == "/metrics":
            return MockResponse(text=VLLM_METRICS)
        if path == "/tokenize" and tokenize:
            ids = (tok.encode_chat(body["messages"], body["add_generation_prompt"]) if "messages" in body
                   else tok.encode_text(body["prompt"]))
            return MockResponse(json={"count": len(ids), "tokens": ids})
        if path == "/v1/chat/completions":
            seen["n"] += 1
            prompt = len(tok.encode_chat(body["messages"]))
            return MockResponse(lines=chat_stream(["baba", " babe"], tok.encode_plain("baba babe"), prompt,
                                                  cached=prompt - 1 if seen["n"] > 1 else 0))
        return MockResponse(status=404, text="Not Found")
    return handler


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return LocalTokenizer(build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=1000))


@pytest.mark.parametrize("local", [True, False], ids=["local-tokenizer", "server-tokenize"])
def test_a_chat_session_sends_messages_of_the_planned_length_and_appends_the_returned_content(tok, local):
    transport = MockTransport(chat_server(tok))
    options = EndpointOptions(url="http://engine:8000", api="chat", tokenizer=str(tok.path) if local else None)

    async def go():
        client = OpenAIEngineClient(WallClock(), options, transport)
        info = await client.preflight()
        shape = SessionShape("synthetic", 300, (2, 2), (40,), (0.0,), shared_prefix_tokens=100)
        ctx = client.session_context(shape, (1, "base"), 4)
        await ctx.start()
        first = await client.generate(TurnRequest(4, 0, 300, 2, 100, prompt_content=ctx.content))
        await ctx.extend(first, 2, 40)
        second = await client.generate(TurnRequest(4, 1, 342, 2, 100, prompt_content=ctx.content))
        return info, first, second, ctx

    info, first, second, ctx = run(go())
    assert info["api"] == "chat" and info["prompt_lengths"]["exact"]
    assert info["prompt_lengths"]["tokenizer"] == (str(tok.path) if local else "server /tokenize")
    turns = [(path, body) for _, path, body, _ in transport.calls if path == "/v1/chat/completions"]
    assert len(turns) == 5  # three probes, two turns
    path, body = turns[-1]
    assert body["messages"][-2] == {"role": "assistant", "content": "baba babe"}  # returned content, verbatim
    assert body["messages"][-1]["role"] == "tool" and body["return_token_ids"] and body["ignore_eos"]
    assert (first.prompt_tokens, second.prompt_tokens) == (300, 342)  # usage.prompt_tokens: as planned
    assert first.output_text == "baba babe" and first.output_token_ids == tok.encode_plain("baba babe")
    assert ctx.drift_tokens == 0


def test_chat_without_a_tokenizer_or_a_tokenize_endpoint_is_a_preflight_error_naming_the_field(tok):
    transport = MockTransport(chat_server(tok, tokenize=False))

    async def go():
        await OpenAIEngineClient(WallClock(), EndpointOptions(url="http://e", api="chat"), transport).preflight()

    with pytest.raises(PreflightError, match="no engine.tokenizer was given and http://e/tokenize failed"):
        run(go())


def test_a_completions_run_on_a_chat_only_endpoint_is_told_to_use_the_chat_api(tok):
    transport = MockTransport(chat_server(tok))

    async def go():
        await OpenAIEngineClient(WallClock(), EndpointOptions(url="http://e"), transport).preflight()

    with pytest.raises(PreflightError, match="/v1/completions answered HTTP 404.*engine.api: chat"):
        run(go())


def test_a_client_without_its_own_preflight_builds_text_prompts_as_the_run_preflight_said(tok):
    """A Ray fleet's client: the run's preflight settled prompt_mode; prepare_prompts gives it the
    same exact-length prompts (not the one-word-per-id approximation)."""
    options = EndpointOptions(url="http://engine:8000", api="chat", model="tiny", tokenizer=str(tok.path))

    async def go():
        client = OpenAIEngineClient(WallClock(), options, MockTransport(chat_server(tok)))
        client.prompt_mode = "text"  # as the run's preflight reported
        await client.prepare_prompts()
        ctx = client.session_context(SessionShape("synthetic", 300, (2,), (), (), shared_prefix_tokens=100),
                                     (1, "base"), 4)
        await ctx.start()
        return ctx

    ctx = run(go())
    assert len(tok.encode_chat(ctx.content)) == 300
