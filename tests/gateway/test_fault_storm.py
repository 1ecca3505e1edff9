"""The gateway under load with faults everywhere: upstreams that die mid-stream, hang, reset, answer
500 or are killed outright and restarted; clients that hang up while parked, while held upstream
or mid-stream; sessions waiting past the maximum park time. Every request ends with an HTTP status
or a completed stream, and the gateway's per-request counter says what each client saw."""

import asyncio
import random
from collections import Counter

import orjson

from loadgen.gateway.upstream_choice import sticky_hash
from tests.gateway.doubles import client_request_counts, running_gateway

NUM_REQUESTS = 10_000
CONCURRENCY = 150
METRICS = (b"vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"100000\"} 1.0\n"
           b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n")


class FaultyEngine:
    """A raw HTTP/1.1 engine on loopback that does to each request what its ``X-Fault`` header
    says: ``die`` (reset after two chunks), ``hang`` (no answer for 5 s), ``reset`` (reset before
    any answer), ``500``, ``long`` (20 chunks over a second), else three chunks at once. ``kill``
    closes its socket and resets every connection, as a crashed engine does; ``start`` again on
    the same port brings it back."""

    def __init__(self) -> None:
        self.port = 0
        self.server = None
        self.writers: set = set()

    async def start(self) -> "FaultyEngine":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kill(self) -> None:
        self.server.close()
        for writer in list(self.writers):
            writer.transport.abort()

    async def _serve(self, reader, writer) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                path = head[0].split(" ")[1]
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:] if line)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                if path == "/metrics":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(METRICS), METRICS))
                    continue
                fault = headers.get("x-fault", "")
                if fault == "reset":
                    writer.transport.abort()
                    return
                if fault == "hang":
                    await asyncio.sleep(5.0)
                    return
                if fault == "500":
                    body = b'{"error": {"message": "engine failure", "type": "engine_error", "code": 500}}'
                    writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
                    continue
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                for i in range(20 if fault == "long" else 3):
                    event = b'data: {"choices":[{"text":"t","token_ids":[%d]}]}\n\n' % i
                    writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                    if fault == "die" and i == 1:
                        await writer.drain()
                        writer.transport.abort()
                        return
                    if fault == "long":
                        await writer.drain()
                        await asyncio.sleep(0.05)
                end = b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":3}}\n\ndata: [DONE]\n\n'
                writer.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(end), end))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()


def request_bytes(session: str, fault: str) -> bytes:
    body = orjson.dumps({"model": "m", "prompt": list(range(8)), "max_tokens": 3, "stream": True})
    return (f"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nX-Session-ID: {session}\r\n"
            f"x-dynamo-session-final: true\r\nX-Fault: {fault}\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def what_the_client_saw(data: bytes) -> tuple[str, str]:
    """(outcome, status) of a response read to the connection's close, as the gateway counts it."""
    if not data.startswith(b"HTTP/1.1 "):
        return "no answer", "none"
    status = data[9:12].decode()
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        complete = body.endswith(b"\r\n0\r\n\r\n") and b"upstream failed mid-response" not in body
    else:
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        complete = len(body) == length
    if not complete:
        return "failed", status  # cut short
    if b'"gateway_error"' in body:
        return ("failed" if status == "502" else "refused"), status
    return "answered", status


def test_ten_thousand_requests_under_faults_each_answered_and_counted():
    rng = random.Random(7)

    async def main():
        steady, killed = await FaultyEngine().start(), await FaultyEngine().start()
        async with running_gateway([steady.url, killed.url], controller="session-cap",
                                   controller_options={"k": 20, "k_hi": 20}, max_park_s=0.5, on_max_park="reject",
                                   request_timeout_s=0.5, scrape_interval_s=0.2) as gw:
            seen: Counter = Counter()
            asked = 0

            async def one(i: int) -> None:
                roll = rng.random()
                kind = ("normal" if roll < 0.70 else "500" if roll < 0.74 else "die" if roll < 0.79 else
                        "hang" if roll < 0.82 else "reset" if roll < 0.86 else "long" if roll < 0.90 else
                        "hangup-held" if roll < 0.95 else "hangup-streaming")
                session = f"s{i}"
                if kind.startswith("hangup"):  # on the upstream that is never killed: the hang-up is the only fault
                    n = 0
                    while sticky_hash(f"h:{session}", 2) != 0:
                        n += 1
                        session = f"s{i}-{n}"
                fault = {"normal": "", "hangup-held": "hang", "hangup-streaming": "long"}.get(kind, kind)
                reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
                writer.write(request_bytes(session, fault))
                data = b""
                try:
                    if kind == "hangup-held":
                        data = await asyncio.wait_for(reader.read(), rng.uniform(0.05, 0.2))
                    elif kind == "hangup-streaming":  # the head and a first event, then away
                        while b"token_ids" not in data and (not data or data.startswith(b"HTTP/1.1 200")):
                            chunk = await reader.read(4096)
                            if not chunk:
                                break
                            data += chunk
                        if b"token_ids" in data:
                            raise asyncio.TimeoutError
                        data += await reader.read()
                    else:
                        data = await asyncio.wait_for(reader.read(), 20.0)
                    seen[what_the_client_saw(data)] += 1
                except asyncio.TimeoutError:
                    seen[("client_gone", data[9:12].decode() if data.startswith(b"HTTP/1.1 ") else "none")] += 1
                finally:
                    writer.transport.abort()

            async def worker() -> None:
                nonlocal asked
                while asked < NUM_REQUESTS:
                    asked += 1
                    await one(asked)

            async def chaos() -> None:  # the second engine dies and comes back, again and again
                while True:
                    await asyncio.sleep(1.0)
                    killed.kill()
                    await asyncio.sleep(0.2)
                    await killed.start()

            chaos_task = asyncio.ensure_future(chaos())
            await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(CONCURRENCY))), 240)
            chaos_task.cancel()
            counted = Counter(client_request_counts(gw))
            table = "\n".join(f"{o:12s} {s:5s} client {seen[(o, s)]:6d}  gateway {counted[(o, s)]:6d}"
                              for o, s in sorted(set(seen) | set(counted)))
            print(table)
            assert seen[("no answer", "none")] == 0, table  # every request got a status, or hung up itself
            assert sum(seen.values()) == sum(counted.values()) == NUM_REQUESTS, table
            assert seen == counted, table  # 0 miscounted
            # every fault happened, and the sessions all ended: nothing held, nothing admitted
            for outcome in (("answered", "200"), ("answered", "500"), ("failed", "200"), ("failed", "502"),
                            ("refused", "429"), ("client_gone", "none"), ("client_gone", "200")):
                assert counted[outcome] > 0, (outcome, table)
            assert gw.gate.num_admitted == 0 and not gw.gate.waiting_new and not gw.sessions
            assert gw.num_open == 0 and gw.num_in_flight == 0
        killed.kill()
        steady.kill()

    asyncio.run(main())
