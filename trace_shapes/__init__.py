"""Session shapes: what each agent session sends, turn by turn (token counts and gaps only).

This package imports nothing from the rest of agent-loadgen: shapes are plain data.
"""

from .shape import SessionShape
from .synthetic import MixShiftSessions, SyntheticSessions

__all__ = ["MixShiftSessions", "SessionShape", "SyntheticSessions"]
