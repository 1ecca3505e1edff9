"""serve-sim's wire format: the JSON bodies and server-sent events it answers with, as vLLM's
OpenAI-compatible API (and SGLang's) spell them, and the chat messages it accepts."""

from __future__ import annotations

import orjson

from ..sim import SimRequest

SGLANG_MODELLED_VERSION = "0.5.x"
# SGLang's /flush_cache body, 200 and 400 alike (python/sglang/srt/entrypoints/http_server.py)
SGLANG_FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. "
                     "(When there are running or waiting requests, the operation will not be performed.)\n")


def completion_chunk(model: str, request_id: str, ids: list[int], body: dict, piece: str) -> dict:
    choice = {"index": 0, "text": piece, "finish_reason": None}
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    return {"id": request_id, "object": "text_completion", "model": model, "choices": [choice]}


def completion_final(model: str, request_id: str, req: SimRequest, ids: list[int], body: dict,
                     pieces: list[str], flavor: str) -> dict:
    text = "".join(pieces) if isinstance(body.get("prompt"), str) else " ".join(pieces)
    choice = {"index": 0, "text": text, "finish_reason": "length"}
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    return {"id": request_id, "object": "text_completion", "model": model, "choices": [choice],
            "usage": usage_of(req, flavor)}


def chat_chunk(model: str, request_id: str, ids: list[int], body: dict, piece: str) -> dict:
    choice = {"index": 0, "delta": {"role": "assistant", "content": piece}, "finish_reason": None}
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    return {"id": request_id, "object": "chat.completion.chunk", "model": model, "choices": [choice]}


def chat_final(model: str, request_id: str, req: SimRequest, ids: list[int], body: dict, pieces: list[str],
               flavor: str) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": "".join(pieces)}, "finish_reason": "length"}
    if body.get("return_token_ids"):
        choice["token_ids"] = ids
    return {"id": request_id, "object": "chat.completion", "model": model, "choices": [choice],
            "usage": usage_of(req, flavor)}


def usage_of(req: SimRequest, flavor: str) -> dict:
    usage = {"prompt_tokens": req.num_prompt_tokens, "completion_tokens": req.generated,
             "total_tokens": req.num_prompt_tokens + req.generated}
    # vLLM (since its guard became ``num_cached_tokens is not None``) reports 0 cached tokens too;
    # SGLang omits the details when nothing hit
    if flavor == "vllm" or req.num_cached_tokens > 0:
        usage["prompt_tokens_details"] = {"cached_tokens": req.num_cached_tokens}
    return usage


def messages_of(value) -> list[dict]:
    """A chat request's messages: a list of {role, content} with text content."""
    if not isinstance(value, list) or not value:
        raise ValueError("messages: expected a non-empty list")
    out = []
    for m in value:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(content, (str, type(None))):
            raise ValueError(f"messages: expected {{role, content}} with text content, got {str(m)[:80]}")
        out.append({"role": m["role"], "content": content or ""})
    return out


def dumps(obj) -> str:
    return orjson.dumps(obj).decode()


def sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def error_response(status: int, message: str):
    from aiohttp import web

    return web.json_response({"error": {"message": message, "type": "BadRequestError", "code": status}},
                             status=status)
