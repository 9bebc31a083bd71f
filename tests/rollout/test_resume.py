"""Resume completes a run as specified, refuses another config, verifies what is there; digests are identities."""

from __future__ import annotations

import pytest

import rollcap
from rollcap.rollout.errors import ConfigError, CorruptEpisode
from rollcap.rollout.recording import episode_digest
from tests.rollout._tiny import make_env, make_runners


@pytest.fixture(scope="module")
def parts():
    p, c = make_runners(seed=3)
    yield p, c
    p.close()
    c.close()


def _run(parts, out, episodes, resume=False, **kw):
    policy, critic = parts
    return rollcap.run(
        episodes,
        out=out,
        env=make_env(),
        policy=policy,
        critic=critic,
        progress=False,
        resume=resume,
        **{"seed": 5, "max_chunks": 3, **kw},
    )


def _digests(run_dir):
    return [episode_digest(r) for r in rollcap.load(run_dir)]


@pytest.mark.slow
def test_identical_runs_and_a_resumed_run_have_identical_episode_digests(parts, tmp_path):
    """Two identical runs give equal digests per episode (timings differ); so does a run done in two sessions."""
    a = _run(parts, tmp_path / "a", 4)
    b = _run(parts, tmp_path / "b", 4)
    _run(parts, tmp_path / "c", 2)
    c = _run(parts, tmp_path / "c", 4, resume=True)
    assert _digests(a.run_dir) == _digests(b.run_dir) == _digests(c.run_dir)
    lat = [r.chunks["latency_boundary_s"].tobytes() for r in rollcap.load(a.run_dir)]
    assert lat != [r.chunks["latency_boundary_s"].tobytes() for r in rollcap.load(b.run_dir)]
    assert [e.index for e in c.episodes] == [2, 3]  # --episodes is the run's total
    assert c.summary["episodes"] == 4  # the summary covers the whole run


@pytest.mark.parametrize(
    "change, field",
    [({"seed": 6}, "seed"), ({"max_chunks": 4}, "max_chunks"), ({"critic_threshold": -0.5}, "critic_threshold")],
)
def test_resume_with_another_config_is_refused_naming_the_field(parts, tmp_path, change, field):
    """A resume whose config differs from the recorded one is refused before anything runs."""
    _run(parts, tmp_path / "r", 2)
    with pytest.raises(ConfigError) as info:
        _run(parts, tmp_path / "r", 4, resume=True, **change)
    assert info.value.field == field
    assert len(rollcap.load(tmp_path / "r")) == 2


def test_resume_verifies_the_episodes_already_there(parts, tmp_path):
    """A truncated episode file is found before anything is appended."""
    _run(parts, tmp_path / "r", 2)
    victim = tmp_path / "r" / "episodes" / "episode_00001.npz"
    victim.write_bytes(victim.read_bytes()[:-200])
    with pytest.raises(CorruptEpisode, match="episode_00001.npz"):
        _run(parts, tmp_path / "r", 4, resume=True)
    assert not (tmp_path / "r" / "episodes" / "episode_00002.npz").exists()


def test_resume_with_other_weights_is_refused(parts, tmp_path):
    """Another policy's weights: refused naming the policy."""
    _run(parts, tmp_path / "r", 1)
    other, critic = make_runners(seed=4)
    try:
        with pytest.raises(ConfigError, match="policy weights") as info:
            rollcap.run(
                2,
                out=tmp_path / "r",
                env=make_env(),
                policy=other,
                critic=parts[1],
                progress=False,
                resume=True,
                seed=5,
                max_chunks=3,
            )
        assert info.value.field == "policy"
    finally:
        other.close()
        critic.close()


@pytest.mark.parametrize("make_bad", ["episodes_file", "h5_dir", "summary_dir", "out_file"])
def test_a_run_directory_of_the_wrong_shape_is_refused(parts, tmp_path, make_bad):
    """--out naming a file, or a run dir whose episodes / episodes.hdf5 / summary.json are of the wrong kind: ConfigError naming out, nothing touched."""
    out = tmp_path / "r"
    if make_bad == "out_file":
        out.write_text("x")
    else:
        _run(parts, out, 1)
        target = {
            "episodes_file": out / "episodes",
            "h5_dir": out / "episodes.hdf5",
            "summary_dir": out / "summary.json",
        }[make_bad]
        import shutil

        shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.mkdir() if make_bad != "episodes_file" else target.write_text("x")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as info:
        _run(parts, out, 2, resume=True)
    assert info.value.field == "out"
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_recordings_follow_the_umask(parts, tmp_path):
    """Episode files get the permissions any other file the user writes gets (0644 under umask 022)."""
    import os

    old = os.umask(0o022)
    try:
        res = _run(parts, tmp_path / "r", 1)
    finally:
        os.umask(old)
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in [*res.run_dir.glob("episodes/*.npz"), res.run_dir / "episodes.hdf5", res.run_dir / "summary.json"]
    }
    assert set(modes.values()) == {0o644}, modes
