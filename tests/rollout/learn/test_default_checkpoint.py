"""The shipped policy and critic load, fit the built-in env, and drive an episode."""

from __future__ import annotations

import json

import pytest

from rollcap.critics import DEFAULT_CHECKPOINT as CRITIC
from rollcap.policies import DEFAULT_CHECKPOINT as POLICY
from rollcap.rollout.spec import Parts
from rollcap.rollout.build import make_env, make_runners
from rollcap.rollout.config import HostConfig
from rollcap.rollout.host import RolloutHost


@pytest.mark.slow
def test_shipped_checkpoints_fit_the_default_env():
    """Both checkpoints load with the built-in env's observation layout and run 2 chunks."""
    env = make_env()
    policy, critic = make_runners(Parts())
    space = env.observation_space
    for cfg in (policy.cfg, critic.cfg):
        assert cfg.state_dim == space["state"].shape[0]
        for key in cfg.image_keys:
            assert space[key].shape == (cfg.image_size, cfg.image_size, 3)
    rec = RolloutHost(env, policy, critic, HostConfig(seed=0, max_chunks=2)).run_episode(0).record
    assert rec.num_chunks >= 1 and rec.fingerprints["policy"]["weights_digest"].startswith("sha256:")


def test_shipped_checkpoints_are_small_and_reported():
    """The weights stay small enough to commit, and the training report sits beside them."""
    for ckpt in (POLICY, CRITIC):
        assert ckpt.with_suffix(".safetensors").stat().st_size < 8 * 2**20
    report = json.loads((POLICY.parent / "training_report.json").read_text())
    assert {"policy_success", "expert_success", "random_success", "critic_auroc_mid_episode"} <= set(report)
