"""The experiment spec: arms, controllers, SLOs, recording, seeds; parsing and loading with clear errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import (Field, ValidationError, field_validator, model_serializer, model_validator)

from controllers import POLICIES, make_policy

from ...sim.cost import PRESETS, StepCostModel

from .base import SpecError, _Model
from .engines import EngineSpec, LaunchedEngineSpec, SimEngineSpec
from .sessions import WorkloadSpec, draws_trees
from .triggers import MixShiftTrigger, Trigger


class ControllerSpec(_Model):
    name: str = Field("none", description="Gateway limit: " + ", ".join(sorted(POLICIES)))
    params: dict[str, Any] = Field(default_factory=dict, description="Constants of the limit (documented defaults).")
    start_s: float = Field(0.0, ge=0, description="Control is switched on here; before it the gate is 'none'.")
    # added with deployments (docs/deployments.md#controllers-at-the-deployment)
    scope: Literal["deployment", "replica"] = Field(
        "deployment", description="deployment: one gate over the sum of the replicas' pools; replica: a gate per "
                                  "replica over its own pool, asked after routing (engine.replicas > 1).")

    # added with session trees (docs/trace-shapes.md#trees-and-the-gateway)
    tree_policy: Literal["sessions", "trees"] = Field(
        "sessions", description="sessions: a tree's children queue at the gate like new sessions; trees: the "
                                "children of an admitted tree are admitted on arrival (the limit gates roots).")

    @model_serializer(mode="wrap")
    def _without_default_scope(self, handler):
        data = handler(self)  # written as before deployments existed unless set (run.json, spec.yaml)
        if isinstance(data, dict) and self.scope == "deployment":
            data.pop("scope", None)
        if isinstance(data, dict) and self.tree_policy == "sessions":
            data.pop("tree_policy", None)
        return data

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
    duration_s: Optional[float] = Field(
        None, gt=0, description="Run length; required unless the workload replays a trace (its run then ends when "
                                "the last request completes).")
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
        replay = self.workload.replay
        if self.duration_s is None:
            if replay is None:
                raise ValueError("duration_s: missing (the run length: duration_s or duration_min)")
            # a frozen model: the derived fields are set once, here, before anything reads them
            object.__setattr__(self, "duration_s", max(replay.span_s(), 1e-3))
            if replay.until_done is None:
                object.__setattr__(replay, "until_done", True)
        elif replay is not None and replay.until_done is None:
            object.__setattr__(replay, "until_done", False)
        if replay is not None:
            if getattr(self.engine, "api", "completions") == "chat":
                raise ValueError("engine.api: a replay sends each prompt as its token ids (the completions API); "
                                 "chat messages would re-tokenize them and lose the recorded prefixes")
            if "sample_interval_s" not in self.recording.model_fields_set:
                # a replay is seconds to minutes long: sampled every second, as vLLM logs its gauges
                object.__setattr__(self.recording, "sample_interval_s", 1.0)
            for i, arm in enumerate(self.arms):
                engine = self._engine_or_none(arm)
                if isinstance(engine, SimEngineSpec) and engine.flavor != "sglang" and engine.offload is not None:
                    raise ValueError("engine.offload: a trace replay is not modelled with the CPU offload tier yet")
                if isinstance(engine, SimEngineSpec) and engine.flavor == "sglang" and replay.client_timeout_s:
                    raise ValueError("workload.replay.client_timeout_s: the simulated SGLang engine does not abort "
                                     "requests yet; leave it out, or replay on the vllm flavour")
                if isinstance(engine, SimEngineSpec) and engine.replicas > 1:
                    raise ValueError("engine.replicas: a trace replay on a simulated deployment is not modelled yet "
                                     "(its routers read what a replica caches by session, not by prompt content); "
                                     "replay against one engine, or against a deployment's endpoint")
                for j, trig in enumerate(arm.triggers):
                    if trig.kind != "flush":
                        raise ValueError(f"arms[{i}].triggers[{j}]: a {trig.kind} trigger changes drawn arrivals or "
                                         "sessions, and a replay draws none (the trace gives every request); only "
                                         "flush triggers go with replay")
        via = getattr(self.engine, "gateway", None)
        if via is not None and via.controller is not None:
            try:
                ControllerSpec.model_validate(via.controller)
            except ValidationError as exc:
                err = exc.errors()[0]
                where = "".join(f".{p}" for p in err["loc"])
                raise ValueError(f"engine.gateway.controller{where}: {err['msg'].removeprefix('Value error, ')}") from None
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
            engine = self._engine_or_none(arm)
            if ctl.name == "thunderagent" and (not isinstance(self.engine, SimEngineSpec) or ctl.scope != "deployment"):
                where = f"arms[{i}].controller" if arm.controller is not None else "controller"
                raise ValueError(f"{where}.name: thunderagent runs on the simulated engine (kind sim) with scope "
                                 "deployment: it keeps its own table of every worker's programs")
            if ctl.scope == "replica" and engine is not None and getattr(engine, "replicas", 1) == 1:
                where = f"arms[{i}].controller" if arm.controller is not None else "controller"
                raise ValueError(f"{where}.scope: replica needs a deployment (engine.replicas > 1); one engine's "
                                 "gate is scope deployment")
            if ctl.scope == "replica" and not isinstance(self.engine, SimEngineSpec):
                where = f"arms[{i}].controller" if arm.controller is not None else "controller"
                raise ValueError(f"{where}.scope: replica runs on the simulated engine (kind sim); a sweep's "
                                 "replicas share one gate over their pools (scope deployment)")
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
        _check_trees(self)
        if isinstance(self.engine, SimEngineSpec) and replay is None:  # a replayed request too long fails alone
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

    def _engine_or_none(self, arm: ArmSpec):
        try:
            return self.engine_for(arm)
        except ValidationError:
            return None  # reported below with the arm's engine fields

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


def _check_trees(spec: "ExperimentSpec") -> None:
    """Where session trees run: the simulator (no CPU offload tier, a deployment-wide gate), or live
    against an endpoint, with either API (docs/trace-shapes.md#running-trees)."""
    shapes = [spec.workload.sessions] + [t.sessions for a in spec.arms for t in a.triggers
                                         if isinstance(t, MixShiftTrigger)]
    if not any(draws_trees(s) for s in shapes):
        return
    if not isinstance(spec.engine, SimEngineSpec):
        # live: a fork resends its parent's exact ids or messages (loadgen/core/tree_runtime.py)
        if spec.engine.kind != "openai":
            raise ValueError(f"engine.kind: session trees replay live against an endpoint (kind openai, e.g. a "
                             f"serve-sim or vLLM server you started); launched engines (kind {spec.engine.kind!r}, "
                             f"sweeps and session fleets) do not run trees yet")
        return
    for arm in spec.arms:
        ctl = spec.controller_for(arm)
        if ctl.scope == "replica" or ctl.name == "thunderagent":
            raise ValueError(f"controller: session trees run behind the deployment's gateway (scope deployment), "
                             f"not {'thunderagent' if ctl.name == 'thunderagent' else 'scope replica'}")
        engine = spec.engine_for(arm)
        if engine.flavor != "sglang" and engine.offload is not None:
            raise ValueError("engine.offload: session trees are not modelled with the CPU offload tier")


def _as_given(data: Any, parts: list) -> list:
    """The location as the spec's author wrote it: a ``*_s`` field given as ``*_min`` (converted to
    seconds before validation) keeps its minutes name (``duration_min: 0``, not ``duration_s``)."""
    node = data
    for i, part in enumerate(parts):
        if isinstance(node, dict) and isinstance(part, str) and part not in node and part.endswith("_s") \
                and part[:-2] + "_min" in node:
            return parts[:i] + [part[:-2] + "_min"] + parts[i + 1:]
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            break
    return parts


def _format_errors(exc: ValidationError, source: str, data: Any = None) -> str:
    lines = [f"{source}: invalid spec"]
    for err in exc.errors():
        # pydantic puts the discriminator's value into the location (engine.sim.pool_tokens)
        # (a tag right after a dropped one is a field: engine.sim.sglang.page_size is engine.sglang.page_size)
        parts, dropped = [], False
        for p in err["loc"]:
            dropped = p in _KIND_TAGS and not dropped
            if not dropped:
                parts.append(p)
        given = _as_given(data, parts)
        minutes = given != parts
        parts = given
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".") or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        field = re.match(r"([a-z_][a-z0-9_]*): ", msg) if err["type"] == "value_error" else None
        if field:  # a model's own check naming one of its fields: print the field's full location
            loc, msg = ".".join(p for p in (loc if parts else "", field.group(1)) if p), msg[field.end():]
        if minutes and re.search(r"[1-9]", msg):  # a bound in seconds, stated for a value in minutes
            msg += " (the minutes x 60, in seconds)"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def parse_spec(data: Any, source: str = "<spec>", base_dir: Optional[Path] = None) -> ExperimentSpec:
    """``base_dir``: where relative file paths in the spec (trace files) are resolved; default the cwd."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return ExperimentSpec.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise SpecError(_format_errors(exc, source, data)) from None


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
