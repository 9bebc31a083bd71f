"""The case behind test_node_death.py (run in its own interpreter): a worker node dies (its raylet SIGKILLed) during a sharded run on a two-node loopback cluster; the run finishes on the survivor.

Its own cluster (the test takes a node down). Ray's node health checks are
shortened so the death is noticed in seconds, and the replacement timeout so
the test does not wait a minute for the actor that can never be placed.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from rollcap.rollout.recording import episode_digest
from rollcap.rollout.recording.shards import ManifestWriter, read_manifest

import rollcap
from tests.rollout.ray._cluster import two_node_cluster
from tests.rollout._tiny import ENV_KW

pytestmark = pytest.mark.slow
EPISODES = 40


@pytest.fixture(scope="module")
def cluster():
    """A head and a worker node with one CPU each, on loopback; node deaths noticed within about 10-15 s."""
    pytest.importorskip("ray")
    fast = {
        "health_check_period_ms": 1000,
        "health_check_timeout_ms": 3000,
        "health_check_failure_threshold": 10,
    }  # ~10-13 s: a busy machine must not fail a live node
    # a throwaway cluster without token auth: this test is about node death
    with two_node_cluster({"RAY_AUTH_MODE": "disabled"}, _system_config=fast) as c:
        yield c


class _KillWorkerRaylet(rollcap.Subscriber):
    """At the second episode end: SIGKILL the worker node's raylet, and hold the driver until the cluster marks the node dead
    (the node's actor dies with it, mid-episode; the other actor keeps running)."""

    def __init__(self, cluster):
        self.cluster, self.seen, self.killed = cluster, 0, None

    def on_episode_end(self, end) -> None:
        self.seen += 1
        if self.seen == 2:
            from ray._private import ray_constants

            node = (
                self.cluster.worker_nodes[0]
                if not isinstance(self.cluster.worker_nodes, set)
                else next(iter(self.cluster.worker_nodes))
            )
            self.killed = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
            os.kill(self.killed, signal.SIGKILL)
            import ray

            deadline = (
                time.monotonic() + 60
            )  # the actor talks to the driver directly: wait until the cluster knows the node is gone
            while time.monotonic() < deadline and any(n["NodeID"] == node.node_id and n["Alive"] for n in ray.nodes()):
                time.sleep(0.2)


def test_a_raylet_killed_mid_run_loses_nothing_and_the_run_finishes_without_a_new_node(
    cluster, ckpt, tmp_path, monkeypatch, capfd
):
    """kill -9 of the worker raylet: its episode runs again on the head's actor, the replacement that cannot be placed is dropped with one line,
    every episode is recorded exactly once with the in-process run's digest, and replay is exact."""
    from rollcap.rollout.cli import main
    from rollcap.rollout.ray import actors

    monkeypatch.setattr(
        actors, "REPLACE_TIMEOUT_S", 0.2
    )  # well inside the survivor's 38 episodes (~2 s even on a quiet machine): the drop is seen
    names = {
        "policy": Path(ckpt[ckpt.index("--policy") + 1]),
        "critic": Path(ckpt[ckpt.index("--critic") + 1]),
        "env_kwargs": ENV_KW,
        "progress": False,
        "seed": 9,
        "max_chunks": 6,
    }
    local = rollcap.run(EPISODES, out=tmp_path / "local", **names)
    kill = _KillWorkerRaylet(cluster)
    result = rollcap.run(
        EPISODES, out=tmp_path / "cluster", actors=2, address=cluster.address, subscribers=(kill,), **names
    )
    err = capfd.readouterr().err
    assert kill.killed is not None
    s = result.summary
    assert (s["episodes"], s["failed"], s["nodes"], s["actors_dropped"]) == (EPISODES, {}, 2, 1), s
    assert s["actors_replaced"] >= 1
    assert [line for line in err.splitlines() if "replacement actor" in line] == [
        "rollcap: a replacement actor was not ready within 0.2 s (no node has 1 CPU(s) / 0 GPU(s) free for it); going on with 1 actor(s)"
    ]
    with ManifestWriter(
        result.run_dir, resume=True
    ) as m:  # every format of every shard read back, digests against the manifest
        assert [r.index for r in m.verify()] == list(range(EPISODES))
    assert len(read_manifest(result.run_dir)[1]) == EPISODES  # one line per episode: exactly once
    assert {r.index: episode_digest(r) for r in rollcap.load(result.run_dir)} == {
        r.index: episode_digest(r) for r in rollcap.load(local.run_dir)
    }
    assert main(["replay", str(result.run_dir), "--mode", "policy,env", *ckpt]) == 0
