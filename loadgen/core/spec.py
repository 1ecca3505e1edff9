"""Typed, validated experiment specs. The CLI is a thin layer over these models.

Times are seconds (``*_s``); every ``*_s`` field also accepts ``*_min`` (minutes) in YAML, as
docs/experiments.md writes them ("5 min at minute 15"). Unknown fields are errors.
"""

from __future__ import annotations

import functools
import re
import typing
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from controllers import POLICIES, make_policy
from trace_shapes import (EmpiricalGaps, ExponentialGaps, GapFallback, GeneratedReplay, LoadedTrace, LoaderOptions,
                          ReplayOptions, TraceLabLikeSessions, TraceReplay, build_replay, load_hf, load_swebench,
                          load_trace, select_models)

from ..sim.cost import PRESETS, StepCostModel
from ..sim.offload import (DEFAULT_BANDWIDTH_BYTES_PER_S, DEFAULT_KV_BYTES_PER_TOKEN, DEFAULT_LATENCY_S,
                           OffloadConfig)


class SpecError(ValueError):
    """A spec that cannot run; the message names the file, field and what was expected."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _minutes_to_seconds(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key in list(data):
            if isinstance(key, str) and key.endswith("_min"):
                target = key[:-4] + "_s"
                if target in cls.model_fields:
                    if target in data:
                        raise ValueError(f"give either {key} or {target}, not both")
                    value = out.pop(key)
                    if isinstance(value, bool):  # True * 60 would silently be one minute
                        raise ValueError(f"{key}: expected a number of minutes, got {str(value).lower()}")
                    out[target] = value * 60 if isinstance(value, (int, float)) else value
        return out

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        # pydantic's lax mode reads true as 1: `duration_s: true` would run a 1-second experiment
        if isinstance(data, dict):
            for key, value in data.items():
                field = cls.model_fields.get(key)
                if isinstance(value, bool) and field is not None and _is_number(field.annotation):
                    raise ValueError(f"{key}: expected a number, got {str(value).lower()}")
        return data


def _is_number(annotation: Any) -> bool:
    """int, float, or Optional of one of them."""
    if annotation in (int, float):
        return True
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return typing.get_origin(annotation) is Union and bool(args) and all(a in (int, float) for a in args)


# ---------------------------------------------------------------- engine
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


class OffloadSpec(_Model):
    """A CPU KV tier behind the GPU pool, as vLLM's native offloading (``--kv-offloading-size``,
    OffloadingConnector with the CPU backend): docs/engine-model.md#cpu-kv-offload-tier."""

    cpu_tokens: int = Field(..., gt=0, description="Host tier size in tokens (cpu_bytes_to_use / KV bytes per token); "
                                                   "900000 is ~124 GiB for Qwen3-8B at 144 KiB/token.")
    bandwidth_bytes_per_s: float = Field(
        DEFAULT_BANDWIDTH_BYTES_PER_S, gt=0,
        description="Host<->GPU copy bandwidth (default 50 GB/s: PCIe 5.0 x16, 64 GB/s raw per direction).")
    latency_s: float = Field(DEFAULT_LATENCY_S, ge=0, description="Fixed cost of one copy job (launch and poll).")
    kv_bytes_per_token: int = Field(DEFAULT_KV_BYTES_PER_TOKEN, gt=0,
                                    description="KV bytes of one token (default Qwen3-8B BF16: 147456 = 144 KiB).")


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
        "qwen3-8b-mi300x",
        description="Step-cost model: a preset name, a path to a cost.json, or the constants inline.")
    offload: Optional[OffloadSpec] = Field(
        None, description="A CPU KV offload tier (flavor vllm), e.g. {cpu_tokens: 900000}; default: none.")

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
        return OffloadConfig(o.cpu_tokens // self.block_size, o.bandwidth_bytes_per_s, o.latency_s,
                             o.kv_bytes_per_token)

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


