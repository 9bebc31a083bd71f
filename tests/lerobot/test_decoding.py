"""LeRobot's venv decodes exported videos without a traceback, and its tools start.

Run in LeRobot's venv: ``bash scripts/lerobot_env.sh && .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip(
    "lerobot", reason="lerobot is not installed here; it lives in its own venv (bash scripts/lerobot_env.sh)"
)

import rollcap

pytestmark = pytest.mark.lerobot
BIN = Path(sys.executable).parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def run_20hz(tmp_path_factory):
    """Two short episodes of the built-in task at frame_skip 5 (0.05 s a step: 20 Hz), images 32 x 32, its scripted expert."""
    out = tmp_path_factory.mktemp("run") / "run"
    rollcap.run(
        2,
        out=out,
        policy="expert",
        critic="none",
        env_kwargs={"frame_skip": 5, "image_size": 32, "max_steps": 8},
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


@pytest.fixture(scope="module")
def video_dataset(run_20hz, tmp_path_factory):
    """The run exported with videos (``rollcap export --videos``)."""
    root = tmp_path_factory.mktemp("videos") / "ds"
    res = _cli("export", run_20hz, "--to", "lerobot", "--root", root, "--videos")
    assert res.returncode == 0, res.stderr[-3000:]
    return root


@pytest.mark.slow(seconds=20)
def test_a_video_dataset_loads_without_a_traceback(video_dataset):
    """An exported video dataset opens and decodes in a fresh process: no traceback, at most LeRobot's one-line PyAV notice.

    Before the venv recipe removed a torchcodec that cannot load this machine's FFmpeg, every LeRobotDataset(...)
    printed about 100 lines of torchcodec's traceback before falling back to PyAV.
    """
    code = (
        "from lerobot.datasets.lerobot_dataset import LeRobotDataset; "
        f"ds = LeRobotDataset('rollcap/ds', root={str(video_dataset)!r}); f = ds[len(ds) - 1]; "
        "print(ds.meta.fps, tuple(f['observation.images.front'].shape))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=ENV)
    other = [
        ln for ln in res.stderr.splitlines() if ln.strip() and "falling back to 'pyav'" not in ln
    ]  # LeRobot's own one-line notice may stay
    assert res.returncode == 0 and "Traceback" not in res.stderr and not other, res.stderr[-3000:]
    assert res.stdout.split() == ["20", "(3,", "32,", "32)"], res.stdout


@pytest.mark.slow(seconds=20)
def test_lerobot_dataset_viz_saves_a_recording(video_dataset, tmp_path):
    """lerobot-dataset-viz (rerun-sdk) reads the export, videos decoded, and saves a .rrd file without a traceback."""
    res = subprocess.run(
        [
            str(BIN / "lerobot-dataset-viz"),
            "--repo-id",
            "rollcap/ds",
            "--root",
            str(video_dataset),
            "--episode-index",
            "0",
            "--save",
            "1",
            "--output-dir",
            str(tmp_path),
            "--num-workers",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert list(tmp_path.glob("*.rrd"))


def test_lerobot_info_starts():
    """`lerobot-info --help` exits 0 (it imported a torchcodec that could not load FFmpeg and died)."""
    res = subprocess.run([str(BIN / "lerobot-info"), "--help"], capture_output=True, text=True, timeout=300, env=ENV)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
