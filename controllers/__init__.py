"""Gateway limits: pure policies over plain data (no I/O, no clock reads, no Ray).

The actuator (loadgen.gateway) owns the queues and asks a policy two questions, with the
gateway's state and the time passed in: may this session be admitted, and should this admitted
session be parked at its turn boundary. ``make_policy`` maps names to policies (docs/experiments.md#gateway-controllers:
none, admission-only, session-cap, adaptive-cap, aimd, budgeter); an unknown name or parameter is
an error that lists the valid ones.
"""

from .adaptive import AdaptiveCap
from .aimd import LatencyAimd
from .base import GatewayView, NoLimit, Policy
from .budgeter import KvBudgeter
from .caps import AdmissionOnlyCap, SessionCap
from .registry import POLICIES, make_policy, policy_params
from .thunderagent import Program, ThunderAgent

__all__ = ["AdaptiveCap", "AdmissionOnlyCap", "GatewayView", "KvBudgeter", "LatencyAimd", "NoLimit",
           "POLICIES", "Policy", "Program", "SessionCap", "ThunderAgent", "make_policy", "policy_params"]
