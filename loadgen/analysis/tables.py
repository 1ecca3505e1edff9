"""The printed tables: paired outcomes and recovery, as fixed-width text."""

from __future__ import annotations

import textwrap
from typing import Any, Callable, Mapping, Optional, Sequence

from .ideal import ideal_hit_lines
from .replicas import replica_lines
from .windows import DEGRADED_HIT_RATIO


def table_arms(summary: Mapping[str, Any]) -> list[str]:
    """Baseline arm, then each compared arm after its own baseline, then any other arm with runs."""
    pairs = summary.get("pairs") or {}
    arms = [pairs.get("baseline_arm")] if pairs.get("baseline_arm") else []
    for c in pairs.get("comparisons", []):
        arms += [c.get("baseline_arm") or pairs.get("baseline_arm"), c["arm"]]
    arms += [r["arm"] for r in summary.get("runs", [])]
    return list(dict.fromkeys(arms))

def outcome_table(summary: Mapping[str, Any]) -> list[dict]:
    """One row per seed: {"seed": int, "arms": {arm: {hit/sessions/degraded fields} or None}}.

    Arms appear baseline first; an arm without a run for that seed maps to None.
    """
    arms = table_arms(summary)
    by_seed: dict[int, dict[str, dict]] = {}
    for run in summary.get("runs", []):
        by_seed.setdefault(int(run["seed"]), {})[run["arm"]] = {
            "hit_ratio_last10min": run["hit_ratio_last10min"],
            "sessions_in_system_last5min": run["sessions_in_system_last5min"],
            "persistently_degraded": bool(run["persistently_degraded"]),
            # .get: summaries written before these fields existed still print
            "ends_degraded": run.get("ends_degraded"),
            "degraded_windows_after_trigger": run.get("degraded_windows_after_trigger"),
            "degraded_only_in_final_window": bool(run.get("degraded_only_in_final_window")),
            "replicas_degraded": _replicas_degraded(run),
        }
    return [
        {"seed": seed, "arms": {arm: by_seed[seed].get(arm) for arm in arms}}
        for seed in sorted(by_seed)
    ]

