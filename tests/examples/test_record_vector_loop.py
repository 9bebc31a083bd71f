"""examples/record_vector_loop.py: a loop over the vector env records its episodes; `rollcap replay` of them exits 0."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "record_vector_loop.py")


@pytest.mark.slow(seconds=30)
def test_recorded_episodes_replay_with_exit_0(tmp_path):
    """Two sub-envs, two updates: every ended episode recorded (time limits included); the default replay passes."""
    out = tmp_path / "loop"
    cmd = [
        sys.executable,
        EXAMPLE,
        "--out",
        str(out),
        "--envs",
        "2",
        "--updates",
        "2",
        "--chunks",
        "6",
        "--max-chunks",
        "3",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    n = int(re.search(r"recorded (\d+) episode\(s\)", res.stdout)[1])
    assert n >= 4, res.stdout  # 12 chunks a sub-env, cut after 3: at least 4 episodes end, more where one succeeds
    replay = subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", "replay", str(out)], capture_output=True, text=True, timeout=600
    )
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-2000:]
    lines = replay.stdout.splitlines()
    assert sum("closed  not comparable: actions came from the caller" in ln for ln in lines) == n, replay.stdout
    assert lines[-1].startswith(f"{n} episode(s), 3 mode(s): {2 * n} exact, 0 diverged, {n} not comparable, 0 failed")


def test_an_existing_out_is_refused_in_one_line(tmp_path):
    res = subprocess.run([sys.executable, EXAMPLE, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"record_vector_loop.py: --out {tmp_path}: already exists; pick a new run directory"
    ], res.stderr
