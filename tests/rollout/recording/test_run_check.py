"""A run check (``rollcap inspect``, ``rollcap replay``) covers every format the run wrote: a damaged, short or
different ``episodes.hdf5`` fails it, naming the file, even when every npz file is whole."""

from __future__ import annotations

import os

import h5py
import pytest

import rollcap
from rollcap.rollout.cli import main
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import EpisodeRecorder, iter_episodes, synthetic_record, write_npz
from tests.rollout._tiny import make_env, make_runners
from tests.rollout.recording.test_shards import ENV_META, _sharded


def _run(path, n: int = 3):
    with EpisodeRecorder(path, env_meta=ENV_META) as rec:
        for i in range(n):
            rec.write(synthetic_record(i, 40 + i, steps=6, image_size=8))
    return path


def _halve(path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def test_a_check_reads_each_episode_in_both_formats_and_names_the_one_that_is_wrong(tmp_path):
    """every_format: a truncated HDF5 file is one error naming it (the npz episodes still come back); a demo that is not
    its npz's episode, an npz with no demo and a demo with no npz are errors of their episodes. Without it, the npz
    files alone are read, as before."""
    run = _run(tmp_path / "cut")
    _halve(run / "episodes.hdf5")
    items = list(iter_episodes(run, every_format=True))
    assert items[0][0] == str(run / "episodes.hdf5") and "not a readable HDF5 file" in str(items[0][1])
    assert [r.index for _, r in items[1:]] == [0, 1, 2]
    assert [r.index for _, r in iter_episodes(run)] == [0, 1, 2]

    run = _run(tmp_path / "disagree")
    write_npz(synthetic_record(1, 99, steps=6, image_size=8), run / "episodes" / "episode_00001.npz")  # another ep 1
    write_npz(synthetic_record(3, 43, steps=6, image_size=8), run / "episodes" / "episode_00003.npz")  # not in HDF5
    os.unlink(run / "episodes" / "episode_00000.npz")  # demo_0 alone
    got = {source: r for source, r in iter_episodes(run, every_format=True)}
    h5 = run / "episodes.hdf5"
    bad = {source: str(r) for source, r in got.items() if isinstance(r, CorruptEpisode)}
    assert bad == {
        str(
            run / "episodes" / "episode_00001.npz"
        ): f"{h5}: demo_1 is not the episode episode_00001.npz holds; the run's formats disagree",
        str(
            run / "episodes" / "episode_00003.npz"
        ): f"{h5}: no demo_3, though episode_00003.npz holds that episode; the run's formats disagree",
        f"{h5}:demo_0": f"{h5}: demo_0 has no episodes/episode_00000.npz beside it",
    }
    assert got[str(run / "episodes" / "episode_00002.npz")].index == 2


def test_a_sharded_run_is_checked_in_every_format_of_each_shard(tmp_path):
    """A shard's HDF5 file cut in half: a check fails its episodes (their npz copies are whole); a plain read does not."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1], "s001": [2]}).close()
    _halve(run / "shards" / "s000" / "episodes.hdf5")
    assert [r.index for _, r in iter_episodes(run)] == [0, 1, 2]
    checked = list(iter_episodes(run, every_format=True))
    assert [isinstance(r, CorruptEpisode) for _, r in checked] == [True, True, False]
    assert "s000/episodes.hdf5" in str(checked[0][1]) and checked[2][1].index == 2


@pytest.fixture
def recorded(tmp_path):
    """A 4-episode run of the built-in task with the tiny models, npz and HDF5."""
    env = make_env()
    policy, critic = make_runners()
    try:
        rollcap.run(4, out=tmp_path / "run", env=env, policy=policy, critic=critic, max_chunks=3, progress=False)
    finally:
        for part in (env, policy, critic):
            part.close()
    return tmp_path / "run"


def test_inspect_and_replay_fail_on_a_run_whose_hdf5_is_cut_in_half(recorded, capsys):
    """The issue's case: `episodes.hdf5` truncated to half, every npz whole: inspect lists the 4 episodes and the file as
    BAD, exit 1; replay replays the 4 episodes exactly and fails the file, exit 1 ('4 episode(s) and 1 unreadable
    file(s)'). A damaged npz of a known episode is named by its index ('episode    1'), not 'episode ?'."""
    h5 = recorded / "episodes.hdf5"
    _halve(h5)
    assert main(["inspect", str(recorded)]) == 1
    out = capsys.readouterr().out
    assert f"BAD {h5}: not a readable HDF5 file" in out and out.splitlines()[-1].endswith(
        "1 file(s) unreadable (BAD above)"
    )
    assert main(["replay", str(recorded), "--mode", "env"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"episode    ? all     FAILED: {h5}: not a readable HDF5 file")
    assert [ln.split()[1:3] for ln in lines[1:5]] == [[str(i), "env"] for i in range(4)] and "exact" in lines[1]
    assert lines[-1].startswith("4 episode(s) and 1 unreadable file(s), 1 mode(s): 4 exact, 0 diverged")
    cut = recorded / "episodes" / "episode_00001.npz"
    cut.write_bytes(cut.read_bytes()[:300])
    assert main(["replay", str(recorded / "episodes"), "--mode", "env"]) == 1
    assert "episode    1 all     FAILED: " in capsys.readouterr().out


def test_an_hdf5_with_a_data_group_and_no_demo_fails_inspect_and_replay_alike(tmp_path, capsys):
    """Nothing to check is a failed check for both (inspect used to exit 0 where replay exited 1), naming the file."""
    empty = tmp_path / "empty.hdf5"
    with h5py.File(empty, "w") as f:
        f.create_group("data")
    assert main(["inspect", str(empty)]) == 1
    assert f"BAD {empty}: its 'data' group holds no demo: no episode to read" in capsys.readouterr().out
    assert main(["replay", str(empty), "--mode", "env"]) == 1
    assert f"FAILED: {empty}: its 'data' group holds no demo" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["episodes.hdf5", "episodes"])
def test_a_file_of_a_sharded_run_named_as_in_a_plain_run_says_where_its_episodes_are(tmp_path, capsys, name):
    """`rollcap replay RUN/episodes.hdf5` (README's form) on a sharded run: one line saying the run is sharded, to name
    the run directory or merge it first; exit 2."""
    run = tmp_path / "run"
    _sharded(run, {"s000": [0, 1]}).close()
    assert main(["replay", str(run / name), "--mode", "env"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{run} is a sharded run" in err and f"rollcap merge {run}" in err, err
