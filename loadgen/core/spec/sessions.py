"""Session specs: synthetic sessions and replayed trace shapes (SWE-bench, trace files, Hugging Face
datasets, the TraceLab-like generator)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union

from pydantic import Field, ValidationInfo, field_validator, model_validator

from trace_shapes.replay import (EmpiricalGaps, ExponentialGaps, GapFallback, ReplayOptions, TraceReplay, build_replay,
                                 select_models)
from trace_shapes.tracelab import GeneratedReplay, TraceLabLikeSessions

if TYPE_CHECKING:  # the trace readers (~20 ms of imports) load when a spec reads a trace
    from trace_shapes.loaders import LoadedTrace
    from trace_shapes.rows import LoaderOptions
    from trace_shapes.timed import TimedTrace
    from trace_shapes.tree_loaders import LoadedTrees

from .base import _Model
from .trees import TreeSessionSpec


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
        from trace_shapes.tree_replay import LoadedTreeTrace, build_tree_replay

        try:
            select_models(trace.sessions, self.models)
        except ValueError as exc:
            raise ValueError(f"models: {exc}") from None
        options = ReplayOptions(self.truncate_at_tokens, self.system_prompt_tokens, self.label)
        if isinstance(trace, LoadedTreeTrace):  # a file of session trees (loadgen/core/tree_runtime.py runs them)
            try:
                return build_tree_replay(trace.trees, options, self._gap_fallback(trace), self.models,
                                         self.sampling == "with_replacement")
            except ValueError as exc:
                raise ValueError(f"format {trace.format}: {trace.path}: {exc}") from None
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
    format: Literal["shapes", "tracelab", "copilot", "bailian", "mooncake", "aiperf", "calls",
                    "dag_jsonl", "weka", "guidellm", "tree"] = Field(
        ..., description="shapes: one session a row, calls [[prompt, completion, gap_s], ...]; tracelab: one "
                         "round a row; copilot: GitHub Copilot coding-agent sessions; bailian: Qwen Bailian "
                         "requests chained by parent_chat_id; mooncake: requests with 512-token block hashes; "
                         "aiperf: AIPerf multi-turn inputs; calls: one call a row, generic "
                         "(trace_shapes/loaders.py). Session trees (trace_shapes/tree_loaders.py): dag_jsonl "
                         "(AIPerf), weka (sub-agent records), guidellm (branches), tree (generic); a file whose "
                         "sessions branch replays its trees (docs/trace-shapes.md#running-trees).")
    system_prompt_tokens: int = Field(
        0, ge=0, description="Tokens of every session's initial context shared by all sessions (the system "
                             "prompt), for sessions whose trace does not record what they share (mooncake and "
                             "aiperf do); 0 shares nothing across sessions.")
    label: str = Field("trace", description="Session kind recorded per turn.")
    tokenizer: Optional[str] = Field(
        None, description="aiperf, dag_jsonl: a local tokenizer.json (or a directory with one) to count the tokens "
                          "of text turns (without one, one token per word, as serve-sim counts); a relative path "
                          "is relative to the spec's directory.")
    default_output_tokens: Optional[int] = Field(
        None, gt=0, description="aiperf: output tokens of a turn without output_length (AIPerf's --osl).")
    block_tokens: int = Field(512, gt=0, description="mooncake: tokens per hash_ids block (512 in Mooncake's traces).")

    def loader_options(self) -> LoaderOptions:
        from trace_shapes.rows import LoaderOptions

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
        return _existing_file(value, info)


def _existing_file(value: str, info: ValidationInfo) -> str:
    """A file the spec names, resolved (relative to the spec's directory), or why it is not one."""
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
    from trace_shapes.loaders import load_swebench

    return load_swebench()


@functools.lru_cache(maxsize=4)
def _cached_trace(path: str, format: str, mtime_ns: int, size: int, options: LoaderOptions) -> LoadedTrace:
    # mtime and size are part of the key so that an edited file is read again
    from trace_shapes.loaders import load_trace
    from trace_shapes.tree_loaders import TREE_FORMATS, load_trees

    if format in TREE_FORMATS:
        return _tree_trace(load_trees(path, format, options))
    return load_trace(path, format, options)


def _tree_trace(loaded: LoadedTrees) -> LoadedTrace:
    """The sessions of a tree-format file: a plain trace when they are all linear, else its trees
    (replayed as trees, trace_shapes/tree_replay.py), never flattened into linear sessions."""
    from trace_shapes.loaders import LoadedTrace
    from trace_shapes.tree_replay import LoadedTreeTrace

    roots = tuple(t.node for t in loaded.trees)
    if loaded.num_branching():
        return LoadedTreeTrace(loaded.path, loaded.format, roots, loaded.num_rows, loaded.notes, loaded.trees)
    return LoadedTrace(loaded.path, loaded.format, roots, loaded.num_rows, loaded.notes)


@functools.lru_cache(maxsize=4)
def _cached_hf(source: "HFSourceSpec", format: str, options: LoaderOptions) -> LoadedTrace:
    from trace_shapes.hf import load_hf

    return load_hf(source.hf, format, source.split, source.config, dict(source.columns), options)


SessionSpec = Annotated[
    Union[SyntheticSessionSpec, SwebenchSessionSpec, TraceFileSessionSpec, HFDatasetSessionSpec,
          TraceLabSyntheticSessionSpec, TreeSessionSpec],
    Field(discriminator="kind"),
]


class ReplaySpec(_Model):
    """A recorded trace on its own clock (trace_shapes/timed.py, docs/replay.md)."""

    path: str = Field(..., description="The trace: JSONL, gzip JSONL (.gz) or Parquet; a relative path is relative "
                                       "to the spec's directory.")
    format: Optional[Literal["llmservingsim", "mooncake", "aiperf"]] = Field(
        None, description="llmservingsim: arrival_time_ns, input_toks, output_toks, input_tok_ids; mooncake: timestamp "
                          "(ms), input_length (the whole prompt), output_length, hash_ids, session_id; aiperf: "
                          "AIPerf's fixed-schedule rows (mooncake's fields; a session's row records what its turn "
                          "adds). Default: guessed from the first row.")
    speed: float = Field(1.0, gt=0, description="Replay this many times faster than recorded (each request at its "
                                                "recorded time / speed).")
    block_tokens: int = Field(512, gt=0, description="Tokens per hash_ids entry (512 in Mooncake's traces).")
    client_timeout_s: Optional[float] = Field(
        None, gt=0, description="The client gives up on a request after this many seconds: it counts as failed "
                                "(error 'timeout after ...') and a simulated vLLM engine aborts it, as vLLM does when a "
                                "client disconnects; live, the HTTP client's timeout. Default: no timeout in "
                                "simulation, engine.request_timeout_s live.")
    until_done: Optional[bool] = Field(
        None, description="Run past duration until every request is answered. Default: true without a duration "
                          "(the run ends when the last request completes), false with one (the run is cut there).")

    @field_validator("path")
    @classmethod
    def _exists(cls, value: str, info: ValidationInfo) -> str:
        return _existing_file(value, info)

    @model_validator(mode="after")
    def _readable(self) -> "ReplaySpec":
        try:
            self.trace()
        except ValueError as exc:  # TraceFormatError names the file, row and field
            raise ValueError(f"path: {exc}") from None
        return self

    def trace(self) -> TimedTrace:
        return timed_trace(self.path, self.format, self.block_tokens)

    def span_s(self) -> float:
        """When the last request is sent (replay time)."""
        return self.trace().span_s / self.speed

    def describe(self, duration_s: float) -> list[str]:
        """What `loadgen run` and `validate` say of the replay before it runs: the trace, how it is
        sent, and the trace's notes (rows sorted, outputs raised to one token)."""
        trace = self.trace()
        num_sessions = len(trace.sessions())
        sessions = f" in {num_sessions} sessions" if num_sessions != len(trace.requests) else ""
        ends = ("until the last request is answered" if self.until_done
                else f"cut at {duration_s:g} s" if duration_s < self.span_s() else f"until {duration_s:g} s")
        lines = [f"replay: {trace.path} ({trace.format}): {len(trace.requests)} requests{sessions} recorded over "
                 f"{trace.span_s:.3f} s, sent at speed {self.speed:g}, {ends}"]
        return lines + [f"  note: {note}" for note in trace.notes]


def timed_trace(path: str, format: Optional[str], block_tokens: int) -> TimedTrace:
    """A replayed trace's requests, read once per file version (its mtime and size are the key)."""
    stat = Path(path).stat()
    return _cached_timed(path, format, block_tokens, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _cached_timed(path: str, format: Optional[str], block_tokens: int, mtime_ns: int, size: int) -> TimedTrace:
    from trace_shapes.timed import load_timed

    return load_timed(path, format, block_tokens)


class WorkloadSpec(_Model):
    arrival_rate_per_s: Optional[float] = Field(
        None, gt=0, description="Base Poisson session arrival rate lambda (/s); not with replay.")
    sessions: SessionSpec = Field(default_factory=SyntheticSessionSpec,
                                  description="Shape of base sessions; not with replay.")
    replay: Optional[ReplaySpec] = Field(
        None, description="Replay a recorded trace on its own clock instead of drawing arrivals: {path, format, "
                          "speed} (docs/replay.md).")

    @model_validator(mode="after")
    def _one_source(self) -> "WorkloadSpec":
        if self.replay is None:
            if self.arrival_rate_per_s is None:
                raise ValueError("arrival_rate_per_s: missing (the base session arrival rate, /s), or give replay: "
                                 "{path: TRACE} to replay a trace on its own clock")
            return self
        if self.arrival_rate_per_s is not None:
            raise ValueError("arrival_rate_per_s: not with replay (the trace's own times are the arrivals)")
        if self.sessions != SyntheticSessionSpec():  # the default is what a resolved spec writes back
            raise ValueError("sessions: not with replay (the trace gives every request its lengths)")
        return self


def draws_trees(sessions: SessionSpec) -> bool:
    """Whether a session spec draws session trees: a tree preset, or a tree-format file that branches."""
    if isinstance(sessions, TreeSessionSpec):
        return True
    if type(sessions) is not TraceFileSessionSpec:
        return False
    from trace_shapes.tree_loaders import TREE_FORMATS
    from trace_shapes.tree_replay import TreeReplay

    return sessions.format in TREE_FORMATS and isinstance(build_session_model(sessions), TreeReplay)
