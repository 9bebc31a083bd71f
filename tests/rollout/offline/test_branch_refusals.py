"""Refused `rollcap branch` commands: one line naming the flag or file, exit 2, and nothing created before every input is checked."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys

import pytest

from rollcap.rollout.config import HostConfig
from rollcap.rollout.errors import ConfigError
from rollcap.rollout.host import RolloutHost
from rollcap.rollout.recording import EpisodeRecorder, load_any
from tests.rollout._other_env import record_inverted_pendulum
from tests.rollout._tiny import make_env

pytestmark = (
    pytest.mark.slow
)  # the rollcap command in subprocesses: the fast tier (-m "not slow") leaves them to the full suite

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


def rollcap(*args, timeout=300):
    return subprocess.run([*ROLLCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def runs(runners, tmp_path_factory):
    """A run of the built-in env (2 episodes), the same episodes with no step limit recorded, and a run of InvertedPendulum-v5."""
    p, c = runners
    root = tmp_path_factory.mktemp("runs")
    host = RolloutHost(make_env(), p, c, HostConfig(seed=5, max_chunks=4))
    recs = [host.run_episode(i).record for i in range(2)]
    with EpisodeRecorder(root / "run", ("npz",)) as rec:
        for r in recs:
            rec.write(r)
    with EpisodeRecorder(
        root / "nolimit", ("npz",)
    ) as rec:  # an env that records no step limit (and PushBlock has no TimeLimit)
        for r in recs:
            fp = copy.deepcopy(r.fingerprints)
            del fp["env"]["dynamics"]["max_steps"]
            rec.write(dataclasses.replace(r, fingerprints=fp))
    (root / "empty").mkdir()
    (root / "a-file").write_text("not a directory")
    return {
        "run": root / "run",
        "nolimit": root / "nolimit",
        "ip": record_inverted_pendulum(root / "ip"),
        "empty": root / "empty",
        "file": root / "a-file",
    }


def _refused(res, *needles) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "MC value" not in res.stdout, "refused after branches ran"
    return lines[0]


@pytest.mark.parametrize(
    "case, args, needles",
    [
        ("empty", ["{empty}", "--calibrate"], ["{empty}"]),
        ("another env", ["{ip}", "--calibrate"], ["--policy", "InvertedPendulum-v5"]),
        ("no such episode", ["{run}", "--calibrate", "--episode", "9"], ["--episode", "episode 9"]),
        ("no such episode, branch", ["{run}", "--episode", "9"], ["--episode", "no episode 9"]),
        (
            "no step limit",
            ["{nolimit}", "--episode", "0", "--chunk", "1", "--n", "2"],
            ["{nolimit}", "no step limit", "cannot be used"],
        ),
        ("no step limit, calibrate", ["{nolimit}", "--calibrate", "--n", "2"], ["{nolimit}", "no step limit"]),
        ("calibrate n", ["{run}", "--calibrate", "--n", "1"], ["--n: "]),
    ],
)
def test_a_refused_branch_creates_no_out_directory(runs, ckpt, tmp_path, case, args, needles):
    """Each refusal names the flag or file, exits 2 before any branch runs, and leaves no --out behind."""
    out = tmp_path / "out"
    res = rollcap("branch", *(a.format(**runs) for a in args), "--out", out, *ckpt[:4])
    line = _refused(res, *(n.format(**runs) for n in needles))
    assert "env_id:" not in line and "`" not in line
    assert not out.exists(), f"{case}: {sorted(p.name for p in out.rglob('*'))}"


@pytest.mark.parametrize("calibrate", [False, True])
def test_an_out_that_is_a_file_is_refused_before_anything_runs(runs, ckpt, calibrate):
    """--out naming a file: one line naming --out, before a branch runs (not an errno after all of them)."""
    res = rollcap(
        "branch",
        runs["run"],
        "--episode",
        "0",
        "--chunk",
        "1",
        "--n",
        "2",
        *(["--calibrate", "--every", "2"] if calibrate else []),
        "--out",
        runs["file"],
        *ckpt[:4],
    )
    _refused(res, "--out", str(runs["file"]), "not a directory")
    assert runs["file"].read_text() == "not a directory"


def test_an_out_holding_episodes_names_the_flag(runs, ckpt):
    """--out holding a run: the message names --out and says there is no resuming (not Python's resume=True), and the run is untouched."""
    before = sorted(p.name for p in (runs["run"] / "episodes").iterdir())
    res = rollcap("branch", runs["run"], "--episode", "0", "--chunk", "1", "--n", "2", "--out", runs["run"], *ckpt[:4])
    line = _refused(res, "--out", "choose another --out")
    assert "resume=True" not in line
    assert sorted(p.name for p in (runs["run"] / "episodes").iterdir()) == before


def test_branch_api_refuses_before_writing(runs, ckpt, tmp_path):
    """rollcap.branch (the same code, in Python): a parent without a step limit is a ConfigError naming the file, and out is never made."""
    from pathlib import Path

    from rollcap.rollout.spec import Parts
    from rollcap.rollout.api import branch_episode

    parts = Parts(policy=Path(ckpt[1]), critic=Path(ckpt[3]))
    with pytest.raises(ConfigError, match="no step limit") as info:
        branch_episode(runs["nolimit"], 0, 1, 2, out=tmp_path / "b", parts=parts)
    assert info.value.field == "env_id" and str(runs["nolimit"]) in str(info.value)
    assert not (tmp_path / "b").exists()


def test_branch_prints_a_label_per_branch_and_writes_them(runs, ckpt, tmp_path):
    """A branch that runs: each row's noise label is the word itself, '(parent)' or '(seed)', never padded inside the brackets."""
    out = tmp_path / "br"
    res = rollcap("branch", runs["run"], "--episode", "0", "--chunk", "1", "--n", "2", "--out", out, *ckpt[:4])
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [ln for ln in res.stdout.splitlines() if ln.startswith("branch ")]
    assert len(rows) == 3 and "(parent)" in rows[0] and all("(seed)" in r for r in rows[1:]), res.stdout
    assert "(seed " not in res.stdout
    assert [r.index for r in load_any(out)] == [0, 1, 2]
