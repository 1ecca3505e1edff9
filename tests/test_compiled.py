"""The simulator's compiled modules (setup.py, loadgen/compiled.py) give the pure-Python bytes."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadgen.compiled import COMPILED_MODULES, PURE_PYTHON_ENV, _paths

ROOT = Path(__file__).resolve().parents[1]
BUILT = [name for name in COMPILED_MODULES if _paths(name)[1] is not None]
needs_build = pytest.mark.skipif(not BUILT and os.environ.get("CI") != "true",
                                 reason="no compiled modules here (no C compiler at install)")


def _run(*args, pure: bool):
    env = {k: v for k, v in os.environ.items() if k != PURE_PYTHON_ENV}
    if pure:
        env[PURE_PYTHON_ENV] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT)


def _compiled_in_a_fresh_process(pure: bool) -> list[str]:
    code = ("import importlib, loadgen.compiled as c\n"
            "for name in c.COMPILED_MODULES: importlib.import_module(name)\n"
            "print(','.join(c.compiled_modules()))")
    proc = _run("-c", code, pure=pure)
    assert proc.returncode == 0, proc.stderr
    return [name for name in proc.stdout.strip().split(",") if name]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@needs_build
def test_the_install_compiled_every_listed_module():
    # CI installs with README's command on a machine with a compiler: a silent fallback to Python
    # there would leave the compiled path untested
    assert BUILT == list(COMPILED_MODULES)
    assert _compiled_in_a_fresh_process(pure=False) == list(COMPILED_MODULES)
    assert _compiled_in_a_fresh_process(pure=True) == []


@needs_build
@pytest.mark.parametrize("flavor", ["vllm", "sglang", "vllm+offload"])
def test_compiled_and_pure_python_runs_write_identical_bytes(tmp_path, flavor):
    spec = yaml.safe_load((ROOT / "examples" / "paired-burst.yaml").read_text())
    spec["duration_min"] = 30
    spec["seeds"] = [501, 502]
    spec["engine"]["flavor"] = "vllm" if flavor == "vllm+offload" else flavor
    if flavor == "vllm+offload":
        spec["engine"]["offload"] = {"cpu_tokens": 900_000}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    written = {}
    for pure in (False, True):
        out = tmp_path / ("pure" if pure else "compiled")
        proc = _run("-m", "loadgen.cli", "run", str(path), "--out", str(out), "--quiet", "--no-figures",
                    "--workers", "1", pure=pure)
        assert proc.returncode == 0, proc.stderr
        written[pure] = _files(out)
    assert len([n for n in written[False] if n.endswith("turns.parquet")]) == 4
    assert written[False] == written[True]


@needs_build
@pytest.mark.parametrize("edited", [".py", ".pxd"])
def test_an_edited_module_runs_every_module_as_python_until_rebuilt(edited):
    # the step machine's typed class is the base of the compiled vLLM engine: an edited step
    # machine running as Python under a compiled engine would not even import, so none runs compiled
    name = "loadgen.sim.step_machine"
    source, compiled = _paths(name)
    edited_path = source.with_suffix(edited)
    before = edited_path.stat()
    code = ("import importlib, loadgen.compiled as c\n"
            "for name in c.COMPILED_MODULES: importlib.import_module(name)\n"
            f"import {name}; print({name}.__file__); print(c.compiled_modules())")
    try:
        os.utime(edited_path, (before.st_atime, compiled.stat().st_mtime + 60))
        proc = _run("-c", code, pure=False)
    finally:
        os.utime(edited_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == str(source)
    assert proc.stdout.splitlines()[1] == "[]"  # every listed module runs as Python
    assert proc.stderr == ""  # silently: a warning would change what every command prints
