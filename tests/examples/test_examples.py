"""Examples only wire parts together; each runs here with a tiny budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollcap.critics import load_critic
from rollcap.policies import load_policy

pytestmark = (
    pytest.mark.slow
)  # subprocesses, Ray or trained examples: the fast tier (-m "not slow") leaves them to the full suite

ROOT = Path(__file__).resolve().parents[2]


def test_train_default_smoke(tmp_path):
    """The training example collects, trains, evaluates and writes loadable checkpoints (here with --shared-prefix,
    which its policy's config keeps)."""
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "train_default.py"),
        "--demos",
        "3",
        "--policy-steps",
        "2",
        "--critic-steps",
        "2",
        "--eval-episodes",
        "2",
        "--batch",
        "8",
        "--shared-prefix",
        "--out",
        str(tmp_path),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert load_policy(tmp_path / "pushblock_policy.json").cfg.shared_prefix
    load_critic(tmp_path / "pushblock_critic.json")
    report = json.loads((tmp_path / "training_report.json").read_text())
    for key in ("policy_success", "expert_success", "random_success", "critic_auroc_mid_episode", "train_seconds"):
        assert key in report


def test_custom_policy_example_replays_exactly(tmp_path):
    """A plain eager module on a gymnasium MuJoCo env: recorded, and every episode replays exactly in both modes."""
    cmd = [sys.executable, str(ROOT / "examples" / "custom_policy.py"), "--episodes", "2", "--out", str(tmp_path / "r")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("episode")]
    assert len(lines) == 2 and all(ln.endswith("policy replay exact, env replay exact") for ln in lines), res.stdout