class OpenAIEngineSpec(_Model):
    """A real server: vLLM, SGLang or any OpenAI-compatible endpoint."""

    kind: Literal["openai"] = "openai"
    url: str = Field(..., description="Base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted and dropped).")
    model: Optional[str] = Field(None, description="Served model name; default: the first one /v1/models lists.")
    api_key_env: Optional[str] = Field(None, description="Name of the environment variable holding the API key.")
    pool_tokens: Optional[int] = Field(None, gt=0, description="KV pool C; default: read from the server's /metrics.")
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
    api: Literal["completions", "chat"] = Field(
        "completions", description=(
            "completions: /v1/completions with token-id prompts; chat: /v1/chat/completions with a message list "
            "per session, built to exact token lengths (docs/chat.md)."))
    tokenizer: Optional[str] = Field(None, description=(
        "A tokenizer.json or a model directory holding one (and its chat template): counts the text prompts of "
        "api chat and of the completions text fallback; default: the server's /tokenize. A relative path is "
        "relative to the spec's directory."))
    session_header: Optional[str] = Field(None, description=(
        "An HTTP header carrying each session's id (RUN_ID/SESSION_ID, the same on every turn), e.g. "
        "X-Session-ID, so a router (llm-d, SGLang router, Dynamo) keeps a session on one replica."))
    metrics_urls: Optional[list[str]] = Field(None, description=(
        "The base URLs of the replicas behind url (a router): /metrics is scraped from each and summed into "
        "samples.parquet (each replica's in replica_samples.parquet), their pools summed into C, and "
        "prefix-cache resets sent to each."))

    @field_validator("url", mode="before")
    @classmethod
    def _base_url(cls, value: Any) -> Any:
        return normalize_endpoint_url(value) if isinstance(value, str) else value

    @field_validator("session_header")
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

    @property
    def name(self) -> str:
        return self.served_model_name or self.model


EngineSpec = Annotated[Union[SimEngineSpec, OpenAIEngineSpec, LaunchedEngineSpec], Field(discriminator="kind")]


# ---------------------------------------------------------------- sessions
class SyntheticSessionSpec(_Model):
    kind: Literal["synthetic"] = "synthetic"
    system_prompt_tokens: int = Field(2000, ge=0, description="Shared system prompt, identical in every session.")
    task_tokens: int = Field(4000, ge=1, description="Task text unique to the session.")
    num_turns: int = Field(25, ge=1, description="Turns per session.")
    output_tokens: int = Field(300, ge=1, description="Output tokens per turn (EOS ignored).")
    tool_tokens: int = Field(1000, ge=0, description="Tool-output tokens appended after each turn.")
    think_time_mean_s: float = Field(5.0, ge=0, description="Mean of the exponential think/tool time.")
    label: str = Field("synthetic", description="Session kind recorded per turn.")

    def max_context_tokens(self) -> int:
        n = self.num_turns
        return (self.system_prompt_tokens + self.task_tokens
                + n * self.output_tokens + (n - 1) * self.tool_tokens)


class EmpiricalGapSpec(_Model):
    kind: Literal["empirical"] = "empirical"  # draw from every gap the trace records (all its rows)


class ExponentialGapSpec(_Model):
    kind: Literal["exponential"] = "exponential"
    mean_s: float = Field(..., gt=0, description="Mean of the exponential gap.")


GapFallbackSpec = Annotated[Union[EmpiricalGapSpec, ExponentialGapSpec], Field(discriminator="kind")]


