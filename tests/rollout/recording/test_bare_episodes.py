"""A bare ``episodes/`` directory reads as its run does: a damaged npz is that episode's failure, the rest are checked."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

import rollcap
from rollcap.rollout.cli import main
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import episodes_of


@pytest.fixture(scope="module")
def run3(tmp_path_factory):
    """Three short episodes of the built-in task (its scripted expert, no images), episode 1's rewards altered after writing."""
    out = tmp_path_factory.mktemp("bare") / "run"
    rollcap.run(
        3,
        out=out,
        policy="expert",
        critic="none",
        env_kwargs={"render_images": False, "max_steps": 6},
        max_chunks=3,
        progress=False,
        formats=("npz",),
    )
    path = out / "episodes" / "episode_00001.npz"
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    rewards = np.load(io.BytesIO(members["steps/rewards.npy"]))
    rewards[0] += 1.0
    buf = io.BytesIO()
    np.lib.format.write_array(buf, rewards)
    members["steps/rewards.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out


@pytest.mark.parametrize("where", ["run", "episodes"])
def test_episodes_of_marks_the_damaged_file_and_reads_the_rest(run3, where):
    """The run directory and its bare episodes/ give the same three items: 0 and 2 read, 1 its one-line error."""
    items = episodes_of(run3 if where == "run" else run3 / "episodes")
    assert [src.rsplit("/", 1)[-1] for src, _ in items] == [f"episode_0000{i}.npz" for i in range(3)]
    assert [r.index for _, r in items if not isinstance(r, Exception)] == [0, 2]
    err = items[1][1]
    assert isinstance(err, CorruptEpisode) and str(err).endswith(
        "episode_00001.npz: content digest mismatch: the data was altered or damaged after writing"
    )


@pytest.mark.parametrize("where", ["run", "episodes"])
def test_replay_of_a_bare_episodes_dir_checks_every_file(run3, where, capsys):
    """`rollcap replay RUN/episodes` marks episode 1 FAILED, checks episode 2 and prints the counts, exit 1, as `rollcap replay RUN`
    does (it stopped at the damaged file with exit 2)."""
    code = main(["replay", str(run3 if where == "run" else run3 / "episodes"), "--mode", "env"])
    out = capsys.readouterr().out.splitlines()
    assert code == 1, out
    assert out[0].split() == ["episode", "0", "env", "exact"] and out[2].split() == ["episode", "2", "env", "exact"]
    assert "FAILED" in out[1] and "episode_00001.npz: content digest mismatch" in out[1]
    assert out[-1] == "3 episode(s), 1 mode(s): 2 exact, 0 diverged, 0 not comparable, 1 failed"
