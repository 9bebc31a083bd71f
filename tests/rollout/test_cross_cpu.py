"""Recordings made on another machine replay exact or "not comparable", never diverged (issue 54).

``cross_cpu/genuineintel-6-207-seed7`` is ``rollcap run --episodes 3 --seed 7 --format npz`` made on an Intel Xeon
(family 6, model 207) with the CPU in its fingerprint; ``cross_cpu/before-cpu-fingerprint-seed7`` is the same command
made on such a box before the fingerprint named the CPU (``../shared/reference/cross-cpu``). On a machine whose
fingerprint matches the recording's, every episode must replay exact; on any other (an AMD box, say) an episode whose
bytes differ must say "not comparable" and name what differs: the bits of MKL's GEMMs follow the CPU's vendor and
model, and the fingerprint says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rollcap.kernels.fingerprint import cpu_identity

FIXTURES = Path(__file__).parent / "cross_cpu"


def _replay(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", "replay", str(run), "--accept-not-comparable"],
        capture_output=True,
        text=True,
        timeout=300,
    )


def _recorded_policy_fingerprint(run: Path) -> dict:
    first = sorted(run.rglob("episode_*.npz"))[0]
    with np.load(first) as z:
        return json.loads(bytes(z["meta.json"]).decode())["fingerprints"]["policy"]


@pytest.mark.slow(seconds=12)
@pytest.mark.parametrize("name", ["genuineintel-6-207-seed7", "before-cpu-fingerprint-seed7"])
def test_a_recording_from_another_cpu_replays_exact_or_not_comparable(name):
    """Every episode of a recording made on an Intel Xeon replays exact or not comparable here, never diverged."""
    run = FIXTURES / name
    proc = _replay(run)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("episode")]
    assert len(lines) == 9, proc.stdout + proc.stderr  # 3 episodes x 3 modes
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "DIVERGED" not in proc.stdout and "FAILED" not in proc.stdout, proc.stdout
    recorded = _recorded_policy_fingerprint(run)
    if recorded.get("cpu") == cpu_identity():
        assert all(ln.split()[3] == "exact" for ln in lines), proc.stdout  # the same CPU kind: the same bytes
    for ln in lines:
        if "not comparable" in ln:  # the reason names the CPU (absent from the older recording's fingerprint)
            assert "cpu" in ln, ln


def test_the_fingerprint_names_the_cpu_and_the_knobs_that_steer_its_libraries(monkeypatch):
    """A CPU runner's fingerprint names the CPU kind and MKL's instruction setting, which changes bits on one box."""
    from rollcap.kernels.fingerprint import device_fingerprint

    fp = device_fingerprint("cpu", threads=1)
    assert fp["cpu"] == cpu_identity() and fp["cpu"]
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert device_fingerprint("cpu", threads=1)["mkl_instructions"] == "AVX2"


@pytest.mark.slow(seconds=15)
def test_opdiff_names_the_gemm_when_mkl_takes_another_code_path(tmp_path):
    """Tracing a recorded chunk under two MKL code paths names the first addmm, the op whose kernel follows the CPU.

    The other path: ``MKL_ENABLE_INSTRUCTIONS=SSE4_2`` on an Intel CPU; MKL's dispatch ignores it elsewhere (an AMD
    Zen 3 traces the same bits), where ``MKL_CBWR=COMPATIBLE`` (MKL's reproducible-results mode) is the other path."""
    import os

    run = FIXTURES / "genuineintel-6-207-seed7"
    other = (
        {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
        if cpu_identity().startswith("GenuineIntel")
        else {"MKL_CBWR": "COMPATIBLE"}
    )
    traces = []
    for name, extra in (("default", {}), ("other", other)):
        out = tmp_path / f"{name}.json"
        env = {k: v for k, v in os.environ.items() if k not in ("MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")} | extra
        cmd = [sys.executable, "-m", "rollcap.rollout.offline.opdiff", "trace", str(run), "--out", str(out)]
        subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
        traces.append(out)
    proc = subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.offline.opdiff", "compare", *map(str, traces)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("policy: op ") and "(addmm) differs first: equal inputs, other outputs" in lines[0]
    assert lines[1].startswith("critic: op ") and "(addmm)" in lines[1]
