"""agent-loadgen: closed-loop agent sessions against real or simulated LLM engines."""

__version__ = "0.1.0"