def fmt_number(value: Optional[float], digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"

SUB_HEADERS = ["hit10m", "sess5m", "degraded", "ends", "degwin"]
TABLE_WIDTH = 100  # a printed table fits a common terminal; more arms go to further blocks


def _blocks(group_widths: Sequence[int], first_width: int) -> list[list[int]]:
    """Consecutive arm indices per block, each block's line (first column, then ' | ' and a
    group per arm) at most TABLE_WIDTH wide; an arm wider than that alone in its block."""
    blocks: list[list[int]] = [[]]
    width = first_width
    for a, w in enumerate(group_widths):
        if blocks[-1] and width + 3 + w > TABLE_WIDTH:
            blocks.append([])
            width = first_width
        blocks[-1].append(a)
        width += 3 + w
    return blocks


def _replicas_degraded(run: Mapping[str, Any]) -> Optional[tuple[int, int]]:
    """(replicas persistently degraded, replicas) of a run on a deployment, else None."""
    replicas = run.get("replicas")
    if not replicas:
        return None
    return (sum(bool(r.get("persistently_degraded")) for r in replicas["per_replica"]), replicas["num_replicas"])


def _replica_totals(comparison: Mapping[str, Any]) -> Optional[dict[str, tuple[int, int]]]:
    """Per side ("arm", "baseline") of a comparison: (replica-runs persistently degraded,
    replica-runs) over its paired seeds; None unless every run of both sides is on a deployment."""
    per_seed = comparison.get("per_seed", [])
    counts = {side: [_replicas_degraded(e[side]) for e in per_seed] for side in ("arm", "baseline")}
    if not per_seed or any(c is None for side in counts.values() for c in side):
        return None
    return {side: (sum(c[0] for c in cs), sum(c[1] for c in cs)) for side, cs in counts.items()}


def _fmt_degraded(cell: Mapping[str, Any]) -> str:
    if not cell["persistently_degraded"]:
        replicas = cell.get("replicas_degraded")
        # the deployment as a whole is not, but some of its replicas are
        return f"{replicas[0]}/{replicas[1]}rep" if replicas and replicas[0] else "no"
    # degraded by the definition, but only its final window is: a late dip, not a collapse
    return "final" if cell["degraded_only_in_final_window"] else "YES"

def _fmt_yes_no(value: Optional[bool]) -> str:
    return "-" if value is None else ("YES" if value else "no")

def _fmt_cell(cell: Optional[Mapping[str, Any]]) -> list[str]:
    if cell is None:
        return ["-"] * len(SUB_HEADERS)
    return [
        fmt_number(cell["hit_ratio_last10min"], 3),
        fmt_number(cell["sessions_in_system_last5min"], 1),
        _fmt_degraded(cell),
        _fmt_yes_no(cell["ends_degraded"]),
        fmt_number(cell["degraded_windows_after_trigger"], 2),
    ]

def _count_per_seed(comparison: Mapping[str, Any], side: str, field: str) -> int:
    return sum(bool(entry[side].get(field)) for entry in comparison.get("per_seed", []))

def _fmt_comparison(comparison: Mapping[str, Any], baseline_arm: str) -> str:
    arm, n_pairs = comparison["arm"], comparison["n_pairs"]
    baseline_arm = comparison.get("baseline_arm") or baseline_arm  # summaries before per-comparison baselines
    line = (
        f"{arm} vs {baseline_arm}: {n_pairs} pairs; persistently degraded "
        f"{comparison['degraded_arm']}/{n_pairs} ({arm}) vs "
        f"{comparison['degraded_baseline']}/{n_pairs} ({baseline_arm}); discordant pairs "
        f"{comparison['discordant_arm_only']} ({arm} only) / "
        f"{comparison['discordant_baseline_only']} ({baseline_arm} only); "
        f"two-sided sign test p = {comparison['sign_test_p']:.4g}"
    )
    final_only = {side: _count_per_seed(comparison, side, "degraded_only_in_final_window")
                  for side in ("arm", "baseline")}
    if any(final_only.values()):
        line += (f"; of the degraded, only in the final window: {final_only['arm']} ({arm}) / "
                 f"{final_only['baseline']} ({baseline_arm})")
    ends = {side: _count_per_seed(comparison, side, "ends_degraded") for side in ("arm", "baseline")}
    line += f"; ends degraded {ends['arm']}/{n_pairs} ({arm}) vs {ends['baseline']}/{n_pairs} ({baseline_arm})"
    replicas = _replica_totals(comparison)
    if replicas is not None:
        line += "; replicas persistently degraded " + " vs ".join(
            f"{replicas[side][0]}/{replicas[side][1]} ({name})" for side, name in (("arm", arm), ("baseline", baseline_arm)))
    return line

def router_verdict_lines(pairs: Mapping[str, Any]) -> list[str]:
    """For runs on deployments, per compared pair (a router's burst arm and its no-burst twin):
    whether each arm stayed healthy at this load, with what that rests on: safe means no run and
    no replica persistently degraded, and then the 95% upper bound on P(degraded) its runs allow."""
    from ..map.analysis import SAFE_P, wilson_interval

    def verdict(arm: str, runs: int, n: int, replicas: tuple[int, int]) -> str:
        bad, total = replicas
        if runs or bad:
            return f"{arm} not safe ({runs}/{n} runs, {bad}/{total} replica-runs persistently degraded)"
        upper = wilson_interval(0, n)[1]
        return (f"{arm} safe in {n} runs (no run or replica degraded: P(degraded) <= {upper:.0%}, 95% upper "
                f"bound{'' if upper < SAFE_P else '; more seeds to show < ' + format(SAFE_P, '.0%')})")

    rows = []
    for c in pairs.get("comparisons", []):
        replicas = _replica_totals(c)
        if replicas is None:
            continue
        router = (c["per_seed"][0]["arm"].get("replicas") or {}).get("router") or "?"
        baseline = c.get("baseline_arm") or pairs.get("baseline_arm")
        rows.append(f"  {router}: {verdict(c['arm'], c['degraded_arm'], c['n_pairs'], replicas['arm'])}; "
                    f"{verdict(baseline, c['degraded_baseline'], c['n_pairs'], replicas['baseline'])}")
    if not rows:
        return []
    return ["routers at this load (safe: no run and no replica persistently degraded, over the paired seeds):", *rows]


def format_outcome_table(summary: Mapping[str, Any]) -> str:
    """The paired outcome table as fixed-width text, followed by one line per comparison."""
    arms = table_arms(summary)
    rows = outcome_table(summary)
    sub_headers = SUB_HEADERS
    per_arm = len(sub_headers)

    header = ["seed"] + sub_headers * len(arms)
    body = [
        [str(row["seed"])] + [cell for arm in arms for cell in _fmt_cell(row["arms"][arm])]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    # Each arm name heads its group of columns; widen the group if the name is longer.
    gaps = 2 * (per_arm - 1)  # the 2-space gaps inside a group
    for a, arm in enumerate(arms):
        first = 1 + per_arm * a
        group_width = sum(widths[first : first + per_arm]) + gaps
        widths[first + per_arm - 1] += max(0, len(arm) - group_width)

    def group(cells: Sequence[str], a: int) -> str:
        first = 1 + per_arm * a
        return "  ".join(cells[i].rjust(widths[i]) for i in range(first, first + per_arm))

    def group_width(a: int) -> int:
        return sum(widths[1 + per_arm * a : 1 + per_arm * (a + 1)]) + gaps

    def join(cells: Sequence[str], block: Sequence[int]) -> str:
        parts = [cells[0].rjust(widths[0])] + [group(cells, a) for a in block]
        return " | ".join(parts).rstrip()

    pairs = summary.get("pairs") or {}
    lines = [
        f"Paired outcomes: experiment {summary.get('experiment')} "
        f"(baseline arm: {pairs.get('baseline_arm')})",
    ]
    table = []
    # arms side by side up to TABLE_WIDTH columns, then the next arms in a block of their own
    for block in _blocks([group_width(a) for a in range(len(arms))], widths[0]):
        table += [" | ".join([" " * widths[0]] + [arms[a].ljust(group_width(a)) for a in block]).rstrip(),
                  join(header, block)]
        table += [join(cells, block) for cells in body]
    flavors = {}
    for run in summary.get("runs") or []:
        if run.get("engine_flavor"):
            flavors.setdefault(run["arm"], set()).add(run["engine_flavor"])
    if flavors:  # which engine each arm ran on (arms may differ: arms[].engine)
        names = {arm: "/".join(FLAVOR_NAMES.get(f, f) for f in sorted(flavors[arm])) for arm in arms if arm in flavors}
        if len(set(names.values())) == 1 and len(names) == len(arms):
            lines.insert(1, f"engine: {next(iter(names.values()))} (every arm)")
        else:
            lines.insert(1, "engine per arm: " + ", ".join(f"{arm} {name}" for arm, name in names.items()))
    offload = {}
    for run in summary.get("runs") or []:
        offload.setdefault(run["arm"], set()).add(run.get("offload_cpu_tokens"))
    if any(v != {None} for v in offload.values()):  # the CPU KV tier each arm ran with
        lines.insert(1, "CPU offload tier: " + ", ".join(
            f"{arm} " + "/".join("none" if t is None else f"{t:,} tokens" for t in sorted(offload[arm], key=str))
            for arm in arms if arm in offload))
    lines += table
    lines += textwrap.wrap(
        "hit10m: token-weighted hit ratio, last 10 min; sess5m: mean sessions in system, "
        "last 5 min; degraded: persistently degraded (final: only its final 5-min window is; k/Nrep: the "
        "deployment is not, k of its N replicas are); "
        f"ends: hit10m < {DEGRADED_HIT_RATIO:g}; degwin: share of the 5-min windows after the trigger that are degraded",
        TABLE_WIDTH, subsequent_indent="  ")
    for comparison in pairs.get("comparisons", []):
        lines.append(_fmt_comparison(comparison, str(pairs.get("baseline_arm"))))
    lines += router_verdict_lines(pairs)
    lines += ideal_hit_lines(summary, arms)
    lines += replica_lines(summary, arms)  # runs on a deployment (docs/deployments.md#records)
    lines += drain_lines(summary)
    incomplete = summary.get("incomplete_runs") or []
    if incomplete:
        lines.append(f"incomplete runs (not counted): {', '.join(incomplete)}")
    unreadable = summary.get("unreadable_runs") or []
    if unreadable:
        lines.append(f"unreadable runs (not counted): {', '.join(e['run_id'] for e in unreadable)}")
    warning = lag_warning([run["run_id"] for run in summary.get("runs", []) if run.get("lagging")])
    if warning:
        lines.append(warning)
    return "\n".join(lines)


FLAVOR_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def drain_lines(summary: Mapping[str, Any]) -> list[str]:
    """The cold-turn fit and, for runs whose rate dropped after a collapse, the drift of the cold
    work they still owe (loadgen.analysis.drain); [] when the summary has neither."""
    lines = []
    fit = summary.get("cold_turn_fit")
    if fit:
        lines.append(f"cold turn (cache-off runs, {fit['windows']} busy 1-min windows): c(L) = "
                     f"{fit['intercept_s']:+.3f} s + {fit['slope_s_per_token'] * 1e3:.4f} ms x L; session cold work "
                     f"S = {fit['session_cold_work_s']:.1f} s, break-even rate 1/S = {fit['break_even_rate_per_s']:.4f}/s"
                     if fit.get("session_cold_work_s") else
                     f"cold turn (cache-off runs): c(L) = {fit['intercept_s']:+.3f} s + "
                     f"{fit['slope_s_per_token'] * 1e3:.4f} ms x L")
    drifting = [r for r in summary.get("runs") or [] if r.get("rate_after_change_per_s") is not None]
    if drifting:
        lines.append("after the rate change (collapsed runs): rate -> cold-work drift per hour")
        for r in sorted(drifting, key=lambda r: (r["rate_after_change_per_s"], r["seed"])):
            drift = r.get("cold_work_drift_s_per_h")
            lines.append(f"  {r['arm']} seed {r['seed']}: {r['rate_after_change_per_s']:.4f}/s -> "
                         + ("n/a (no cold-turn fit)" if drift is None else f"{drift:+.0f} s/h"))
    return lines


def lag_warning(run_ids: Sequence[str]) -> Optional[str]:
    """The line naming runs that fell behind their time scale (run.json ``lagging``), or None."""
    if not run_ids:
        return None
    return (f"warning: lagging runs (the load generator or serve-sim fell behind the time scale, so their "
            f"timings are not the spec's; run.json \"lag\" has the figures): {', '.join(run_ids)}")

def _fmt_recovery_minutes(minutes: Optional[float]) -> str:
    """docs/experiments.md#measurements: recovery times under 5 minutes are reported as "<5"."""
    if minutes is None:
        return "-"
    return "<5" if minutes < 5 else f"{minutes:.0f}"

def _fmt_completion_minutes(row: Mapping[str, Any], key: str) -> str:
    if row[key] is not None:
        return f"{row[key]:.1f}"
    return "-" if not row["cohort_sessions"] else "n/f"

def format_recovery_table(summary: Mapping[str, Any]) -> Optional[str]:
    """The per-arm recovery table as fixed-width text; None when the summary has none."""
    rows = summary.get("recovery")
    if not rows:
        return None
    header = ["arm", "controller", "ctl@min", "collapsed", "recovered", "recover min",
              "hit10m", "cohort20", "done med", "done p90"]
    body = []
    for row in rows:
        basis_mark = "" if row["basis"] == "collapsed" else "*"
        times = _fmt_recovery_minutes(row["recovery_time_min_median"])
        if row["num_recovered"] > 1:
            times += f" ({_fmt_recovery_minutes(row['recovery_time_min_max'])})"
        body.append([
            row["arm"], str(row["controller"]), f"{row['control_start_s'] / 60:g}",
            f"{row['num_collapsed']}/{row['num_runs']}",
            f"{row['num_recovered']}/{row['num_basis']}{basis_mark}", times,
            fmt_number(row["hit_ratio_last10min_mean"], 3), fmt_number(row["cohort_done"], 2),
            _fmt_completion_minutes(row, "cohort_completion_median_min"),
            _fmt_completion_minutes(row, "cohort_completion_p90_min"),
        ])
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]

    def join(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    lines = [f"Recovery: experiment {summary.get('experiment')}", join(header)]
    lines += [join(cells) for cells in body]
    lines += _recovery_interval_lines(rows, widths[0])
    # notes wrapped under 120 characters, like the table
    lines += [
        "collapsed: hit ratio < 0.5 in the 5 min before control starts. The columns after it are over",
        "  the arm's collapsed runs (* over all its runs when none collapsed).",
        "recover min: median (max) minutes from control start to the first 5-min window, slid by 1 min,",
        "  from which every window has hit ratio >= 0.8, with >= 10 min of follow-up.",
        "hit10m: mean hit ratio over the last 10 min; cohort20: share of the sessions arriving in the 20 min",
        "  after control start that finished by the run's end; done med/p90: their arrival-to-completion",
        "  minutes (n/f: not finished by the run's end).",
    ]
    return "\n".join(lines)


def _recovery_interval_lines(rows: Sequence[Mapping[str, Any]], arm_width: int) -> list[str]:
    """Bootstrap 95% intervals of the recovery time and cohort completion, one line per arm
    (loadgen/analysis/uncertainty.py); nothing for summaries written before them."""
    if not any("recovery_time_min_ci95" in row for row in rows):
        return []

    def interval(pair: Any, fmt: Callable[[Optional[float]], str]) -> str:
        lo, hi = pair if pair else (None, None)
        return "-" if lo is None else f"[{fmt(lo)}, {fmt(hi)}]"

    lines = ["95% intervals (bootstrap over the runs each row counts, 10000 resamples):",
             f"  {'arm'.ljust(arm_width)}  {'recover min median':>20}  {'cohort20':>14}"]
    for row in rows:
        lines.append(f"  {row['arm'].ljust(arm_width)}  "
                     f"{interval(row.get('recovery_time_min_ci95'), lambda m: f'{m:.0f}'):>20}  "
                     f"{interval(row.get('cohort_done_ci95'), lambda v: f'{v:.2f}'):>14}")
    return lines
