"""Typed, validated experiment specs. The CLI is a thin layer over these models.

Times are seconds (``*_s``); every ``*_s`` field also accepts ``*_min`` (minutes) in YAML, as
docs/experiments.md writes them ("5 min at minute 15"). Unknown fields are errors. One module per part
of a spec: ``engines``, ``sessions``, ``triggers``, and ``experiment`` (arms, controllers, SLOs, parsing).
"""

from .base import SpecError, error_message
from .engines import (EngineSpec, LaunchedEngineSpec, OffloadSpec, OpenAIEngineSpec, RetrySpec,
                      RouterSpec, SGLangOptionsSpec, SimEngineSpec, normalize_endpoint_url)
from .sessions import (EmpiricalGapSpec, ExponentialGapSpec, GapFallbackSpec, HFDatasetSessionSpec,
                       HFSourceSpec, SessionSpec, SwebenchSessionSpec, SyntheticSessionSpec,
                       TraceFileSessionSpec, TraceLabSyntheticSessionSpec, WorkloadSpec, build_session_model)
from .trees import TreeSessionSpec
from .triggers import (BurstTrigger, ExtraSessionsTrigger, FlushTrigger, MixShiftTrigger, RateChangeTrigger,
                       Trigger)
from .experiment import (ArmSpec, ControllerSpec, ExperimentSpec, RecordingSpec, SLOSpec, check_spec_files,
                         load_spec, parse_seeds, parse_spec)

__all__ = [
    "ArmSpec", "BurstTrigger", "ControllerSpec", "EmpiricalGapSpec", "EngineSpec", "ExperimentSpec",
    "ExponentialGapSpec", "ExtraSessionsTrigger", "FlushTrigger", "GapFallbackSpec", "HFDatasetSessionSpec",
    "HFSourceSpec", "LaunchedEngineSpec", "MixShiftTrigger", "OffloadSpec", "OpenAIEngineSpec",
    "RateChangeTrigger", "RecordingSpec", "RetrySpec", "RouterSpec", "SGLangOptionsSpec", "SLOSpec", "SessionSpec",
    "SimEngineSpec", "SpecError", "SwebenchSessionSpec", "SyntheticSessionSpec", "TraceFileSessionSpec",
    "TraceLabSyntheticSessionSpec", "TreeSessionSpec", "Trigger", "WorkloadSpec", "build_session_model", "check_spec_files",
    "error_message",
    "load_spec", "normalize_endpoint_url", "parse_seeds", "parse_spec",
]
