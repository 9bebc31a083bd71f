"""``rollcap run --resume`` with another deployment: one line naming the flag and both values, exit 2, nothing touched."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys

import pytest

from rollcap.rollout.config import HostConfig
from rollcap.rollout.recording import episode_digest, load_any
from rollcap.rollout.offline.deployment import SAME_ON_RESUME

pytestmark = pytest.mark.slow(seconds=60)  # the rollcap command in subprocesses

ROLLCAP = [sys.executable, "-m", "rollcap.rollout.cli"]


def rollcap(*args, timeout=240):
    return subprocess.run([*ROLLCAP, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _tree(d) -> dict:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def run_dir(ckpt, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "r"
    res = rollcap("run", "--episodes", 1, "--seed", 5, "--out", out, "--max-chunks", 2, "--no-progress", *ckpt)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


@pytest.mark.parametrize(
    "flags, flag, was, got",
    [
        (["--precision", "bf16"], "--precision", "fp32", "bf16"),
        (["--sampler", "fused"], "--sampler", "plain", "fused"),
        (["--backend", "eager"], "--backend", "jit", "eager"),
        (["--envs", "2"], "--envs", "1", "2"),
        (["--envs", "4", "--graphs", "2"], "--envs", "1", "2"),
        (["--seed", "6"], "--seed", "5", "6"),
        (["--max-chunks", "3"], "--max-chunks", "2", "3"),
        (["--critic", "none"], "--critic", "sha256:", "none"),
        (["--env-kwargs", '{"image_size": 32, "max_steps": 50}'], "--env-kwargs", "{", '"max_steps":50'),
        # dropping a format the run records is refused first (its later episodes would be missing from that format)
        (["--env-kwargs", '{"image_size": 32, "max_steps": 50}', "--format", "npz"], "--format", "npz,h5", "npz"),
    ],
)
def test_resume_refuses_another_setting_naming_its_flag(run_dir, ckpt, flags, flag, was, got):
    """Each setting an episode's bytes depend on: refused in one line (the flag, the recorded and the given value), exit 2, the run untouched."""
    before = _tree(run_dir)
    base = [*ckpt]
    if "--critic" in flags:
        base = base[:2] + base[4:]  # the given --critic replaces the checkpoint's
    if "--env-kwargs" in flags:
        base = base[:-2]
    res = rollcap(
        "run", "--episodes", 2, "--seed", 5, "--out", run_dir, "--resume", "--max-chunks", 2, "--no-progress",
        *base, *flags,
    )  # fmt: skip
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and " MuJoCo: compiler attribute" not in ln]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    line = lines[0]
    assert line.startswith(f"rollcap run: error: {flag}: "), line
    assert "--resume needs" in line and was in line and got in line.split("got", 1)[1], line
    assert _tree(run_dir) == before


def test_resume_with_the_same_batch_on_more_graphs_is_accepted(run_dir, ckpt, tmp_path):
    """--envs 2 --graphs 2 runs each graph at batch 1, the bytes of --envs 1: not refused."""
    import shutil

    out = tmp_path / "r"
    shutil.copytree(run_dir, out)
    res = rollcap(
        "run", "--episodes", 2, "--seed", 5, "--out", out, "--resume", "--max-chunks", 2, "--no-progress",
        "--envs", 2, "--graphs", 2, *ckpt,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    first = json.loads((run_dir / "summary.json").read_text())
    assert summary["episodes"] == 2 and summary["chunks"] > first["chunks"]  # the summary covers the whole run


def test_the_table_holds_every_host_setting_and_no_placement():
    """Every HostConfig field (in every episode's config) is compared; where episodes run (actors, env workers, writers) is not."""
    options = {option for _, option in SAME_ON_RESUME}
    assert {f.name for f in dataclasses.fields(HostConfig)} <= options
    assert not options & {"actors", "env_workers", "writers", "graphs", "threads", "out", "episodes"}


def test_resume_with_another_env_worker_count_is_accepted(ckpt, tmp_path):
    """Where the envs step (--env-workers) changes no byte: a run made on 2 workers resumes on 1, all its settings the
    same, and the summary names the worker count; --env-workers auto says what it chose and records the same bytes."""
    out = tmp_path / "w"
    common = ["--seed", 5, "--out", out, "--max-chunks", 2, "--no-progress", "--envs", 2, *ckpt]
    first = rollcap("run", "--episodes", 2, "--env-workers", 2, *common)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "env workers      2" in first.stdout, first.stdout
    res = rollcap("run", "--episodes", 4, "--env-workers", 1, "--resume", *common)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["episodes"] == 4
    # auto says what it chose (in this process on a box of under 4 cores, else workers), and records the same bytes
    common[common.index(out)] = tmp_path / "auto"
    res = rollcap("run", "--episodes", 4, "--env-workers", "auto", *common)
    assert res.returncode == 0, res.stderr[-3000:]
    said = [ln for ln in res.stderr.splitlines() if ln.startswith("rollcap: --env-workers auto: ")]
    assert len(said) == 1 and said[0].endswith("cores, --envs 2)"), res.stderr[-2000:]
    digests = [sorted(episode_digest(r) for r in load_any(d)) for d in (out, tmp_path / "auto")]
    assert digests[0] == digests[1]
