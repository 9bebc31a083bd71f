"""Small models and observations for fast tests (import as ``tests.helpers``)."""

from __future__ import annotations

import numpy as np
import torch

from rollcap.critics import ValueCritic, ValueCriticConfig
from rollcap.policies import FlowVLA, FlowVLAConfig

TINY_POLICY = FlowVLAConfig(
    image_size=32,
    patch_size=16,
    state_dim=5,
    state_group=0,
    max_tokens=32,
    width=32,
    depth=1,
    heads=2,
    num_steps=3,
    horizon=4,
    cfg_beta=1.5,
)
TINY_CRITIC = ValueCriticConfig(
    image_size=32, patch_size=16, state_dim=5, state_group=0, max_tokens=32, width=32, depth=1, heads=2, n_bins=11
)


def tiny_policy(seed: int = 0, cfg: FlowVLAConfig = TINY_POLICY) -> FlowVLA:
    torch.manual_seed(seed)
    return FlowVLA(cfg).eval()


def tiny_critic(seed: int = 0, cfg: ValueCriticConfig = TINY_CRITIC) -> ValueCritic:
    torch.manual_seed(seed)
    return ValueCritic(cfg).eval()


def make_obs(seed: int, image_size: int = 32, state_dim: int = 5, instruction: str = "push the red block left") -> dict:
    rng = np.random.default_rng(seed)
    return {
        "image_front": rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8),
        "state": rng.standard_normal(state_dim).astype(np.float32),
        "instruction": instruction,
    }


def make_noise(seed: int, horizon: int = 4, action_dim: int = 2) -> np.ndarray:
    return np.random.default_rng(seed + 10_000).standard_normal((horizon, action_dim)).astype(np.float32)
