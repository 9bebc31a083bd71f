"""The LeRobot doors of the command line: `rollcap run --policy lerobot:DIR` (locally and on 1 and 2 Ray actors,
with the shipped critic), `rollcap replay` exact in a fresh process, `rollcap export --to lerobot|minari`,
the instruction as a feature, the shipped ACT checkpoint and the loop example. Run in LeRobot's venv:

    bash scripts/lerobot_env.sh && HF_HUB_OFFLINE=1 .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip(
    "lerobot", reason="lerobot is not installed here; it lives in its own venv (bash scripts/lerobot_env.sh)"
)
pytest.importorskip(
    "minari", reason="minari is not installed here (it is in LeRobot's venv: bash scripts/lerobot_env.sh)"
)

import torch
from rollcap.policies.lerobot_features import INSTRUCTION_FEATURE, instruction_vector
from rollcap.policies.lerobot import LeRobotPolicy
from rollcap.rollout.recording import episode_digest, load_any

from tests.lerobot import _tiny

pytestmark = pytest.mark.lerobot
torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]
SHIPPED_ACT = ROOT / "examples" / "lerobot_act"
KW = json.dumps({"max_steps": 16})
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def rollcap(*args, timeout=600) -> subprocess.CompletedProcess:
    """``rollcap ARGS`` in a fresh process of this venv."""
    return subprocess.run(
        [sys.executable, "-m", "rollcap.rollout.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        check=False,
    )


def digests(run_dir) -> list[str]:
    return [episode_digest(r) for r in sorted(load_any(run_dir), key=lambda r: r.index)]


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory):
    """A tiny ACT reading the state and the instruction (as a 16-dim hashed bag of words)."""
    return _tiny.act(tmp_path_factory.mktemp("act"), image=False, instruction_dims=16)


@pytest.fixture(scope="module")
def local_run(act_dir, tmp_path_factory):
    """Three episodes of `rollcap run --policy lerobot:DIR` with the shipped critic, in this venv's CLI."""
    out = tmp_path_factory.mktemp("local") / "run"
    res = rollcap("run", "--policy", f"lerobot:{act_dir}", "--episodes", 3, "--env-kwargs", KW, "--out", out)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_run_and_replay_in_a_fresh_process(act_dir, local_run):
    """Recorded with the critic; `rollcap replay --policy lerobot:DIR` in a new process: every episode exact in all three modes."""
    rec = load_any(local_run)[0]
    assert rec.fingerprints["policy"]["kind"] == "lerobot.act" and "critic" in rec.fingerprints
    assert np.isfinite(rec.chunks["critic_value"]).all()
    res = rollcap("replay", local_run, "--policy", f"lerobot:{act_dir}")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "9 exact" in res.stdout.splitlines()[-1], res.stdout


