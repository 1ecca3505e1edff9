"""What the commands print: the engine line says what ran, the paired table fits 100 columns
however many arms, progress lines stay whole when piped, and a trace file read in the wrong
format says which --format to try."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from loadgen.analysis.tables import format_outcome_table
from tests.conftest import make_spec_dict

FIXTURES = Path(__file__).parent / "trace_shapes" / "fixtures"


def _summary(arms, flavor="vllm"):
    runs = [{"run_id": f"{arm}-s{seed}", "arm": arm, "seed": seed, "hit_ratio_last10min": 0.9,
             "sessions_in_system_last5min": 10.0, "persistently_degraded": False, "engine_flavor": flavor}
            for arm in arms for seed in (1, 2)]
    return {"experiment": "recovery", "runs": runs, "pairs": {"baseline_arm": arms[0], "comparisons": []}}


def test_the_engine_line_names_the_engine_not_an_arm_on_it():
    text = format_outcome_table(_summary(["no-burst", "burst"]))
    assert text.splitlines()[1] == "engine: vLLM (every arm)"
    assert " on vllm" not in text


def test_the_paired_table_of_six_arms_fits_100_columns_in_blocks():
    arms = ["none", "admission-only", "session-cap", "adaptive-cap", "aimd", "budgeter"]
    lines = format_outcome_table(_summary(arms)).splitlines()
    assert max(len(line) for line in lines) <= 100, max(lines, key=len)
    # every arm heads a block, every seed has a row in every block
    heads = [line for line in lines if line.startswith("     | ")]
    assert [h.split("|")[1].strip() for h in heads] == arms[0::2]
    assert sum(line.startswith("   1 |") for line in lines) == len(heads) == 3


def test_progress_lines_are_not_cut_at_80_columns_when_piped(tmp_path):
    data = make_spec_dict(experiment="a-rather-long-experiment-name-that-makes-the-progress-line-wide")
    data["arms"] = [{**a, "name": a["name"] + "-with-a-long-arm-name"} for a in data["arms"]]
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "run", str(spec), "--out", str(tmp_path / "r"),
                           "--no-report"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "completed," in ln]
    assert len(line) > 80 and line.rstrip().endswith(" s"), line
    assert "…" not in proc.stderr


def test_a_mooncake_file_read_as_shapes_suggests_format_mooncake():
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "shapes", "describe", str(FIXTURES / "mooncake.jsonl")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "field 'calls'" in proc.stderr and "try --format mooncake" in proc.stderr


@pytest.mark.parametrize("path, expected", [
    ("aiperf.jsonl", "aiperf"), ("bailian.jsonl", "bailian"), ("copilot.jsonl", "copilot"),
    ("mooncake.jsonl", "mooncake"), ("shapes.jsonl", "shapes"), ("tracelab.jsonl", "tracelab"),
    ("trees/dag.jsonl", "dag_jsonl"), ("trees/guidellm.jsonl", "guidellm"), ("trees/tree.jsonl", "tree"),
])
def test_each_fixtures_rows_are_taken_for_their_own_format(path, expected):
    from trace_shapes.guess import guess_format

    assert guess_format(FIXTURES / path) == expected


def test_a_dag_file_read_without_format_suggests_its_format():
    proc = subprocess.run([sys.executable, "-m", "loadgen.cli", "shapes", "describe", str(FIXTURES / "trees/dag.jsonl")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "try --format dag_jsonl" in proc.stderr, proc.stderr
