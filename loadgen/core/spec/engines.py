"""Engine specs: the simulated engine (vLLM or SGLang flavour, CPU offload tier), an OpenAI-compatible
endpoint, and servers that `loadgen sweep` launches."""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_serializer, model_validator

from routers import ROUTERS, make_router

from ...sim.cost import DEFAULT_PRESET, PRESETS, StepCostModel
from ...sim.offload import (DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_KV_LAYERS, DEFAULT_LATENCY_S, DEFAULT_VLLM_VERSION,
                           OffloadConfig, copy_piece_bytes, effective_bandwidth_bytes_per_s, parse_vllm_version)

from .base import _Model


class SGLangOptionsSpec(_Model):
    """SGLang's server arguments for the sglang flavour (SGLang 0.5.x's names and defaults;
    docs/engine-model.md#sglang-flavour). Chunks are ``max_num_batched_tokens`` tokens
    (``--chunked-prefill-size``) and at most ``max_num_seqs`` requests run."""

    page_size: int = Field(1, gt=0, description="Tokens per radix-tree page (--page-size).")
    schedule_policy: Literal["fcfs", "lpm"] = Field("fcfs", description="Waiting-queue order (--schedule-policy).")
    max_prefill_tokens: int = Field(16384, gt=0, description="Tokens one prefill batch may take (--max-prefill-tokens).")
    init_new_token_ratio: float = Field(
        0.7, gt=0, le=1, description="Share of each running request's remaining output reserved at admission, "
                                     "at start and after a flush (SGLANG_INIT_NEW_TOKEN_RATIO).")
    min_new_token_ratio_factor: float = Field(0.14, gt=0, le=1, description="The ratio decays to init x this.")
    new_token_ratio_decay_steps: int = Field(600, gt=0, description="Decode steps from init to min.")
    retract_decode_steps: int = Field(20, ge=0, description="Decode steps per request assumed after a retraction.")
    overlap_schedule: bool = Field(
        True, description="SGLang's overlap schedule (its default; false is --disable-overlap-schedule): the next "
                          "batch is scheduled while the GPU computes, hiding the cost model's hidden_cpu_s, and a "
                          "batch's results reach the scheduler one batch late (docs/engine-model.md#sglang-flavour).")


class OffloadSpec(_Model):
    """A CPU KV tier behind the GPU pool, as vLLM's native offloading (``--kv-offloading-size``,
    OffloadingConnector with the CPU backend): docs/engine-model.md#cpu-kv-offload-tier."""

    cpu_tokens: int = Field(..., gt=0, description="Host tier size in tokens (cpu_bytes_to_use / KV bytes per token); "
                                                   "900000 is ~124 GiB for Qwen3-8B at 144 KiB/token.")
    vllm_version: str = Field(
        DEFAULT_VLLM_VERSION,
        description="The vLLM release whose copy layout sets the effective bandwidth: before 0.12 per-layer K and "
                    "V pieces of a block (32 KiB for Qwen3-8B: ~9 GB/s), from 0.12 one contiguous block (~47 GB/s); "
                    "docs/engine-model.md#cpu-kv-offload-tier.")
    bandwidth_bytes_per_s: Optional[float] = Field(
        None, gt=0, description="An explicit effective host<->GPU copy bandwidth per direction (replaces the "
                                "vllm_version figure); default: from vllm_version.")
    latency_s: float = Field(DEFAULT_LATENCY_S, ge=0, description="Fixed cost of one copy job (launch and poll).")
    kv_bytes_per_token: int = Field(DEFAULT_KV_BYTES_PER_TOKEN, gt=0,
                                    description="KV bytes of one token (default Qwen3-8B BF16: 147456 = 144 KiB).")
    kv_layers: int = Field(DEFAULT_KV_LAYERS, gt=0,
                           description="Attention layers holding KV (Qwen3-8B: 36): the pieces of a pre-0.12 copy.")
    link: Literal["duplex", "shared"] = Field(
        "duplex", description="duplex: loads and stores each queue on their own direction's link (vLLM's two "
                              "copy handlers over full-duplex PCIe); shared: both queue on one link.")

    @field_validator("vllm_version")
    @classmethod
    def _check_version(cls, value: str) -> str:
        parse_vllm_version(value)
        return value

    def effective_bandwidth_bytes_per_s(self, block_size: int) -> float:
        if self.bandwidth_bytes_per_s is not None:
            return self.bandwidth_bytes_per_s
        return effective_bandwidth_bytes_per_s(
            copy_piece_bytes(self.vllm_version, block_size, self.kv_bytes_per_token, self.kv_layers))


