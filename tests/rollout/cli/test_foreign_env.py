"""An env another package registers (gymnasium-robotics' FetchReach-v4): recorded with its module, replayed with --env module:id."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from rollcap.rollout.recording import load_any

HELPER = Path(__file__).with_name("_foreign_env.py")
QUALIFIED = "gymnasium_robotics:FetchReach-v4"

pytestmark = [
    pytest.mark.slow,  # the rollcap command in subprocesses: the fast tier leaves them to the full suite
    pytest.mark.skipif(
        importlib.util.find_spec("gymnasium_robotics") is None,
        reason="gymnasium_robotics is not installed (pip install gymnasium-robotics): no env of another package to record",
    ),
]


def helper(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(HELPER), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def _ours(stderr: str) -> list[str]:
    """stderr without gymnasium-robotics' import-time notice."""
    return [ln for ln in stderr.splitlines() if ln.strip() and "gymnasium-robotics" not in ln]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One FetchReach-v4 episode made from 'gymnasium_robotics:FetchReach-v4', and one from the plain id after importing the package."""
    root = tmp_path_factory.mktemp("fetch")
    for name, extra in (("qualified", ()), ("plain", ("--plain",))):
        res = helper("record", root / name, *extra)
        assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    return root


def test_the_recording_names_the_module(runs):
    """The env id is recorded with its module (episode and robomimic env_args); a plain id stays plain."""
    rec = load_any(runs / "qualified")[0]
    assert rec.env_id == QUALIFIED and rec.fingerprints["env"]["env_id"] == QUALIFIED
    import h5py
    import json

    with h5py.File(runs / "qualified" / "episodes.hdf5", "r") as f:
        assert json.loads(f["data"].attrs["env_args"])["env_name"] == QUALIFIED
    assert load_any(runs / "plain")[0].env_id == "FetchReach-v4"


def test_replay_without_env_imports_nothing_and_says_which_flag(runs):
    """No --env: the episode fails naming --env gymnasium_robotics:FetchReach-v4, and gymnasium_robotics is never imported."""
    res = helper("cli", "replay", runs / "qualified", "--mode", "env")
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"pass --env {QUALIFIED}" in res.stdout and "env_id:" not in res.stdout
    assert "imported gymnasium_robotics: no" in res.stderr


def test_replay_with_the_plain_id_names_the_qualified_one(runs):
    """--env FetchReach-v4 for a recording of gymnasium_robotics:FetchReach-v4: one line naming --env and the id to pass; nothing imported."""
    res = helper("cli", "replay", runs / "qualified", "--mode", "env", "--env", "FetchReach-v4")
    assert res.returncode == 2, res.stdout + res.stderr
    lines = _ours(res.stderr)
    assert (
        len(lines) == 2
        and lines[0].startswith("rollcap replay: error: --env: FetchReach-v4: ")
        and f"--env {QUALIFIED}" in lines[0]
    ), lines
    assert lines[1] == "imported gymnasium_robotics: no"


def test_replay_with_the_module_qualified_id_is_exact(runs):
    """--env gymnasium_robotics:FetchReach-v4 names the recorded env: it is imported and the episode replays exactly."""
    res = helper("cli", "replay", runs / "qualified", "--mode", "env", "--env", QUALIFIED)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 episode(s), 1 mode(s): 1 exact" in res.stdout


def test_a_plain_recording_is_replayed_by_naming_its_module(runs):
    """A recording of the plain id: without --env it says how to name the package; --env module:id names the same env and is exact."""
    res = helper("cli", "replay", runs / "plain", "--mode", "env")
    assert res.returncode == 1 and "--env PACKAGE:FetchReach-v4" in res.stdout, res.stdout + res.stderr
    assert "imported gymnasium_robotics: no" in res.stderr
    res = helper("cli", "replay", runs / "plain", "--mode", "env", "--env", QUALIFIED)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 episode(s), 1 mode(s): 1 exact" in res.stdout
