"""What the recorded runs say: windows, per-run outcomes, recovery, paired statistics, tables, figures.

The package face for notebooks and scripts: ``load_results(DIR)`` reads a results directory
(its summary and runs by arm); the other names are the measures and renderers the report uses.
Every name loads its module on first use (figures and the real-vs-simulated comparison import
matplotlib).
"""

# the runner writes windows.parquet through windows_table without importing the rest
_LAZY = {
    "LATENCY_METRICS": "latency", "format_latency_table": "latency", "latency_by_arm": "latency",
    "latency_outcome": "latency", "turn_latencies": "latency", "run_outcome": "outcomes",
    "paired_comparisons": "paired", "sign_test_p": "paired", "Cohort": "recovery", "cohort": "recovery",
    "cohort_completion_by_arrival": "recovery", "collapsed_at": "recovery", "control_outcome": "recovery",
    "first_phase_end_s": "recovery", "first_turn_gateway_waits_s": "recovery",
    "quantile_nearest_rank": "recovery", "recovery_table": "recovery", "recovery_time_s": "recovery",
    "SAMPLES_SCHEMA": "runs", "SESSIONS_SCHEMA": "runs", "TURNS_SCHEMA": "runs", "RunData": "runs",
    "load_run": "runs", "session_results": "sessions", "task_outcome": "sessions", "slo_of": "slo",
    "slo_outcome": "slo", "Results": "summary", "ResultsError": "summary", "check_results_dir": "summary",
    "load_results": "summary", "summarize": "summary", "write_summary": "summary",
    "format_outcome_table": "tables", "format_recovery_table": "tables", "outcome_table": "tables",
    "bootstrap_interval": "uncertainty", "compare_arms": "uncertainty", "format_arm_comparison": "uncertainty",
    "paired_difference": "uncertainty", "DEGRADED_HIT_RATIO": "windows", "WindowSeries": "windows",
    "degraded_windows": "windows", "ends_degraded": "windows", "hit_ratio_between": "windows",
    "persistently_degraded": "windows", "window_series": "windows", "read_windows": "windows_table",
    "window_table": "windows_table", "write_windows": "windows_table",
    "arm_colors": "figures", "write_figures": "figures", "figure_arm_timeseries": "figures",
    "figure_cohort_completion": "figures", "figure_mix_shift_scatter": "figures",
    "figure_latency_over_time": "latency_figures", "figure_cost_of_control": "latency_figures",
    "figure_ttft_vs_depth": "latency_figures",
    "compare_runs": "compare", "format_comparison": "compare", "write_comparison": "compare",
}

__all__ = [
    "load_results", "Results", "ResultsError", "check_results_dir", "summarize", "write_summary",
    "RunData", "load_run", "TURNS_SCHEMA", "SAMPLES_SCHEMA", "SESSIONS_SCHEMA",
    "WindowSeries", "window_series", "hit_ratio_between", "persistently_degraded", "DEGRADED_HIT_RATIO",
    "degraded_windows", "ends_degraded",
    "run_outcome", "control_outcome", "collapsed_at", "recovery_time_s", "recovery_table", "Cohort", "cohort",
    "cohort_completion_by_arrival", "first_phase_end_s", "first_turn_gateway_waits_s", "quantile_nearest_rank",
    "paired_comparisons", "sign_test_p", "outcome_table", "format_outcome_table", "format_recovery_table",
    "LATENCY_METRICS", "turn_latencies", "latency_outcome", "latency_by_arm", "format_latency_table",
    "session_results", "task_outcome", "slo_outcome", "slo_of", "window_table", "write_windows", "read_windows",
    "compare_arms", "format_arm_comparison", "paired_difference", "bootstrap_interval",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