class RouterSpec(_Model):
    """The router in front of a deployment's replicas: ``{policy: NAME, ...its knobs}``
    (docs/deployments.md); knobs left out take the real router's shipped defaults."""

    model_config = ConfigDict(extra="allow", frozen=True)
    policy: str = Field(..., description="Router: " + ", ".join(ROUTERS))

    @field_validator("policy")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in ROUTERS:
            raise ValueError(f"unknown router {value!r}; valid routers: {list(ROUTERS)}")
        return value

    @model_validator(mode="after")
    def _knobs_make_a_router(self) -> "RouterSpec":
        make_router(self.policy, **self.knobs)  # names the router and its valid knobs
        return self

    @property
    def knobs(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def _drop_default_deployment(spec, data):
    """One engine writes the spec it wrote before deployments existed (run.json, spec.yaml): results
    of the same spec stay the same spec, and --resume keeps them. Replicas of their own are
    written back in the list form they were given in."""
    if isinstance(data, dict):
        if spec.replicas == 1:
            data.pop("replicas", None)
        if spec.router is None:
            data.pop("router", None)
        own = data.pop("replica_specs", None)
        if own is not None:
            data["replicas"] = own
    return data


class ReplicaSpec(_Model):
    """One replica of a deployment whose replicas differ (``replicas: [{pool_tokens: ...}, ...]``):
    the engine's fields it sets for itself; the rest are the engine's."""

    pool_tokens: Optional[int] = Field(None, gt=0, description="This replica's KV pool in tokens.")
    max_num_batched_tokens: Optional[int] = Field(None, ge=1, description="This replica's token budget per step.")
    max_num_seqs: Optional[int] = Field(None, ge=1, description="This replica's most running requests.")

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}

    def fields(self) -> dict[str, Any]:
        return self.model_dump()


