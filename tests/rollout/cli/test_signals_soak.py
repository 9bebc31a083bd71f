"""SIGINT at random moments never makes `rollcap run` die by a signal or leave a partial episode.

The slow test sends ROLLCAP_SOAK signals (default 6; the audit's figure is 50):

    ROLLCAP_SOAK=50 python3 -m pytest -q -m slow tests/rollout/cli/test_signals_soak.py
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from rollcap.rollout.recording import load_any

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


@pytest.mark.slow(seconds=31)
def test_sigint_at_random_times_exits_cleanly(ckpt, tmp_path):
    """Each run gets 1-2 SIGINTs at a seeded random time: exit 130 or 0, no traceback, both formats agree, no journal."""
    rng = random.Random(20261121)
    for k in range(int(os.environ.get("ROLLCAP_SOAK", "6"))):
        out = tmp_path / f"r{k}"
        proc = subprocess.Popen(
            [*ROLLCAP, "run", "--episodes", "6", "--out", str(out), "--no-progress", *ckpt],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(rng.uniform(1.5, 6.0))
        for _ in range(rng.choice((1, 1, 2))):
            proc.send_signal(signal.SIGINT)
            time.sleep(rng.uniform(0.0, 0.05))
        _, err = proc.communicate(timeout=60)
        assert proc.returncode in (0, 130), (k, proc.returncode, err[-2000:])
        assert "Traceback" not in err, (k, err[-2000:])
        if (out / "episodes.hdf5").exists():
            assert [r.index for r in load_any(out / "episodes")] == [
                r.index for r in load_any(out / "episodes.hdf5")
            ], k
        assert not [p for p in out.rglob("*") if p.name.endswith(("-journal", ".tmp"))], k
