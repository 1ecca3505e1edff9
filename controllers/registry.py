"""Names to policies."""

from __future__ import annotations

from typing import Any, Callable

from .base import NoLimit, Policy

POLICIES: dict[str, Callable[..., Policy]] = {
    "none": NoLimit,
}


def make_policy(name: str, **params: Any) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown controller {name!r}; valid controllers: {sorted(POLICIES)}") from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise ValueError(f"controller {name!r}: bad parameters {params} ({exc})") from None