class _ReplaySessionSpec(_Model):
    """Fields every replayed-trace session kind shares (trace_shapes/replay.py has the treatments)."""

    models: Optional[tuple[str, ...]] = Field(
        None, description="Replay only sessions of these models (exact names, see `loadgen shapes describe`); "
                          "default: all.")
    truncate_at_tokens: int = Field(
        38_000, gt=0, description="Engine limit: a session stops before the first call whose prompt + output "
                                  "would exceed this (38K of a 40K engine in the reference runs).")
    sampling: Literal["without_replacement", "with_replacement"] = Field(
        "without_replacement", description="without_replacement: one seeded permutation of the sessions after "
                                           "another (none repeats until all are used); with_replacement: "
                                           "independent uniform draws.")
    gap_fallback: GapFallbackSpec = Field(
        default_factory=EmpiricalGapSpec,
        description="Gaps for calls whose gap the trace does not record: {kind: empirical} draws from the "
                    "gaps recorded in the same trace; {kind: exponential, mean_s: ...} names a distribution.")

    def max_context_tokens(self) -> int:
        return self.truncate_at_tokens

    def build_replay(self, trace: LoadedTrace) -> TraceReplay:
        try:
            select_models(trace.sessions, self.models)
        except ValueError as exc:
            raise ValueError(f"models: {exc}") from None
        options = ReplayOptions(self.truncate_at_tokens, self.system_prompt_tokens, self.label)
        return build_replay(trace.sessions, options, self._gap_fallback(trace), self.models,
                            self.sampling == "with_replacement")

    def _gap_fallback(self, trace: LoadedTrace) -> Optional[GapFallback]:
        if isinstance(self.gap_fallback, ExponentialGapSpec):
            return ExponentialGaps(self.gap_fallback.mean_s)
        recorded = trace.recorded_gaps_s()
        if recorded:
            return EmpiricalGaps(tuple(recorded))
        if any(g is None for s in trace.sessions for g in s.gaps_s):
            raise ValueError("gap_fallback: the trace records no gaps to draw from; name a distribution, "
                             "e.g. {kind: exponential, mean_s: 0.3}")
        return None

    @model_validator(mode="after")
    def _replayable(self) -> "_ReplaySessionSpec":
        build_session_model(self)  # a trace that cannot be replayed fails at spec load
        return self


class SwebenchSessionSpec(_ReplaySessionSpec):
    """The shipped SWE-bench agent shapes (trace_shapes/data/README.md)."""

    kind: Literal["swebench"] = "swebench"
    system_prompt_tokens: int = Field(
        150, ge=0, description="Tokens of every session's initial context shared by all sessions: mini-swe-agent's "
                               "SWE-bench system template (~150 tokens); its ~1.2K-token instructions come after "
                               "the task text, so in prefix-cache terms they are unique to the session.")
    label: str = Field("swebench", description="Session kind recorded per turn.")


class TraceFileSessionSpec(_ReplaySessionSpec):
    """A user's own trace file."""

    kind: Literal["trace_file"] = "trace_file"
    path: str = Field(..., description="Local JSONL, gzip JSONL (.gz) or Parquet (.parquet) file; a relative path "
                                       "is relative to the spec's directory.")
    format: Literal["shapes", "tracelab", "copilot", "bailian", "mooncake", "aiperf", "calls"] = Field(
        ..., description="shapes: one session a row, calls [[prompt, completion, gap_s], ...]; tracelab: one "
                         "round a row; copilot: GitHub Copilot coding-agent sessions; bailian: Qwen Bailian "
                         "requests chained by parent_chat_id; mooncake: requests with 512-token block hashes; "
                         "aiperf: AIPerf multi-turn inputs; calls: one call a row, generic "
                         "(trace_shapes/loaders.py).")
    system_prompt_tokens: int = Field(
        0, ge=0, description="Tokens of every session's initial context shared by all sessions (the system "
                             "prompt), for sessions whose trace does not record what they share (mooncake and "
                             "aiperf do); 0 shares nothing across sessions.")
    label: str = Field("trace", description="Session kind recorded per turn.")
    tokenizer: Optional[str] = Field(
        None, description="aiperf: a local tokenizer.json (or a directory with one) to count the tokens of text "
                          "turns; a relative path is relative to the spec's directory.")
    default_output_tokens: Optional[int] = Field(
        None, gt=0, description="aiperf: output tokens of a turn without output_length (AIPerf's --osl).")
    block_tokens: int = Field(512, gt=0, description="mooncake: tokens per hash_ids block (512 in Mooncake's traces).")

    def loader_options(self) -> LoaderOptions:
        return LoaderOptions(self.tokenizer, self.default_output_tokens, self.block_tokens)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, value: Optional[str], info: ValidationInfo) -> Optional[str]:
        if value is None:
            return None
        path = _resolve(value, info)
        if not path.exists():
            raise ValueError(f"no such file or directory: {path}")
        return str(path.resolve())

    @field_validator("path")
    @classmethod
    def _exists(cls, value: str, info: ValidationInfo) -> str:
        path = _resolve(value, info)
        if not path.is_file():
            raise ValueError(f"no such file: {path}")
        return str(path.resolve())


