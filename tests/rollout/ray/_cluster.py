"""A two-node Ray cluster on loopback for one test module (a head and a worker, one CPU each)."""

from __future__ import annotations

import contextlib

import pytest


@contextlib.contextmanager
def two_node_cluster(env: dict | None = None, **head_node_args):
    """Start a head and a worker node, one CPU each, with gRPC's fork handlers off (README); yield the ``Cluster``.

    This process is disconnected from Ray before the cluster starts and after it stops.

    ``env``: more environment for the nodes (set before they start, undone after).
    """
    import ray
    from ray.cluster_utils import Cluster

    from rollcap.rollout.ray.connect import FORK_SAFE_ENV

    if (
        ray.is_initialized()
    ):  # a connection left by an earlier module would be reused (connect() keeps one) and point at a dead cluster
        ray.shutdown()

    mp = pytest.MonkeyPatch()
    for k, v in {**FORK_SAFE_ENV, **(env or {})}.items():
        mp.setenv(k, v)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **head_node_args})
    try:
        c.add_node(num_cpus=1, include_dashboard=False)
        c.wait_for_nodes()
        yield c
    finally:
        if ray.is_initialized():  # a test that joined and kept the connection: it must not outlive the cluster
            ray.shutdown()
        c.shutdown()
        mp.undo()
