"""The simulated engine: a vLLM-v1-style step machine over a shared, prefix-cached block pool."""

from .cost import PRESETS, StepCostModel, get_preset
from .engine import EngineConfig, SimEngine
from .request import SimRequest

__all__ = ["EngineConfig", "PRESETS", "SimEngine", "SimRequest", "StepCostModel", "get_preset"]
