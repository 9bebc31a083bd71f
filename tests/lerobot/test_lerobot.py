"""LeRobot both ways: rollcap recordings exported to LeRobotDataset v3 and Minari and read back exactly; a
LeRobot policy (ACT, Diffusion Policy) under rollcap's host, replayed. Run in LeRobot's venv:

    bash scripts/lerobot_env.sh && .venv-lerobot/bin/python -m pytest -q -m lerobot tests/lerobot
"""

from __future__ import annotations

import os

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
from rollcap.policies.lerobot import LeRobotPolicy
from rollcap.rollout.offline.replay import (
    closed_loop_host,
    replay_closed,
    replay_env,
    replay_policy,
)
from rollcap.rollout.recording import load_any
from rollcap.rollout.recording.to_lerobot import export_lerobot
from rollcap.rollout.recording.to_minari import export_minari
from rollcap.rollout.errors import ExportWarning

import rollcap
from tests.lerobot import _tiny

pytestmark = pytest.mark.lerobot
torch.set_num_threads(1)
ENV_KWARGS = {"max_steps": 24}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Three episodes of the built-in task with the shipped policy and critic."""
    out = tmp_path_factory.mktemp("run") / "run"
    rollcap.run(episodes=3, out=out, progress=False, env_kwargs=ENV_KWARGS)
    return out


def test_export_lerobot_reads_back_exactly(run_dir, tmp_path):
    """Every frame's state, action and image come back bit-exact, with the instruction as task and the extras."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    records = load_any(run_dir)
    out = export_lerobot(run_dir, tmp_path / "ds")
    assert (out.episodes, out.frames) == (3, sum(r.num_steps for r in records))
    ds = LeRobotDataset(out.repo_id, root=out.root)
    assert (
        ds.meta.total_episodes == 3
        and len(ds) == out.frames
        and ds.meta.features["observation.images.front"]["dtype"] == "image"
    )
    i = 0
    for e, rec in enumerate(records):
        for t in range(rec.num_steps):
            f = ds[i]
            i += 1
            assert (int(f["episode_index"]), int(f["frame_index"]), f["task"]) == (e, t, rec.instruction)
            assert f["observation.state"].numpy().tobytes() == rec.obs["state"][t].tobytes()
            assert f["action"].numpy().tobytes() == rec.steps["actions"][t].tobytes()
            img = (f["observation.images.front"] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
            assert np.array_equal(img, rec.obs["image_front"][t])
            assert float(f["next.reward"]) == np.float32(rec.steps["rewards"][t])
            assert bool(f["next.done"]) == rec.steps["dones"][t] and bool(f["intervention"]) is False
            assert bool(f["next.success"]) == (rec.success and t == rec.num_steps - 1)
            k = np.searchsorted(rec.chunks["chunk_start"], t, side="right") - 1
            assert float(f["critic_value"]) == rec.chunks["critic_value"][k]
    assert i == len(ds)


def test_export_lerobot_leaves_nothing_on_failure(run_dir, tmp_path, monkeypatch):
    """An error mid-export leaves neither the dataset nor its staging directory."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    def boom(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(LeRobotDataset, "save_episode", boom)
    with pytest.raises(OSError, match="disk full"):
        export_lerobot(run_dir, tmp_path / "ds")
    assert list(tmp_path.iterdir()) == []


def test_export_minari_reads_back_exactly(run_dir, tmp_path, monkeypatch):
    """Observations (with the final one), actions, rewards, terminations and truncations come back exactly; actions the
    env clipped are kept as recorded, with one warning saying how many."""
    import minari

    records = load_any(run_dir)
    # the policy's chunks leave the action box at 2 of 72 steps: said once, kept as recorded (the env clipped them)
    with pytest.warns(ExportWarning, match="steps with data outside the env's space"):
        out = export_minari(
            run_dir,
            "rollcap/pushblock-v0",
            root=tmp_path / "minari",
            author="rollcap tests",
            author_email="tests@rollcap.invalid",
            code_permalink="tests/lerobot/test_lerobot.py",
        )
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out.root))
    ds = minari.load_dataset(out.dataset_id)
    assert ds.total_episodes == 3 and ds.total_steps == out.steps
    for rec, ep in zip(records, ds.iterate_episodes(), strict=True):
        assert ep.id == rec.index
        for k in ("state", "image_front"):
            want = np.concatenate([rec.obs[k], rec.final_obs[k][None]])
            assert ep.observations[k].dtype == want.dtype and ep.observations[k].tobytes() == want.tobytes()
        assert list(ep.observations["instruction"]) == [rec.instruction] * (rec.num_steps + 1)
        assert ep.actions.tobytes() == rec.steps["actions"].tobytes()
        assert ep.rewards.dtype == np.float64 and ep.rewards.tobytes() == rec.steps["rewards"].tobytes()
        assert np.array_equal(ep.terminations, rec.steps["terminated"]) and np.array_equal(
            ep.truncations, rec.steps["truncated"]
        )
    assert ds.recover_environment().spec.id == records[0].env_id


@pytest.fixture(scope="module")
def act_dir(tmp_path_factory):
    """A tiny ACT (no pretrained backbone), saved with its processors."""
    return _tiny.act(tmp_path_factory.mktemp("act"))


def test_act_under_the_host_replays_exactly(act_dir, tmp_path):
    """A saved ACT loads offline, runs two episodes under rollcap's host, and replays exactly (policy, env, closed loop)."""
    policy = LeRobotPolicy.load(act_dir)
    assert policy.chunk_shape == (6, 2) and policy.state_fingerprint()["noise"] == "not an input"
    result = rollcap.run(2, out=tmp_path / "run", policy=policy, progress=False, env_kwargs=ENV_KWARGS)
    assert result.summary["episodes"] == 2
    again = LeRobotPolicy.load(act_dir)  # a fresh load: what an offline replay has
    env = rollcap.make_env(rollcap.rollout.spec.DEFAULT_ENV, ENV_KWARGS)
    for rec in result.records():
        assert rec.fingerprints["policy"]["kind"] == "lerobot.act" and rec.num_steps == ENV_KWARGS["max_steps"]
        assert replay_policy(rec, again).status == "exact"
        assert replay_env(rec, env).status == "exact"
        assert replay_closed(rec, closed_loop_host(rec, env, again)).status == "exact"


def test_unmappable_feature_is_named(act_dir):
    """An observation without the policy's state feature is a one-line ValueError naming it."""
    policy = LeRobotPolicy.load(act_dir)
    obs = {"image_front": np.zeros((64, 64, 3), np.uint8), "instruction": "push"}
    with pytest.raises(ValueError, match="'observation.state'") as err:
        policy.start(obs, np.zeros(policy.chunk_shape, np.float32))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=r"'observation.images.front': expected shape \(3, 64, 64\)"):
        policy.start(
            {**obs, "state": np.zeros(28, np.float32), "image_front": np.zeros((32, 32, 3), np.uint8)},
            np.zeros(policy.chunk_shape, np.float32),
        )


