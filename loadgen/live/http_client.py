"""The engine seam for real servers: vLLM, SGLang or any OpenAI-compatible endpoint.

Two layers:

* ``Transport`` (loadgen/live/transport.py): the one seam to the network. Plain http:// goes
  through the raw HTTP/1.1 client (raw_http.py), https:// through ``AiohttpTransport``;
  ``MockTransport`` is the test double.
* ``OpenAIEngineClient``: the ``EngineClient`` sessions talk to. Each turn is one streamed
  ``/v1/completions`` request with a token-id prompt (text as a fallback), ``ignore_eos`` and a
  fixed output length; it records time to first token and inter-token gaps, reads cached tokens
  from ``usage.prompt_tokens_details.cached_tokens`` (a missing field means 0, as vLLM omits it
  when nothing hit), and, when the server returns generated ids (vLLM ``return_token_ids``),
  hands them back so the next turn appends exactly what the engine cached. With ``api: chat``
  each turn is a streamed ``/v1/chat/completions`` request instead, its messages built by
  loadgen/live/chat.py to the planned token length (docs/chat.md); the returned text is kept
  for the next turn's assistant message.

Failures (HTTP errors, timeouts, resets, a dead server) become a ``TurnResult`` with ``error``
set; whether to retry is the session's policy. The API key comes from an environment variable
and is never logged or recorded.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import orjson

from ..core.clock import Clock
from ..core.engines import EngineMetrics, TurnRequest, TurnResult
from ..core.lateness import LatenessHistogram
from ..core.session import TokenContext, TokenIds
from .chat import Messages, PromptBuilder, probe_content
from .raw_http import HttpStatusError, RawHttpTransport, TransportError
from .server_metrics import ScrapedMetrics, parse_metrics
from .tokenizer import LocalTokenizer, ServerTokenizer, TokenizerError
from .transport import AiohttpTransport, Transport

# serve-sim's lateness histogram (JSON); a real server answers 404 and has no lag of its own to report
LAG_PATH = "/loadgen/lag"
# loadgen gateway's answer to every turn: the seconds (its clock) it held the request before
# sending it upstream, a wait the engine never sees (recorded as the turn's gateway wait)
GATEWAY_WAIT_HEADER = "X-Loadgen-Gateway-Wait-Seconds"
GATEWAY_RUN_START_PATH = "/loadgen/run_start"  # a run starts: the gateway's gate and clock start with it
# the session header a run sends a loadgen gateway (it reads this one by default) when the spec names none
GATEWAY_SESSION_HEADER = "X-Session-ID"


def _seconds(value: Optional[str]) -> float:
    """A header's seconds; 0.0 when absent or not a finite, non-negative number."""
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        return 0.0
    return seconds if 0.0 <= seconds < math.inf else 0.0


def _until_done(events: list[bytes]) -> list[bytes]:
    """A batch's SSE data payloads up to the ``[DONE]`` that ends the stream (later ones ignored)."""
    for i, data in enumerate(events):
        if data.strip() == b"[DONE]":
            return events[:i]
    return events


class StreamError(Exception):
    """The stream said the request failed (an error event, or an event that is not one)."""


class PreflightError(RuntimeError):
    """The endpoint cannot run this experiment; the message says what to change."""


# SGLang's /flush_cache refuses while requests run: retried every FLUSH_RETRY_INTERVAL_S of run
# time, at most FLUSH_MAX_ATTEMPTS times (a minute of run time), then the flush is an error
FLUSH_RETRY_INTERVAL_S = 0.5
FLUSH_MAX_ATTEMPTS = 120


@dataclass
class EndpointOptions:
    url: str
    model: Optional[str] = None
    api_key: Optional[str] = None
    prompt_mode: str = "auto"  # token_ids | text | auto (token ids, text if the server refuses them)
    request_timeout_s: float = 600.0
    return_token_ids: bool = True
    server: str = "auto"  # vllm | sglang | auto: which flush and metric names to use
    api: str = "completions"  # completions | chat (docs/chat.md)
    tokenizer: Optional[str] = None  # counts text prompts; None: the server's /tokenize
    # routers: a header naming the session (SESSION_LABEL/SESSION_ID) so every turn goes to one replica
    session_header: Optional[str] = None
    session_label: str = "loadgen"  # the run's id in a run
    # a router's response header naming the replica that served the turn (turns.parquet replica)
    replica_header: Optional[str] = None
    # the pool of the simulated engine a spec run with --endpoint was written for: the preflight
    # uses it when the server reports none and refuses a server that reports another
    simulated_pool_tokens: Optional[int] = None


