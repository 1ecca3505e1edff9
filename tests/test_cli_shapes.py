"""``loadgen shapes describe`` as a user runs it."""

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "trace_shapes" / "fixtures"


def _loadgen(*args):
    return subprocess.run([sys.executable, "-m", "loadgen.cli", *args], capture_output=True, text=True)


def test_describe_the_shipped_shapes():
    proc = _loadgen("shapes", "describe", "swebench", "--over", "38000", "--over", "60000")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("swebench: 609 sessions (google/gemini-3-pro-preview 500, deepseek/deepseek-chat 99, "
                          "deepseek/deepseek-reasoner 10)")
    for needle in ("calls per session            p10 22  p50 39", "sessions over 38,000 tokens: 14.9%",
                   "sessions over 60,000 tokens: 3.4%", "shrinking turns (next prompt < prompt + output): 974 of "
                   "28133 (3.5%)", "0 dropped (first call too long), 91 truncated", "gaps recorded: 8470 of 28133"):
        assert needle in out, needle


def test_describe_a_users_file_as_json_with_a_model_filter():
    proc = _loadgen("shapes", "describe", str(FIXTURES / "tracelab.jsonl"), "--format", "tracelab",
                    "--model", "claude-x", "--json")
    assert proc.returncode == 0, proc.stderr
    description = json.loads(proc.stdout)
    assert description["recorded"]["num_sessions"] == 1 and description["recorded"]["gap_s"]["max"] == 60.0


def test_describe_errors_exit_2_and_say_why(tmp_path):
    proc = _loadgen("shapes", "describe", "no-such-thing")
    assert proc.returncode == 2 and "no such file" in proc.stderr and "swebench, tracelab-synthetic" in proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"calls": [[10, 1, 0.0]]}\n{"calls": "oops"}\n')
    proc = _loadgen("shapes", "describe", str(bad))
    assert proc.returncode == 2 and f"{bad}: row 2: field 'calls': expected a list" in proc.stderr
    proc = _loadgen("shapes", "describe", "swebench", "--model", "gpt-9")
    assert proc.returncode == 2 and "no sessions of model(s) ['gpt-9']" in proc.stderr
