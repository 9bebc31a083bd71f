"""The replay summary counts episodes, however many of their modes failed."""

from __future__ import annotations

from pathlib import Path

from rollcap.rollout.spec import Parts
from rollcap.rollout.offline.replay import MODES, Replayer, summary_line
from rollcap.rollout.recording import iter_episodes
from tests.rollout._other_env import record_inverted_pendulum


def test_an_episode_with_failed_modes_is_counted_once(ckpt, tmp_path):
    """Two InvertedPendulum episodes through a policy that cannot read them: policy mode fails, env mode is exact; '2 episode(s)'."""
    run = record_inverted_pendulum(tmp_path / "ip", episodes=2)
    replayer = Replayer(Parts(policy=Path(ckpt[1]), critic=Path(ckpt[3])))
    try:
        results = [res for source, rec in iter_episodes(run / "episodes") for res in replayer.check(source, rec, MODES)]
    finally:
        replayer.close()
    assert [r.status for r in results if r.mode == "policy"] == ["failed", "failed"]
    assert [r.status for r in results if r.mode == "env"] == ["exact", "exact"]
    line, ok = summary_line(results)
    assert line.startswith("2 episode(s), 3 mode(s): ") and not ok, line
