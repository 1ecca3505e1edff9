"""``loadgen report DIR --html``: one self-contained HTML file a user can open or attach to a
ticket. Every warning first (lagging, crashed sessions, failed or unreadable runs), then the
tables as the terminal prints them, the figures inline as data: URIs (no file beside it is
needed), and the spec. A map directory gets the map's report and its figures instead."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Iterable, Optional, Sequence

REPORT_FILE = "report.html"

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; white-space: pre-wrap; font-size: 12px; line-height: 1.3; }
.warnings { background: #fff3cd; border: 1px solid #e0b000; padding: 0.6em 1em; }
.warnings li { margin: 0.2em 0; } .ok { color: #2a7a2a; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-size: 0.9em; color: #555; }
"""


def _pre(text: Optional[str]) -> str:
    return "" if not text else f"<pre>{html.escape(text)}</pre>"


def _figures(paths: Iterable[Path]) -> str:
    parts = []
    for path in paths:
        data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
        name = html.escape(Path(path).name)
        parts.append(f'<figure><img alt="{name}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{name}</figcaption></figure>")
    return "\n".join(parts)


def _warnings(items: Sequence[str]) -> str:
    if not items:
        return '<p class="ok" id="no-warnings">No warnings: every run completed, none lagged.</p>'
    lis = "\n".join(f"<li>{html.escape(w)}</li>" for w in items)
    return f'<div class="warnings" id="warnings"><strong>Warnings</strong><ul>\n{lis}\n</ul></div>'


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            f"<h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")


def results_warnings(results_dir: Path, summary: dict) -> list[str]:
    """What the user must know before reading the tables: runs that did not complete (and why),
    sessions that crashed, runs that lagged their time scale, runs that could not be read."""
    warnings = []
    for path in sorted((results_dir / "runs").glob("*/run.json")):
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # the summary lists it among the unreadable runs
        run_id = info.get("run_id", path.parent.name)
        if info.get("status") != "completed":
            warnings.append(f"run {run_id} did not complete (status {info.get('status')}): {info.get('error')}; "
                            "left out of the tables")
        crashed = (info.get("counts") or {}).get("sessions_crashed")
        if crashed and "crashed" not in str(info.get("error")):  # a failed run's error may say it already
            warnings.append(f"run {run_id}: {crashed} session(s) crashed (sessions.parquet status 'error' has the "
                            "exception)")
        if info.get("lagging"):
            lag = info.get("lag") or {}
            warnings.append(f"run {run_id} lagged: the {lag.get('source', 'driver')}'s timers fired p99 "
                            f"{lag.get('p99_s', float('nan')):.3g} s late (bound {lag.get('bound_s', float('nan')):.3g} s); "
                            "its timings are not the spec's")
    for entry in summary.get("unreadable_runs") or []:
        warnings.append(f"unreadable run {entry['run_id']} (left out of the tables): {entry['error']}")
    return warnings


def write_results_html(results_dir: Path, summary: dict, figure_paths: Sequence[Path]) -> Path:
    """DIR/report.html of a results directory whose summary (and figures) were just written."""
    from .latency import format_latency_table
    from .serving import format_serving_table
    from .tables import format_outcome_table, format_recovery_table

    results_dir = Path(results_dir)
    figure_paths = list(figure_paths)
    pairs = [p for p in figure_paths if p.name.startswith("pair-s")]
    others = [p for p in figure_paths if p not in pairs]
    spec = results_dir / "spec.yaml"
    sections = [_warnings(results_warnings(results_dir, summary))]
    serving = format_serving_table(summary)
    if serving:  # a replayed trace: the open-loop benchmark's table (the paired verdicts do not apply)
        sections += ["<h2>Serving metrics</h2>", _pre(serving)]
    else:
        sections += ["<h2>Outcomes</h2>", _pre(format_outcome_table(summary)),
                     "<h2>Latency and SLOs</h2>", _pre(format_latency_table(summary)) or "<p>No latency table.</p>"]
    recovery = format_recovery_table(summary)
    if recovery:
        sections += ["<h2>Recovery</h2>", _pre(recovery)]
    from .trees import format_trees_table

    trees = format_trees_table(summary)  # runs of session trees only
    if trees:
        sections += ["<h2>Tasks (session trees)</h2>", _pre(trees)]
    sections += ["<h2>Per-seed pairs</h2>", _figures(pairs) or "<p>No seed ran in two arms.</p>",
                 "<h2>Figures</h2>", _figures(others),
                 "<h2>Spec</h2>", _pre(spec.read_text()) if spec.is_file() else "<p>No spec.yaml.</p>"]
    path = results_dir / REPORT_FILE
    path.write_text(_page(f"agent-loadgen report: {summary.get('experiment')} ({results_dir.name})",
                          "\n".join(sections)), encoding="utf-8")
    return path


def write_map_html(map_dir: Path) -> Path:
    """DIR/report.html of a map directory: its report, the phase diagram and the other map
    figures (redrawn from map.json), failed runs as warnings, and the spec."""
    from ..map.figures import write_map_figures

    map_dir = Path(map_dir)
    summary = json.loads((map_dir / "map.json").read_text())
    paths = write_map_figures(summary, map_dir)
    phase = [p for p in paths if p.name == "phase-diagram.png"]
    warnings = []
    if summary.get("num_failed"):
        warnings.append(f"{summary['num_failed']} map runs failed (outcomes.parquet rows with status failed, "
                        "their error in the error column); the cells count only the completed runs")
    spec = map_dir / "spec.yaml"
    sections = [_warnings(warnings), "<h2>Map report</h2>", _pre(summary.get("report")),
                "<h2>Phase diagram</h2>", _figures(phase),
                "<h2>Figures</h2>", _figures([p for p in paths if p not in phase]),
                "<h2>Spec</h2>", _pre(spec.read_text()) if spec.is_file() else "<p>No spec.yaml.</p>"]
    path = map_dir / REPORT_FILE
    path.write_text(_page(f"agent-loadgen map: {summary.get('experiment')} ({map_dir.name})", "\n".join(sections)),
                    encoding="utf-8")
    return path
