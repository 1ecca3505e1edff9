"""Names to policies, and the checked construction of a policy from a spec's params."""

from __future__ import annotations

import dataclasses
from typing import Any

from .adaptive import AdaptiveCap
from .aimd import LatencyAimd
from .base import NoLimit, Policy
from .budgeter import KvBudgeter
from .caps import AdmissionOnlyCap, SessionCap
from .thunderagent import ThunderAgent

# docs/experiments.md#gateway-controllers, in its order.
POLICIES: dict[str, type[Policy]] = {
    policy.name: policy
    for policy in (NoLimit, AdmissionOnlyCap, SessionCap, AdaptiveCap, LatencyAimd, KvBudgeter, ThunderAgent)
}


def policy_params(name: str) -> dict[str, Any]:
    """The constants a policy takes, with their documented defaults."""
    policy = _policy_class(name)
    if not dataclasses.is_dataclass(policy):
        return {}
    return {f.name: f.default for f in dataclasses.fields(policy) if f.init}


def make_policy(name: str, **params: Any) -> Policy:
    """A fresh policy (policies keep state: one per run); a bad name or param is a ValueError."""
    valid = policy_params(name)
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(f"controller {name!r}: unknown parameter(s) {unknown}; "
                         f"valid parameters: {sorted(valid) if valid else 'none'}")
    try:
        return _policy_class(name)(**params)
    except ValueError as exc:
        raise ValueError(f"controller {name!r}: {exc}") from None


def _policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown controller {name!r}; valid controllers: {sorted(POLICIES)}") from None
