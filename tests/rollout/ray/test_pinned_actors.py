"""2 Ray actors at batch 1 and at ``envs=4``: the bytes of the same runs in this process, and the pinned digests."""

from __future__ import annotations

import pytest

from tests.rollout.pinned import ACTOR_RUN, check, run_digests


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (127.0.0.1 only) for the module."""
    ray = pytest.importorskip("ray")
    from rollcap.rollout.ray.connect import connect

    if ray.is_initialized():
        ray.shutdown()
    assert connect(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.mark.slow(seconds=60)
def test_2_actor_runs_are_the_in_process_bytes_and_the_pinned_ones(ray_local, tmp_path):
    """2 actors (shards) at batch 1 and at envs=4: each episode's digest is the in-process run's, and the pinned one."""
    batch_1 = run_digests(tmp_path / "a1", actors=2, **ACTOR_RUN)
    assert batch_1 == run_digests(tmp_path / "h1", **ACTOR_RUN)
    check("actors2", batch_1)
    more = {**ACTOR_RUN, "episodes": 8}
    batch_4 = run_digests(tmp_path / "a4", actors=2, envs=4, **more)
    assert batch_4 == run_digests(tmp_path / "h4", envs=4, **more)
    check("actors2_envs4", batch_4)