def _resolve(value: str, info: ValidationInfo) -> Path:
    """A path of the spec: a relative one is relative to the spec's directory."""
    path = Path(value).expanduser()
    base_dir = (info.context or {}).get("base_dir")
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path


class HFSourceSpec(_Model):
    """A Hugging Face dataset, read offline (trace_shapes/hf.py)."""

    hf: str = Field(..., description="A local dataset directory (save_to_disk, or data files) or a Hub name "
                                     "ORG/NAME already in the local datasets cache; nothing is downloaded.")
    split: str = Field("train", description="The split to read.")
    config: Optional[str] = Field(None, description="The dataset's configuration name, if it has several.")
    columns: tuple[tuple[str, str], ...] = Field(
        (), description="{field: column}: the format's field names for the dataset's columns (a field whose "
                        "column has its name needs no entry).")

    @field_validator("hf")
    @classmethod
    def _local_or_name(cls, value: str, info: ValidationInfo) -> str:
        path = _resolve(value, info)
        return str(path.resolve()) if path.exists() else value

    @field_validator("columns", mode="before")
    @classmethod
    def _mapping(cls, value: Any) -> Any:
        # written as a mapping; kept as sorted pairs so that the spec stays hashable (cached replays)
        if isinstance(value, dict):
            return tuple(sorted((str(k), str(v)) for k, v in value.items()))
        return value


class HFDatasetSessionSpec(TraceFileSessionSpec):
    """Sessions from a Hugging Face dataset through the same formats as trace files."""

    kind: Literal["hf_dataset"] = "hf_dataset"  # type: ignore[assignment]
    path: None = Field(None, description="Not used: the dataset is named by source.")  # type: ignore[assignment]
    source: HFSourceSpec = Field(..., description="{hf: ORG/NAME or a local path, split, config, columns}.")
    format: Literal["shapes", "tracelab", "copilot", "bailian", "mooncake", "aiperf", "calls"] = Field(
        "calls", description="The rows' format after the column renames; calls (default): one call a row with "
                             "session_id, input_tokens or new_input_tokens, output_tokens, optional turn_index, "
                             "gap_s, timestamp_s, model.")
    label: str = Field("hf", description="Session kind recorded per turn.")

    @field_validator("path")
    @classmethod
    def _exists(cls, value: None, info: ValidationInfo) -> None:
        return value


class TraceLabSyntheticSessionSpec(_Model):
    """TraceLab-like sessions generated from its published statistics (trace_shapes/tracelab.py)."""

    kind: Literal["tracelab_synthetic"] = "tracelab_synthetic"
    initial_context_median_tokens: float = Field(19_000, gt=0, description="Median starting context (published).")
    num_calls_median: float = Field(50, gt=0, description="Median calls per session (lognormal; mean ~1.65x).")
    output_median_tokens: float = Field(250, gt=0, description="Median output tokens per call.")
    appended_median_tokens: float = Field(
        700, gt=0, description="Median tokens appended per call beyond the output (tool results).")
    gap_median_s: float = Field(0.15, gt=0, description="Median gap between calls (lognormal, heavy tail).")
    truncate_at_tokens: int = Field(
        38_000, gt=0, description="Engine limit: a session stops before the first call whose prompt + output "
                                  "would exceed this.")
    system_prompt_tokens: int = Field(
        0, ge=0, description="Tokens of every session's initial context shared by all sessions; TraceLab does "
                             "not publish it, 0 shares nothing across sessions.")
    label: str = Field("tracelab-synthetic", description="Session kind recorded per turn.")

    def max_context_tokens(self) -> int:
        return self.truncate_at_tokens


