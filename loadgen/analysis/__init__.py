"""What the recorded runs say: windows, per-run outcomes, recovery, paired statistics, tables, figures.

The package face for notebooks and scripts: ``load_results(DIR)`` reads a results directory
(its summary and runs by arm); the other names are the measures and renderers the report uses.
Figures and the real-vs-simulated comparison import matplotlib, so they load on first use.
"""

from .latency import LATENCY_METRICS, format_latency_table, latency_by_arm, latency_outcome, turn_latencies
from .outcomes import run_outcome
from .paired import paired_comparisons, sign_test_p
from .recovery import (Cohort, cohort, cohort_completion_by_arrival, collapsed_at, control_outcome,
                       first_phase_end_s, first_turn_gateway_waits_s, quantile_nearest_rank, recovery_table,
                       recovery_time_s)
from .runs import SAMPLES_SCHEMA, SESSIONS_SCHEMA, TURNS_SCHEMA, RunData, load_run
from .summary import Results, ResultsError, check_results_dir, load_results, summarize, write_summary
from .tables import format_outcome_table, format_recovery_table, outcome_table
from .sessions import session_results, task_outcome
from .slo import slo_of, slo_outcome
from .uncertainty import bootstrap_interval, compare_arms, format_arm_comparison, paired_difference
from .windows_table import read_windows, window_table, write_windows
from .windows import (DEGRADED_HIT_RATIO, WindowSeries, degraded_windows, ends_degraded, hit_ratio_between,
                      persistently_degraded, window_series)

_LAZY = {
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
