"""The Ray layer: thin adapters that run the core (loadgen/) on a cluster.

The only package that imports ``ray``. ``sweep`` places runs on GPUs and runs them: simulated
runs as Ray tasks, live runs with an ``engine`` actor (vLLM, SGLang or serve-sim on its own
GPU), a ``controller`` actor (the run's gateway), session ``fleet`` actors and a ``recorder``.
"""