def build_session_model(spec: Union[SwebenchSessionSpec, TraceFileSessionSpec, TraceLabSyntheticSessionSpec]
                        ) -> Union[TraceReplay, GeneratedReplay]:
    """The trace_shapes model behind a replayed-session spec (cached: each file is read once)."""
    if isinstance(spec, TraceLabSyntheticSessionSpec):
        source = TraceLabLikeSessions(
            initial_context_median_tokens=spec.initial_context_median_tokens,
            num_calls_median=spec.num_calls_median, output_median_tokens=spec.output_median_tokens,
            appended_median_tokens=spec.appended_median_tokens, gap_median_s=spec.gap_median_s)
        return GeneratedReplay(source, ReplayOptions(spec.truncate_at_tokens, spec.system_prompt_tokens, spec.label))
    return _cached_replay(spec)


@functools.lru_cache(maxsize=16)
def _cached_replay(spec: Union[SwebenchSessionSpec, TraceFileSessionSpec]) -> TraceReplay:
    if isinstance(spec, SwebenchSessionSpec):
        return spec.build_replay(_cached_swebench())
    if isinstance(spec, HFDatasetSessionSpec):
        return spec.build_replay(_cached_hf(spec.source, spec.format, spec.loader_options()))
    stat = Path(spec.path).stat()
    return spec.build_replay(_cached_trace(spec.path, spec.format, stat.st_mtime_ns, stat.st_size,
                                           spec.loader_options()))


@functools.lru_cache(maxsize=1)
def _cached_swebench() -> LoadedTrace:
    return load_swebench()


@functools.lru_cache(maxsize=4)
def _cached_trace(path: str, format: str, mtime_ns: int, size: int, options: LoaderOptions) -> LoadedTrace:
    # mtime and size are part of the key so that an edited file is read again
    return load_trace(path, format, options)


@functools.lru_cache(maxsize=4)
def _cached_hf(source: "HFSourceSpec", format: str, options: LoaderOptions) -> LoadedTrace:
    return load_hf(source.hf, format, source.split, source.config, dict(source.columns), options)


SessionSpec = Annotated[
    Union[SyntheticSessionSpec, SwebenchSessionSpec, TraceFileSessionSpec, HFDatasetSessionSpec,
          TraceLabSyntheticSessionSpec],
    Field(discriminator="kind"),
]


class WorkloadSpec(_Model):
    arrival_rate_per_s: float = Field(..., gt=0, description="Base Poisson session arrival rate lambda (/s).")
    sessions: SessionSpec = Field(default_factory=SyntheticSessionSpec, description="Shape of base sessions.")


# ---------------------------------------------------------------- triggers
class BurstTrigger(_Model):
    kind: Literal["burst"] = "burst"
    extra_rate_factor: float = Field(..., gt=0, description="b: the extra stream's rate is b x lambda.")
    start_s: float = Field(..., ge=0, description="When the extra stream starts.")
    duration_s: float = Field(..., gt=0, description="How long it lasts.")
    seed_offset: int = Field(0, description="Changes the extra stream's seed without touching the base stream.")

    def window(self) -> tuple[float, float]:
        return self.start_s, self.start_s + self.duration_s


