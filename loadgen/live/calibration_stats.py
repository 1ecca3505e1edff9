"""What a calibration can stand behind: intervals on its coefficients, its noise, and a check
that judges a cost model class by class against that noise.

* ``identify``: bootstrap intervals per coefficient (rows resampled within their class, and
  each row's repeats resampled, then the fit redone), the condition number of the fit's scaled
  design, and which coefficients the rows do not pin down (an interval wider than the value);
* ``step_jitter``: the spread of one step, from the repeats of one-step rows;
* ``check_rows``: a cost model's predictions of every measured row, judged per class (cold,
  incremental, decode, queue) against each row's own spread, and the cold-turn cost at the
  workload's typical context, the quantity a collapse turns on.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import numpy as np

from ..core.workload import Stream, rng_for
from ..sim.cost import StepCostModel, fit_cost_model, prefill

COEFFICIENTS = ("t0_s", "a_s_per_token", "b_s_per_token2", "g_s_per_token")
MIXED = "mixed_decode_s_per_token"
KINDS = ("cold", "incremental", "decode", "queue", "loaded")
# a row's bound in --check: this many times its repeats' spread (and never below --tolerance)
SPREAD_FACTOR = 3.0


def fits_mixed_term(rows: Sequence) -> bool:
    """The mixed-step decode term is fitted when the plan measured loaded queues: the other rows'
    decodes beside chunks are too few to tell it from g, and a term they cannot see stays 0."""
    return any(r.kind == "loaded" for r in rows)


@dataclass
class Identification:
    """Bootstrap intervals (``level``) per coefficient, request overhead included."""

    value: dict
    low: dict
    high: dict
    condition_number: float
    level: float = 0.95
    num_resamples: int = 0

    def unidentified(self) -> list[str]:
        """Coefficients whose interval is wider than the value itself; the mixed-step term, which
        a real engine may well not pay (0), is pinned down when its interval is narrower than g
        (what it adds to a decode is then known to within a decode's own cost)."""
        out = [c for c in COEFFICIENTS if self.high[c] - self.low[c] > self.value[c]]
        if MIXED in self.value and self.high[MIXED] - self.low[MIXED] > max(self.value[MIXED],
                                                                               self.value["g_s_per_token"]):
            out.append(MIXED)
        return out

    def to_json(self) -> dict:
        return {"level": self.level, "num_resamples": self.num_resamples, "condition_number": self.condition_number,
                "intervals": {c: {"value": self.value[c], "low": self.low[c],
                                  "high": self.high[c] if math.isfinite(self.high[c]) else None}
                              for c in self.value},
                "unidentified": self.unidentified()}

    def table(self) -> str:
        units = {"t0_s": (1e3, "ms"), "a_s_per_token": (1e6, "us/token"), "b_s_per_token2": (1e9, "ns/token^2"),
                 "g_s_per_token": (1e9, "ns/token"), MIXED: (1e9, "ns/token"), "request_overhead_s": (1e3, "ms")}
        lines = [f"{100 * self.level:.0f}% bootstrap intervals ({self.num_resamples} resamples), "
                 f"condition number {self.condition_number:.3g}:"]
        for c in self.value:
            k, unit = units[c]
            flag = "  NOT PINNED DOWN (interval wider than the value)" if c in self.unidentified() else ""
            lines.append(f"  {c:20s} {self.value[c] * k:10.4g} {unit:11s} [{self.low[c] * k:.4g}, "
                         f"{self.high[c] * k:.4g}]{flag}")
        return "\n".join(lines)


def _coefs(fit, mixed: bool) -> dict:
    m = fit.model
    return {"t0_s": m.t0_s, "a_s_per_token": m.a_s_per_token, "b_s_per_token2": m.b_s_per_token2,
            "g_s_per_token": m.g_s_per_token, **({MIXED: m.mixed_decode_s_per_token} if mixed else {}),
            "request_overhead_s": fit.request_overhead_s}


def _design(measurements: Sequence, mixed: bool) -> list[list[float]]:
    """The fit's columns, in ``_coefs``'s order."""
    return [m.features()[:5 if mixed else 4] + [m.num_requests] for m in measurements]


def condition_number(measurements: Sequence, mixed: bool = False) -> float:
    """Of the design the fit solves (features scaled per column, rows by their time): how much
    the rows' noise is amplified into the coefficients."""
    X = np.array(_design(measurements, mixed), dtype=float)
    y = np.array([m.seconds for m in measurements], dtype=float)
    X = X[:, np.any(X != 0, axis=0)]  # a feature no row has (no request overhead) is no direction
    return float(np.linalg.cond((X / X.max(axis=0)) / y[:, None]))


def identify(rows: Sequence, seed: int, num_resamples: int = 200, level: float = 0.95) -> Identification:
    """Bootstrap the fit: resample rows within each class and each row's repeats (its median
    taken again), refit, and take the central ``level`` of each coefficient."""
    rng = rng_for(Stream.CALIBRATION_BOOTSTRAP, seed)
    measurements = [r.measurement for r in rows]
    mixed = fits_mixed_term(rows)
    value = _coefs(fit_cost_model(measurements, fit_request_overhead=True, fit_mixed=mixed), mixed)
    by_kind: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_kind.setdefault(r.kind, []).append(i)
    draws = {c: [] for c in value}
    for _ in range(num_resamples):
        sample = []
        for members in by_kind.values():
            for i in rng.choice(members, size=len(members), replace=True):
                repeats = rng.choice(rows[i].samples, size=len(rows[i].samples), replace=True)
                sample.append(replace(measurements[i], seconds=float(np.median(repeats))))
        for c, v in _coefs(fit_cost_model(sample, fit_request_overhead=True, fit_mixed=mixed), mixed).items():
            draws[c].append(v)
    tail = 100 * (1 - level) / 2
    low = {c: float(np.percentile(d, tail)) for c, d in draws.items()}
    high = {c: float(np.percentile(d, 100 - tail)) for c, d in draws.items()}
    for c, column in zip(value, zip(*_design(measurements, mixed))):
        if not any(column):  # no row exercises it: the fit's 0 says nothing
            low[c], high[c] = 0.0, math.inf
    return Identification(value, low, high, condition_number(measurements, mixed), level, num_resamples)


def step_jitter(rows: Sequence, chunk_tokens: int) -> float:
    """The spread of one engine step as the standard deviation of log time across repeats,
    pooled over the rows that are one step each (cold prefills within one chunk): the
    multiplicative noise a twin draws per step (``StepCostModel.step_jitter_sigma``). The
    request's own round trip is inside these times, so this errs on the noisy side."""
    variances = [statistics.variance([math.log(s) for s in r.samples]) for r in rows
                 if r.kind == "cold" and r.measurement.num_steps == 1 and len(r.samples) > 1
                 and min(r.samples) > 0 and r.measurement.num_tokens <= chunk_tokens]
    return math.sqrt(statistics.fmean(variances)) if variances else 0.0


@dataclass
class CostCheck:
    """A cost model's predictions of measured rows, judged per class: is the twin built on it still true?"""

    model_name: str
    rows: list[dict]
    classes: dict  # kind -> {"worst": row label, "ratio", "bound", "passed"}
    cold_turn: Optional[dict] = None  # the cold-turn cost at the typical context, measured vs predicted
    median_ratio: float = math.nan  # measured / predicted over every row (a summary; never the verdict)
    failures: list[str] = field(default_factory=list)
    # rows whose repeats spread too wide to tell (their miss within SPREAD_FACTOR x the spread):
    # a check with one is not passed, whatever the others say
    inconclusive: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures and not self.inconclusive

    def table(self) -> str:
        lines = [f"checking {self.model_name}:", f"{'measurement':56s} {'class':11s} {'measured s':>10s} "
                                                 f"{'predicted s':>11s} {'ratio':>6s} {'bound':>6s}"]
        for r in self.rows:
            mark = "" if r["passed"] else "  <-- noisy" if r.get("noisy") else "  <-- off"
            lines.append(f"{r['label'][:56]:56s} {r['kind']:11s} {r['measured_s']:10.4f} {r['predicted_s']:11.4f} "
                         f"{r['ratio']:6.2f} {r['bound']:6.2f}{mark}")
        for kind, c in self.classes.items():
            verdict = "ok" if c["passed"] else "too noisy to tell" if c.get("noisy") else "FAILS"
            lines.append(f"{kind:11s} worst ratio {c['ratio']:.2f} (bound +-{c['bound']:.2f}): {verdict}")
        if self.cold_turn:
            t = self.cold_turn
            lines.append(f"cold turn at {t['context_tokens']} tokens: measured {t['measured_s'] * 1e3:.1f} ms, "
                         f"predicted {t['predicted_s'] * 1e3:.1f} ms, ratio {t['ratio']:.2f} "
                         f"(bound +-{t['bound']:.2f}): {'ok' if t['passed'] else 'FAILS'}")
        lines.append(f"median ratio {self.median_ratio:.2f} over all rows (measured / predicted; a summary, "
                     "not the verdict)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"model": self.model_name, "passed": self.passed, "failures": self.failures,
                "inconclusive": self.inconclusive, "classes": self.classes, "cold_turn": self.cold_turn,
                "median_ratio": self.median_ratio, "rows": self.rows}


def _within_noise(miss: float, spread: float) -> bool:
    """A miss of |measured / predicted - 1| that the row's repeats cannot tell from noise."""
    return miss <= SPREAD_FACTOR * spread


def check_rows(model: StepCostModel, rows: Sequence, request_overhead_s: float, tolerance: float,
               typical_context: Optional[int] = None, chunk_tokens: int = 8192) -> CostCheck:
    """Predict every row with ``model`` (request round trips charged what this calibration
    measured them at, so only the engine's steps are judged). A row passes when |measured / predicted - 1| is within
    ``tolerance``; one outside it is off, unless its repeats spread so wide (SPREAD_FACTOR x the
    spread covers the miss) that it cannot tell: then it is noisy, and the check is not passed
    either (a busy machine never passes a poor model). A class fails when any of its rows is off,
    so a coefficient that only a few rows feel (decode's t0 and g, the attention term at long
    contexts) cannot hide behind the others."""
    out, classes, failures, inconclusive = [], {}, [], []
    for r in rows:
        m = r.measurement
        predicted = model.predict(m) + request_overhead_s * m.num_requests
        ratio = m.seconds / predicted if predicted > 0 else math.inf
        miss = abs(ratio - 1)
        passed = miss <= tolerance
        out.append({"label": m.label, "kind": r.kind, "measured_s": m.seconds, "predicted_s": predicted,
                    "ratio": ratio, "bound": tolerance, "spread": r.spread, "passed": passed,
                    "noisy": not passed and _within_noise(miss, r.spread)})
    for kind in KINDS:
        members = [x for x in out if x["kind"] == kind]
        if not members:
            continue
        worst = max(members, key=lambda x: abs(x["ratio"] - 1))
        off = [x for x in members if not x["passed"] and not x["noisy"]]
        noisy = [x for x in members if x["noisy"]]
        classes[kind] = {"worst": worst["label"], "ratio": worst["ratio"], "bound": tolerance,
                         "passed": not off and not noisy, "noisy": bool(noisy and not off)}
        if off:
            w = max(off, key=lambda x: abs(x["ratio"] - 1))
            failures.append(f"{kind} rows: {w['label']} runs {w['ratio']:.2f}x the predicted time "
                            f"(bound +-{tolerance:.2f})")
        elif noisy:
            w = max(noisy, key=lambda x: abs(x["ratio"] - 1))
            inconclusive.append(f"{kind} rows: {w['label']} runs {w['ratio']:.2f}x the predicted time, within "
                                f"{SPREAD_FACTOR:g}x its repeats' spread (+-{w['spread']:.2f})")
    cold_turn = None
    cold = [(r, x) for r, x in zip(rows, out) if r.kind == "cold"]
    if cold:
        target = typical_context or int(statistics.median(r.measurement.num_tokens for r, _ in cold))
        r, x = min(cold, key=lambda rx: abs(rx[0].measurement.num_tokens - target))
        context = int(r.measurement.num_tokens)
        predicted = model.predict(prefill("", 0.0, context, chunk_tokens=chunk_tokens)) + request_overhead_s
        ratio = r.measurement.seconds / predicted if predicted > 0 else math.inf
        cold_turn = {"context_tokens": context, "measured_s": r.measurement.seconds, "predicted_s": predicted,
                     "ratio": ratio, "bound": tolerance, "passed": abs(ratio - 1) <= tolerance}
        if not cold_turn["passed"]:
            (inconclusive if _within_noise(abs(ratio - 1), r.spread) else failures).append(
                f"the cold turn at {context} tokens runs {ratio:.2f}x the predicted time")
    median = statistics.median(x["ratio"] for x in out) if out else math.nan
    return CostCheck(model.name, out, classes, cold_turn, median, failures, inconclusive)
