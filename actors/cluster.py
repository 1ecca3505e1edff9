"""Joining a Ray cluster, or starting a small local one."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator, Optional

import ray

# A local cluster started for one sweep keeps its object store small: results travel as a few
# MB of Parquet per run, and Ray would otherwise reserve ~30% of the machine's memory.
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
QUIET = {"log_to_driver": False, "logging_level": "ERROR"}


@contextmanager
def ray_cluster(address: Optional[str] = None) -> Iterator[None]:
    """Connected to ``address`` (else $RAY_ADDRESS, set inside `ray job submit`); with neither,
    a local cluster on this machine's CPUs and GPUs, shut down on exit. An already initialized
    Ray (a test fixture, a notebook) is used as it is."""
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, **QUIET)
    else:
        # "local", not None: a stale ray_current_cluster file would otherwise be joined
        ray.init(address="local", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **QUIET)
    try:
        yield
    finally:
        ray.shutdown()


def cluster_resources() -> dict[str, float]:
    return dict(ray.cluster_resources())


def num_alive_nodes() -> int:
    return sum(1 for node in ray.nodes() if node.get("Alive"))
