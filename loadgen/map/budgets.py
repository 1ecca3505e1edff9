"""The budgets a map searches: the budgeter at several (admit, park) fractions of the pool.

Each budget is a controller of the grid, named ``budgeter@A-P`` (A the admit fraction, P the
park fraction), so every table of the map (cells, boundaries, what a controller buys) covers it
like any controller; the recommendation then picks a budget the map measured instead of
reporting the one budget the spec happened to name.
"""

from __future__ import annotations

from typing import Mapping, Optional

from .grid import DIGITS, GridError, controller_policy

BUDGETER = "budgeter"


def budget_label(admit_fraction: float, park_fraction: float) -> str:
    return f"{BUDGETER}@{admit_fraction:g}-{park_fraction:g}"


def budget_params(label: str, spec_params: Mapping[str, float]) -> Optional[dict]:
    """The budgeter params a grid controller runs with (its label's, else the spec's with the
    policy's defaults under them); None when the controller is not a budgeter."""
    name, params = controller_policy(label)
    if name != BUDGETER:
        return None
    from controllers import policy_params

    return {**policy_params(BUDGETER), **spec_params, **params}


def parse_budgets(text: str, spec_params: Mapping[str, float]) -> tuple[str, ...]:
    """``--budgets``: admit fractions (the park fraction stays the spec's) or ADMIT/PARK pairs,
    comma-separated, e.g. ``0.6,0.75,0.9/0.98``; the grid's controller labels, in order."""
    from controllers import policy_params

    default_park = {**policy_params(BUDGETER), **spec_params}["park_fraction"]
    labels = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        admit_text, _, park_text = part.partition("/")
        try:
            admit = round(float(admit_text), DIGITS)
            park = round(float(park_text), DIGITS) if park_text else default_park
        except ValueError:
            raise GridError(f"--budgets: cannot read {part!r}: expected an admit fraction or ADMIT/PARK, "
                            "e.g. 0.6,0.75,0.9/0.98") from None
        if not 0 < admit <= park:
            raise GridError(f"--budgets: {part!r} needs 0 < admit_fraction <= park_fraction "
                            f"(park_fraction {park:g})")
        labels.append(budget_label(admit, park))
    if not labels:
        raise GridError(f"--budgets: no budgets in {text!r}")
    if len(set(labels)) != len(labels):
        raise GridError(f"--budgets: {text!r} names one budget twice")
    return tuple(labels)
