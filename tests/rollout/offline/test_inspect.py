"""inspect: load any recording, the episode table, the episode plot."""

from __future__ import annotations

import numpy as np
import pytest

from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.offline.inspect import episode_table, plot_episode
from rollcap.rollout.recording import load_any
from rollcap.rollout.recording import EpisodeRecorder, records_equal, synthetic_record

ENV_META = {"env_name": "PushBlock-v0", "type": 2, "env_kwargs": {}}


def records() -> list:
    """A 0-step episode, one with a human takeover, and a longer one."""
    return [synthetic_record(i, 40 + i, steps=t, image_size=16) for i, t in enumerate((0, 13, 24))]


@pytest.fixture
def run_dir(tmp_path):
    with EpisodeRecorder(tmp_path / "run", env_meta=ENV_META) as rec:
        for r in records():
            rec.write(r)
    return tmp_path / "run"


@pytest.mark.parametrize("what", ["run_dir", "npz", "h5", "h5_only_dir"])
def test_load_any_reads_every_kind_of_path(what, run_dir):
    """load_any takes a run directory, one npz, or the HDF5 file, and returns the episodes by index."""
    if what == "h5_only_dir":
        for p in (run_dir / "episodes").iterdir():
            p.unlink()
    path = {
        "run_dir": run_dir,
        "h5_only_dir": run_dir,
        "npz": run_dir / "episodes" / "episode_00001.npz",
        "h5": run_dir / "episodes.hdf5",
    }[what]
    got = load_any(path)
    want = records()[1:2] if what == "npz" else records()
    assert [records_equal(g, w) for g, w in zip(got, want, strict=True)] == [None] * len(want)


def test_load_any_rejects_other_paths(tmp_path):
    """A file of another kind is CorruptEpisode naming it; a missing path or an empty dir is FileNotFoundError."""
    (tmp_path / "notes.txt").write_text("not a recording")
    with pytest.raises(CorruptEpisode, match="notes.txt: neither an npz archive nor an HDF5 file"):
        load_any(tmp_path / "notes.txt")
    with pytest.raises(FileNotFoundError):
        load_any(tmp_path / "missing.npz")
    with pytest.raises(FileNotFoundError, match="run directory"):
        load_any(tmp_path)


def test_episode_table_has_a_row_per_episode():
    """The table lists index, seed, steps, chunks, human steps, stop reason, success, critic values, instruction."""
    recs = records()
    table = episode_table(recs)
    lines = table.splitlines()
    assert lines[0].split() == [
        "index",
        "seed",
        "steps",
        "chunks",
        "human",
        "stop",
        "success",
        "v_mean",
        "v_min",
        "instruction",
    ]
    assert len(lines) == 2 + len(recs) + 1 and lines[-1].startswith("3 episode(s), 1 successful")
    row = lines[3].split()
    r = recs[1]
    v = r.chunks["critic_value"]
    assert row[:7] == ["1", "41", "13", "2", str(int((r.steps["actor"] == 1).sum())), r.stop_reason, "yes"]
    assert row[7:9] == [f"{v.mean():.3f}", f"{v.min():.3f}"] and "push the red block" in lines[3]
    assert "…" in episode_table(recs, instruction_width=10)
    assert episode_table([]).count("\n") == 1


def test_plot_episode_writes_a_png(tmp_path):
    """plot_episode writes a real PNG (read back by matplotlib) for a normal and a 0-step episode."""
    from matplotlib.image import imread

    for r in (records()[2], records()[0]):
        path = plot_episode(r, tmp_path / f"ep{r.index}.png")
        img = imread(path)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 400
        assert np.ptp(img[..., :3]) > 0.5  # not a blank canvas


def test_plotting_without_matplotlib_is_refused_before_loading(tmp_path, monkeypatch):
    """No matplotlib: --plot is one line naming the extra to install, before any episode is read (a real import failure, not a mock of the plot)."""
    import importlib.util

    from rollcap.rollout.offline.inspect import check_plot_dir

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs matplotlib: pip install 'rollcap\[plot\]'"):
        check_plot_dir(tmp_path / "plots")
    assert not (tmp_path / "plots").exists()


def test_inspect_lists_every_episode_and_marks_each_bad_one(run_dir):
    """`rollcap inspect` on a run with one altered and one truncated npz: every episode is a row, both bad ones are
    marked and named with their error, the counts say so, exit 1 (as replay); the readable ones still tabulated."""
    import subprocess
    import sys
    import zipfile

    altered = run_dir / "episodes" / "episode_00001.npz"
    with zipfile.ZipFile(altered) as z:
        arrays = {n: np.load(z.open(n), allow_pickle=False) for n in z.namelist()}
    key = next(n for n, a in arrays.items() if a.dtype == np.float32 and a.size)
    arrays[key] = arrays[key] + 1
    np.savez(altered, **{n[: -len(".npy")]: a for n, a in arrays.items()})
    cut = run_dir / "episodes" / "episode_00002.npz"
    cut.write_bytes(cut.read_bytes()[:500])
    res = subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", "inspect", str(run_dir)], capture_output=True, text=True
    )
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stdout + res.stderr
    rows = [ln.split() for ln in res.stdout.splitlines()[2:5]]
    assert [r[0] for r in rows] == ["0", "1", "2"] and [r[5] for r in rows[1:]] == ["BAD", "BAD"], res.stdout
    assert f"BAD {altered}: content digest mismatch" in res.stdout and f"BAD {cut}: " in res.stdout
    assert res.stdout.splitlines()[-1].startswith("1 episode(s), ") and "2 episode(s) unreadable" in res.stdout
