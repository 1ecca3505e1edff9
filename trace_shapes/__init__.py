"""Session shapes: what each agent session sends, turn by turn (token counts and gaps only).

This package imports nothing from the rest of agent-loadgen: shapes are plain data.
"""

from .describe import describe_sessions, format_description
from .hf import DatasetRows, load_hf
from .loaders import FORMATS, LoadedTrace, TraceFormatError, load_rows, load_swebench, load_trace, swebench_shapes_path
from .records import RecordedSession
from .rows import FileRows, LoaderOptions, RowSource
from .replay import (EmpiricalGaps, ExponentialGaps, GapFallback, ReplayOptions, ReplayStats, TraceReplay,
                     build_replay, select_models)
from .shape import SessionShape
from .synthetic import MixShiftSessions, SyntheticSessions
from .tracelab import GeneratedReplay, TraceLabLikeSessions
from .tree import FORK, SPAWN, Branch, Child, ParallelCalls, RecordedTree, Tree
from .tree_loaders import TREE_FORMATS, LoadedTrees, load_trees
from .tree_presets import TREE_PRESETS, OrchestratorWorkers, ParallelTools, TreeSearch, node_stream, tree_preset

__all__ = [
    "FORMATS", "DatasetRows", "EmpiricalGaps", "FileRows", "LoaderOptions", "RowSource", "load_hf", "load_rows", "ExponentialGaps", "GapFallback", "GeneratedReplay", "LoadedTrace",
    "MixShiftSessions", "RecordedSession", "ReplayOptions", "ReplayStats", "SessionShape", "SyntheticSessions",
    "TraceFormatError", "TraceLabLikeSessions", "TraceReplay", "build_replay", "describe_sessions",
    "format_description", "load_swebench", "load_trace", "select_models", "swebench_shapes_path",
    "FORK", "SPAWN", "Branch", "Child", "ParallelCalls", "RecordedTree", "Tree", "TREE_FORMATS", "LoadedTrees",
    "load_trees", "TREE_PRESETS", "OrchestratorWorkers", "ParallelTools", "TreeSearch", "node_stream", "tree_preset",
]
