"""What every spec model shares: frozen, no unknown fields, `*_min` accepted for `*_s`, no booleans as numbers;
and SpecError, the one error a bad spec raises."""

from __future__ import annotations

import typing
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


class SpecError(ValueError):
    """A spec that cannot run; the message names the file, field and what was expected."""


def error_message(exc: ValueError) -> str:
    """A value error as one line for a flag's message: a ValidationError's own messages, without
    pydantic's model name, input repr and documentation link."""
    if not isinstance(exc, ValidationError):
        return str(exc)
    return "; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

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
