"""rollcap.run(writers=N): episodes recorded by N child processes, one shard each; the same episodes as the thread writes."""

from __future__ import annotations

import pytest

import rollcap
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.recording import iter_episodes
from rollcap.rollout.recording.codec import episode_digest
from rollcap.rollout.recording.shards import is_sharded

pytestmark = pytest.mark.slow(seconds=40)


def _digests(run) -> dict[int, str]:
    return {rec.index: episode_digest(rec) for _, rec in iter_episodes(run)}


def test_writer_processes_record_the_same_episodes_and_resume(tmp_path):
    """Two writer processes (batched run, both formats) give the thread writer's digests, a sharded run, and resume."""
    kw = dict(envs=2, max_chunks=2, progress=False)
    rollcap.run(episodes=4, out=tmp_path / "thread", **kw)
    res = rollcap.run(episodes=3, out=tmp_path / "procs", writers=2, **kw)
    assert res.summary["episodes"] == 3 and is_sharded(tmp_path / "procs")
    res = rollcap.run(episodes=4, out=tmp_path / "procs", writers=2, resume=True, **kw)
    assert res.summary["episodes"] == 4
    assert _digests(tmp_path / "procs") == _digests(tmp_path / "thread")
    with pytest.raises(ConfigError, match="writers: expected an integer in 0..64, got -1"):
        rollcap.run(episodes=1, out=tmp_path / "bad", writers=-1)
    assert not (tmp_path / "bad").exists()