@pytest.mark.slow
@pytest.mark.parametrize("actors", [1, 2])
def test_ray_actors_record_the_same_episodes(act_dir, local_run, tmp_path, actors):
    """On 1 and 2 Ray actors: the same episode digests as the local run, and each replays exact in a fresh process."""
    pytest.importorskip("ray", reason="ray is not installed in this venv (bash scripts/lerobot_env.sh installs it)")
    out = tmp_path / "ray"
    res = rollcap(
        "run", "--policy", f"lerobot:{act_dir}", "--episodes", 3, "--env-kwargs", KW, "--actors", actors, "--out", out
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert digests(out) == digests(local_run)
    res = rollcap("replay", out, "--policy", f"lerobot:{act_dir}", "--mode", "policy,closed")
    assert res.returncode == 0 and "6 exact" in res.stdout.splitlines()[-1], res.stdout[-2000:] + res.stderr[-2000:]


def test_bad_policy_names_are_one_line(tmp_path):
    """A directory without config.json, a non-LeRobot config: one line naming --policy, exit 2, nothing created."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text('{"type": "no-such-policy"}')
    for arg in (f"lerobot:{tmp_path}", f"lerobot:{tmp_path / 'bad'}"):
        res = rollcap("run", "--policy", arg, "--episodes", 1, "--out", tmp_path / "out")
        assert res.returncode == 2 and res.stderr.startswith("rollcap run: error: --policy: lerobot:"), res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "out").exists()


def test_export_cli_lerobot_and_minari(local_run, tmp_path):
    """`rollcap export --to lerobot` (state + instruction vector) and `--to minari` write whole datasets that read back."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    res = rollcap(
        "export",
        local_run,
        "--to",
        "lerobot",
        "--root",
        tmp_path / "ds",
        "--obs-keys",
        "state",
        "--instruction-dims",
        16,
        "--extras",
        "reward,success",
    )
    assert res.returncode == 0, res.stderr[-2000:]
    records = load_any(local_run)
    ds = LeRobotDataset("rollcap/ds", root=tmp_path / "ds")
    assert "observation.images.front" not in ds.meta.features and {"next.reward", "next.success"} <= set(
        ds.meta.features
    )
    assert len(ds) == sum(r.num_steps for r in records)
    first = ds[0]
    assert first[INSTRUCTION_FEATURE].numpy().tobytes() == instruction_vector(records[0].instruction, 16).tobytes()
    assert first["observation.state"].numpy().tobytes() == records[0].obs["state"][0].tobytes()
    res = rollcap(
        "export", local_run, "--to", "minari", "--root", tmp_path / "minari", "--dataset-id", "rollcap/loop-v0"
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "minari" / "rollcap" / "loop-v0" / "data" / "main_data.hdf5").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--to", "lerobot", "--obs-keys", "wrist"), "--obs-keys: 'wrist' is not an observation key"),
        (("--to", "lerobot", "--extras", "colour"), "--extras: unknown feature 'colour'"),
        (("--to", "minari", "--videos"), "--videos: an option of --to lerobot"),
        (("--to", "lerobot", "--instruction-dims", "-1"), "--instruction-dims: expected an integer >= 0"),
    ],
)
def test_export_cli_refuses_bad_input(local_run, tmp_path, args, message):
    """Bad flags: one line naming the flag, exit 2, nothing written."""
    res = rollcap("export", local_run, "--root", tmp_path / "out", *args)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert list(tmp_path.iterdir()) == []


def test_export_leaves_nothing_when_a_run_is_missing(tmp_path):
    """A missing run: one line naming RUN, exit 2, no dataset directory."""
    res = rollcap("export", tmp_path / "missing", "--to", "lerobot", "--root", tmp_path / "ds")
    assert res.returncode == 2 and "RUN: " in res.stderr and not (tmp_path / "ds").exists(), res.stderr


def test_rollcap_export_in_python(local_run, tmp_path):
    """`rollcap.export(run, to=..., root=...)` is the command's door; an option the target lacks is a ValueError naming it."""
    import rollcap as rc

    out = rc.export(local_run, "lerobot", tmp_path / "ds", obs_keys=("state",))
    assert out.episodes == 3
    with pytest.raises(ValueError, match="videos: not an option of the minari export"):
        rc.export(local_run, "minari", tmp_path / "m", videos=True)


@pytest.mark.skipif(
    not (SHIPPED_ACT / "config.json").is_file(), reason="no shipped ACT checkpoint in examples/lerobot_act"
)
def test_shipped_act_runs_with_the_critic_and_replays(tmp_path):
    """examples/lerobot_act (trained by examples/lerobot_loop.py): two episodes with the shipped critic, replayed exact."""
    policy = LeRobotPolicy.load(SHIPPED_ACT)
    assert policy.chunk_shape == (8, 2) and policy.execute_steps == 4
    out = tmp_path / "run"
    res = rollcap("run", "--policy", f"lerobot:{SHIPPED_ACT}", "--episodes", 2, "--seed", 5, "--out", out)
    assert res.returncode == 0, res.stderr[-2000:]
    res = rollcap("replay", out, "--policy", f"lerobot:{SHIPPED_ACT}")
    assert res.returncode == 0 and "6 exact" in res.stdout.splitlines()[-1], res.stdout[-2000:]


@pytest.mark.slow
def test_loop_example_smoke(tmp_path):
    """examples/lerobot_loop.py with a tiny budget: demos, export, lerobot-train, run, replay exact, inspect --plot."""
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "lerobot_loop.py"),
        "--out",
        str(tmp_path),
        "--demos",
        "4",
        "--steps",
        "2",
        "--episodes",
        "2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=ENV, check=False)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "6 exact" in res.stdout and list((tmp_path / "eval" / "plots").glob("*.png")), res.stdout[-3000:]