class ExtraSessionsTrigger(_Model):
    kind: Literal["extra_sessions"] = "extra_sessions"
    num_sessions: int = Field(..., gt=0, description="Extra sessions, evenly spread over the duration.")
    start_s: float = Field(..., ge=0)
    duration_s: float = Field(..., gt=0)
    seed_offset: int = 0

    def window(self) -> tuple[float, float]:
        return self.start_s, self.start_s + self.duration_s


class FlushTrigger(_Model):
    kind: Literal["flush"] = "flush"
    at_s: float = Field(..., ge=0, description="Reset the prefix cache, preempting running requests.")

    def window(self) -> tuple[float, float]:
        return self.at_s, self.at_s


class RateChangeTrigger(_Model):
    kind: Literal["rate_change"] = "rate_change"
    at_s: float = Field(..., ge=0)
    arrival_rate_per_s: float = Field(..., ge=0, description="The new base rate from at_s on.")

    def window(self) -> tuple[float, float]:
        return self.at_s, self.at_s


class MixShiftTrigger(_Model):
    kind: Literal["mix_shift"] = "mix_shift"
    at_s: float = Field(..., ge=0, description="Base sessions arriving from here on take the new shape.")
    sessions: SessionSpec = Field(..., description="The shape after the shift.")

    def window(self) -> tuple[float, float]:
        return self.at_s, self.at_s


