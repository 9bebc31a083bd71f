"""Ray actors with N envs each (``rollcap run --actors A --envs N``): the in-process ``--envs N`` bytes, every episode once, lost calls re-run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import rollcap
from rollcap.rollout.spec import RunConfig, Parts
from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.ray.actors import call_size, halves, spec_batches
from rollcap.rollout.ray.episodes import RolloutActor, episode_specs
from rollcap.rollout.recording import episode_digest
from rollcap.rollout.recording.shards import ManifestWriter, is_sharded, read_manifest
from tests.rollout._tiny import ENV_KW

EPISODES = 8
ENVS = 2
CFG = {"seed": 11, "max_chunks": 6}


@pytest.fixture(scope="module")
def parts(ckpt) -> Parts:
    return Parts(
        env_kwargs=ENV_KW, policy=Path(ckpt[ckpt.index("--policy") + 1]), critic=Path(ckpt[ckpt.index("--critic") + 1])
    )


def _run(parts: Parts, out: Path, episodes: int = EPISODES, **kw):
    return rollcap.run(
        episodes,
        out=out,
        env=parts.env_id,
        policy=parts.policy,
        critic=parts.critic,
        env_kwargs=parts.env_kwargs,
        progress=False,
        envs=ENVS,
        **CFG,
        **kw,
    )


def _digests(run_dir) -> dict[int, str]:
    return {r.index: episode_digest(r) for r in rollcap.load(run_dir)}


@pytest.fixture(scope="module")
def in_process(parts, tmp_path_factory) -> tuple[dict[int, str], list[int]]:
    """The same episodes run in this process at ``envs=2`` (no Ray): digests by index, and the order they ended in."""
    result = _run(parts, tmp_path_factory.mktemp("local") / "run")
    return _digests(result.run_dir), [e.index for e in result.episodes]


@pytest.fixture(scope="module")
def local(in_process) -> dict[int, str]:
    return in_process[0]


@pytest.fixture(scope="module")
def ray_local():
    """One local Ray instance (127.0.0.1 only) for the module."""
    ray = pytest.importorskip("ray")
    from rollcap.rollout.ray.connect import connect

    if ray.is_initialized():  # an earlier module's connection (connect() would reuse it)
        ray.shutdown()
    assert connect(num_cpus=2)
    yield ray
    ray.shutdown()


def _once(run_dir: Path, n: int) -> None:
    """Episodes 0..n-1 named once each in the manifest, every format of every shard read back and checked against it."""
    with ManifestWriter(run_dir, resume=True) as m:
        assert [r.index for r in m.verify()] == list(range(n))


# ------------------------------------------------------------ without Ray
def test_actors_with_envs_are_accepted_and_teleop_with_envs_still_refused():
    """``envs`` with ``actors`` is a run of its own now; a person still drives one episode (teleop with envs is refused, naming envs)."""
    assert (RunConfig(actors=2, envs=4, graphs=2).envs, RunConfig(actors=2, envs=4).actors) == (4, 2)
    with pytest.raises(ConfigError, match="drop `teleop`") as info:
        RunConfig(envs=2, teleop="terminal")
    assert info.value.field == "envs"
    with pytest.raises(ConfigError) as info:
        RunConfig(actors=2, envs=3, graphs=2)
    assert info.value.field == "graphs"


def test_calls_are_cut_to_keep_every_actor_busy_and_a_lost_call_splits_in_halves():
    """Calls of 2 x envs episodes (fewer when actors would idle), one config each; a lost call goes back as two."""
    specs = episode_specs(range(7), HostConfig(**CFG))
    assert call_size(7, 2, 2) == 4 and call_size(100, 2, 4) == 8 and call_size(3, 4, 8) == 1
    assert [[s.index for s in b] for b in spec_batches(specs, 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    other = episode_specs([9], HostConfig(seed=12))
    assert [len(b) for b in spec_batches(specs[:2] + other + specs[2:3], 4)] == [2, 1, 1]
    assert halves((1, 2, 3)) == [(1, 2), (3,)] and halves((1,)) == [(1,)]


def test_the_batched_actor_class_runs_the_in_process_batched_episodes(parts, local):
    """The actor at envs=2 without Ray: a list of episodes in any order is the ``envs=2`` run's bytes; its fingerprint names the batch."""
    actor = RolloutActor(parts, HostConfig(**CFG), envs=ENVS)
    try:
        records = actor.run_batch([(s.index, s.seed) for s in episode_specs([5, 2, 0], HostConfig(**CFG))])
        one = actor.run(7, episode_specs([7], HostConfig(**CFG))[0].seed)
        assert actor.ready()["weights"]["policy"] is not None
    finally:
        actor.close()
    assert sorted(r.index for r in records) == [0, 2, 5]
    assert {r.index: episode_digest(r) for r in records + [one]} == {i: local[i] for i in (0, 2, 5, 7)}
    assert {r.fingerprints["policy"]["batch"] for r in records} == {ENVS}


