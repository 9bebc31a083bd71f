"""examples/vector_noise_pg.py: an RL loop on the batched vector env, with a tiny budget."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=30)
def test_vector_noise_pg_smoke(tmp_path):
    """Two updates of two chunks in two sub-envs: it trains, prints one line per update and writes them as
    TensorBoard events (--tensorboard)."""
    board = importlib.util.find_spec("tensorboard") is not None  # the rl extra's
    cmd = [sys.executable, str(ROOT / "examples" / "vector_noise_pg.py"), "--envs", "2", "--updates", "2",
           "--chunks", "2", *(["--tensorboard", str(tmp_path / "tb")] if board else [])]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("update")]
    assert len(lines) == 2 and all("mean chunk reward" in ln for ln in lines), res.stdout
    if board:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(tmp_path / "tb")).Reload()
        assert [e.step for e in events.Scalars("train/mean_chunk_reward")] == [4, 8]


def test_vector_noise_pg_refuses_no_sub_envs_in_one_line():
    """--envs 0: one line naming the flag, exit 2 (it was an IndexError traceback from inside the vector env)."""
    cmd = [sys.executable, str(ROOT / "examples" / "vector_noise_pg.py"), "--envs", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "vector_noise_pg.py: --envs: expected an integer >= 1, got 0"
    ], res.stderr
