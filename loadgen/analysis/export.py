"""``loadgen export DIR --format F``: a results directory for other tools (docs/results-format.md#exports).

``csv`` / ``jsonl``: every turn of the summary's runs (turns.parquet's columns, in its order)
and the per-run summary (summary.json ``runs``). ``llm-d``: one llm-d-benchmark benchmark
report (schema v0.2.1) per run. ``aiperf``: one AIPerf-style ``profile_export.jsonl`` per run,
with AIPerf's record names where a column maps onto one. Nothing is computed here that the
summary does not already say; the exports only rename and reshape.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
from pathlib import Path
from typing import Any, Iterable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..core.arrow_numpy import float_values
from ..version import __version__

FORMATS = ("csv", "jsonl", "llm-d", "aiperf")
LLMD_VERSION = "0.2.1"


def _json_value(value: Any) -> Any:
    """JSON has no NaN or infinity: they are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _write_jsonl(path: Path, rows: Iterable[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(_json_value(row), allow_nan=False) + "\n")
    return path


def _run_dirs(results_dir: Path, summary: dict) -> list[tuple[dict, Path]]:
    return [(entry, results_dir / "runs" / entry["run_id"]) for entry in summary.get("runs", [])]


def turns_table(results_dir: Path, summary: dict) -> pa.Table:
    """Every turn of the summary's runs, run by run in the summary's order."""
    tables = [pq.read_table(run_dir / "turns.parquet") for _, run_dir in _run_dirs(results_dir, summary)]
    if not tables:
        raise ValueError(f"{results_dir}: no completed runs to export")
    return pa.concat_tables(tables, promote_options="default")


def _flat(entry: dict, prefix: str = "") -> dict:
    """A summary run entry with nested fields as dotted columns (CSV has one level)."""
    out = {}
    for key, value in entry.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return out


def export_tables(results_dir: Path, summary: dict, fmt: str, out_dir: Path) -> list[Path]:
    """turns.csv + runs.csv, or turns.jsonl + runs.jsonl."""
    turns = turns_table(results_dir, summary)
    runs = summary.get("runs", [])
    if fmt == "csv":
        pacsv.write_csv(turns, out_dir / "turns.csv")
        flat = [_flat(r) for r in runs]
        columns = list(dict.fromkeys(k for r in flat for k in r))
        with open(out_dir / "runs.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(flat)
        return [out_dir / "turns.csv", out_dir / "runs.csv"]
    return [_write_jsonl(out_dir / "turns.jsonl", turns.to_pylist()), _write_jsonl(out_dir / "runs.jsonl", runs)]


# ---------------------------------------------------------------- llm-d benchmark report
def _stats(values: np.ndarray, units: str) -> Optional[dict]:
    """llm-d's Statistics of the finite values (None when there are none)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    q = lambda p: float(np.quantile(values, p))  # noqa: E731
    return {"units": units, "mean": float(values.mean()), "stddev": float(values.std()), "min": float(values.min()),
            "p0p1": q(0.001), "p1": q(0.01), "p5": q(0.05), "p10": q(0.1), "p25": q(0.25), "p50": q(0.5),
            "p75": q(0.75), "p90": q(0.9), "p95": q(0.95), "p99": q(0.99), "p99p9": q(0.999), "max": float(values.max())}


def _column(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    return float_values(table.column(name))


def _sequence_length(values: np.ndarray) -> dict:
    values = values[np.isfinite(values)]
    return {"distribution": "other", "value": float(values.mean()) if values.size else 0.0,
            "min": int(values.min()) if values.size else 0, "max": max(1, int(values.max())) if values.size else 1}


def llmd_report(run_dir: Path) -> dict:
    """One run as an llm-d-benchmark benchmark report v0.2.1 (llm-d/llm-d-benchmark,
    llmdbenchmark/analysis/benchmark_report/br_v0_2_1_json_schema.json): the request latencies
    from the moment the request was sent (admit_s, the gateway wait excluded, as a harness
    measures them), throughput over the run, and the run's sessions."""
    info = json.loads((run_dir / "run.json").read_text())
    turns = pq.read_table(run_dir / "turns.parquet")
    errors = turns.column("error").to_pylist()
    ok = np.array([e is None for e in errors], dtype=bool)
    sent_s, first_s, finish_s = _column(turns, "admit_s"), _column(turns, "first_token_s"), _column(turns, "finish_s")
    prompt, output = _column(turns, "prompt_tokens"), _column(turns, "output_tokens")
    duration_s = float(info["duration_s"])
    spec = info.get("spec") or {}
    latency = {"time_to_first_token": _stats((first_s - sent_s)[ok], "s"),
               "inter_token_latency": _stats(_column(turns, "itl_mean_s")[ok], "s"),
               "request_latency": _stats((finish_s - sent_s)[ok], "s")}
    throughput = {"request_rate": {"units": "queries/s", "mean": float(ok.sum()) / duration_s},
                  "input_token_rate": {"units": "tokens/s", "mean": float(prompt[ok].sum()) / duration_s},
                  "output_token_rate": {"units": "tokens/s", "mean": float(output[ok].sum()) / duration_s},
                  "total_token_rate": {"units": "tokens/s", "mean": float(prompt[ok].sum() + output[ok].sum()) / duration_s}}
    requests = {"total": int(turns.num_rows), "failures": int((~ok).sum()),
                "input_length": _stats(prompt[ok], "count"), "output_length": _stats(output[ok], "count")}
    report: dict = {
        "version": LLMD_VERSION,
        "run": {"uid": hashlib.sha256(f"{info.get('experiment')}/{info['run_id']}/{json.dumps(spec, sort_keys=True)}"
                                      .encode()).hexdigest()[:32],
                "eid": str(info.get("experiment")), "description": f"{info.get('experiment')} {info['run_id']}",
                "time": {"duration": f"PT{duration_s:g}S"}},
        "scenario": {"load": {
            "metadata": {"schema_version": "0.0.1", "cfg_id": hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
                         .hexdigest()[:32], "description": spec.get("description")},
            "standardized": {"tool": "agent-loadgen", "tool_version": __version__, "source": "random",
                             "input_seq_len": _sequence_length(prompt), "output_seq_len": _sequence_length(output),
                             "multi_turn": {"enabled": True}},
            "native": {"config": spec}}},
        "results": {"request_performance": {"aggregate": {
            "requests": {k: v for k, v in requests.items() if v is not None},
            "latency": {k: v for k, v in latency.items() if v is not None}, "throughput": throughput}}},
    }
    sessions_path = run_dir / "sessions.parquet"
    if sessions_path.is_file():
        sessions = pq.read_table(sessions_path)
        status = sessions.column("status").to_pylist()
        done = np.array([s == "completed" for s in status], dtype=bool)
        length_s = _column(sessions, "finish_s") - _column(sessions, "arrival_s")
        turns_per_session = _column(sessions, "turns_completed")
        report["results"]["session_performance"] = {"sessions": {
            k: v for k, v in {
                "total": int(sessions.num_rows), "succeeded": int(done.sum()),
                "failed": int(sum(s == "error" for s in status)),
                "total_events": int(turns.num_rows), "total_events_completed": int(ok.sum()),
                "session_duration": _stats(length_s[done], "s"),
                "events_per_session": _stats(turns_per_session[done], "count")}.items() if v is not None}}
    return report


# ---------------------------------------------------------------- AIPerf profile_export.jsonl
def _ms(value_s: float) -> Optional[dict]:
    return {"value": value_s * 1e3, "unit": "ms"} if math.isfinite(value_s) else None


def aiperf_records(run_dir: Path) -> list[dict]:
    """One run's turns as AIPerf profile_export.jsonl records (metadata, metrics with value and
    unit, error). Times are nanoseconds of run time (0 = the run's start), not epoch: a run in
    virtual time has no wall-clock start. A request starts when it was sent (admit_s)."""
    info = json.loads((run_dir / "run.json").read_text())
    run_id = info["run_id"]
    records = []
    for row in pq.read_table(run_dir / "turns.parquet").to_pylist():
        sent_s, finish_s = float(row["admit_s"]), float(row["finish_s"])
        first_s = float(row["first_token_s"]) if row.get("first_token_s") is not None else math.nan
        session = f"{run_id}-session-{row['session_id']}"
        metadata = {"session_num": int(row["session_id"]), "x_request_id": f"{session}-turn-{row['turn_index']}",
                    "x_correlation_id": session, "conversation_id": session, "turn_index": int(row["turn_index"]),
                    "request_start_ns": round(sent_s * 1e9),
                    "request_ack_ns": round(first_s * 1e9) if math.isfinite(first_s) else None,
                    "request_end_ns": round(finish_s * 1e9), "benchmark_phase": "profiling", "was_cancelled": False,
                    "cancellation_time_ns": None}
        if row["error"] is not None:
            records.append({"metadata": metadata, "metrics": {"error_isl": {"value": int(row["prompt_tokens"]),
                                                                           "unit": "tokens"}},
                            "error": {"code": None, "type": "TurnError", "message": row["error"]}})
            continue
        metrics = {"input_sequence_length": {"value": int(row["prompt_tokens"]), "unit": "tokens"},
                   "time_to_first_token": _ms(first_s - sent_s), "request_latency": _ms(finish_s - sent_s),
                   "output_sequence_length": {"value": int(row["output_tokens"]), "unit": "tokens"},
                   "inter_token_latency": _ms(float(row["itl_mean_s"])) if row.get("itl_mean_s") is not None else None}
        records.append({"metadata": metadata, "metrics": {k: v for k, v in metrics.items() if v is not None},
                        "error": None})
    return records


def export_results(results_dir: Path, summary: dict, fmt: str, out_dir: Path) -> list[Path]:
    """Write the export of ``fmt`` under ``out_dir``; the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if fmt in ("csv", "jsonl"):
        return export_tables(Path(results_dir), summary, fmt, out_dir)
    paths: list[Path] = []
    for entry, run_dir in _run_dirs(Path(results_dir), summary):
        if fmt == "llm-d":
            path = out_dir / f"{entry['run_id']}.benchmark_report.json"
            path.write_text(json.dumps(_json_value(llmd_report(run_dir)), indent=1, allow_nan=False) + "\n")
        else:
            (out_dir / entry["run_id"]).mkdir(exist_ok=True)
            path = _write_jsonl(out_dir / entry["run_id"] / "profile_export.jsonl", aiperf_records(run_dir))
        paths.append(path)
    return paths


def read_turns_csv(path: Path, schema: pa.Schema) -> pa.Table:
    """turns.csv back as a table of turns.parquet's types (an empty field is null)."""
    options = pacsv.ConvertOptions(column_types=schema, strings_can_be_null=True, null_values=[""])
    return pacsv.read_csv(path, convert_options=options)
