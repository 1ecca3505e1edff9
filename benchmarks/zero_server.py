"""A minimal zero-service-time OpenAI-style server for load-generator benchmarks.

Raw asyncio (no framework) so that the server is never the bottleneck: every
``/v1/completions`` or ``/v1/chat/completions`` answers at once with ``max_tokens`` streamed SSE chunks (one token each,
like vLLM streams) and a usage chunk. Also ``/v1/models``, ``/health`` and a ``/metrics`` that
states its pool. Bound to 127.0.0.1.

    python benchmarks/zero_server.py --port 18766
"""

from __future__ import annotations

import argparse
import asyncio

import orjson

MODELS = orjson.dumps({"object": "list", "data": [{"id": "zero", "object": "model", "max_model_len": 1_000_000}]})
METRICS = (b'# TYPE vllm:cache_config_info gauge\n'
           b'vllm:cache_config_info{block_size="16",num_gpu_blocks="250000"} 1.0\n')


def _response(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + content_type +
            b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _stream(body: dict) -> bytes:
    n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
    messages = body.get("messages")
    if messages is not None:  # chat: a word per token and 4 per message (roughly ChatML's markers)
        num_prompt = sum(len(str(m.get("content") or "").split()) + 4 for m in messages)
    else:
        prompt = body.get("prompt")
        num_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    parts = []
    for i in range(n):
        if messages is not None:
            parts.append(b'data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" w' +
                         str(i).encode() + b'"}}]}\n\n')
        else:
            parts.append(b'data: {"object":"text_completion","choices":[{"index":0,"text":"t","token_ids":[' +
                         str(100 + i).encode() + b"]}]}\n\n")
    usage = {"prompt_tokens": num_prompt, "completion_tokens": n,
             "prompt_tokens_details": {"cached_tokens": max(0, num_prompt - 1) // 16 * 16}}
    parts.append(b"data: " + orjson.dumps({"choices": [], "usage": usage}) + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    payload = b"".join(parts)
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: " +
            str(len(payload)).encode() + b"\r\n\r\n" + payload)


class Protocol(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""

    def data_received(self, data):
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                if line[:15].lower() == "content-length:":
                    length = int(line[15:])
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            method, path = head.split(" ", 2)[:2]
            if path.startswith("/v1/completions") or path.startswith("/v1/chat/completions"):
                self.transport.write(_stream(orjson.loads(body)))
            elif path.startswith("/v1/models"):
                self.transport.write(_response("200 OK", MODELS))
            elif path.startswith("/metrics"):
                self.transport.write(_response("200 OK", METRICS, b"text/plain"))
            elif path.startswith("/health") or path.startswith("/reset_prefix_cache"):
                self.transport.write(_response("200 OK", b""))
            else:
                self.transport.write(_response("404 Not Found", b""))


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Protocol, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=18766)
    asyncio.run(main(parser.parse_args().port))