Trigger = Annotated[
    Union[BurstTrigger, ExtraSessionsTrigger, FlushTrigger, RateChangeTrigger, MixShiftTrigger],
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- controllers, arms
class ControllerSpec(_Model):
    name: str = Field("none", description="Gateway limit: " + ", ".join(sorted(POLICIES)))
    params: dict[str, Any] = Field(default_factory=dict, description="Constants of the limit (documented defaults).")
    start_s: float = Field(0.0, ge=0, description="Control is switched on here; before it the gate is 'none'.")

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in POLICIES:
            raise ValueError(f"unknown controller {value!r}; valid controllers: {sorted(POLICIES)}")
        return value

    @model_validator(mode="after")
    def _params_make_a_policy(self) -> "ControllerSpec":
        make_policy(self.name, **self.params)  # names the controller and its valid params
        return self


class ArmSpec(_Model):
    name: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Arm name, used in run ids.")
    triggers: list[Trigger] = Field(default_factory=list)
    controller: Optional[ControllerSpec] = Field(None, description="Overrides the experiment's controller.")
    engine: Optional[dict[str, Any]] = Field(
        None, description="Fields of the experiment's simulated engine this arm changes, e.g. {flavor: sglang}: "
                          "arms of one seed then see the same sessions on different engines.")


class SLOSpec(_Model):
    """Service-level objectives the report measures goodput against (docs/results-format.md#slos-and-goodput).

    Each target is optional; a turn meets the SLO when it meets every per-turn target given,
    a task (session) when it finished within ``task_s`` and, at ``percentile`` over its own
    turns, meets every per-turn target."""

    ttft_s: Optional[float] = Field(None, gt=0, description="Time to first token, gateway wait included (s).")
    itl_s: Optional[float] = Field(None, gt=0, description="Mean inter-token latency of a turn (s).")
    turn_s: Optional[float] = Field(None, gt=0, description="End-to-end turn latency, gateway wait included (s).")
    task_s: Optional[float] = Field(None, gt=0, description="Task (session) arrival to completion; "
                                                            "`task_min: 30` gives it in minutes.")
    percentile: float = Field(90.0, gt=0, le=100, description="Percentile of a task's turns (and of a run's turns "
                                                              "for slo_met) held to the per-turn targets.")

    @model_validator(mode="after")
    def _some_target(self) -> "SLOSpec":
        if all(v is None for v in (self.ttft_s, self.itl_s, self.turn_s, self.task_s)):
            raise ValueError("an slo needs at least one of ttft_s, itl_s, turn_s, task_s (or task_min)")
        return self


class RecordingSpec(_Model):
    sample_interval_s: float = Field(10.0, gt=0, description="Run time between samples.")
    flush_interval_s: float = Field(600.0, gt=0, description="Run time between writes of buffered rows to disk.")


def parse_seeds(value: Union[str, int, list]) -> list[int]:
    """``[501, 502]``, ``501`` or ``"501-512"`` / ``"1,3,5-7"``: whole numbers >= 0.

    Anything else is a ValueError saying what was expected: a fractional seed (2.7) is not
    rounded and a boolean is not 1, because either would silently run another experiment.
    """
    if isinstance(value, list):
        return [_one_seed(v) for v in value]
    if not isinstance(value, str):
        return [_one_seed(value)]
    seeds: list[int] = []
    for part in value.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ValueError(f"seed range {part!r} runs backwards: expected LOW-HIGH with LOW <= HIGH, "
                                 f"e.g. {hi}-{lo}")
            seeds.extend(range(lo, hi + 1))
        elif re.fullmatch(r"\d+", part):
            seeds.append(int(part))
        elif re.fullmatch(r"-\d+", part):
            raise ValueError(f"seed {part} is negative: seeds are whole numbers >= 0")
        else:
            raise ValueError(f"cannot read seeds {value!r}: expected whole numbers >= 0, e.g. 501-512 or 1,2,3")
    return seeds


def _one_seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        shown = str(value).lower() if isinstance(value, bool) else repr(value)
        raise ValueError(f"seed {shown} is not a whole number: expected whole numbers >= 0, "
                         "e.g. [501, 502] or '501-512'")
    if value < 0:
        raise ValueError(f"seed {value} is negative: seeds are whole numbers >= 0")
    return value


class ExperimentSpec(_Model):
    experiment: str = Field(..., pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="Experiment name.")
    description: str = ""
    duration_s: float = Field(..., gt=0, description="Run length.")
    seeds: list[int] = Field(..., min_length=1, description="Each seed fixes one base arrival stream.")
    engine: EngineSpec = Field(default_factory=SimEngineSpec)
    workload: WorkloadSpec
    controller: ControllerSpec = Field(default_factory=ControllerSpec)
    arms: list[ArmSpec] = Field(..., min_length=1, description="Arms share base arrivals; differ in triggers/controller.")
    recording: RecordingSpec = Field(default_factory=RecordingSpec)
    slo: Optional[SLOSpec] = Field(None, description="Latency and task-time targets for goodput (report only).")
    time_scale: float = Field(
        1.0, gt=0, description="Live runs only: every workload time (arrivals, think times, triggers, run length) "
                               "is compressed this many times (use serve-sim at the same scale).")

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value: Any) -> list[int]:
        return parse_seeds(value)

    @model_validator(mode="after")
    def _check(self) -> "ExperimentSpec":
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"arm names must be unique, got {names}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds must be unique")
        for i, arm in enumerate(self.arms):
            for j, trig in enumerate(arm.triggers):
                start, end = trig.window()
                if end > self.duration_s:
                    raise ValueError(f"arms[{i}].triggers[{j}] ({trig.kind}) ends at {end:g} s, after the run "
                                     f"ends at duration_s={self.duration_s:g} s")
            ctl = self.controller_for(arm)
            if ctl.start_s > self.duration_s:
                raise ValueError(f"arms[{i}].controller.start_s={ctl.start_s:g} is after the run ends")
            if arm.engine is not None:
                if not isinstance(self.engine, SimEngineSpec):
                    raise ValueError(f"arms[{i}].engine: per-arm engine fields apply to the simulated engine "
                                     f"(kind sim), not kind {self.engine.kind!r}")
                if "kind" in arm.engine:
                    raise ValueError(f"arms[{i}].engine: an arm changes fields of the sim engine, not its kind")
                try:
                    self.engine_for(arm)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(x) for x in err["loc"])
                    raise ValueError(f"arms[{i}].engine.{where}: {err['msg']}") from None
        if isinstance(self.engine, SimEngineSpec):
            shapes = [self.workload.sessions] + [t.sessions for a in self.arms for t in a.triggers
                                                 if isinstance(t, MixShiftTrigger)]
            for shape in shapes:
                need = shape.max_context_tokens()
                if need > self.engine.max_model_len:
                    raise ValueError(f"sessions reach {need} tokens of context, more than "
                                     f"engine.max_model_len={self.engine.max_model_len}")
                if need > self.engine.pool_tokens - self.engine.block_size:
                    raise ValueError(f"engine.pool_tokens={self.engine.pool_tokens} is smaller than one "
                                     f"session's context ({need} tokens)")
        return self

    def controller_for(self, arm: ArmSpec) -> ControllerSpec:
        return arm.controller or self.controller

    def engine_for(self, arm: ArmSpec) -> "EngineSpec":
        """The engine ``arm`` runs on: the experiment's, with the arm's fields (if any) put over it."""
        if arm.engine is None:
            return self.engine
        return SimEngineSpec.model_validate({**self.engine.model_dump(exclude_unset=True), **arm.engine})

    def arm(self, name: str) -> ArmSpec:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(f"no arm {name!r}; arms: {[a.name for a in self.arms]}")

    def reference_trigger_end_s(self) -> Optional[float]:
        """The latest trigger end over all arms: windows of every arm align to it."""
        ends = [t.window()[1] for a in self.arms for t in a.triggers]
        return max(ends) if ends else None