class SimEngineSpec(_Model):
    kind: Literal["sim"] = "sim"
    flavor: Literal["vllm", "sglang"] = Field(
        "vllm", description="Which engine the simulator models: vLLM v1 (block pool) or SGLang (radix cache).")
    sglang: SGLangOptionsSpec = Field(default_factory=SGLangOptionsSpec,
                                      description="SGLang's own knobs (flavor sglang only).")
    pool_tokens: int = Field(400_000, gt=0, description="KV pool C in tokens (num_gpu_blocks x block_size).")
    block_size: int = Field(16, gt=0, description="Tokens per KV block (16 on GPUs, 128 on CPU vLLM).")
    max_num_batched_tokens: int = Field(8192, gt=0, description="Token budget of one engine step.")
    max_num_seqs: int = Field(1024, gt=0, description="Most requests running at once.")
    max_model_len: int = Field(40960, gt=0, description="Longest prompt + output a request may have.")
    enable_prefix_caching: bool = Field(True, description="Automatic prefix caching on/off (off is the control).")
    reserve_full_prompt: bool = Field(
        True, description="Admit a waiting request only if its whole prompt fits (vLLM 0.33); "
                          "false: hit + first chunk (vLLM 0.11).")
    cost_model: Union[str, dict] = Field(
        DEFAULT_PRESET["vllm"],
        description="Step-cost model: a preset name, a path to a cost.json, or the constants inline; default: "
                    "qwen3-8b-mi300x, sglang-qwen3-8b-mi300x for flavor sglang.")
    offload: Optional[OffloadSpec] = Field(
        None, description="A CPU KV offload tier (flavor vllm), e.g. {cpu_tokens: 900000}; default: none.")
    # added with deployments (docs/deployments.md)
    replicas: int = Field(1, ge=1, description="Engines of this kind behind a router (a deployment); each has "
                                               "the whole pool, cost model and flavour above. A list of "
                                               "replicas, e.g. [{pool_tokens: 400000}, {pool_tokens: 200000}], "
                                               "gives each the fields it sets (pool_tokens, "
                                               "max_num_batched_tokens, max_num_seqs).")
    replica_specs: Optional[list[ReplicaSpec]] = Field(None, description="Set by the list form of replicas.")
    router: Optional[RouterSpec] = Field(None, description="The router in front of the replicas (replicas > 1), "
                                                           "e.g. {policy: cache_aware, cache_threshold: 0.5}.")

    @model_serializer(mode="wrap")
    def _without_default_deployment(self, handler):
        return _drop_default_deployment(self, handler(self))

    @model_validator(mode="before")
    @classmethod
    def _replica_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("replicas"), list):
            if "replica_specs" in data:
                raise ValueError("replicas: give the list of replicas once (replicas: [...])")
            own = data["replicas"]
            data = {**data, "replicas": len(own), "replica_specs": own}
            if not own:
                raise ValueError("replicas: an empty list; give at least one replica")
            allowed = set(ReplicaSpec.model_fields)
            for i, entry in enumerate(own):
                if not isinstance(entry, dict):
                    raise ValueError(f"replicas[{i}]: expected a mapping of the fields this replica sets "
                                     f"({sorted(allowed)}), got {entry!r}")
                unknown = sorted(set(entry) - allowed)
                if unknown:
                    raise ValueError(f"replicas[{i}]: unknown field(s) {unknown}; a replica may set {sorted(allowed)}")
        return data

    def replica_engines(self) -> list["SimEngineSpec"]:
        """Each replica's engine: this one, with the fields a replica of its own sets."""
        one = {"replicas": 1, "router": None, "replica_specs": None}
        if self.replica_specs is None:
            return [self.model_copy(update=one)] * self.replicas
        return [self.model_copy(update={**one, **r.fields()}) for r in self.replica_specs]

    @model_validator(mode="before")
    @classmethod
    def _flavour_cost_model(cls, data: Any) -> Any:
        # the sglang flavour's default preset is SGLang's (vLLM's constants, the overlap's share);
        # written into the resolved spec, so a rerun of it keeps it
        if isinstance(data, dict) and data.get("flavor") == "sglang" and "cost_model" not in data:
            data = {**data, "cost_model": DEFAULT_PRESET["sglang"]}
        return data

    @field_validator("cost_model")
    @classmethod
    def _check_cost(cls, value: Union[str, dict]) -> Union[str, dict]:
        if isinstance(value, dict):
            StepCostModel.from_json(value)
        elif value not in PRESETS and not value.endswith(".json"):
            raise ValueError(f"unknown cost-model preset {value!r}; valid presets: {sorted(PRESETS)} "
                             "(or a path to a cost.json)")
        return value

    @model_validator(mode="after")
    def _check_pool(self) -> "SimEngineSpec":
        if self.pool_tokens % self.block_size:
            raise ValueError(f"pool_tokens ({self.pool_tokens}) must be a multiple of block_size ({self.block_size})")
        if self.flavor == "sglang" and not self.enable_prefix_caching:
            raise ValueError("flavor sglang models the radix cache: enable_prefix_caching false (SGLang's "
                             "--disable-radix-cache) is not modelled")
        # A resolved spec (DIR/spec.yaml, run.json) writes the default block out; only settings count.
        if self.flavor != "sglang" and self.sglang != SGLangOptionsSpec():
            raise ValueError("engine.sglang applies to flavor sglang only")
        if self.replicas > 1 and self.router is None:
            raise ValueError(f"router: {self.replicas} replicas need a router, e.g. router: {{policy: round_robin}}; "
                             f"valid routers: {list(ROUTERS)}")
        if self.replicas == 1 and self.router is not None:
            raise ValueError("router: a router needs replicas > 1 (one engine has nothing to route between)")
        if self.replica_specs is not None:
            if len(self.replica_specs) != self.replicas:
                raise ValueError(f"replicas: {self.replicas} replicas but {len(self.replica_specs)} in the list")
            for i, r in enumerate(self.replica_specs):
                if r.pool_tokens is not None and r.pool_tokens % self.block_size:
                    raise ValueError(f"replicas[{i}].pool_tokens ({r.pool_tokens}) must be a multiple of block_size "
                                     f"({self.block_size})")
        if self.offload is not None:
            if self.flavor != "vllm":
                raise ValueError("offload: the CPU offload tier models vLLM's OffloadingConnector (flavor vllm)")
            if not self.enable_prefix_caching:
                raise ValueError("offload: the CPU tier finds blocks by their prefix-cache hashes: it needs "
                                 "enable_prefix_caching true")
            if self.offload.cpu_tokens < self.block_size:
                raise ValueError(f"offload: cpu_tokens ({self.offload.cpu_tokens}) holds no whole block of "
                                 f"block_size {self.block_size}")
        return self

    def offload_config(self) -> Optional[OffloadConfig]:
        """The engine's host tier: cpu_tokens // block_size blocks (vLLM rounds bytes down to blocks)."""
        o = self.offload
        if o is None:
            return None
        return OffloadConfig(o.cpu_tokens // self.block_size, o.effective_bandwidth_bytes_per_s(self.block_size),
                             o.latency_s, o.kv_bytes_per_token, shared_link=o.link == "shared")

    def load_cost_model(self, base_dir: Optional[Path] = None) -> StepCostModel:
        if isinstance(self.cost_model, dict):
            return StepCostModel.from_json(self.cost_model)
        if self.cost_model in PRESETS:
            return PRESETS[self.cost_model]
        path = Path(self.cost_model)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return StepCostModel.from_file(path)


