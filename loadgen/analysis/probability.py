"""The twin's probabilities against what the real engine did (``loadgen compare`` when the sim
results hold ``replicates.json`` from ``loadgen run --replicates R``).

Per matched run: the twin's P(persistently degraded) beside the real end state. Scores: the
Brier score (mean of (p - outcome)^2; 0 is perfect, 0.25 is a coin's), agreement on the runs the
twin calls certain (p 0 or 1: every replicate ended the same way), and the borderline runs
(0 < p < 1), where one run of the twin could have gone either way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

REPLICATES_FILE = "replicates.json"  # loadgen/replicates.py writes it


def load_probabilities(sim_dir: Path) -> Optional[dict]:
    path = Path(sim_dir) / REPLICATES_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def score_probabilities(replicates: dict, real_degraded: dict[str, bool]) -> dict:
    """``real_degraded``: run id -> the real run's end state, for the runs both sides completed."""
    rows = []
    for run_id, degraded in sorted(real_degraded.items()):
        entry = replicates["runs"].get(run_id)
        if entry is None:
            continue
        p = float(entry["p_degraded"])
        rows.append({"run_id": run_id, "p_degraded": p, "real_degraded": bool(degraded),
                     "certain": p in (0.0, 1.0), "squared_error": (p - float(bool(degraded))) ** 2})
    certain = [r for r in rows if r["certain"]]
    return {
        "num_replicates": replicates["num_replicates"], "runs": rows,
        "brier_score": sum(r["squared_error"] for r in rows) / len(rows) if rows else None,
        "num_certain": len(certain),
        "certain_agreement": (sum((r["p_degraded"] == 1.0) == r["real_degraded"] for r in certain) / len(certain)
                              if certain else None),
        "borderline": [r["run_id"] for r in rows if not r["certain"]],
    }


def format_probabilities(score: dict) -> str:
    lines = [f"{'run':24s} {'P(degraded) twin':>16s} {'real':>9s}"]
    for r in score["runs"]:
        mark = "" if r["certain"] else "  borderline"
        lines.append(f"{r['run_id']:24s} {r['p_degraded']:16.2f} {'degraded' if r['real_degraded'] else 'healthy':>9s}"
                     f"{mark}")
    brier = "n/a" if score["brier_score"] is None else f"{score['brier_score']:.3f}"
    agree = ("n/a" if score["certain_agreement"] is None
             else f"{100 * score['certain_agreement']:.0f}% of {score['num_certain']}")
    lines.append(f"Brier score {brier} over {len(score['runs'])} runs ({score['num_replicates']} replicates each); "
                 f"agreement where the twin is certain: {agree}; borderline: "
                 f"{', '.join(score['borderline']) or 'none'}")
    return "\n".join(lines)
