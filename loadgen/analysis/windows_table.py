"""windows.parquet: one row per 1-minute window of a run (docs/results-format.md#windowsparquet).

Turns belong to the window they finish in (as everywhere in loadgen/analysis/windows.py);
session counts are the mean of the samples taken in the window. Written when a run ends and by
``loadgen report`` for runs that lack it; a pure function of the run's files.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.arrow_numpy import array
from .latency import LATENCY_METRICS, PERCENTILES, nearest_rank_by_group, turn_latencies
from .runs import RunData, float_column, load_run, read_parquet
from .windows import count_windows

WINDOW_S = 60.0
_SESSION_STATES = ("sessions_in_system", "sessions_thinking", "sessions_gateway_waiting", "sessions_parked",
                   "sessions_in_engine")

WINDOW_SCHEMA = pa.schema(
    [("run_id", pa.string()), ("arm", pa.string()), ("seed", pa.int64()),
     ("window_start_s", pa.float64()), ("window_s", pa.float64()), ("num_turns", pa.int64()),
     ("hit_ratio", pa.float64()), ("turns_per_s", pa.float64()), ("prompt_tokens_per_s", pa.float64()),
     ("generated_tokens_per_s", pa.float64())]
    + [(name, pa.float64()) for name in _SESSION_STATES]
    + [(f"{metric[:-2]}_{p}_s", pa.float64()) for metric in LATENCY_METRICS for p, _ in PERCENTILES]
)


def window_table(run: RunData, width_s: float = WINDOW_S) -> pa.Table:
    """The run's windows [k width_s, (k+1) width_s) up to its duration (the last one may be shorter)."""
    info = run.run_json
    duration_s = float(info["duration_s"])
    num_windows = count_windows(0.0, duration_s, width_s)
    starts_s = width_s * np.arange(num_windows, dtype=np.float64)
    widths_s = np.minimum(width_s, duration_s - starts_s)
    lat = turn_latencies(run.turns)
    index = np.minimum(np.floor(lat.finish_s / width_s), num_windows - 1).astype(np.int64)
    in_span = (lat.finish_s >= 0) & (lat.finish_s <= duration_s)
    index = index[in_span]
    num_turns = np.bincount(index, minlength=num_windows)
    prompt = np.bincount(index, weights=lat.prompt_tokens[in_span], minlength=num_windows)
    cached = np.bincount(index, weights=lat.cached_tokens[in_span], minlength=num_windows)
    generated = np.bincount(index, weights=lat.output_tokens[in_span], minlength=num_windows)
    with np.errstate(divide="ignore", invalid="ignore"):
        columns: dict[str, object] = {
            "run_id": [str(info["run_id"])] * num_windows, "arm": [str(info["arm"])] * num_windows,
            "seed": [int(info["seed"])] * num_windows,
            "window_start_s": starts_s, "window_s": widths_s, "num_turns": num_turns,
            "hit_ratio": np.where(prompt > 0, cached / prompt, math.nan),
            "turns_per_s": num_turns / widths_s, "prompt_tokens_per_s": prompt / widths_s,
            "generated_tokens_per_s": generated / widths_s,
        }
    t_s = float_column(run.samples, "t_s") if run.samples.num_rows else np.zeros(0)
    sample_index = np.minimum(np.floor(t_s / width_s), num_windows - 1).astype(np.int64)
    sample_ok = (t_s >= 0) & (t_s <= duration_s)
    num_samples = np.bincount(sample_index[sample_ok], minlength=num_windows)
    for name in _SESSION_STATES:
        if name in run.samples.column_names:
            values = np.nan_to_num(float_column(run.samples, name))[sample_ok]
            sums = np.bincount(sample_index[sample_ok], weights=values, minlength=num_windows)
            with np.errstate(divide="ignore", invalid="ignore"):
                columns[name] = np.where(num_samples > 0, sums / np.maximum(num_samples, 1), math.nan)
        else:
            columns[name] = np.full(num_windows, math.nan)
    for metric in LATENCY_METRICS:
        quantiles = nearest_rank_by_group(getattr(lat, metric)[in_span], index, num_windows,
                                          tuple(q for _, q in PERCENTILES))
        for (p, _), values in zip(PERCENTILES, quantiles):
            columns[f"{metric[:-2]}_{p}_s"] = values
    return pa.table({f.name: array(columns[f.name], f.type) for f in WINDOW_SCHEMA}, schema=WINDOW_SCHEMA)


def write_windows(run_dir: str | os.PathLike, run: RunData | None = None) -> Path:
    """Write ``run_dir/windows.parquet`` (temp file + rename); return its path."""
    run_dir = Path(run_dir)
    table = window_table(run if run is not None else load_run(run_dir))
    target = run_dir / "windows.parquet"
    tmp = target.with_name(target.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, target)
    return target


def read_windows(run: RunData) -> pa.Table:
    """windows.parquet of a run, computed when the file is absent."""
    path = Path(run.run_dir) / "windows.parquet"
    return read_parquet(path) if path.is_file() else window_table(run)


def write_missing_windows(results_dir: str | os.PathLike, summary: dict,
                          load: Callable[[Path], RunData] = load_run) -> list[Path]:
    """windows.parquet for every summarized run that lacks one (results from before it existed,
    or written by `loadgen sweep`); returns the files written. ``load`` reads a run directory (the
    report's, which has read them for the summary)."""
    written = []
    for entry in summary.get("runs") or []:
        run_dir = Path(results_dir) / "runs" / str(entry["run_id"])
        if not (run_dir / "windows.parquet").is_file():
            written.append(write_windows(run_dir, load(run_dir)))
    return written