class RetrySpec(_Model):
    max_attempts: int = Field(3, ge=1, description="Tries per turn (first try included).")
    backoff_s: float = Field(1.0, ge=0, description="Wait before the 2nd try; doubles after each failure.")


API_DESCRIPTION = ("completions: /v1/completions with token-id prompts; chat: /v1/chat/completions with a "
                   "message list per session, built to exact token lengths (docs/chat.md).")


class ViaGatewaySpec(_Model):
    """``engine.gateway``: every turn goes through a ``loadgen gateway`` proxy the run starts in front of
    the engine (docs/gateway.md#in-experiments); the limit is enforced there, not in the load generator."""

    controller: Optional[dict[str, Any]] = Field(None, description=(
        "The proxy's limit ({name, params, start_s} as the experiment's controller, checked with it); default: "
        "each arm's controller, moved into the proxy (the load generator then runs uncontrolled)."))
    max_park_s: Optional[float] = Field(None, gt=0, description="The proxy's maximum park time (run seconds).")
    on_max_park: Literal["admit", "reject"] = Field("admit", description="At the maximum park time: admit or 429.")
    idle_timeout_s: float = Field(300.0, gt=0, description="A session without a request this long has ended.")


class OpenAIEngineSpec(_Model):
    """A real server: vLLM, SGLang or any OpenAI-compatible endpoint."""

    kind: Literal["openai"] = "openai"
    url: str = Field(..., description="Base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted and dropped).")
    model: Optional[str] = Field(None, description="Served model name; default: the first one /v1/models lists.")
    api_key_env: Optional[str] = Field(None, description="Name of the environment variable holding the API key.")
    pool_tokens: Optional[int] = Field(None, gt=0, description="KV pool C; default: read from the server's /metrics.")
    simulated_pool_tokens: Optional[int] = Field(None, gt=0, description=(
        "The KV pool of the simulated engine the spec was written for (loadgen run --endpoint sets it from the "
        "spec's engine.pool_tokens): used when the server reports no pool; a server that reports another pool "
        "is refused before any load (give pool_tokens, or --pool-tokens, to choose)."))
    prompt_mode: Literal["auto", "token_ids", "text"] = Field(
        "auto", description="Send token-id prompts; 'auto' falls back to text if the server refuses ids.")
    server: Literal["auto", "vllm", "sglang"] = Field("auto", description="Which flush API and metric names.")
    request_timeout_s: float = Field(600.0, gt=0, description="Give up on one request after this long.")
    retry: RetrySpec = Field(default_factory=RetrySpec, description="Per-turn retry policy.")
    engine_gone_after_s: float = Field(
        60.0, gt=0, description="End the run (status engine_lost) when every request failed for this long.")
    max_connections: int = Field(4096, gt=0, description="Connection pool size.")
    flush_before_run: bool = Field(True, description=(
        "Reset the prefix cache before each run (a fresh engine); a failed reset stops the run "
        "(vLLM needs VLLM_SERVER_DEV_MODE=1). false: run on whatever the server has cached."))
    api: Literal["completions", "chat"] = Field("completions", description=API_DESCRIPTION)
    tokenizer: Optional[str] = Field(None, description=(
        "A tokenizer.json or a model directory holding one (and its chat template): counts the text prompts of "
        "api chat and of the completions text fallback; default: the server's /tokenize. A relative path is "
        "relative to the spec's directory."))
    session_header: Optional[str] = Field(None, description=(
        "An HTTP header carrying each session's id (RUN_ID/SESSION_ID, the same on every turn), e.g. "
        "X-Session-ID, so a router (llm-d, SGLang router, Dynamo) keeps a session on one replica."))
    replica_header: Optional[str] = Field(None, description=(
        "A response header the router sets naming the replica that served a request (serve-sim --replicas: "
        "X-Loadgen-Replica): recorded per turn in turns.parquet replica (docs/deployments.md#serve-sim-deployments)."))
    gateway: Optional[ViaGatewaySpec] = Field(None, description=(
        "Put a loadgen gateway between the load generator and this engine (loadgen run --via-gateway): the "
        "run's limit is enforced by the proxy (docs/gateway.md#in-experiments)."))
    metrics_urls: Optional[list[str]] = Field(None, description=(
        "The base URLs of the replicas behind url (a router): /metrics is scraped from each and summed into "
        "samples.parquet (each replica's in replica_samples.parquet), their pools summed into C, and "
        "prefix-cache resets sent to each."))

    @field_validator("url", mode="before")
    @classmethod
    def _base_url(cls, value: Any) -> Any:
        return normalize_endpoint_url(value) if isinstance(value, str) else value

    @field_validator("session_header", "replica_header")
    @classmethod
    def _header_name(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and not _HTTP_TOKEN.fullmatch(value):
            raise ValueError(f"{value!r} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, "
                             "e.g. X-Session-ID)")
        return value

    @field_validator("metrics_urls", mode="before")
    @classmethod
    def _replica_urls(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        if not value:
            raise ValueError("an empty list: give the replicas' base URLs, or leave metrics_urls out")
        urls = []
        for i, url in enumerate(value):
            if not isinstance(url, str):
                raise ValueError(f"[{i}]: expected a URL string, got {url!r}")
            try:  # a replica's /metrics URL is accepted for its base URL, as a /v1 suffix is
                urls.append(normalize_endpoint_url(url.strip().rstrip("/").removesuffix("/metrics")))
            except ValueError as exc:
                raise ValueError(f"[{i}]: {exc}") from None
        if len(set(urls)) < len(urls):
            raise ValueError(f"a replica is listed twice: {urls}")
        return urls

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        return _tokenizer_path(value, info)


def _tokenizer_path(value: Optional[str], info: ValidationInfo) -> Optional[str]:
    """A spec's tokenizer (a tokenizer.json or a model directory holding one), made absolute:
    a relative path is relative to the spec's directory."""
    if value is None:
        return None
    path = Path(value).expanduser()
    base_dir = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not (path.is_file() or (path / "tokenizer.json").is_file()):
        raise ValueError(f"no tokenizer.json at {path} (expected a tokenizer.json file or a model directory "
                         "holding one)")
    return str(path.resolve())


# an HTTP header name (RFC 9110 token)
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def normalize_endpoint_url(url: str) -> str:
    """The server's base URL, ``http(s)://HOST[:PORT][/PREFIX]``, without a trailing slash.

    A trailing ``/v1`` is accepted and dropped: OpenAI clients are configured with it, and the
    client adds ``/v1/completions`` itself (keeping it would request ``/v1/v1/completions``).
    ValueError says what was wrong and what is expected.
    """
    text = url.strip()
    if "://" not in text:
        raise ValueError(f"{url!r} has no scheme: expected a URL like http://{text or '127.0.0.1:8000'}")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{url!r}: expected an http:// or https:// URL, got scheme {parts.scheme!r}")
    try:
        parts.port  # noqa: B018 (parses the port: urlsplit alone accepts http://host:99999)
    except ValueError:
        raise ValueError(f"{url!r}: the port is not a number from 0 to 65535") from None
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host: expected e.g. http://127.0.0.1:8000")
    if parts.query or parts.fragment:
        raise ValueError(f"{url!r}: expected a base URL without ?query or #fragment")
    path = parts.path.rstrip("/").removesuffix("/v1")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class LaunchedEngineSpec(_Model):
    """A server ``loadgen sweep`` launches itself, a fresh one per run, each on its own GPU(s) of a
    Ray cluster (actors/engine.py): vLLM, SGLang, or serve-sim (the simulated engine behind
    vLLM's API, so the whole path runs on a laptop). The flags loadgen needs (prefix caching,
    cached-token reports, metrics, host, port, served name) are added; ``flags`` are appended."""

    kind: Literal["vllm", "sglang", "serve_sim"]
    model: str = Field("sim", description="Model to serve: a path or hub name (vllm, sglang); serve_sim: its name.")
    served_model_name: Optional[str] = Field(None, description="Name the server answers to; default: model.")
    flags: list[str] = Field(default_factory=list,
                             description="Extra server flags, verbatim, e.g. [--max-model-len, '40960'].")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the server.")
    python: Optional[str] = Field(
        None, description="Interpreter that has vLLM/SGLang on the GPU nodes; default: the Ray worker's.")
    num_gpus: int = Field(1, ge=0, description="GPUs each engine reserves (0: serve_sim on a machine without GPUs).")
    startup_timeout_s: float = Field(1800.0, gt=0, description="Fail the run if the server is not healthy by then.")
    simulator: SimEngineSpec = Field(default_factory=SimEngineSpec,
                                     description="serve_sim only: the simulated engine it serves.")
    pool_tokens: Optional[int] = Field(None, gt=0, description="KV pool C; default: read from the server's /metrics.")
    request_timeout_s: float = Field(600.0, gt=0, description="Give up on one request after this long.")
    retry: RetrySpec = Field(default_factory=RetrySpec, description="Per-turn retry policy.")
    flush_before_run: bool = Field(True, description="Reset the prefix cache before each run (after warm-up probes).")
    api: Literal["completions", "chat"] = Field("completions", description=API_DESCRIPTION)
    gateway: Optional[ViaGatewaySpec] = Field(None, description=(
        "Put a loadgen gateway in front of each launched engine (in its controller actor, on its node): the "
        "run's limit is enforced by the proxy (docs/gateway.md#in-experiments)."))
    tokenizer: Optional[str] = Field(None, description=(
        "A tokenizer.json or a model directory holding one (and its chat template), readable on every node: "
        "counts the text prompts of api chat; default: the server's /tokenize. serve_sim serves with it too. "
        "A relative path is relative to the spec's directory."))

    # added with sweeps of deployments (docs/deployments.md#sweeps-of-deployments)
    replicas: int = Field(1, ge=1, description=(
        "Engines per run, each its own server on its own num_gpus, behind a loadgen gateway that routes each "
        "session to one of them (needs router or gateway)."))
    router: Optional[RouterSpec] = Field(None, description=(
        "How the gateway in front of the replicas routes (replicas > 1), e.g. {policy: consistent_hash}; the "
        "gateway routes by the policies it knows and says in run.json when it fell back to sticky-hash."))

    @model_serializer(mode="wrap")
    def _without_default_deployment(self, handler):
        return _drop_default_deployment(self, handler(self))

    @field_validator("simulator")
    @classmethod
    def _one_engine(cls, value: SimEngineSpec) -> SimEngineSpec:
        # each launched serve-sim is one engine; several are engine.replicas
        if value.replicas > 1:
            raise ValueError("replicas: a launched serve-sim serves one simulated engine; for N of them per run "
                             "give engine.replicas: N with engine.router (docs/deployments.md#sweeps-of-deployments)")
        return value

    @model_validator(mode="after")
    def _deployment(self) -> "LaunchedEngineSpec":
        if self.replicas > 1 and self.router is None and self.gateway is None:
            raise ValueError(f"router: {self.replicas} replicas need a router in front, e.g. router: {{policy: "
                             f"consistent_hash}} (valid routers: {list(ROUTERS)}), or engine.gateway")
        if self.replicas == 1 and self.router is not None:
            raise ValueError("router: a router needs replicas > 1 (one engine has nothing to route between)")
        if self.router is not None and make_router(self.router.policy, **self.router.knobs).reads_kv_events:
            raise ValueError(f"router: {self.router.policy} reads the engines' KV events, which the gateway in front "
                             f"of launched engines does not receive; set router.use_kv_events: false (its "
                             f"approximate mode, Dynamo's --no-kv-events)")
        return self

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        return _tokenizer_path(value, info)

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


EngineSpec = Annotated[Union[SimEngineSpec, OpenAIEngineSpec, LaunchedEngineSpec], Field(discriminator="kind")]


def prefix_cache_block_size(engine) -> Optional[int]:
    """The tokens per cache block that hits come in (the ideal hit ratio rounds to them,
    loadgen/analysis/ideal.py): the simulated engine's block size (vLLM) or page size (SGLang),
    a launched server's --block-size / --page-size flag or its default (vLLM 16, SGLang 1); None
    for an endpoint (kind openai), whose preflight reads it from the server."""
    kind = getattr(engine, "kind", None)
    if kind == "serve_sim":
        engine = engine.simulator
        kind = "sim"
    if kind == "sim":
        return engine.sglang.page_size if engine.flavor == "sglang" else engine.block_size
    if kind in ("vllm", "sglang"):
        flag, default = ("--block-size", 16) if kind == "vllm" else ("--page-size", 1)
        flags = list(engine.flags)
        for i, value in enumerate(flags):
            if value == flag and i + 1 < len(flags) and flags[i + 1].isdigit():
                return int(flags[i + 1])
            if value.startswith(flag + "=") and value.split("=", 1)[1].isdigit():
                return int(value.split("=", 1)[1])
        return default
    return None
