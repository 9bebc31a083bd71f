"""Errors on the command line name flags, not Python parameters: one message, spelled for whoever reads it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollcap.rollout.options import Options

pytestmark = (
    pytest.mark.slow
)  # the rollcap command in subprocesses: the fast tier (-m "not slow") leaves them to the full suite

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


def rollcap(*args, timeout=240):
    return subprocess.run([*ROLLCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


@dataclass(frozen=True)
class Toy:
    """A toy config."""

    resume: bool = False
    """Continue."""
    actors: int = 0
    """Actors."""
    env_id: str = "x"
    """Env."""


def test_spell_writes_quoted_fields_as_this_commands_flags():
    """`name`, `name=True/False/value` become the flag (of a config field or the command's own option); unknown names stay."""
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--chunk", type=int)
    opts = Options(p)
    opts.add(Toy, flags={"env_id": "--env"})
    assert opts.spell("pass `resume=True`; or `resume=False`") == "pass --resume; or --no-resume"
    assert (
        opts.spell("needs actors (`actors=N`, N >= 1); drop `actors`")
        == "needs actors (--actors N, N >= 1); drop --actors"
    )
    assert (
        opts.spell("`env_id` and `chunk=3` but not `episodes=5` nor `FetchReach`")
        == "--env and --chunk 3 but not `episodes=5` nor `FetchReach`"
    )
    assert opts.flag("chunk") == "--chunk" and opts.flag("resume") == "--resume" and opts.flag("file") is None


@pytest.fixture(scope="module")
def run_dir(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    res = rollcap("run", "--episodes", 1, "--out", out, "--max-chunks", 2, "--no-progress", *ckpt)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def _line(res) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and " MuJoCo: compiler attribute" not in ln]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    line = lines[0]
    for python in ("=True", "=N", "`", "env_id:", "n=", " resume ", "(resume"):
        assert python not in line, line
    return line


@pytest.mark.parametrize(
    "args, needles",
    [
        (["run", "--teleop", "terminal", "--actors", "2"], ["--teleop: ", "drop --actors"]),
        (["run", "--address", "auto"], ["--address: ", "--actors N"]),
        (["branch", "{run}", "--address", "auto"], ["--address: ", "--actors N"]),
        (["branch", "{run}", "--format", "csv"], ["--format: "]),
        (["branch", "{run}", "--every", "0", "--calibrate"], ["--every: "]),
        (["branch", "{run}", "--n", "0", "--no-control"], ["--n: "]),
        (["branch", "{run}", "--chunk", "99"], ["--chunk: "]),
        (["branch", "{run}", "--env", "HalfCheetah-v5"], ["--env: ", "drop --env"]),
        (["replay", "{run}", "--env", "HalfCheetah-v5"], ["--env: ", "drop --env"]),
        # a flag the command does not take: the error names the command, not the top-level parser
        (["replay", "{run}", "--episodes", "x"], ["rollcap replay: error: unrecognized arguments: --episodes x"]),
        (["run", "--policy-size", "3b"], ["rollcap run: error: unrecognized arguments: --policy-size 3b"]),
    ],
)
def test_quick_refusals_name_flags(run_dir, ckpt, tmp_path, args, needles):
    """Refusals found from the flags alone (or the recording): one line, the flag first, every other field as a flag too."""
    out = ["--out", tmp_path / "out"] if args[0] in ("run", "branch") else []
    line = _line(rollcap(*(a.format(run=run_dir) for a in args), *out, *(ckpt[:4] if args[0] != "run" else ())))
    for needle in needles:
        assert needle in line, line
    assert not (tmp_path / "out").exists()


def test_a_non_empty_out_names_resume(run_dir, ckpt):
    """run --out DIR holding a run, without --resume: the message names --resume and --out."""
    line = _line(rollcap("run", "--episodes", 1, "--out", run_dir, "--no-progress", *ckpt))
    assert (
        line.startswith("rollcap run: error: --out: ")
        and "--resume continues that run" in line
        and "choose another --out" in line
    )


def test_resuming_with_another_seed_names_both_flags(run_dir, ckpt):
    """run --resume with another --seed: the message names --seed and --resume."""
    line = _line(
        rollcap(
            "run", "--episodes", 2, "--out", run_dir, "--resume", "--seed", 9, "--max-chunks", 2, "--no-progress", *ckpt
        )
    )
    assert line.startswith("rollcap run: error: --seed: ") and "--resume needs the same" in line


def test_branching_a_run_the_policy_cannot_read_names_the_policy_and_the_file(run_dir, ckpt, tmp_path):
    """The recording's env cannot change: a model that cannot read it is named (--policy) with the recording, not a Python field."""
    from tests.rollout._other_env import record_inverted_pendulum

    ip = record_inverted_pendulum(tmp_path / "ip", episodes=1)
    line = _line(rollcap("branch", ip, "--out", tmp_path / "b", *ckpt[:4]))
    assert line.startswith("rollcap branch: error: --policy: ") and str(ip) in line and "InvertedPendulum-v5" in line


@pytest.mark.parametrize("command", ["run", "branch"])
def test_an_out_that_cannot_be_created_names_out(run_dir, ckpt, tmp_path, command):
    """--out under a file, or where no directory can be made (/proc): one line naming --out and why, before building."""
    (tmp_path / "file").write_text("")
    outs = [tmp_path / "file" / "x"] + ([Path("/proc/rollcap-x")] if Path("/proc/self").is_dir() else [])
    for out in outs:
        args = ["run", "--episodes", 1, *ckpt] if command == "run" else ["branch", run_dir, *ckpt[:4]]
        line = _line(rollcap(*args, "--out", out))
        assert line.startswith(f"rollcap {command}: error: --out: ") and str(out.parent) in line, line
        assert "Errno" not in line and not out.exists()


def test_a_cuda_backend_without_a_cuda_device_names_backend_and_device(ckpt, tmp_path):
    """--backend cuda on the CPU: one line naming --backend and --device, not a critic's buffers."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: --backend cuda is fine")
    line = _line(rollcap("run", "--backend", "cuda", "--episodes", 1, "--out", tmp_path / "o", *ckpt))
    assert line.startswith("rollcap run: error: --backend: ") and "--device cuda" in line and "critic" not in line
    assert not (tmp_path / "o").exists()
