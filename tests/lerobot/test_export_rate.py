"""LeRobot exports carry the recording's frame rate (the env's control period), and refuse in one line when it is unknown.

Run in LeRobot's venv: ``bash scripts/lerobot_env.sh && .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip(
    "lerobot", reason="lerobot is not installed here; it lives in its own venv (bash scripts/lerobot_env.sh)"
)

import rollcap

pytestmark = pytest.mark.lerobot
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def run_20hz(tmp_path_factory):
    """Two short episodes of the built-in task at frame_skip 5 (0.05 s a step: 20 Hz), no images, its scripted expert."""
    out = tmp_path_factory.mktemp("run") / "run"
    rollcap.run(
        2,
        out=out,
        policy="expert",
        critic="none",
        env_kwargs={"frame_skip": 5, "render_images": False, "max_steps": 8},
        progress=False,
    )
    return out


def _cli(*args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def test_export_takes_the_recorded_rate(run_20hz, tmp_path):
    """info.json's fps and the frames' timestamps are the recording's 20 Hz (they were 10 whatever the env)."""
    res = _cli("export", run_20hz, "--to", "lerobot", "--root", tmp_path / "ds")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "at 20 fps (the recording's control rate)" in res.stdout
    info = json.loads((tmp_path / "ds" / "meta" / "info.json").read_text())
    assert info["fps"] == 20
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset("rollcap/ds", root=tmp_path / "ds")
    stamps = np.array([float(ds[i]["timestamp"]) for i in range(4)])
    assert np.allclose(np.diff(stamps), 0.05)


def test_export_of_an_unknown_rate_is_one_line(run_20hz, tmp_path):
    """A recording that does not say its rate, of an env rollcap does not build: one line naming --fps, exit 2, nothing written."""
    from dataclasses import replace

    from rollcap.rollout.recording import load_any, write_npz

    rec = replace(load_any(run_20hz)[0], control_period_s=None, env_id="some_package:Other-v0")
    (tmp_path / "old").mkdir()
    write_npz(rec, tmp_path / "old" / "episode_00000.npz")
    res = _cli("export", tmp_path / "old", "--to", "lerobot", "--root", tmp_path / "ds")
    assert (
        res.returncode == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("rollcap export: error: --fps: ")
    ), res.stderr[-3000:]
    assert "does not record its control rate" in res.stderr and not (tmp_path / "ds").exists()
    res = _cli("export", tmp_path / "old", "--to", "lerobot", "--root", tmp_path / "ds", "--fps", 30)
    assert res.returncode == 0 and "at 30 fps (--fps)" in res.stdout, res.stderr[-3000:]
