"""``rollcap run --envs N``: the batched run from the command line, replayed exactly by ``rollcap replay``."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _rollcap(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *args], capture_output=True, text=True, timeout=600, cwd=cwd
    )


@pytest.mark.slow(seconds=40)
def test_run_envs_then_replay(tmp_path):
    """Three episodes on two envs at batch 2 are recorded and replay exact in every mode; a bad --graphs is one line, exit 2."""
    out = tmp_path / "r"
    res = _rollcap(
        "run",
        "--envs",
        "2",
        "--episodes",
        "3",
        "--max-chunks",
        "3",
        "--format",
        "npz",
        "--out",
        str(out),
        "--no-progress",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    res = _rollcap("replay", str(out), cwd=tmp_path)
    assert res.returncode == 0 and "9 exact" in res.stdout and "all exact" in res.stdout, (
        res.stdout[-2000:] + res.stderr[-2000:]
    )
    bad = _rollcap("run", "--envs", "4", "--graphs", "3", "--out", str(tmp_path / "bad"), cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "--graphs" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad").exists()
