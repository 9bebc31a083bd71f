"""The env's control period is recorded (beside the digest), and exports take their frame rate from it."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace

import numpy as np
import pytest

import rollcap
from rollcap.envs.control import control_period, frames_per_second
from rollcap.rollout.errors import CorruptEpisode
from rollcap.rollout.recording import episode_digest, load_any, read_h5_episode, read_npz, write_npz
from rollcap.rollout.recording.export import frame_rate

FAST = {"render_images": False, "max_steps": 12}


def _run(out, env="rollcap/PushBlock-v0", **env_kwargs):
    rollcap.run(
        1, out=out, env=env, policy="expert", critic="none", env_kwargs=env_kwargs, max_chunks=4, progress=False
    )
    return load_any(out)[0]


def test_pushblock_records_its_own_rate_in_both_formats(tmp_path):
    """frame_skip 5 x 0.01 s: 0.05 s a step in the npz and the HDF5 episode; the digest does not cover it."""
    rec = _run(tmp_path / "r", frame_skip=5, **FAST)
    assert rec.control_period_s == 0.05
    assert read_h5_episode(tmp_path / "r" / "episodes.hdf5", 0).control_period_s == 0.05
    assert episode_digest(rec) == episode_digest(replace(rec, control_period_s=None))  # recordings keep their identity
    assert frame_rate(rec, None, "r") == (20, "recorded")


def test_metaworld_records_80_hz(tmp_path):
    """MetaWorld's dt (0.0125 s) is recorded, so an export is 80 fps, not the built-in task's 10."""
    pytest.importorskip("metaworld", reason="metaworld is not installed (pip install --no-deps metaworld==3.1.1)")
    rec = _run(tmp_path / "mw", env="rollcap/MetaWorld-push-v3", render_images=False)
    assert rec.control_period_s == 0.0125
    assert frame_rate(rec, None, "mw") == (80, "recorded")
    assert frame_rate(rec, 15, "mw") == (15, "given")  # an explicit rate wins


def test_older_recordings_take_the_rate_of_their_env(tmp_path):
    """A recording without the field (written before it existed) gets its env's rate, built from the recorded id and kwargs."""
    rec = replace(_run(tmp_path / "r", frame_skip=4, **FAST), control_period_s=None)
    write_npz(rec, tmp_path / "old.npz")
    with zipfile.ZipFile(tmp_path / "old.npz") as zf:
        assert "control_period_s" not in json.loads(np.load(zf.open("meta.json.npy")).tobytes())
    old = read_npz(tmp_path / "old.npz")
    assert old.control_period_s is None
    assert frame_rate(old, None, "old.npz") == (25, "env")


def test_unknown_rate_is_refused_naming_fps(tmp_path):
    """No recorded period and an env rollcap does not build (an id another package registers): refused, naming fps."""
    rec = replace(_run(tmp_path / "r", **FAST), control_period_s=None, env_id="some_package:Other-v0")
    with pytest.raises(
        ValueError,
        match=r"^fps: old\.npz does not record its control rate .*'some_package:Other-v0' is not one rollcap builds .*pass the rate as fps \(--fps N\)$",
    ):
        frame_rate(rec, None, "old.npz")
    with pytest.raises(ValueError, match=r"^fps: r steps every 0\.015 s \(66\.67 Hz\), not a whole number"):
        frame_rate(replace(rec, control_period_s=0.015), None, "r")
    with pytest.raises(ValueError, match=r"^fps: expected an integer >= 1, got 0$"):
        frame_rate(rec, 0, "r")


def test_a_damaged_period_is_refused(tmp_path):
    """The field is outside the digest, so the reader checks it: a non-positive period is a corrupt file."""
    rec = replace(_run(tmp_path / "r", **FAST), control_period_s=-1.0)
    write_npz(rec, tmp_path / "bad.npz")
    with pytest.raises(CorruptEpisode, match=r"bad\.npz: meta control_period_s is -1\.0, expected seconds > 0"):
        read_npz(tmp_path / "bad.npz")


def test_control_period_of_envs():
    """gymnasium's dt convention; None where an env does not say (CartPole keeps tau, not dt)."""
    assert control_period(rollcap.make_env("rollcap/PushBlock-v0", FAST)) == 0.1
    assert control_period(rollcap.make_env("InvertedPendulum-v5")) == 0.04
    assert control_period(rollcap.make_env("CartPole-v1")) is None
    assert (frames_per_second(0.0125), frames_per_second(0.1), frames_per_second(0.015)) == (80, 10, None)