@pytest.mark.parametrize("scheduler", ["DDIM", "DDPM"])
def test_diffusion_noise_is_the_hosts(scheduler, tmp_path):
    """DDIM: the host's noise decides the chunk and replay is exact; DDPM: marked 'not injected', replay not comparable."""
    policy = LeRobotPolicy.load(_tiny.diffusion(tmp_path / "dp", scheduler))
    assert policy.chunk_shape == (4, 2)
    fp = policy.state_fingerprint()["noise"]
    assert fp == ("not injected" if scheduler == "DDPM" else "derived (seeded by the host noise digest)")
    result = rollcap.run(1, out=tmp_path / "run", policy=policy, progress=False, env_kwargs={"max_steps": 8})
    rec = result.records()[0]
    status = replay_policy(rec, policy).status
    assert status == ("not comparable" if scheduler == "DDPM" else "exact")
    if scheduler == "DDIM":
        obs = {"state": rec.obs["state"][0], "image_front": rec.obs["image_front"][0], "instruction": rec.instruction}
        chunks = []
        for noise in (rec.chunks["noise"][0], rec.chunks["noise"][0], rec.chunks["noise"][0] + 1):
            policy.start(obs, noise.astype(np.float32))
            chunks.append(policy.result())
        assert chunks[0].tobytes() == chunks[1].tobytes() != chunks[2].tobytes()


@pytest.mark.slow
def test_record_export_train_load_run(run_dir, tmp_path):
    """The loop closes offline: an exported run trains with lerobot-train (2 steps) and the checkpoint runs under the host."""
    import subprocess
    import sys
    from pathlib import Path

    out = export_lerobot(run_dir, tmp_path / "ds")
    train = tmp_path / "train"
    cmd = [
        str(Path(sys.executable).with_name("lerobot-train")),
        f"--dataset.repo_id={out.repo_id}",
        f"--dataset.root={out.root}",
        "--policy.type=act",
        "--policy.pretrained_backbone_weights=null",
        "--policy.push_to_hub=false",
        "--policy.device=cpu",
        "--policy.dim_model=32",
        "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1",
        "--policy.dim_feedforward=64",
        "--policy.chunk_size=6",
        "--policy.n_action_steps=6",
        "--steps=2",
        "--batch_size=2",
        "--num_workers=0",
        "--save_freq=2",
        "--wandb.enable=false",
        f"--output_dir={train}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    policy = LeRobotPolicy.load(train / "checkpoints" / "last" / "pretrained_model")
    result = rollcap.run(1, out=tmp_path / "run", policy=policy, progress=False, env_kwargs={"max_steps": 12})
    assert replay_policy(result.records()[0], policy).status == "exact"
