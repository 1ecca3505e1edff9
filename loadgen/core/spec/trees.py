"""The session-tree workload spec: sessions that spawn sub-agents or fork branches and join them
(trace_shapes/tree_presets.py), run by loadgen/core/tree_runtime.py."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator


from .base import _Model

RUNNABLE_PRESETS = ("orchestrator-workers", "tree-search", "parallel-tools")


class TreeSessionSpec(_Model):
    """Each arrival is a tree drawn from a preset; ``params`` override the preset's fields (an
    agent's fields, e.g. ``worker: {num_turns_mean: 3}``, as a mapping)."""

    kind: Literal["tree"] = "tree"
    preset: str = Field(..., description=f"Tree preset: one of {list(RUNNABLE_PRESETS)}.")
    params: dict[str, Any] = Field(default_factory=dict, description="Fields of the preset to change.")
    label: str = Field("", description="Session kind recorded per turn (default: the preset's).")

    @field_validator("preset")
    @classmethod
    def _runnable(cls, value: str) -> str:
        if value not in RUNNABLE_PRESETS:
            raise ValueError(f"unknown tree preset {value!r}; runnable presets: {list(RUNNABLE_PRESETS)}")
        return value

    @field_validator("params")
    @classmethod
    def _known_params(cls, value: dict, info) -> dict:
        preset = info.data.get("preset")
        if preset is not None:
            model = _build(preset, value, "")  # raises naming the field
            try:  # values each field accepts alone but not together (a fan-out cap of 0, say)
                for i in range(8):
                    model.make(np.random.default_rng(i))
            except ValueError as exc:
                raise ValueError(f"these params draw no valid tree: {exc}") from None
        return value

    def model(self):
        """The tree model: ``make(rng)`` draws one tree."""
        return _build(self.preset, self.params, self.label)

    def max_context_tokens(self) -> int:
        # A tree's contexts are drawn without a fixed bound (turns, results and forks add up): the
        # engine refuses an over-long turn at run time, recorded as that turn's error.
        return 0


def _build(preset: str, params: dict, label: str):
    from trace_shapes.tree_presets import TREE_PRESETS, AgentShape

    cls = TREE_PRESETS[preset]
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for name, value in params.items():
        if name not in fields or name == "kind":
            raise ValueError(f"params.{name}: not a field of {preset}; fields: "
                             f"{sorted(n for n in fields if n != 'kind')}")
        default = fields[name].default
        if isinstance(default, AgentShape):
            if not isinstance(value, dict):
                raise ValueError(f"params.{name}: expected a mapping of agent fields, got {value!r}")
            agent_fields = {f.name: f for f in dataclasses.fields(AgentShape)}
            unknown = sorted(set(value) - set(agent_fields))
            if unknown:
                raise ValueError(f"params.{name}: unknown agent fields {unknown}; fields: {sorted(agent_fields)}")
            for key, v in value.items():
                _check_number(f"params.{name}.{key}", v, agent_fields[key].type)
            value = dataclasses.replace(default, **value)
        else:
            _check_number(f"params.{name}", value, fields[name].type)
        values[name] = value
    if label:
        values["kind"] = label
    return cls(**values)


def _check_number(where: str, value: Any, type_name: str) -> None:
    """``value`` for a preset field annotated ``type_name`` (str, int or float)."""
    if type_name == "str":
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    if type_name == "int" and not isinstance(value, int):
        raise ValueError(f"{where}: expected an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{where}: must be >= 0, got {value!r}")
    if where.endswith(("probability", "fraction")) and value > 1:
        raise ValueError(f"{where}: must lie in [0, 1], got {value!r}")
