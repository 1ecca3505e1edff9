"""save_png computes each axis' ticks once per axes size and view limits instead of each time
matplotlib asks (loadgen/analysis/figures.py, _ticks_computed_once): the PNGs must be the same
bytes as with matplotlib asking every time, for the pair, overview and latency figures (shared
x axes, log axes with minor ticks, a layout that resizes the axes between its passes)."""

from __future__ import annotations

import contextlib

import pytest
from matplotlib.axis import Axis

from loadgen.analysis import figures, summarize
from loadgen.analysis.figures import figure_jobs
from loadgen.analysis.latency_figures import latency_figure_jobs
from tests.factories import sample_row, turn_row, write_run_dir

DURATION_S = 1800.0


def _turns(hit_ratio: float, ttft_s: float, scale: int) -> list[dict]:
    rows = []
    for i in range(int(DURATION_S / 10) - 1):
        finish_s = 10.0 + 10 * i
        prompt = 2000 * (1 + i % 5)
        rows.append(turn_row(finish_s, prompt, int(prompt * hit_ratio), turn_index=i % 5,
                             ready_s=finish_s - ttft_s * scale - 1, admit_s=finish_s - ttft_s * scale - 1,
                             first_token_s=finish_s - 1.0))
    return rows


@pytest.fixture
def results(tmp_path):
    """Two arms x two seeds, one run collapsed; the seeds' sessions differ in scale, so the pair
    figures' tick labels (and so their layout) differ."""
    for arm, hit_ratio in (("base", 0.9), ("burst", 0.5)):
        for seed in (1, 2):
            collapsed = arm == "burst" and seed == 2
            write_run_dir(tmp_path, f"{arm}-s{seed}", arm, seed,
                          _turns(0.1 if collapsed else hit_ratio, 60.0 if collapsed else 0.2, seed),
                          [sample_row(t, 3 + (t // 60) * 7 ** seed % 2000) for t in range(0, int(DURATION_S), 30)],
                          [{"kind": "burst", "start_s": 300.0, "end_s": 600.0}], DURATION_S, 600.0)
    return tmp_path, summarize(tmp_path)


def _draw_all(results_dir, summary) -> dict[str, bytes]:
    jobs = latency_figure_jobs(results_dir, summary) + figure_jobs(results_dir, summary)
    for _, draw in jobs:
        draw()
    return {path.name: path.read_bytes() for path, _ in jobs}


def test_ticks_computed_once_draw_the_same_bytes(results, monkeypatch):
    results_dir, summary = results
    real_update = Axis._update_ticks
    calls = {"n": 0}

    def counted(axis):
        calls["n"] += 1
        return real_update(axis)

    monkeypatch.setattr(Axis, "_update_ticks", counted)
    once = _draw_all(results_dir, summary)
    calls_once, calls["n"] = calls["n"], 0
    with monkeypatch.context() as m:
        m.setattr(figures, "_ticks_computed_once", lambda fig: contextlib.nullcontext())
        every_time = _draw_all(results_dir, summary)
    assert {"pair-s1.png", "pair-s2.png", "overview.png", "latency-over-time.png",
            "ttft-vs-depth.png"} <= set(once)
    assert calls_once * 3 < calls["n"]  # the memo is in use: most of matplotlib's asks are answered from it
    assert [name for name in once if once[name] != every_time[name]] == []
