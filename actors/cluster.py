"""Joining a Ray cluster, or starting a small local one."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import Iterator, Optional

import ray

# A local cluster started for one sweep keeps its object store small: results travel as a few
# MB of Parquet per run, and Ray would otherwise reserve ~30% of the machine's memory.
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
QUIET = {"log_to_driver": False, "logging_level": "ERROR"}
# How long a cluster address may take to connect and to answer the gRPC handshake. ray.init
# itself retries an address where nothing answers for minutes (Ray 2.60: still waiting after
# 2 minutes), so the address is probed first: a dead address fails within 2 x this.
CONNECT_TIMEOUT_S = 10.0
# Every Ray head serves gRPC (the GCS on host:6379, Ray Client on ray://host:10001), and a gRPC
# server answers an HTTP/2 client preface with a SETTINGS frame: that is the probe.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS
_HTTP2_SETTINGS = 4
_FRAME_HEADER_BYTES = 9


class ClusterUnreachable(ConnectionError):
    """The Ray cluster named by --address (or $RAY_ADDRESS) does not answer; the message names it."""


@contextmanager
def ray_cluster(address: Optional[str] = None) -> Iterator[None]:
    """Connected to ``address`` (else $RAY_ADDRESS, set inside `ray job submit`); with neither,
    a local cluster on this machine's CPUs and GPUs, shut down on exit. An already initialized
    Ray (a test fixture, a notebook) is used as it is."""
    if ray.is_initialized():
        yield
        return
    source = "--address" if address else "$RAY_ADDRESS"
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        check_answers(address, source)
        try:
            ray.init(address=address, **QUIET)
        except ConnectionError as exc:  # e.g. "auto" with no cluster running on this node
            raise ClusterUnreachable(f"{source} {address}: {exc}") from None
    else:
        # "local", not None: a stale ray_current_cluster file would otherwise be joined
        ray.init(address="local", include_dashboard=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **QUIET)
    try:
        yield
    finally:
        ray.shutdown()


def check_answers(address: str, source: str = "--address", timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Raise ``ClusterUnreachable`` naming ``address`` unless a gRPC server (a Ray head) answers there.

    ``auto`` and ``local`` are left to Ray (they name no host)."""
    if address in ("auto", "local"):
        return
    host_port = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = host_port.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterUnreachable(f"{source} {address}: expected the head node's host:port (e.g. 10.0.0.5:6379) "
                                 "or ray://host:10001")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(_HTTP2_PREFACE)
            header = b""
            while len(header) < _FRAME_HEADER_BYTES:
                chunk = sock.recv(_FRAME_HEADER_BYTES - len(header))
                if not chunk:
                    break
                header += chunk
    except socket.timeout:
        raise ClusterUnreachable(f"{source} {address}: no Ray cluster answers there (no answer within "
                                 f"{timeout_s:g} s); is the head node up (`ray start --head`) and the port open?"
                                 ) from None
    except OSError as exc:
        raise ClusterUnreachable(f"{source} {address}: no Ray cluster answers there ({exc.strerror or exc}); "
                                 "is the head node up (`ray start --head`)?") from None
    if len(header) < _FRAME_HEADER_BYTES or header[3] != _HTTP2_SETTINGS:
        raise ClusterUnreachable(f"{source} {address}: something listens there but it is not a Ray head (no gRPC "
                                 "answer); give the head node's GCS address host:6379, or ray://host:10001")


def cluster_resources() -> dict[str, float]:
    return dict(ray.cluster_resources())


def num_alive_nodes() -> int:
    return sum(1 for node in ray.nodes() if node.get("Alive"))
