"""``loadgen serve-sim``: the simulated engine behind vLLM's HTTP API, in (scaled) real time.

Endpoints: ``/v1/completions`` (token-id or text prompts, streamed or not, ``usage`` with
``prompt_tokens_details.cached_tokens`` as vLLM reports it, ``return_token_ids``),
``/v1/models``, ``/health``, ``/metrics`` (vLLM's names, ``vllm:cache_config_info`` included)
and ``POST /reset_prefix_cache``. Bound to 127.0.0.1 unless told otherwise. Chat too:
``/v1/chat/completions`` (the messages through a chat template and ``--tokenizer``, else one
token per word with ChatML) and ``POST /tokenize``; ``--chat-only`` drops ``/v1/completions``
(docs/chat.md#serve-sim-speaks-chat).

``--flavor sglang`` serves the SGLang flavour of the engine behind SGLang 0.5.x's API surface
instead: ``/v1/completions`` (cached tokens in ``usage.prompt_tokens_details`` as SGLang's
``--enable-cache-report`` gives them; ``token_ids`` when asked, as newer SGLang does), the native
``/generate`` (``meta_info.cached_tokens``), ``/flush_cache`` (HTTP 400 while any request runs),
``/get_server_info`` (``max_total_num_tokens``), ``/get_model_info``, ``/health`` and
``/metrics`` under SGLang's names (``sglang:token_usage``, ``sglang:cache_hit_rate``,
``sglang:cached_tokens_total``, ...; no ``sglang:max_total_num_tokens`` gauge, as in 0.5.x).
Its requests are matched token by token (``TokenMatcher``, loadgen/sim/prefix_match.py), since
SGLang caches every token. A client that hangs up does not abort its request (the simulated SGLang engine has
no abort): it runs to its end.

serve-sim measures how late it delivers the engine's step completions against its scaled clock
(a busy machine or a high ``--time-scale`` makes it fall behind): ``/metrics`` has the gauges
``loadgen_serve_sim_lag_{p50,p99,max}_seconds`` (since start, in scaled seconds) and
``GET /loadgen/lag`` the whole histogram, which the live runner reads at a run's start and end
to mark a run whose server fell behind (run.json ``lagging``, docs/results-format.md#lag).

The simulated engine reasons about streams, not tokens, so requests are mapped onto streams by
content: block hashes chained as vLLM chains them. With ``--flavor vllm`` any token prompt is
matched as vLLM matches it (loadgen/sim/prefix_match.py): a retried, edited or forked prompt,
or a prefix shared across sessions, hits every block vLLM's pool would give it; the
``X-Loadgen-Prefix-Tokens`` header that loadgen's client sends (real servers ignore it) only
makes a shared system prompt a stream of its own from the start; ``--flavor sglang`` matches
any prompt token by token, as SGLang's radix tree does. With the CPU offload tier
(``--offload-cpu-tokens``) a request continues a stream only when its prompt extends
everything recorded for it (after the header's shared prefix), else it starts a new one: a
client that forks or rewrites a context gets fewer hits there than vLLM would give it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Optional, Union

import orjson

from ..core.clock import WallClock
from ..core.engines import SimEngineClient
from ..core.workload import Stream, rng_for
from .http_client import LAG_PATH
from ..sim.prefix_match import BlockHashMatcher, Placement, TokenMatcher
from .serve_sim_prompts import PromptMapper, TextOutput, WordTokenizer
from .serve_sim_wire import (SGLANG_FLUSH_TEXT, SGLANG_MODELLED_VERSION, chat_chunk, chat_final, completion_chunk,
                             completion_final, dumps, error_response, messages_of, sse, usage_of)
from .tokenizer import LocalTokenizer, common_prefix
from ..sim import EngineConfig, SimRequest, StepCostModel
from ..sim.jitter import StepJitter
from ..sim.sglang_engine import SGLangConfig

LOG = logging.getLogger("loadgen.serve_sim")


class SimServer:
    def __init__(self, config: Union[EngineConfig, SGLangConfig], cost: StepCostModel, time_scale: float = 1.0,
                 model: str = "sim", seed: int = 0, tokenizer: Optional[LocalTokenizer] = None,
                 chat_only: bool = False) -> None:
        self.config = config
        self.cost = cost
        self.time_scale = time_scale
        self.model = model
        # which engine's API surface is served follows the engine: SGLang's radix cache or vLLM's pool
        self.flavor = "sglang" if isinstance(config, SGLangConfig) else "vllm"
        self.seed = seed
        self._rng = rng_for(Stream.SERVE_SIM_OUTPUT, seed)
        self.client: Optional[SimEngineClient] = None
        self.mapper = PromptMapper(config.block_size)  # vLLM with the host tier
        # vLLM without a host tier: any prompt matched by block hashes (made with the engine)
        self._matcher: Optional[BlockHashMatcher] = None
        self._match_blocks = self.flavor == "vllm" and getattr(config, "offload", None) is None
        # SGLang: any prompt matched token by token (its radix tree then names tokens by chains)
        self._tokens = TokenMatcher(config.page_size, common_prefix) if self.flavor == "sglang" else None
        self._ids = itertools.count(1)
        self._hit_rate_mark = (0, 0)  # (queries, hits) at the previous /metrics: sglang:cache_hit_rate
        self._retracted_mark = 0  # retractions at the previous /metrics: sglang:num_retracted_reqs
        # text (chat messages, text prompts) to token ids: --tokenizer, else one token per word
        self.tokenizer = tokenizer if tokenizer is not None else WordTokenizer()
        self._text_output: Optional[TextOutput] = None
        self.chat_only = chat_only  # stands in for an endpoint that serves only /v1/chat/completions
        self.num_client_hangups = 0

    def _engine(self) -> SimEngineClient:
        if self.client is None:  # needs the running loop
            self.client = SimEngineClient(WallClock(self.time_scale), self.config, self.cost)
            if self.cost.step_jitter_sigma > 0:  # a calibrated cost.json: steps as noisy as the engine it measured
                self.client.engine.jitter = StepJitter(self.cost.step_jitter_sigma,
                                                       rng_for(Stream.STEP_JITTER, self.seed, "serve-sim", 0, 0))
            if self._match_blocks:
                self._matcher = BlockHashMatcher(self.client.engine, self.config.block_size)
            if self._tokens is not None:
                from ..sim.radix_chains import ChainRadixCache

                self.client.engine.tree = ChainRadixCache(self.config.page_size)
        return self.client

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([
            web.get("/health", self.health), web.get("/v1/models", self.models), web.get(LAG_PATH, self.lag),
            web.post("/v1/chat/completions", self.chat_completions), web.post("/tokenize", self.tokenize),
        ])
        if not self.chat_only:
            app.add_routes([web.post("/v1/completions", self.completions)])
        if self.flavor == "sglang":
            app.add_routes([
                web.get("/metrics", self.sglang_metrics), web.post("/generate", self.generate),
                web.get("/flush_cache", self.flush_cache), web.post("/flush_cache", self.flush_cache),
                web.get("/get_server_info", self.server_info), web.get("/server_info", self.server_info),
                web.get("/get_model_info", self.model_info), web.get("/health_generate", self.health),
            ])
        else:
            app.add_routes([web.get("/metrics", self.metrics), web.post("/reset_prefix_cache", self.reset)])
        return app

    async def health(self, request):
        from aiohttp import web

        return web.Response(text="")

    async def models(self, request):
        from aiohttp import web

        owner = "sglang" if self.flavor == "sglang" else "agent-loadgen"
        return web.json_response({"object": "list", "data": [
            {"id": self.model, "object": "model", "owned_by": owner, "max_model_len": self.config.max_model_len}]})

    async def lag(self, request):
        from aiohttp import web

        clock = self._engine().clock
        return web.json_response({"time_scale": self.time_scale, "lateness": clock.lateness.to_json()}, dumps=dumps)

    async def flush_cache(self, request):
        """SGLang's /flush_cache: done only when no request is waiting or running, else HTTP 400;
        SGLang answers the same text either way (python/sglang/srt/entrypoints/http_server.py)."""
        from aiohttp import web

        client = self._engine()
        flushed = client.engine.try_flush(client.clock.now())
        client._rearm()
        return web.Response(text=SGLANG_FLUSH_TEXT, status=200 if flushed else 400)

    async def server_info(self, request):
        """SGLang's /get_server_info (/server_info on newer versions): the server arguments, the
        scheduler's ``max_total_num_tokens`` (the pool in tokens; SGLang 0.5.x has no metric for
        it) and the version."""
        from aiohttp import web

        c = self.config
        return web.json_response({
            "model_path": self.model, "served_model_name": self.model, "page_size": c.page_size,
            "chunked_prefill_size": c.chunked_prefill_size, "max_prefill_tokens": c.max_prefill_tokens,
            "max_running_requests": c.max_running_requests, "context_length": c.max_model_len,
            "schedule_policy": c.schedule_policy, "disable_radix_cache": not c.enable_prefix_caching,
            "enable_cache_report": True, "enable_metrics": True,
            "max_total_num_tokens": c.pool_tokens, "max_req_input_len": min(c.max_model_len, c.pool_tokens) - 1,
            "internal_states": [{"new_token_ratio": self._engine().engine.new_token_ratio}],
            "version": f"serve-sim (SGLang {SGLANG_MODELLED_VERSION} flavour)"}, dumps=dumps)

    async def model_info(self, request):
        from aiohttp import web

        return web.json_response({"model_path": self.model, "tokenizer_path": self.model, "is_generation": True,
                                  "preferred_sampling_params": None})

    async def sglang_metrics(self, request):
        """SGLang 0.5.x's /metrics names (python/sglang/srt/metrics/collector.py): the scheduler's
        gauges (set at every scrape here, at every logged batch in SGLang) and the tokenizer's
        counters (moved when a request finishes, as SGLang does)."""
        from aiohttp import web

        client = self._engine()
        m = client.metrics()
        eng = client.engine
        label = f'{{model_name="{self.model}"}}'
        queries, hits = eng.prefix_cache_queries, eng.prefix_cache_hits
        q0, h0 = self._hit_rate_mark
        # SGLang's gauge is the last prefill batch's hit share; here that of the requests finished
        # since the previous scrape (0 when none), which a scraper every few seconds cannot tell apart
        hit_rate = (hits - h0) / (queries - q0) if queries > q0 else 0.0
        self._hit_rate_mark = (queries, hits)
        # SGLang's gauge counts the retractions since its previous stats log, then restarts from 0
        retracted = eng.num_preemptions - self._retracted_mark
        self._retracted_mark = eng.num_preemptions
        used = eng.total_tokens - eng.available - eng.tree.evictable_size
        lines = [
            "# TYPE sglang:num_running_reqs gauge", f"sglang:num_running_reqs{label} {m.num_running}",
            "# TYPE sglang:num_used_tokens gauge", f"sglang:num_used_tokens{label} {used}",
            "# TYPE sglang:token_usage gauge", f"sglang:token_usage{label} {m.kv_usage!r}",
            "# TYPE sglang:num_queue_reqs gauge", f"sglang:num_queue_reqs{label} {m.num_waiting}",
            "# TYPE sglang:cache_hit_rate gauge", f"sglang:cache_hit_rate{label} {hit_rate!r}",
            "# TYPE sglang:num_retracted_reqs gauge", f"sglang:num_retracted_reqs{label} {retracted}",
            "# TYPE sglang:prompt_tokens counter", f"sglang:prompt_tokens_total{label} {queries}",
            "# TYPE sglang:generation_tokens counter",
            f"sglang:generation_tokens_total{label} {eng.generation_tokens_total}",
            "# TYPE sglang:cached_tokens counter", f"sglang:cached_tokens_total{label} {hits}",
            "# TYPE loadgen_serve_sim_client_hangups counter",
            f"loadgen_serve_sim_client_hangups_total {self.num_client_hangups}",
        ]
        lag = client.clock.lateness.summary()
        for name, key in (("p50", "p50_s"), ("p99", "p99_s"), ("max", "max_s")):
            lines += [f"# TYPE loadgen_serve_sim_lag_{name}_seconds gauge",
                      f"loadgen_serve_sim_lag_{name}_seconds {lag[key]!r}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def reset(self, request):
        from aiohttp import web

        self._engine().flush()
        return web.Response(text="")

    async def metrics(self, request):
        from aiohttp import web

        client = self._engine()
        m = client.metrics()
        eng = client.engine
        c = self.config
        lines = [
            "# TYPE vllm:num_requests_running gauge", f'vllm:num_requests_running{{model_name="{self.model}"}} {m.num_running}',
            "# TYPE vllm:num_requests_waiting gauge", f'vllm:num_requests_waiting{{model_name="{self.model}"}} {m.num_waiting}',
            "# TYPE vllm:kv_cache_usage_perc gauge", f'vllm:kv_cache_usage_perc{{model_name="{self.model}"}} {m.kv_usage}',
            "# TYPE vllm:prefix_cache_queries counter",
            f'vllm:prefix_cache_queries_total{{model_name="{self.model}"}} {m.prefix_cache_queries_total}',
            "# TYPE vllm:prefix_cache_hits counter",
            f'vllm:prefix_cache_hits_total{{model_name="{self.model}"}} {m.prefix_cache_hits_total}',
            "# TYPE vllm:num_preemptions counter",
            f'vllm:num_preemptions_total{{model_name="{self.model}"}} {m.num_preemptions_total}',
            "# TYPE vllm:prompt_tokens counter", f'vllm:prompt_tokens_total{{model_name="{self.model}"}} {eng.prompt_tokens_total}',
            "# TYPE vllm:generation_tokens counter",
            f'vllm:generation_tokens_total{{model_name="{self.model}"}} {eng.generation_tokens_total}',
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{c.block_size}",enable_prefix_caching="{c.enable_prefix_caching}",'
            f'num_gpu_blocks="{c.num_blocks}"}} 1.0',
        ]
        if getattr(eng, "host", None) is not None:
            # the CPU offload tier under vLLM's names: tokens looked up in / served from it
            # (vllm:external_prefix_cache_*) and bytes copied each way (vllm:kv_offload_total_bytes)
            lines += [
                "# TYPE vllm:external_prefix_cache_queries counter",
                f'vllm:external_prefix_cache_queries_total{{model_name="{self.model}"}} '
                f'{eng.external_prefix_cache_queries}',
                "# TYPE vllm:external_prefix_cache_hits counter",
                f'vllm:external_prefix_cache_hits_total{{model_name="{self.model}"}} {eng.external_prefix_cache_hits}',
                "# TYPE vllm:kv_offload_total_bytes counter",
                f'vllm:kv_offload_total_bytes_total{{model_name="{self.model}",transfer_type="GPU_to_CPU"}} '
                f'{eng.kv_offload_bytes_gpu_to_cpu}',
                f'vllm:kv_offload_total_bytes_total{{model_name="{self.model}",transfer_type="CPU_to_GPU"}} '
                f'{eng.kv_offload_bytes_cpu_to_gpu}',
            ]
        lines += ["# TYPE loadgen_serve_sim_client_hangups counter",
                  f"loadgen_serve_sim_client_hangups_total {self.num_client_hangups}"]
        # how late engine steps complete against the scaled clock, since serve-sim started
        lag = client.clock.lateness.summary()
        for name, key in (("p50", "p50_s"), ("p99", "p99_s"), ("max", "max_s")):
            lines += [f"# TYPE loadgen_serve_sim_lag_{name}_seconds gauge",
                      f"loadgen_serve_sim_lag_{name}_seconds {lag[key]!r}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def completions(self, request):
        return await self._serve(request, native=False)

    async def chat_completions(self, request):
        """vLLM's ``/v1/chat/completions``: the messages through the chat template and the tokenizer,
        then the same engine path as a completion; content streamed as ``delta.content``, with
        ``token_ids`` when ``return_token_ids`` is asked (as vLLM does)."""
        return await self._serve(request, native=False, chat=True)

    async def tokenize(self, request):
        """vLLM's ``POST /tokenize``: ``prompt`` (``add_special_tokens``) or ``messages``
        (``add_generation_prompt``, the chat template applied) -> ``count``, ``tokens``."""
        from aiohttp import web

        try:
            body = orjson.loads(await request.read())
            if body.get("messages") is not None:
                ids = self.tokenizer.encode_chat(messages_of(body["messages"]), bool(body.get("add_generation_prompt", True)))
            elif isinstance(body.get("prompt"), str):
                ids = (self.tokenizer.encode_text(body["prompt"]) if body.get("add_special_tokens", True)
                       else self.tokenizer.encode_plain(body["prompt"]))
            else:
                raise ValueError("give prompt (a string) or messages")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            return error_response(400, f"bad request: {exc}")
        return web.json_response({"count": len(ids), "max_model_len": self.config.max_model_len, "tokens": ids,
                                  "token_strs": None}, dumps=dumps)

    def text_output(self) -> TextOutput:
        if self._text_output is None:  # scanning a vocabulary takes a moment: only when text is asked for
            self._text_output = TextOutput(self.tokenizer)
        return self._text_output

    async def generate(self, request):
        """SGLang's native ``/generate``: ``input_ids`` or ``text``, ``sampling_params.max_new_tokens``;
        answers ``text``, ``output_ids`` and ``meta_info`` (``cached_tokens`` included), streamed as
        cumulative chunks like SGLang's default (non-incremental) streaming."""
        return await self._serve(request, native=True)

    async def _serve(self, request, native: bool, chat: bool = False):
        from aiohttp import web

        try:
            body = orjson.loads(await request.read())
            if chat:
                prompt = messages_of(body["messages"])
                max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
            elif native:
                prompt = body["input_ids"] if body.get("input_ids") is not None else body["text"]
                max_tokens = int((body.get("sampling_params") or {}).get("max_new_tokens") or 128)
            else:
                prompt = body["prompt"]
                max_tokens = int(body.get("max_tokens") or 16)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return error_response(400, f"bad request: {exc}")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        # text: chat messages or a text prompt, whose output is text that re-tokenizes exactly
        text = chat or isinstance(prompt, str)
        if chat:
            token_ids = self.tokenizer.encode_chat(prompt)
        elif isinstance(prompt, str):
            token_ids = self.tokenizer.encode_text(prompt)
        else:
            token_ids = [int(t) for t in prompt]
        client = self._engine()
        engine = client.engine
        reason = engine.validate(len(token_ids), max_tokens)
        if reason is not None:
            return error_response(400, reason)
        try:
            prefix_hint = int(request.headers.get("X-Loadgen-Prefix-Tokens", "0"))
        except ValueError:
            prefix_hint = 0
        placement: Optional[Placement] = None
        chain = None
        if self._matcher is not None:
            placement = self._matcher.place(token_ids, prefix_hint)
            prefix, stream = placement.prefix, placement.stream
        elif self._tokens is not None:
            chain = self._tokens.place(token_ids)
            prefix, stream = None, engine.stream(chain, 0)
        else:
            prefix_key, prefix_tokens, stream_id = self.mapper.map(token_ids, prefix_hint)
            prefix = engine.prefix_stream(prefix_key, prefix_tokens) if prefix_key is not None else None
            stream = engine.stream(("stream", stream_id), prefix_tokens)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        first = loop.create_future()
        sim_req = SimRequest(next(self._ids), stream, len(token_ids), max_tokens, prefix=prefix,
                             on_done=lambda r: done.done() or done.set_result(None), context=None)
        sim_req.on_first_token = lambda r: first.done() or first.set_result(None)
        clock = client.clock
        engine.submit(sim_req, clock.now())
        client._rearm()
        if text:
            output_ids, pieces = self.text_output().make(self._rng, max_tokens, chat)
        else:
            output_ids = self._rng.integers(1, 30000, size=max_tokens).tolist()
            pieces = [f"t{t}" for t in output_ids]
        recorded = False

        def record() -> None:
            # the stream now holds prompt + output (the last output token never enters KV)
            if placement is not None:
                self._matcher.finished(placement, token_ids + output_ids[:-1])
            elif chain is not None:
                self._tokens.finished(chain, token_ids + output_ids[:-1])
            else:
                self.mapper.record(stream_id, self.mapper.chained_hashes(token_ids + output_ids[:-1]))

        async def finished() -> None:
            nonlocal recorded
            await done
            record()
            recorded = True

        try:
            request_id = f"cmpl-{sim_req.request_id}"
            if native:
                return await self._serve_native(request, body, request_id, sim_req, output_ids, first, finished)
            if chat:
                request_id = f"chatcmpl-{sim_req.request_id}"
            if not body.get("stream"):
                await finished()
                final = (chat_final if chat else completion_final)(self.model, request_id, sim_req, output_ids, body, pieces,
                                                                 self.flavor)
                return web.json_response(final, dumps=dumps)
            chunk = chat_chunk if chat else completion_chunk
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            sent = 0
            try:
                await first
                await resp.write(sse(chunk(self.model, request_id, output_ids[:1], body, pieces[0])))
                sent = 1
                await finished()
                # per-token timing inside a request is not simulated: the rest streams at completion
                for tok, piece in zip(output_ids[1:], pieces[1:]):
                    await resp.write(sse(chunk(self.model, request_id, [tok], body, piece)))
                    sent += 1
                options = body.get("stream_options") or {}
                if options.get("include_usage"):
                    kind = "chat.completion.chunk" if chat else "text_completion"
                    await resp.write(sse({"id": request_id, "object": kind, "model": self.model,
                                          "choices": [], "usage": usage_of(sim_req, self.flavor)}))
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
            except (ConnectionResetError, asyncio.CancelledError) as exc:
                self._hung_up(request_id, sent, max_tokens, exc)
            return resp
        finally:
            if not recorded and self.flavor == "sglang":
                # the client went away: SGLang aborts the request, the simulated SGLang engine cannot,
                # so it runs to its end (holding its slots) and its stream is recorded then
                if sim_req.finish_s is None:
                    sim_req.on_done = lambda r: record()
                else:
                    record()
            elif not recorded:
                # the client went away (aiohttp cancels the handler): vLLM aborts the request,
                # freeing its blocks and keeping their hashes, so a retry of the prompt hits them
                if sim_req.finish_s is None:  # (``done`` is cancelled with the handler)
                    engine.abort(sim_req, client.clock.now())
                    client._rearm()
                if placement is not None:
                    self._matcher.finished(placement, token_ids)
                else:
                    self.mapper.aborted(stream_id, self.mapper.chained_hashes(token_ids))

    async def _serve_native(self, request, body: dict, request_id: str, req: SimRequest, ids: list[int],
                            first, finished):
        from aiohttp import web

        def answer(upto: int, done: bool) -> dict:
            meta = {"id": request_id, "finish_reason": {"type": "length", "length": len(ids)} if done else None,
                    "prompt_tokens": req.num_prompt_tokens, "completion_tokens": upto,
                    "cached_tokens": req.num_cached_tokens}
            return {"text": " ".join(f"t{t}" for t in ids[:upto]), "output_ids": ids[:upto], "meta_info": meta}

        if not body.get("stream"):
            await finished()
            return web.json_response(answer(len(ids), True), dumps=dumps)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent = 0
        try:
            await first
            await resp.write(sse(answer(1, len(ids) == 1)))
            sent = 1
            await finished()
            for upto in range(2, len(ids) + 1):  # cumulative, as SGLang streams by default
                await resp.write(sse(answer(upto, upto == len(ids))))
                sent = upto
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError) as exc:
            self._hung_up(request_id, sent, len(ids), exc)
        return resp

    def _hung_up(self, request_id: str, sent: int, num_tokens: int, exc: BaseException) -> None:
        """A client that hangs up mid-stream (a timeout, a stopped run) is normal: one line and a
        count (``loadgen_serve_sim_client_hangups_total``), not aiohttp's traceback. A write to
        the closed connection raises ConnectionResetError (aiohttp's ClientConnectionResetError);
        a hang-up aiohttp noticed first cancels the handler, and the cancellation goes on."""
        self.num_client_hangups += 1
        LOG.info("serve-sim: a client hung up mid-stream (%s, %d of %d tokens sent); %d hang-ups so far",
                 request_id, sent, num_tokens, self.num_client_hangups)
        if isinstance(exc, asyncio.CancelledError):
            raise exc


