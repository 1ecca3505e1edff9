"""Session shapes: what each agent session sends, turn by turn (token counts and gaps only).

This package imports nothing from the rest of agent-loadgen: shapes are plain data.
"""

# each name loads its module on first use: a synthetic run needs none of the loaders, and their
# imports and dataclasses cost every command ~20 ms
_LAZY = {
    "describe_sessions": "describe", "format_description": "describe", "DatasetRows": "hf", "load_hf": "hf",
    "FORMATS": "loaders", "LoadedTrace": "loaders", "TraceFormatError": "loaders", "load_rows": "loaders",
    "load_swebench": "loaders", "load_trace": "loaders", "swebench_shapes_path": "loaders",
    "RecordedSession": "records", "EmpiricalGaps": "replay", "ExponentialGaps": "replay",
    "GapFallback": "replay", "ReplayOptions": "replay", "ReplayStats": "replay", "TraceReplay": "replay",
    "build_replay": "replay", "select_models": "replay", "FileRows": "rows", "LoaderOptions": "rows",
    "RowSource": "rows", "SessionShape": "shape", "MixShiftSessions": "synthetic",
    "SyntheticSessions": "synthetic", "GeneratedReplay": "tracelab", "TraceLabLikeSessions": "tracelab",
    "FORK": "tree", "SPAWN": "tree", "Branch": "tree", "Child": "tree", "ParallelCalls": "tree",
    "RecordedTree": "tree", "Tree": "tree", "TREE_FORMATS": "tree_loaders", "LoadedTrees": "tree_loaders",
    "load_trees": "tree_loaders", "TREE_PRESETS": "tree_presets", "OrchestratorWorkers": "tree_presets",
    "ParallelTools": "tree_presets", "TreeSearch": "tree_presets", "node_stream": "tree_presets",
    "tree_preset": "tree_presets",
}

__all__ = [
    "FORMATS", "DatasetRows", "EmpiricalGaps", "FileRows", "LoaderOptions", "RowSource", "load_hf", "load_rows", "ExponentialGaps", "GapFallback", "GeneratedReplay", "LoadedTrace",
    "MixShiftSessions", "RecordedSession", "ReplayOptions", "ReplayStats", "SessionShape", "SyntheticSessions",
    "TraceFormatError", "TraceLabLikeSessions", "TraceReplay", "build_replay", "describe_sessions",
    "format_description", "load_swebench", "load_trace", "select_models", "swebench_shapes_path",
    "FORK", "SPAWN", "Branch", "Child", "ParallelCalls", "RecordedTree", "Tree", "TREE_FORMATS", "LoadedTrees",
    "load_trees", "TREE_PRESETS", "OrchestratorWorkers", "ParallelTools", "TreeSearch", "node_stream", "tree_preset",
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
