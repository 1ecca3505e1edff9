"""One local Ray cluster for every Ray test: 2 CPUs, 4 fake GPUs, quiet, small."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_local(tmp_path_factory):
    import ray

    previous = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # token auth would need a token for every client
    # workers' scratch files (an engine actor killed by a test cannot remove its own) go to pytest's tmp
    scratch = str(tmp_path_factory.mktemp("ray-workers"))
    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False,
             logging_level="ERROR", object_store_memory=200 * 2**20,
             _temp_dir=str(tmp_path_factory.mktemp("ray")), runtime_env={"env_vars": {"TMPDIR": scratch}})
    try:
        yield ray
    finally:
        ray.shutdown()
        if previous is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = previous