_KIND_TAGS = {"sim", "openai", "vllm", "sglang", "serve_sim", "synthetic", "swebench", "trace_file", "hf_dataset", "tracelab_synthetic", "empirical", "exponential",
              "burst", "extra_sessions", "flush", "rate_change", "mix_shift"}


def _format_errors(exc: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid spec"]
    for err in exc.errors():
        # pydantic puts the discriminator's value into the location (engine.sim.pool_tokens)
        parts = [p for p in err["loc"] if p not in _KIND_TAGS]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        field = re.match(r"([a-z_][a-z0-9_]*): ", msg) if err["type"] == "value_error" else None
        if field:  # a model's own check naming one of its fields: print the field's full location
            loc, msg = ".".join(p for p in (loc if parts else "", field.group(1)) if p), msg[field.end():]
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "<spec>", base_dir: Optional[Path] = None) -> ExperimentSpec:
    """``base_dir``: where relative file paths in the spec (trace files) are resolved; default the cwd."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return ExperimentSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, source)) from None


def check_spec_files(spec: ExperimentSpec, base_dir: Optional[Path], source: str = "<spec>") -> None:
    """SpecError unless every file the spec names exists and parses, naming the field and file.

    Trace files are read when the spec loads (a session spec that cannot be replayed is invalid);
    cost-model files are read here, as a run reads them (relative to ``base_dir``).
    """
    engines = [("engine", spec.engine)]
    if isinstance(spec.engine, LaunchedEngineSpec) and spec.engine.kind == "serve_sim":
        engines.append(("engine.simulator", spec.engine.simulator))
    for where, engine in engines:
        if not isinstance(engine, SimEngineSpec) or not isinstance(engine.cost_model, str) \
                or engine.cost_model in PRESETS:
            continue
        path = Path(engine.cost_model).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise SpecError(f"{source}: {where}.cost_model: no such file: {path} (expected a cost.json as "
                            "`loadgen calibrate` writes, or a preset name)")
        try:
            StepCostModel.from_file(path)
        except (ValueError, TypeError) as exc:  # TypeError: fields missing from the JSON object
            raise SpecError(f"{source}: {where}.cost_model: {path}: not a cost model ({exc})") from None


def load_spec(path: Union[str, Path]) -> ExperimentSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML ({exc})") from None
    return parse_spec(data, str(path), base_dir=path.parent)