class OpenAIEngineClient:
    """``EngineClient`` over an OpenAI-compatible HTTP server."""

    needs_token_ids = True

    def __init__(self, clock: Clock, options: EndpointOptions, transport: Optional[Transport] = None,
                 pool_tokens: int = 0) -> None:
        self.clock = clock
        self.options = options
        self.base = options.url.rstrip("/")
        # plain http:// through the raw HTTP/1.1 client (measured ~2x cheaper per streamed turn than
        # aiohttp: benchmarks/README.md), https:// through aiohttp
        self.transport = transport or RawHttpTransport(fallback=AiohttpTransport())
        self.pool_tokens = pool_tokens
        self.model = options.model
        self.prompt_mode = options.prompt_mode
        self.server = options.server
        self.max_model_len: Optional[int] = None
        self.flush_times_s: list[float] = []
        self.last_metrics: Optional[ScrapedMetrics] = None
        self.consecutive_failures = 0
        self.first_failure_s: Optional[float] = None
        self.api = options.api
        self._path = "/v1/chat/completions" if options.api == "chat" else "/v1/completions"
        # text prompts of exact lengths (chat, or the completions text fallback); set by the preflight
        self.prompts: Optional[PromptBuilder] = None
        self.replica_names: list[str] = []  # replica_header values in order of first sight: their index
        self._headers = {"Content-Type": "application/json"}
        if options.api_key:
            self._headers["Authorization"] = f"Bearer {options.api_key}"

    # ---------------------------------------------------------------- plumbing
    async def _json(self, method: str, path: str, payload: Any = None, timeout_s: float = 30.0) -> Any:
        body = orjson.dumps(payload) if payload is not None else None
        status, data = await self.transport.request(method, self.base + path, body, self._headers, timeout_s)
        if status >= 400:
            raise HttpStatusError(status, data.decode(errors="replace"))
        try:
            return orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            return data.decode(errors="replace")

    def _body(self, request: TurnRequest, prompt: Any, stream: bool = True) -> dict:
        body = {"model": self.model, "messages" if self.api == "chat" else "prompt": prompt,
                "max_tokens": request.max_tokens,
                "min_tokens": request.max_tokens, "ignore_eos": True, "temperature": 0.0, "stream": stream}
        if stream:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": False}
        if self.options.return_token_ids:
            body["return_token_ids"] = True
        return body

    def _prompt(self, request: TurnRequest) -> Any:
        if request.prompt_content is not None:  # chat messages, or a text built to its exact length
            return request.prompt_content
        ids = request.token_ids
        if ids is None:
            raise ValueError("the HTTP engine needs token ids in TurnRequest.token_ids")
        if self.prompt_mode == "text":
            return " ".join(f"t{i}" for i in ids)  # one word per token id: same length, same reuse
        return ids

    # ---------------------------------------------------------------- a turn
    async def generate(self, request: TurnRequest) -> TurnResult:
        clock = self.clock
        submitted = clock.now()
        first = math.nan
        last = submitted
        gaps: list[float] = []
        output_ids: list[int] = []
        texts: list[str] = []
        usage = meta_info = None
        streamed_tokens = 0
        headers = self._headers
        if request.shared_prefix_tokens:
            # a hint only our own serve-sim reads; real servers ignore unknown headers
            headers = {**headers, "X-Loadgen-Prefix-Tokens": str(request.shared_prefix_tokens)}
        if self.options.session_header:
            headers = {**headers, self.options.session_header: self.session_value(request.session_id)}
            if request.final:  # Dynamo's end-of-session header, which loadgen gateway reads too
                headers["x-dynamo-session-final"] = "true"
            if request.parent_session_id is not None:  # a sub-agent's parent (Dynamo's header)
                headers["x-dynamo-parent-session-id"] = self.session_value(request.parent_session_id)
        prompt = self._prompt(request)
        if isinstance(prompt, (TokenIds, Messages)):  # its JSON kept up to date as the context grows
            fields = orjson.dumps(self._body(request, None))  # '{"model":..,"prompt":null,..}'
            key = b'"messages":' if self.api == "chat" else b'"prompt":'
            body = fields.replace(key + b"null", key + prompt.json(), 1)
        else:
            body = orjson.dumps(self._body(request, prompt))
        # a gateway's wait (loadgen gateway says it on every turn) and the replica when the spec names its header
        replica_header = self.options.replica_header
        response_headers = {GATEWAY_WAIT_HEADER: None}
        if replica_header:
            response_headers[replica_header] = None
        try:
            async for batch in self.transport.stream_lines(self.base + self._path, body, headers,
                                                           self.options.request_timeout_s, response_headers):
                now = clock.now()
                # one JSON parse per network read (the batch's events as one array), not per event
                events = [line[5:] for line in batch if line[:5] == b"data:"]
                if not events:
                    continue
                joined = b",".join(events)
                if b"[DONE]" in joined:  # the end of the stream, or "[DONE]" in some text
                    events = _until_done(events)
                    if not events:
                        continue
                    joined = b",".join(events)
                num_tokens = 0
                for chunk in orjson.loads(b"[" + joined + b"]"):
                    if not isinstance(chunk, dict):
                        raise StreamError(f"an event that is not a JSON object: {str(chunk)[:200]}")
                    error = chunk.get("error")
                    if error:
                        if not isinstance(error, dict):  # some servers send {"error": "..."}
                            raise StreamError(f"the server streamed an error: {str(error)[:300]}")
                        raise HttpStatusError(int(error.get("code") or 500), str(error))
                    event_tokens = 0
                    for choice in chunk.get("choices") or ():
                        ids = choice.get("token_ids")
                        # completions stream "text"; chat streams "delta": {"content": ...}
                        text = choice["text"] if "text" in choice else (choice.get("delta") or {}).get("content")
                        if text:
                            texts.append(text)
                        if ids:
                            output_ids.extend(ids)
                            event_tokens += len(ids)
                        elif text:
                            event_tokens += 1
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                        # a usage streamed with every event (continuous usage stats) counts its tokens
                        counted = usage.get("completion_tokens")
                        if event_tokens and isinstance(counted, int) and counted > streamed_tokens + num_tokens:
                            event_tokens = counted - streamed_tokens - num_tokens
                    if chunk.get("meta_info"):
                        meta_info = chunk["meta_info"]
                    num_tokens += event_tokens
                if num_tokens:
                    # per token, not per read: a read that brought n tokens since the last one
                    # spreads its gap over them (reads coalesce when the driver is busy); the first
                    # read's tokens arrived together, their spacing unseen
                    if math.isnan(first):
                        first = now
                    else:
                        gap = (now - last) / num_tokens
                        gaps.extend((gap,) * num_tokens)
                    streamed_tokens += num_tokens
                    last = now
        except (TransportError, HttpStatusError, StreamError, orjson.JSONDecodeError, ValueError) as exc:
            return self._failed(request, submitted, first, f"{type(exc).__name__}: {exc}")
        finish = clock.now()
        if usage is None:
            return self._failed(request, submitted, first, "stream ended without usage (is stream_options supported?)")
        self.consecutive_failures = 0
        self.first_failure_s = None
        # SGLang (--enable-cache-report) and vLLM (--enable-prompt-tokens-details) both report cached
        # tokens in usage.prompt_tokens_details and omit it when nothing hit; SGLang's native
        # responses carry meta_info.cached_tokens instead, read when the usage has no details
        details = usage.get("prompt_tokens_details")
        if details:
            cached = int(details.get("cached_tokens") or 0)
        else:
            cached = int((meta_info or {}).get("cached_tokens") or 0)
        return TurnResult(submitted, first, finish, int(usage.get("prompt_tokens", request.prompt_tokens)), cached,
                          int(usage.get("completion_tokens", len(output_ids))), 0, None,
                          output_ids if output_ids else None, tuple(gaps), output_text="".join(texts),
                          replica=self.replica_index(response_headers.get(replica_header) if replica_header else None),
                          gateway_wait_s=_seconds(response_headers[GATEWAY_WAIT_HEADER]))

    def replica_index(self, value: Optional[str]) -> Optional[int]:
        """The replica a response names (None without the header): an index when the value is one
        (serve-sim's X-Loadgen-Replica), else the order in which the run first saw the value."""
        if value is None:
            return None
        if value.isdigit():
            return int(value)
        if value not in self.replica_names:
            self.replica_names.append(value)
        return self.replica_names.index(value)

    def session_value(self, session_id: int) -> str:
        """The affinity header's value: stable for a session within a run, distinct across sessions
        and runs; the preflight's probes (session -1) share one, so its repeated prompt meets its cache."""
        label = self.options.session_label
        return f"{label}/{session_id}" if session_id >= 0 else f"{label}/preflight"

    def _failed(self, request: TurnRequest, submitted: float, first: float, error: str) -> TurnResult:
        now = self.clock.now()
        self.consecutive_failures += 1
        if self.first_failure_s is None:
            self.first_failure_s = now
        return TurnResult(submitted, first, now, request.prompt_tokens, 0, 0, 0, error)

    def engine_gone(self, now_s: float, after_s: float) -> bool:
        """Every request has failed for ``after_s`` seconds: the engine is gone."""
        return self.first_failure_s is not None and now_s - self.first_failure_s >= after_s

    # ---------------------------------------------------------------- metrics, flush
    async def scrape(self) -> ScrapedMetrics:
        status, data = await self.transport.request("GET", self.base + "/metrics", None, self._headers, 10.0)
        if status >= 400:
            raise HttpStatusError(status, data.decode(errors="replace"))
        scraped = parse_metrics(data.decode(errors="replace"))
        self.last_metrics = scraped
        return scraped

    async def start_run_at_gateway(self) -> bool:
        """Tell a loadgen gateway in front of the engine (its /metrics said so at the preflight)
        that a run starts now: its gate and clock start with the run's, and every turn names its
        session (the gateway's own header unless the spec names one; a fingerprint would take
        sessions that open alike for one). False when there is none."""
        if self.last_metrics is None or not self.last_metrics.loadgen_gateway:
            return False
        await self._json("POST", GATEWAY_RUN_START_PATH, None)
        self.options.session_header = self.options.session_header or GATEWAY_SESSION_HEADER
        return True

    async def metrics_async(self) -> EngineMetrics:
        try:
            return (await self.scrape()).metrics
        except (TransportError, HttpStatusError, ValueError):
            return EngineMetrics(-1, -1, math.nan, -1, -1, -1)

    async def server_lateness(self) -> Optional[LatenessHistogram]:
        """The server's own timer lateness so far (serve-sim's ``/loadgen/lag``), or None when the
        server does not measure it (vLLM, SGLang) or cannot be asked: lag is a diagnosis, never a
        reason to fail a run."""
        data = await self._lag_report()
        try:
            return LatenessHistogram.from_json(data["lateness"]) if data is not None else None
        except Exception:  # whatever a server (or a test double) answers to a path it does not serve
            return None

    async def _lag_report(self) -> Optional[dict]:
        """serve-sim's ``/loadgen/lag`` (its time scale and timer lateness), None from a server
        that does not answer it with a JSON object."""
        try:
            data = await self._json("GET", LAG_PATH, timeout_s=10.0)
        except Exception:  # whatever a server (or a test double) answers to a path it does not serve
            return None
        return data if isinstance(data, dict) else None

    async def flush_async(self) -> float:
        """Reset the server's prefix cache, preempting running requests; returns when it happened."""
        server = self.server
        if server in ("vllm", "auto"):
            try:
                await self._json("POST", "/reset_prefix_cache?reset_running_requests=true", None)
                self.flush_times_s.append(self.clock.now())
                return self.flush_times_s[-1]
            except TransportError as exc:
                raise PreflightError(f"{self.base}/reset_prefix_cache: transport error: {exc}") from None
            except HttpStatusError as exc:
                if exc.status != 404 or server == "vllm":
                    raise PreflightError(
                        f"{self.base}/reset_prefix_cache refused ({exc}); vLLM serves it only with "
                        "VLLM_SERVER_DEV_MODE=1 in the server's environment") from None
        # SGLang refuses /flush_cache while requests run: retry until it is idle, a bounded
        # number of times on the run's clock (so a scaled run waits in run time, like its sessions)
        for _attempt in range(FLUSH_MAX_ATTEMPTS):
            try:
                await self._json("POST", "/flush_cache", None)
                self.flush_times_s.append(self.clock.now())
                return self.flush_times_s[-1]
            except HttpStatusError as exc:
                if exc.status == 404:
                    raise PreflightError(f"{self.base} has neither /reset_prefix_cache nor /flush_cache") from None
                last = exc
            except TransportError as exc:
                raise PreflightError(f"{self.base}/flush_cache: transport error: {exc}") from None
            await self.clock.sleep(FLUSH_RETRY_INTERVAL_S)
        raise PreflightError(f"{self.base}/flush_cache refused {FLUSH_MAX_ATTEMPTS} times, "
                             f"{FLUSH_RETRY_INTERVAL_S:g} s of run time apart (last answer: {last})")

    # ---------------------------------------------------------------- preflight
    async def preflight(self, needed_context_tokens: int = 0, pool_tokens: Optional[int] = None,
                        time_scale: Optional[float] = None) -> dict:
        """Before any load: reachable, model served, token-id prompts accepted, cached tokens
        reported, pool size known, serve-sim at the run's ``time_scale`` (default: the clock's).
        Raises PreflightError with what to fix."""
        try:
            models = await self._json("GET", "/v1/models")
        except HttpStatusError as exc:
            if exc.status == 404:
                root = "/".join(self.base.split("/")[:3])  # scheme://host:port
                hint = (f"; is {root} the server's base URL?" if root != self.base
                        else "; is this an OpenAI-compatible server (vLLM, SGLang)?")
                raise PreflightError(f"{self.base}/v1/models answered HTTP 404 (no such path){hint}") from None
            raise PreflightError(f"{self.base}/v1/models failed: {exc}") from None
        except TransportError as exc:
            raise PreflightError(f"{self.base} is not reachable: {exc}") from None
        listed = models.get("data") if isinstance(models, dict) else None
        if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
            what = ("text/HTML" if isinstance(models, str) and models.lstrip()[:1] == "<"
                    else "text" if isinstance(models, str) else f"JSON {type(models).__name__}")
            raise PreflightError(f"{self.base}/v1/models answered HTTP 200 with {what}, not the JSON model list "
                                 f"of an OpenAI-compatible server ({{\"data\": [...]}}): is {self.base} the "
                                 f"server's base URL? It answered: {str(models)[:200]!r}")
        served = [m.get("id") for m in listed]
        if self.model is None:
            if not served:
                raise PreflightError(f"{self.base}/v1/models lists no model")
            self.model = served[0]
        elif self.model not in served:
            raise PreflightError(f"model {self.model!r} is not served by {self.base}; it serves {served}")
        for m in listed:
            if m.get("id") == self.model and m.get("max_model_len"):
                self.max_model_len = int(m["max_model_len"])
        if self.max_model_len and needed_context_tokens > self.max_model_len:
            raise PreflightError(f"sessions reach {needed_context_tokens} tokens but {self.model} serves at most "
                                 f"{self.max_model_len} (--max-model-len)")
        probe = TurnRequest(-1, 0, 512, 2, token_ids=[(i * 7919) % 29989 + 1 for i in range(512)])
        if self.api == "chat":  # a message list, counted as the sessions' will be
            self.prompt_mode = "text"
            self.prompts = await self._prompt_builder(required=True)
            content, num_tokens = await probe_content(self.prompts, 512)
            probe = TurnRequest(-1, 0, num_tokens, 2, prompt_content=content)
        results = []
        for attempt in range(3):  # the first requests after a start can be slow: warm up too
            if self.prompt_mode == "auto":
                self.prompt_mode = "token_ids"
            result = await self.generate(probe)
            if result.error and self.options.prompt_mode == "auto" and "HTTP 400" in result.error:
                self.prompt_mode = "text"
                result = await self.generate(probe)
            if result.error and "HTTP 404" in result.error:
                other = "completions" if self.api == "chat" else "chat"
                raise PreflightError(f"{self.base}{self._path} answered HTTP 404 (no such path): an endpoint "
                                     f"without the {self.api} API? set engine.api: {other} (loadgen run --api {other})")
            if result.error:
                raise PreflightError(f"a probe completion to {self.base} failed: {result.error}")
            results.append(result)
        if self.options.prompt_mode == "auto" and self.prompt_mode == "auto":
            self.prompt_mode = "token_ids"
        if self.api == "completions" and self.prompt_mode == "text":
            # the text fallback: prompts of exact lengths when a tokenizer is at hand (the spec's, or
            # the server's /tokenize), else one word per token id (lengths approximate)
            self.prompts = await self._prompt_builder(required=False)
        if all(r.cached_tokens == 0 for r in results[1:]):
            raise PreflightError(
                f"{self.base} reports no cached prompt tokens for a repeated prompt: start vLLM with "
                "--enable-prefix-caching --enable-prompt-tokens-details, or SGLang with --enable-cache-report")
        try:
            scraped = await self.scrape()
            self.server = scraped.server if self.server == "auto" else self.server
        except (TransportError, HttpStatusError, ValueError):
            scraped = None
        pool = pool_tokens or (scraped.pool_tokens if scraped else None)
        if not pool and self.server == "sglang":
            pool = await self._sglang_pool_tokens()
        simulated = self.options.simulated_pool_tokens
        if pool and simulated and not pool_tokens and pool != simulated:
            raise PreflightError(
                f"engine.pool_tokens: the spec's simulated engine has a {simulated}-token KV pool, but {self.base} "
                f"has {pool} tokens, and the spec's load and limits were sized for its pool. Give --pool-tokens "
                f"{pool} to run it against this engine's pool, or start the engine with a {simulated}-token pool")
        pool = pool or simulated
        if not pool:
            raise PreflightError(f"the KV pool size of {self.base} is unknown (no vllm:cache_config_info or "
                                 "sglang:max_total_num_tokens in /metrics, no max_total_num_tokens in "
                                 "/get_server_info): give --pool-tokens N, or engine.pool_tokens in the spec")
        self.pool_tokens = pool
        self.consecutive_failures = 0
        self.first_failure_s = None
        # the tokens per cache block hits come in (the ideal hit ratio rounds to it): vLLM's
        # cache_config_info, SGLang's page size (its default 1 when /get_server_info has none)
        block_size = scraped.block_size if scraped else None
        if block_size is None and self.server == "sglang":
            block_size = await self._sglang_page_size() or 1
        return {"model": self.model, "prompt_mode": self.prompt_mode, "pool_tokens": pool, "block_size": block_size,
                "server": self.server, "max_model_len": self.max_model_len,
                "probe_cached_tokens": [r.cached_tokens for r in results],
                "api": self.api, "prompt_lengths": self._prompt_lengths(),
                "warnings": await self._time_scale_check(time_scale)}

    async def _time_scale_check(self, run_scale: Optional[float]) -> list[str]:
        """serve-sim says its time scale (``/loadgen/lag``): another than the run's is refused, as
        every engine step would take the ratio of them longer or shorter in run time than its cost
        model says. A server that does not say it (vLLM, SGLang) runs in real time: a scaled run
        against it is warned of (its steps read time_scale times longer in run time)."""
        if run_scale is None:
            run_scale = getattr(self.clock, "time_scale", 1.0)
        data = await self._lag_report()
        gateway_scale = (data or {}).get("gateway_time_scale")
        if isinstance(gateway_scale, (int, float)) and not math.isclose(gateway_scale, run_scale, rel_tol=1e-9):
            raise PreflightError(
                f"{self.base} is a loadgen gateway whose clock runs at time_scale {gateway_scale:g}, and this run's "
                f"time scale is {run_scale:g}: its limit's start and its park times would be off by "
                f"{run_scale / gateway_scale:.3g}x in run time; start the gateway with --time-scale {run_scale:g}, or "
                f"run with --time-scale {gateway_scale:g}")
        try:
            server_scale = float(data["time_scale"]) if data is not None else None
        except (KeyError, TypeError, ValueError):  # not serve-sim's answer: nothing said
            server_scale = None
        if server_scale is None:
            if run_scale == 1.0:
                return []
            return [f"--time-scale {run_scale:g} against {self.base}, which does not report a time scale (a real "
                    f"engine runs in real time): its steps take {run_scale:g}x as long in run time as on the server "
                    f"(a 30 ms step reads {0.03 * run_scale:.3g} s); the run compares with a twin only at its own speed"]
        if not math.isclose(server_scale, run_scale, rel_tol=1e-9):
            raise PreflightError(
                f"{self.base} is serve-sim at --time-scale {server_scale:g}, and this run's time scale is {run_scale:g}: "
                f"its engine steps would take {run_scale / server_scale:.3g}x as long in run time as its cost model says; "
                f"start serve-sim with --time-scale {run_scale:g}, or run with --time-scale {server_scale:g}")
        return []

    def _prompt_lengths(self) -> dict:
        """How prompt lengths are made (run.json preflight): token ids are exact by construction;
        text is counted by a tokenizer, or approximate (one word per token) without one."""
        if self.prompts is not None:
            return {"exact": True, **self.prompts.counter.describe()}
        return {"exact": self.prompt_mode == "token_ids", "tokenizer": None}

    async def _prompt_builder(self, required: bool) -> Optional[PromptBuilder]:
        """Text prompts of exact lengths: the spec's tokenizer, else the server's /tokenize.
        PreflightError when neither works and ``required``; None when not required."""
        try:
            if self.options.tokenizer:
                counter = LocalTokenizer(self.options.tokenizer)
            else:
                counter = ServerTokenizer(lambda path, payload: self._json("POST", path, payload), self.model)
            builder = PromptBuilder(counter, self.api)
            await builder.prepare()
            return builder
        except TokenizerError as exc:
            if required or self.options.tokenizer:
                raise PreflightError(f"engine.tokenizer: {exc}") from None
        except (HttpStatusError, TransportError) as exc:
            if required:
                raise PreflightError(
                    f"{self.api} prompts are built to exact token lengths with a tokenizer: no engine.tokenizer "
                    f"was given and {self.base}/tokenize failed ({exc}); give engine.tokenizer (a tokenizer.json "
                    "or the model's directory)") from None
        return None

    async def prepare_prompts(self) -> None:
        """For a client that skips the preflight because the run's preflight settled its
        ``prompt_mode`` (a Ray fleet's): the prompt builder that text prompts need, so that they
        have the exact lengths the run's preflight reported."""
        if self.prompt_mode == "text" and self.prompts is None:
            self.prompts = await self._prompt_builder(required=self.api == "chat")

    def session_context(self, shape, run_key: tuple[int, str], session_id: int):
        """A session's context (loadgen/core/session.py): token ids, or text built by the preflight's
        prompt builder (chat messages, or the completions text fallback)."""
        if self.prompts is None:
            return TokenContext(shape, run_key, session_id)
        return self.prompts.session(shape, run_key, session_id)

    async def _sglang_pool_tokens(self) -> Optional[int]:
        """SGLang's pool in tokens from its server info: SGLang 0.5.x exports no metric for it but
        ``/get_server_info`` (``/server_info`` on newer versions) has the scheduler's
        ``max_total_num_tokens``."""
        return await self._sglang_info_int("max_total_num_tokens")

    async def _sglang_page_size(self) -> Optional[int]:
        return await self._sglang_info_int("page_size")

    async def _sglang_info_int(self, key: str) -> Optional[int]:
        """A positive number from SGLang's server info, or None."""
        for path in ("/get_server_info", "/server_info"):
            try:
                info = await self._json("GET", path)
            except (TransportError, HttpStatusError):
                continue
            value = info.get(key) if isinstance(info, dict) else None
            if isinstance(value, (int, float)) and value > 0:
                return int(value)
        return None

    async def close(self) -> None:
        await self.transport.close()


def api_key_from_env(var: Optional[str]) -> Optional[str]:
    if not var:
        return None
    value = os.environ.get(var)
    if not value:
        raise PreflightError(f"engine.api_key_env names ${var}, which is not set")
    return value
