"""A worker node's raylet killed (-9) mid-run on a two-node loopback cluster: the case in ``node_death_case.py``, in its own interpreter.

Run after the other Ray modules in one process, the fresh cluster cancelled the
new actors before they ran ("The actor never ran - it was cancelled before it
started running"); in a fresh process it passed every time it ran here. The case
takes a node down and starts its own cluster, so it gets its own process too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def test_a_raylet_killed_mid_run_loses_nothing_and_the_run_finishes_without_a_new_node():
    pytest.importorskip("ray")
    case = Path(__file__).with_name("node_death_case.py")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(case)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout, out.stdout[-2000:]