def check_options(port: int, pool_tokens: int, block_size: int, max_num_batched_tokens: int,
                  max_model_len: int, flavor: str = "vllm", page_size: int = 1) -> None:
    """serve-sim's command-line numbers, checked before anything starts: ValueError naming the flag
    and what it needs."""
    if not 1 <= port <= 65535:
        raise ValueError(f"--port {port}: a TCP port is 1..65535")
    for flag, value in (("--block-size", block_size), ("--max-num-batched-tokens", max_num_batched_tokens),
                        ("--max-model-len", max_model_len), ("--pool-tokens", pool_tokens),
                        ("--page-size", page_size)):
        if value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")
    if flavor == "sglang":
        # SGLang sizes its pool in tokens, not blocks, and refuses per request what it cannot hold
        return
    if pool_tokens % block_size:
        raise ValueError(f"--pool-tokens ({pool_tokens}) must be a multiple of --block-size ({block_size})")
    if pool_tokens < max_model_len:
        # vLLM refuses to start when its KV cache cannot hold one request of the longest length
        raise ValueError(f"--pool-tokens {pool_tokens} cannot hold one request of --max-model-len {max_model_len} "
                         f"tokens: give a pool of at least {max_model_len} tokens or a smaller --max-model-len")
    if pool_tokens < 2 * block_size:
        raise ValueError(f"--pool-tokens {pool_tokens}: the pool needs at least 2 blocks of {block_size} tokens "
                         "(one is vLLM's null block)")


async def serve(server: SimServer, host: str, port: int, ready: Optional[asyncio.Event] = None):
    from aiohttp import web

    # handler_cancellation: a client that hangs up cancels its handler, which aborts its request
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if ready is not None:
        ready.set()
    return runner
