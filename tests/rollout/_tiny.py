"""Tiny runners matched to the built-in env (state 16, 32x32 images) for fast host tests."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

import rollcap.envs  # noqa: F401
from rollcap.critics import CriticRunner, ValueCritic, ValueCriticConfig
from rollcap.policies import FlowVLA, FlowVLAConfig, PolicyRunner

POLICY = FlowVLAConfig(image_size=32, patch_size=16, state_dim=28, width=32, depth=1, heads=2, num_steps=2, horizon=4)
CRITIC = ValueCriticConfig(image_size=32, patch_size=16, state_dim=28, width=32, depth=1, heads=2, n_bins=11)
ENV_KW = {"image_size": 32}


def make_env(**kw):
    return gym.make("rollcap/PushBlock-v0", **{**ENV_KW, **kw})


def make_runners(seed: int = 0, backend: str = "jit"):
    torch.manual_seed(seed)
    p = FlowVLA(POLICY).eval()
    c = ValueCritic(CRITIC).eval()
    return PolicyRunner(p, backend=backend), CriticRunner(c, backend=backend)


def first_obs(seed: int = 0) -> dict:
    """The built-in env's first observation for ``seed`` (the env is closed)."""
    env = make_env()
    obs, _ = env.reset(seed=seed)
    env.close()
    return obs


def flow_noise(seed: int) -> np.ndarray:
    """A ``[horizon, action_dim]`` float32 standard-normal chunk of flow noise for the tiny POLICY."""
    return np.random.default_rng(seed).standard_normal((POLICY.horizon, POLICY.action_dim)).astype(np.float32)
