"""The golden runs, a batch-8 run in process and the same run on 2 env workers: the pinned digests (``pinned.py``)."""

from __future__ import annotations

import pytest

from rollcap.rollout.recording import episode_digest
from tests.rollout.pinned import BATCH_RUN, check, run_digests
from tests.rollout.test_golden import RUNS


@pytest.mark.slow(seconds=20)
def test_golden_runs_keep_their_pinned_digests(tmp_path):
    """The golden runs give the digests pinned before the refactor, driven by one host and by ``rollcap.run``."""
    from rollcap.rollout.spec import Parts
    from rollcap.rollout.build import make_env, make_runners
    from rollcap.rollout.config import HostConfig
    from rollcap.rollout.host import RolloutHost

    policy, critic = make_runners(Parts())
    env = make_env()
    by_host, by_run = {}, {}
    try:
        for seed, n, kw in RUNS:
            host = RolloutHost(env, policy, critic, HostConfig(seed=seed, **kw))
            by_host.update({f"{seed}/{e.index}": episode_digest(e.record) for e in host.run(n)})
    finally:
        policy.close()
        critic.close()
        env.close()
    for seed, n, kw in RUNS:
        got = run_digests(tmp_path / f"s{seed}", n, seed=seed, **kw)
        by_run.update({f"{seed}/{i}": d for i, d in got.items()})
    assert by_run == by_host
    check("golden", by_host)


@pytest.mark.slow(seconds=40)
def test_a_batch_8_run_is_the_same_bytes_in_process_and_on_2_env_workers(tmp_path):
    """``envs=8`` in this process and on 2 env workers: the same digests, and those pinned."""
    here = run_digests(tmp_path / "here", envs=8, **BATCH_RUN)
    workers = run_digests(tmp_path / "workers", envs=8, env_workers=2, **BATCH_RUN)
    assert len(here) == BATCH_RUN["episodes"] and workers == here
    check("envs8", here)
