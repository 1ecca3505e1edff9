"""trace_shapes stands alone: plain data, no imports from the rest of agent-loadgen."""

import subprocess
import sys


def test_importing_trace_shapes_loads_nothing_of_loadgen_or_controllers():
    code = ("import sys, trace_shapes; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('loadgen', 'controllers', 'actors')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