# --------------------------------------------------------------- with Ray
@pytest.mark.slow(seconds=15)
def test_two_actors_with_two_envs_record_each_episode_once_as_the_in_process_run_and_replay_exact(
    ray_local, parts, local, ckpt, tmp_path, capsys
):
    """actors=2, envs=2, sharded and driver-recorded: the in-process envs=2 digests, every episode once; `rollcap replay` finds all exact."""
    from rollcap.rollout.cli import main

    sharded = _run(parts, tmp_path / "sharded", actors=ENVS)
    driver = _run(parts, tmp_path / "driver", actors=ENVS, shards=False)
    assert _digests(sharded.run_dir) == _digests(driver.run_dir) == local
    assert is_sharded(sharded.run_dir) and not is_sharded(driver.run_dir)
    assert (
        sharded.summary["actors"],
        sharded.summary["envs_per_actor"],
        sharded.summary["shards"],
        sharded.summary["retries"],
        sharded.summary["failed"],
    ) == (2, ENVS, 2, 0, {})
    assert sharded.summary["episodes"] == driver.summary["episodes"] == EPISODES
    _once(sharded.run_dir, EPISODES)
    capsys.readouterr()
    code, out = main(["replay", str(sharded.run_dir), *ckpt]), capsys.readouterr().out
    assert code == 0 and f"{EPISODES} episode(s), 3 mode(s): {3 * EPISODES} exact, 0 diverged" in out, out


def _dies_once_after_writing(index: int, marker: Path) -> type:
    """An actor killed once, after writing episode ``index`` to its shard and before sending it back
    (two seconds first: the episodes it sent before have reached the driver)."""

    class DiesOnce(RolloutActor):  # defined here, so Ray ships the class (and ``marker``) by value
        def recorded(self, record):
            answer = super().recorded(record)
            if record.index == index and not marker.exists():
                marker.touch()
                time.sleep(2.0)
                os.kill(os.getpid(), signal.SIGKILL)
            return answer

    return DiesOnce


@pytest.mark.slow(seconds=10)
def test_a_killed_actor_s_unanswered_episodes_run_again_and_every_episode_is_recorded_once(
    ray_local, parts, in_process, tmp_path, monkeypatch
):
    """The actor of the first call (episodes 0-3, shard s000) is killed after writing episode 1 and before answering for it:
    the episodes it answered for stay named in s000, episode 1 and those after it run again elsewhere; every episode is
    named once, with the in-process digests; s000's copy of episode 1 is named by no line."""
    import rollcap.rollout.ray.episodes as episodes

    digests, order = in_process
    monkeypatch.setattr(episodes, "RolloutActor", _dies_once_after_writing(1, tmp_path / "died"))
    result = _run(parts, tmp_path / "run", actors=ENVS)
    assert (tmp_path / "died").exists()
    assert result.summary["retries"] == 1 and result.summary["actors_replaced"] == 1 and result.summary["failed"] == {}
    _once(result.run_dir, EPISODES)
    assert _digests(result.run_dir) == digests
    entries = read_manifest(result.run_dir)[1]
    answered = {
        i for i in order[: order.index(1)] if i in (0, 2, 3)
    }  # the first call's episodes that ended before episode 1
    assert {i for i, e in entries.items() if e.shard == "shards/s000"} == answered
    assert entries[1].shard != "shards/s000" and (result.run_dir / "shards/s000/episodes/episode_00001.npz").is_file()


def _always_dies_at(index: int) -> type:
    class Doomed(RolloutActor):
        def episodes(self, specs, config=None):
            if index in [i for i, _ in specs]:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().episodes(specs, config)

    return Doomed


@pytest.mark.slow(seconds=15)
def test_an_episode_that_keeps_killing_its_actor_is_isolated_and_only_it_fails(ray_local, parts, local, capfd):
    """Episode 1 kills every actor whose call holds it: its call is split until it runs alone; after max_tries only it is
    failed. Each lost actor is one line naming what of its call runs again (a batched call: all it had not answered)."""
    from rollcap.rollout.ray.actors import batch_rollout

    result = batch_rollout(
        episode_specs(range(4), HostConfig(**CFG)), 2, parts=parts, actor_cls=_always_dies_at(1), envs=ENVS, max_tries=3
    )
    assert sorted(e.index for e in result.ends) == [0, 2, 3]
    assert {e.index: episode_digest(e.record) for e in result.ends} == {i: local[i] for i in (0, 2, 3)}
    assert list(result.summary["failed"]) == ["1"] and "Actor" in result.summary["failed"]["1"]
    assert result.summary["retries"] == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("rollcap:")]
    assert len(err) == 3 and all(e.startswith("rollcap: lost an actor on ") and "(its actor died); " in e for e in err)
    assert "episodes 0, 1 run again on a live actor" in err[0] and err[-1].endswith("episode 1 failed"), err
