"""The map's grid: which runs it is made of, and the spec of each.

A point is (controller, base arrival rate, trigger factor, seed, run length). The trigger is the
spec's burst with its ``extra_rate_factor`` set to the factor (0: no trigger), for the burst's own
start and duration; the controller runs from time 0. Every point keeps the rest of the spec, and
the same seeds at every point, so two points differ only in what the grid varies.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from controllers import POLICIES
from routers import ROUTERS

from ..core.spec import BurstTrigger, ExperimentSpec, SimEngineSpec

DEFAULT_RATES = "0.02:0.06:0.0025"
DEFAULT_TRIGGER_FACTORS = "0,0.5,1,1.5,2,3"
DEFAULT_SEEDS = "1-20"
DEFAULT_CONTROLLERS = "none,budgeter"
DEFAULT_HORIZON_H = 6.0
DEFAULT_BISECT_STEPS = 3
DEFAULT_MAX_ESCAPE_RATES = 4

# grid values are rounded so that 0.02 + 8 x 0.0025 is 0.04, the same key in every run
DIGITS = 9


class GridError(ValueError):
    """A grid option that cannot be read; the message names the option."""


def parse_values(text: str, option: str, minimum: float = 0.0, allow_minimum: bool = True) -> list[float]:
    """``start:stop:step`` (stop included when the steps land on it) or ``a,b,c``; sorted, unique."""
    text = str(text).strip()
    unreadable = GridError(f"{option}: cannot read {text!r}: expected start:stop:step or a comma list, "
                           "e.g. 0.02:0.06:0.0025 or 0,1.5,3")
    try:
        parts = [float(p) for p in text.split(":")] if ":" in text else [
            float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise unreadable from None
    if ":" in text:
        if len(parts) != 3:
            raise unreadable
        start, stop, step = parts
        if not step > 0 or not stop >= start:
            raise GridError(f"{option}: range {text!r} needs start <= stop and step > 0")
        count = int(math.floor((stop - start) / step + 1e-9)) + 1
        values = [start + i * step for i in range(count)]
    else:
        values = parts
    if not values:
        raise GridError(f"{option}: no values in {text!r}")
    values = sorted({round(v, DIGITS) for v in values})
    low = values[0]
    if low < minimum or (low == minimum and not allow_minimum) or not all(map(math.isfinite, values)):
        bound = ">=" if allow_minimum else ">"
        raise GridError(f"{option}: every value must be {bound} {minimum:g}, got {low:g}")
    return values


@dataclass(frozen=True, order=True)
class MapPoint:
    """One run of the map. ``phase``: grid, bisect (tipping-trigger search) or escape (long runs)."""

    controller: str
    rate_per_s: float
    trigger_factor: float
    seed: int
    duration_s: float
    phase: str = "grid"

    @property
    def run_id(self) -> str:
        # escape runs judge windows from time 0, grid runs from the burst's end: never one id
        prefix = "escape-" if self.phase == "escape" else ""
        return (f"{prefix}{self.controller}-r{self.rate_per_s:g}-b{self.trigger_factor:g}-d{self.duration_s:g}"
                f"-s{self.seed}")


@dataclass(frozen=True)
class MapGrid:
    rates_per_s: tuple[float, ...]
    trigger_factors: tuple[float, ...]
    seeds: tuple[int, ...]
    controllers: tuple[str, ...]
    horizon_s: float = DEFAULT_HORIZON_H * 3600
    bisect_steps: int = DEFAULT_BISECT_STEPS
    max_escape_rates: int = DEFAULT_MAX_ESCAPE_RATES

    def __post_init__(self) -> None:
        # with --routers each entry is CONTROLLER+ROUTER (with_routers): one map column per pair
        unknown = [c for c in self.controllers if controller_policy(c)[0] not in POLICIES]
        if unknown:
            raise GridError(f"--controllers: unknown {unknown}; valid controllers: {sorted(POLICIES)}")
        unknown = sorted({split_policy(c)[1] for c in self.controllers} - {None, *ROUTERS})
        if unknown:
            raise GridError(f"--routers: unknown {unknown}; valid routers: {list(ROUTERS)}")
        if not self.controllers or not self.seeds:
            raise GridError("the grid needs at least one controller and one seed")
        if len(set(self.controllers)) != len(self.controllers):
            raise GridError(f"--controllers: {list(self.controllers)} names one twice")
        if not (math.isfinite(self.horizon_s) and self.horizon_s >= 0):
            raise GridError(f"--horizon-h must be a number of hours >= 0, got {self.horizon_s / 3600:g}")
        if self.bisect_steps < 0 or self.max_escape_rates < 0:
            raise GridError("--bisect-steps and --max-escape-rates must be >= 0")

    def grid_points(self, duration_s: float) -> list[MapPoint]:
        return [MapPoint(c, r, f, s, duration_s) for c in self.controllers for r in self.rates_per_s
                for f in self.trigger_factors for s in self.seeds]

    def to_json(self) -> dict:
        return {"rates_per_s": list(self.rates_per_s), "trigger_factors": list(self.trigger_factors),
                "seeds": list(self.seeds), "controllers": list(self.controllers), "horizon_s": self.horizon_s,
                "bisect_steps": self.bisect_steps, "max_escape_rates": self.max_escape_rates}


@dataclass(frozen=True)
class MapJob:
    """What every worker needs to run any point: the spec and its burst."""

    spec: ExperimentSpec
    spec_dir: Optional[Path]
    burst: Optional[BurstTrigger]
    fingerprint: str  # changes with the spec: a resumed map reruns points of another spec

    @property
    def reference_trigger_end_s(self) -> Optional[float]:
        """Windows of every map point align to the burst's end, with or without the burst (as a
        paired experiment aligns its untreated arm to its treated twin)."""
        return None if self.burst is None else self.burst.window()[1]

    @property
    def spec_trigger_factor(self) -> Optional[float]:
        return None if self.burst is None else round(self.burst.extra_rate_factor, DIGITS)


def map_job(spec: ExperimentSpec, spec_dir: Optional[Path], trigger_factors: Sequence[float]) -> MapJob:
    """The map of ``spec``: it needs the simulated engine, and a burst if any factor is above 0."""
    if not isinstance(spec.engine, SimEngineSpec):
        raise GridError(f"loadgen map simulates: engine kind {spec.engine.kind!r} is not 'sim'")
    if spec.workload.replay is not None:
        raise GridError("loadgen map varies the base arrival rate and a burst; a replayed trace (workload.replay) "
                        "sends its own recorded times, so it has neither: replay it with loadgen run, or map "
                        "its sessions drawn at a rate (workload.sessions: {kind: trace_file, ...})")
    bursts = [t for a in spec.arms for t in a.triggers if isinstance(t, BurstTrigger)]
    burst = bursts[0] if bursts else None
    if burst is None and any(f > 0 for f in trigger_factors):
        raise GridError("the map's trigger is the spec's burst (its start and duration; the map varies its "
                        "extra_rate_factor), and no arm of the spec has a `kind: burst` trigger; add one, or "
                        "pass --trigger-factors 0")
    # the spec as written (its set fields, resolved): a tool update that only adds a field with
    # its default does not void a map in progress; any change to what the spec says does
    text = json.dumps(spec.model_dump(mode="json", exclude_unset=True), sort_keys=True)
    return MapJob(spec, spec_dir, burst, hashlib.sha256(text.encode()).hexdigest()[:16])


def point_spec(job: MapJob, point: MapPoint) -> ExperimentSpec:
    """The one-arm, one-seed spec of a point (validated like any spec)."""
    # only the fields the spec set: a full dump carries defaults that are valid only in context
    # (a sim engine's flavour-specific sections), and the point's spec is validated again
    data = job.spec.model_dump(mode="json", exclude_unset=True)
    data["workload"]["arrival_rate_per_s"] = point.rate_per_s
    data["duration_s"] = point.duration_s
    data["seeds"] = [point.seed]
    triggers = []
    if point.trigger_factor > 0:
        triggers.append({**job.burst.model_dump(mode="json", exclude_unset=True), "extra_rate_factor": point.trigger_factor})
    data["arms"] = [{"name": "map", "triggers": triggers}]
    ctl = job.spec.controller
    label, router = split_policy(point.controller)
    name, label_params = controller_policy(label)  # a budget the map searches: budgeter@A-P
    params = {**(ctl.params if ctl.name == name else {}), **label_params}
    data["controller"] = {"name": name, "params": params, "start_s": 0.0,
                          **({"scope": ctl.scope} if ctl.scope != "deployment" else {})}
    if router is not None:
        spec_router = job.spec.engine.router
        knobs = spec_router.knobs if spec_router is not None and spec_router.policy == router else {}
        data["engine"]["router"] = {"policy": router, **knobs}
    return ExperimentSpec.model_validate(data, context={"base_dir": job.spec_dir})


def split_policy(label: str) -> tuple[str, Optional[str]]:
    """A map column's controller label and router (None: the spec's engine as it is)."""
    name, _, router = label.partition("+")
    return name, router or None


def controller_policy(label: str) -> tuple[str, dict]:
    """A grid controller's policy name and the params its label sets ({} for a plain name): a
    budget the map searches is ``budgeter@A-P`` (loadgen/map/budgets.py); a router after ``+``
    (``--routers``) is not the controller's."""
    name, sep, rest = split_policy(label)[0].partition("@")
    if not sep:
        return name, {}
    admit, _, park = rest.partition("-")
    return name, {"admit_fraction": float(admit), "park_fraction": float(park)}


def with_routers(controllers: Sequence[str], routers: Sequence[str], spec: ExperimentSpec) -> tuple[str, ...]:
    """``loadgen map --routers``: every controller with every router, as CONTROLLER+ROUTER columns."""
    if not routers:
        return tuple(controllers)
    if not isinstance(spec.engine, SimEngineSpec) or spec.engine.replicas < 2:
        raise GridError("--routers: the spec's engine is one engine; a router needs engine.replicas > 1 "
                        "(and engine.router: {policy: ...})")
    if len(set(routers)) != len(routers):
        raise GridError(f"--routers: {list(routers)} names one twice")
    return tuple(f"{c}+{r}" for c in controllers for r in routers)


def parse_controllers(text: str, flag: str = "--controllers", example: str = "none,budgeter") -> tuple[str, ...]:
    names = tuple(n.strip() for n in str(text).split(",") if n.strip())
    if not names or any(not re.fullmatch(r"[A-Za-z0-9_.-]+", n) for n in names):
        raise GridError(f"{flag}: cannot read {text!r}: expected names, e.g. {example}")
    return names
