"""RECAP's inputs: a run of an env the policy cannot read, or without a step limit, is refused naming the run (no flag can fix it)."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest

from rollcap.rollout.errors import ConfigError
from rollcap.rollout.offline.branch import max_steps_of
from rollcap.rollout.recording import load_any, synthetic_record
from tests.rollout._other_env import record_inverted_pendulum

pytestmark = (
    pytest.mark.slow
)  # the rollcap command in subprocesses: the fast tier (-m "not slow") leaves them to the full suite


@pytest.fixture(scope="module")
def ip_run(tmp_path_factory):
    return record_inverted_pendulum(tmp_path_factory.mktemp("ip") / "run", episodes=1)


def test_recap_of_a_run_the_policy_cannot_read_says_so_in_one_line(ip_run, tmp_path):
    """`rollcap recap` on InvertedPendulum-v5: exit 2, one line naming the run and why the env cannot be used; nothing written."""
    out = tmp_path / "recap"
    res = subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", "recap", str(ip_run), "--out", str(out), "--demos", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    line = lines[0]
    assert (
        str(ip_run) in line and "InvertedPendulum-v5" in line and "cannot read" in line and "observation (4,)" in line
    ), line
    assert "env_id:" not in line and "no step limit" not in line
    assert not out.exists() and not list(tmp_path.glob(".recap*"))


def test_the_step_limit_comes_from_the_recording(ip_run):
    """A recorded TimeLimit (the adapted env's fingerprint) is the step limit; no env needs building to know it."""
    assert max_steps_of(load_any(ip_run)[0]) == 1000


def test_an_episode_without_any_step_limit_cannot_be_used():
    """No limit recorded and no env to ask: a ConfigError naming the file and saying the env cannot be used (there is no flag for it)."""
    rec = synthetic_record(steps=4)
    fp = copy.deepcopy(rec.fingerprints)
    fp.setdefault("env", {}).pop("dynamics", None)
    fp["env"].pop("time_limits", None)
    with pytest.raises(ConfigError, match="no step limit.*cannot be used") as info:
        max_steps_of(dataclasses.replace(rec, fingerprints=fp), source="runs/x")
    assert info.value.problem.startswith("runs/x: episode 0")


def test_overlapping_seeds_name_the_seed_flag():
    """Held-out seeds that overlap the collected ones: a ConfigError on `seed`, which `rollcap recap` spells --seed."""
    from rollcap.rollout.cli.commands import build_parser
    from rollcap.rollout.learn.recap import evaluate

    seeds = evaluate.stream_seeds(0, evaluate.TEST, 3)
    with pytest.raises(ConfigError) as info:
        evaluate.check_disjoint(seeds, {seeds[1]}, "held-out")
    opts = build_parser().parse_args(["recap", "runs/x", "--out", "runs/y"]).options
    assert info.value.field == "seed" and opts.flag("seed") == "--seed"
    assert opts.spell(info.value.problem).endswith("use another --seed")
