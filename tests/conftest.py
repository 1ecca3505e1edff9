"""Shared factories: small specs and runs that finish in well under a second."""

from __future__ import annotations

import copy
import signal
from typing import Any

import pytest

from loadgen.core.spec import ExperimentSpec, parse_spec

# a suite started in the background of a shell without job control (`cmd &` in a script) starts
# with SIGINT ignored, and every process it starts inherits that: the Ctrl-C tests would then see
# commands that cannot be interrupted. A handler here is reset to the default in every child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

BASE_SPEC: dict[str, Any] = {
    "experiment": "tiny",
    "duration_s": 600,
    "seeds": [1, 2],
    "engine": {"kind": "sim", "pool_tokens": 160_000},
    "workload": {
        "arrival_rate_per_s": 0.03,
        "sessions": {"kind": "synthetic", "num_turns": 6, "task_tokens": 2000, "output_tokens": 100,
                     "tool_tokens": 500, "think_time_mean_s": 3.0},
    },
    "arms": [
        {"name": "base"},
        {"name": "burst", "triggers": [{"kind": "burst", "extra_rate_factor": 2.0, "start_s": 120,
                                        "duration_s": 120}]},
    ],
}


def make_spec_dict(**overrides: Any) -> dict:
    data = copy.deepcopy(BASE_SPEC)
    for key, value in overrides.items():
        data[key] = value
    return data


def make_spec(**overrides: Any) -> ExperimentSpec:
    return parse_spec(make_spec_dict(**overrides))


@pytest.fixture
def tiny_spec() -> ExperimentSpec:
    return make_spec()
