"""The run core, the same whatever the engine: spec -> workload -> sessions -> gateway -> engine seam -> recorder.

``spec`` (typed experiment specs), ``clock`` (the virtual and wall clocks: the one time seam),
``workload`` (seeded arrivals, triggers, session plans), ``session`` (the closed loop),
``gateway`` (the actuator that runs a controller policy), ``engines`` (the engine seam and the
simulated engine behind it), ``recording`` (Parquet written as the run goes), ``runner`` (one
simulated run in virtual time). Never imports ``loadgen.live``, ``actors`` or Ray.
"""
