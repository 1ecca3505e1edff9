"""Which of the simulator's hot modules run compiled, and the switch back to pure Python.

``pip install`` compiles the modules in ``COMPILED_MODULES`` with Cython when it can (setup.py;
a machine without a C compiler gets none of them and runs the same code as Python). A compiled
module is the same source, so a run gives the same bytes either way
(tests/test_compiled.py compares whole results directories).

The compiled modules are used only while each is newer than its source and its ``.pxd``:
after an edit or a checkout, every listed module runs as Python instead (they share typed
classes, so it is all or none), silently (a warning would change what every command prints to
stderr) until ``pip install -e .`` rebuilds them; ``compiled_modules()`` says which run compiled
(benchmarks/bench_sim.py prints it).
``LOADGEN_PURE_PYTHON=1`` runs every module as Python.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Optional

__all__ = ["COMPILED_MODULES", "PURE_PYTHON_ENV", "pure_python_requested", "install", "compiled_modules"]

PURE_PYTHON_ENV = "LOADGEN_PURE_PYTHON"

# the innermost loops of a simulated run (profile in benchmarks/README.md): the step machine, the
# engines' scheduling, and the event loop, sessions and engine adapter that drive them
COMPILED_MODULES = (
    "loadgen.sim.keyed_heap",
    "loadgen.sim.step_machine",
    "loadgen.sim.vllm_state",
    "loadgen.sim.vllm_admission",
    "loadgen.sim.vllm_decode",
    "loadgen.sim.vllm_stream_tree",
    "loadgen.sim.vllm_offload",
    "loadgen.sim.offload",
    "loadgen.sim.engine",
    "loadgen.sim.kv_pool",
    "loadgen.sim.sglang_state",
    "loadgen.sim.sglang_overlap",
    "loadgen.sim.sglang_decode",
    "loadgen.sim.sglang_prefill",
    "loadgen.sim.sglang_engine",
    "loadgen.sim.radix_cache",
    "loadgen.sim.request",
    "loadgen.core.clock",
    "loadgen.core.session",
    "loadgen.core.engines",
    "loadgen.core.gateway",
    "loadgen.core.recording",
    "loadgen.core.seeding",
)

_ROOT = Path(__file__).resolve().parent.parent


def pure_python_requested() -> bool:
    """``LOADGEN_PURE_PYTHON`` set (and not 0): run as Python, and setup.py compiles nothing."""
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def _paths(name: str) -> tuple[Path, Optional[Path]]:
    """A module's source and its compiled file next to it (None when there is none)."""
    source = _ROOT.joinpath(*name.split(".")).with_suffix(".py")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return source, candidate
    return source, None


class _SourceFirst:
    """Loads the listed modules from their ``.py`` even where a compiled file sits beside it (a
    meta path finder needs only ``find_spec``; importlib.abc would cost every command ~6 ms)."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        source, _ = _paths(fullname)
        return importlib.util.spec_from_file_location(fullname, source)


def _stale(source: Path, compiled: Path) -> bool:
    """The source, or its typed layout (the ``.pxd`` beside it), changed after it was compiled."""
    built_s = compiled.stat().st_mtime
    layout = source.with_suffix(".pxd")
    return source.stat().st_mtime > built_s or (layout.exists() and layout.stat().st_mtime > built_s)


def install() -> None:
    """Decide, once per process and before any listed module is imported, which run compiled.

    All or none: the compiled modules share typed classes (a compiled engine subclasses the
    compiled step machine and reads compiled requests' fields), so one module that must run as
    Python (edited since the build, or never built) makes every listed module run as Python."""
    if any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        return
    paths = [_paths(name) for name in COMPILED_MODULES]
    if all(compiled is None for _, compiled in paths):
        return
    if pure_python_requested() or any(compiled is None or _stale(source, compiled) for source, compiled in paths):
        sys.meta_path.insert(0, _SourceFirst(set(COMPILED_MODULES)))


def compiled_modules() -> list[str]:
    """The listed modules this process runs compiled (imported ones only)."""
    return [name for name in COMPILED_MODULES
            if name in sys.modules and not str(getattr(sys.modules[name], "__file__", "")).endswith(".py")]
