"""Gateway limits: pure policies over plain data (no I/O, no clock reads, no Ray).

The actuator (loadgen.gateway) owns the queues and asks a policy two questions, with the
gateway's state and the time passed in: may this session be admitted, and should this admitted
session be parked at its turn boundary. ``make_policy`` maps names to policies; an unknown name
is an error that lists the valid ones.
"""

from .base import GatewayView, NoLimit, Policy
from .registry import POLICIES, make_policy

__all__ = ["GatewayView", "NoLimit", "POLICIES", "Policy", "make_policy"]
