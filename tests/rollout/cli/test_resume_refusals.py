"""`rollcap run --resume` refusals that name the flag, on a plain run and on a sharded (env-worker) run: another format,
other env kwargs, a total smaller than what the run holds. Exit 2, one line, the run untouched."""

from __future__ import annotations

import hashlib
import json

import pytest

from rollcap.rollout.cli import main


def _tree(d) -> dict:
    return {
        str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()
    }


def _run(ckpt, out, *extra) -> int:
    return main(["run", "--max-chunks", "2", "--no-progress", "--out", str(out), *ckpt, *extra])


@pytest.fixture(scope="module")
def runs(ckpt, tmp_path_factory):
    """A plain run of 3 episodes and a sharded one (2 envs on 1 env worker) of 2."""
    d = tmp_path_factory.mktemp("resume")
    assert _run(ckpt, d / "plain", "--episodes", "3") == 0
    assert _run(ckpt, d / "sharded", "--episodes", "2", "--envs", "2", "--env-workers", "1") == 0
    return d


OTHER_KWARGS = '{"image_size": 32, "max_steps": 50}'


@pytest.mark.slow(seconds=25)
@pytest.mark.parametrize(
    "kind, flags, needle",
    [
        ("plain", ["--episodes", "4", "--format", "npz"], "--format: {run} records npz,h5; --resume needs the same formats, got npz"),
        ("sharded", ["--episodes", "4", "--format", "npz"], "--format: {run} records npz,h5; --resume needs the same formats, got npz"),
        ("sharded", ["--episodes", "4", "--env-kwargs", OTHER_KWARGS],
         '--env-kwargs: {run} was recorded with env_kwargs {{"image_size":32}}; --resume needs the same, got {{"image_size":32,"max_steps":50}}'),
        ("plain", ["--episodes", "2"], "--episodes: {run} holds 3 episodes already; with --resume it is the run's total: give at least 3"),
        ("sharded", ["--episodes", "1"], "--episodes: {run} holds 2 episodes already; with --resume it is the run's total: give at least 2"),
    ],
)  # fmt: skip
def test_resume_refuses_naming_the_flag_not_the_manifest(runs, ckpt, capsys, kind, flags, needle):
    """One line naming the flag and the run (manifest.jsonl and raw env metadata were named for a sharded run; the format
    of a plain run was changed without a word, and a smaller total rewrote summary.json as finished)."""
    run = runs / kind
    before = _tree(run)
    extra = ["--envs", "2", "--env-workers", "1"] if kind == "sharded" else []
    assert _run(ckpt, run, "--resume", *extra, *flags) == 2  # a later --env-kwargs replaces the checkpoints' one
    err = capsys.readouterr().err.strip()
    assert err == f"rollcap run: error: {needle.format(run=run)}", err
    assert "manifest.jsonl" not in err and _tree(run) == before
    assert json.loads((run / "summary.json").read_text())["episodes"] == (3 if kind == "plain" else 2)
