"""Real endpoints in wall-clock time: the OpenAI-compatible HTTP client (the engine seam for real
servers), the live runner, serve-sim (the simulated engine behind vLLM's HTTP API) and calibration
of the step-cost model against a real engine."""
