"""How exact a run's prompts were: the server's prompt lengths against the planned ones, and the
re-tokenization drift of returned text (docs/chat.md#drift; summary.json fields in
docs/results-format.md#prompt-lengths-and-re-tokenization-drift-added-every-field-above-is-unchanged)."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from .runs import float_column, success_mask


def tokenization_outcome(turns: pa.Table) -> dict:
    """Per run, over successful turns: how many prompts the server counted off the planned length
    and by how much at most; how many turns re-sent text that re-tokenized differently and how
    many tokens of the previous prompt + output that cost (each is then not a prefix hit); how
    many turns could not be checked (the server returned no token ids). None for files written
    before these columns existed."""
    out: dict[str, Optional[float]] = {
        "prompt_tokens_off_plan_turns": None, "prompt_tokens_off_plan_max": None,
        "retokenization_drift_turns": None, "retokenization_drift_tokens_total": None,
        "retokenization_drift_unknown_turns": None,
    }
    ok = success_mask(turns)
    names = turns.column_names
    if "planned_prompt_tokens" in names:
        off = np.abs(float_column(turns, "prompt_tokens") - float_column(turns, "planned_prompt_tokens"))[ok]
        off = off[np.isfinite(off)]
        out["prompt_tokens_off_plan_turns"] = int((off > 0).sum())
        out["prompt_tokens_off_plan_max"] = int(off.max()) if len(off) else 0
    if "retokenization_drift_tokens" in names:
        drift = float_column(turns, "retokenization_drift_tokens")[ok]
        drift = drift[np.isfinite(drift)]
        out["retokenization_drift_turns"] = int((drift > 0).sum())
        out["retokenization_drift_tokens_total"] = int(drift[drift > 0].sum())
        out["retokenization_drift_unknown_turns"] = int((drift < 0).sum())
    return out
