"""examples/vector_noise_pg.py: an RL loop on the batched vector env, with a tiny budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=30)
def test_vector_noise_pg_smoke():
    """Two updates of two chunks in two sub-envs: it trains and prints one line per update."""
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "vector_noise_pg.py"),
        "--envs",
        "2",
        "--updates",
        "2",
        "--chunks",
        "2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("update")]
    assert len(lines) == 2 and all("mean chunk reward" in ln for ln in lines), res.stdout
