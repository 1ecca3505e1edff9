"""Ideal vs measured hit ratio (loadgen/analysis/ideal.py, docs/results-format.md#ideal-hit-ratio)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from loadgen.analysis.ideal import ideal_cached_tokens
from loadgen.analysis.outcomes import run_outcome
from loadgen.analysis.runs import load_run
from loadgen.analysis.summary import write_summary
from loadgen.analysis.tables import format_outcome_table
from loadgen.core.runner import RunKey, run_simulated
from loadgen.core.spec import load_spec, parse_spec
from tests.conftest import make_spec_dict
from tests.factories import sample_row, turn_row, write_run_dir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _recorded_run(tmp_path: Path, block_size=16) -> Path:
    # finish times: the first two turns before the last 10 minutes of a 1200 s run, the rest in them
    turns = [
        turn_row(100.0, 4000, 0, cacheable_prefix_tokens=0),  # first sender of the system prompt
        turn_row(100.0, 4000, 1000, cacheable_prefix_tokens=2000),  # system prompt sent before
        turn_row(900.0, 4600, 0, cacheable_prefix_tokens=4099),  # previous prompt 4000 + output 100 - 1
        turn_row(900.0, 4600, 4592, cacheable_prefix_tokens=4600),  # a retry: its whole prompt was sent
        turn_row(900.0, 4600, 0, error="HttpStatusError: HTTP 500", cacheable_prefix_tokens=4099),
        turn_row(900.0, 10, 0, cacheable_prefix_tokens=10),  # shorter than a block: nothing to hit
    ]
    run_dir = write_run_dir(tmp_path, "base-s1", "base", 1, turns, [sample_row(0.0, 1)], [], 1200.0, None)
    info = json.loads((run_dir / "run.json").read_text())
    if block_size is not None:
        info["prefix_cache_block_size"] = block_size
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def test_ideal_hit_ratio_of_a_recorded_table_by_hand(tmp_path):
    outcome = run_outcome(load_run(_recorded_run(tmp_path)))
    # per successful turn, whole 16-token blocks of the cacheable prefix, at most those of prompt - 1:
    # 0; 2000 (125 blocks); 4096 (256 blocks of 4099); 4592 (287 blocks: 4600 - 1 = 4599 caps it); 0
    prompts = 4000 + 4000 + 4600 + 4600 + 10
    assert outcome["ideal_hit_ratio"] == pytest.approx((0 + 2000 + 4096 + 4592 + 0) / prompts)
    assert outcome["measured_hit_ratio"] == pytest.approx((0 + 1000 + 0 + 4592 + 0) / prompts)
    assert outcome["ideal_hit_ratio_last10min"] == pytest.approx((4096 + 4592) / (4600 + 4600 + 10))
    measured, ideal = outcome["measured_hit_ratio"], outcome["ideal_hit_ratio"]
    assert outcome["engine_miss_share"] == pytest.approx((ideal - measured) / (1 - measured))
    assert outcome["ideal_block_size"] == 16 and outcome["ideal_block_size_assumed"] is False


def test_ideal_hit_ratio_rounds_to_the_runs_block_size(tmp_path):
    outcome = run_outcome(load_run(_recorded_run(tmp_path, block_size=64)))
    # 64-token blocks: 1984 (31 blocks of 2000); 4096 (64 of 4099); 4544 (71 blocks of 4599)
    assert outcome["ideal_hit_ratio"] == pytest.approx((1984 + 4096 + 4544) / (4000 + 4000 + 4600 + 4600 + 10))
    assert outcome["ideal_block_size"] == 64


def test_unknown_block_size_assumes_vllms_default_and_says_so(tmp_path):
    run_dir = _recorded_run(tmp_path, block_size=None)
    outcome = run_outcome(load_run(run_dir))
    assert outcome["ideal_block_size"] == 16 and outcome["ideal_block_size_assumed"] is True
    summary = write_summary(tmp_path)
    assert "16 assumed" in format_outcome_table(summary)


def test_results_recorded_before_the_column_have_no_ideal_and_no_report_line(tmp_path):
    write_run_dir(tmp_path, "base-s1", "base", 1, [turn_row(100.0, 1000, 500)], [sample_row(0.0, 1)], [],
                  1200.0, None)
    summary = write_summary(tmp_path)
    run = summary["runs"][0]
    assert run["measured_hit_ratio"] == pytest.approx(0.5)
    assert run["ideal_hit_ratio"] is None and run["engine_miss_share"] is None
    assert "measured / ideal" not in format_outcome_table(summary)


def test_with_a_pool_that_never_evicts_the_simulated_engine_hits_exactly_the_ideal(tmp_path):
    """The definition matches the simulated vLLM engine turn by turn when nothing is evicted: shared
    prefix once sent, previous prompt + output - 1, whole blocks, capped at prompt - 1."""
    for flavor in ("vllm", "sglang"):
        spec = parse_spec(make_spec_dict(engine={"kind": "sim", "flavor": flavor, "pool_tokens": 2_000_000}))
        run_simulated(spec, RunKey("burst", 1), tmp_path / flavor)
        run = load_run(tmp_path / flavor / "runs" / "burst-s1")
        turns = run.turns.to_pydict()
        assert len(turns["cached_tokens"]) > 50
        block = run.run_json["prefix_cache_block_size"]
        assert block == (16 if flavor == "vllm" else 1)
        ideal = ideal_cached_tokens(np.array(turns["prompt_tokens"]), np.array(turns["cacheable_prefix_tokens"]),
                                    block)
        assert ideal.tolist() == turns["cached_tokens"]
        outcome = run_outcome(run)
        assert outcome["ideal_hit_ratio"] == outcome["measured_hit_ratio"] and outcome["engine_miss_share"] == 0.0


def test_a_collapsed_run_misses_what_an_infinite_cache_would_hit(tmp_path):
    """The main example's burst arm at seed 501 collapses: its prompts were as cacheable as ever
    (ideal ~0.94), the engine's evictions made it miss (measured ~0.41 over the run)."""
    spec = load_spec(EXAMPLES / "paired-burst.yaml")
    run_simulated(spec, RunKey("burst", 501), tmp_path)
    run_dir = tmp_path / "runs" / "burst-s501"
    turns = pq.read_table(run_dir / "turns.parquet").to_pydict()
    ideal = ideal_cached_tokens(np.array(turns["prompt_tokens"]), np.array(turns["cacheable_prefix_tokens"]), 16)
    assert (np.array(turns["cached_tokens"]) <= ideal).all()
    summary = write_summary(tmp_path)
    run = summary["runs"][0]
    assert run["ideal_hit_ratio"] >= run["measured_hit_ratio"]
    assert run["ideal_hit_ratio"] > 0.9 and run["measured_hit_ratio"] < 0.5
    assert run["ideal_hit_ratio_last10min"] > 0.9 > 0.5 > run["hit_ratio_last10min"]
    assert run["engine_miss_share"] > 0.8
    saved = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert saved["ideal_hit_ratio"] == run["ideal_hit_ratio"]
    line = [ln for ln in format_outcome_table(summary).splitlines() if "measured / ideal" in ln]
    assert line == [f"hit ratio over the whole run, measured / ideal (an infinite cache, the same prompts; mean of "
                    f"runs): burst {run['measured_hit_ratio']:.3f} / {run['ideal_hit_ratio']:.3f} "
                    f"(engine's share of the miss {run['engine_miss_share']:.2f})"]
