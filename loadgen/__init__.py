"""agent-loadgen: closed-loop agent sessions against real or simulated LLM engines.

The package face: the names users and notebooks call, loaded on first use so that importing one
room (say ``loadgen.sim``) does not import them all.

- ``load_spec(path)`` / ``parse_spec(dict)``: a validated ``ExperimentSpec`` (``SpecError`` on bad input);
- ``run_keys(spec)`` and ``run_experiment(spec, out_dir, keys)``: every run of a spec, simulated or live;
- ``load_results(dir)``: a results directory's summary and runs (see ``loadgen.analysis``).

Rooms: ``loadgen.core`` (spec, clock, workload, sessions, gateway, engine seam, recording, the
simulated runner), ``loadgen.sim`` (the engine), ``loadgen.live`` (HTTP client, live runner,
serve-sim, calibration), ``loadgen.analysis`` (outcomes, statistics, tables, figures), ``loadgen.cli``.
"""

from . import compiled as _compiled
from .version import __version__

_compiled.install()  # before any compiled module loads: stale or switched-off ones run as Python

_LAZY = {
    "load_spec": "core.spec", "parse_spec": "core.spec", "parse_seeds": "core.spec", "ExperimentSpec": "core.spec",
    "SpecError": "core.spec", "RunKey": "core.runner", "run_keys": "core.runner",
    "run_experiment": "experiment", "load_results": "analysis",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
