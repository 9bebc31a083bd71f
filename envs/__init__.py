"""Built-in tasks and exact-state adapters for gymnasium / MuJoCo envs.

Import direction: ``rollcap.envs`` imports ``rollcap.kernels`` and
``rollcap.capsule`` only (calls point downward); ``rollcap.rollout`` imports
this package. Nothing here knows what an episode of the rollout host is.
Importing this package registers ``rollcap/PushBlock-v0`` with gymnasium
(once, however often it is imported).
"""

from __future__ import annotations

import gymnasium as gym

from rollcap.envs.errors import BadAction, CheckFailed, NoExactState, RenderUnavailable, StateMismatch
from rollcap.envs.push_block import ENV_ID, PushBlockConfig, PushBlockEnv
from rollcap.envs.scene import BLOCKS, TARGETS, VOCAB, make_instruction, parse_instruction

if ENV_ID not in gym.registry:
    # No TimeLimit (the env truncates itself, so max_steps is part of its exact
    # state) and no OrderEnforcing (the env checks order itself).
    gym.register(id=ENV_ID, entry_point="rollcap.envs.push_block:PushBlockEnv", order_enforce=False)

__all__ = [
    "BLOCKS",
    "ENV_ID",
    "TARGETS",
    "VOCAB",
    "BadAction",
    "CheckFailed",
    "NoExactState",
    "PushBlockConfig",
    "PushBlockEnv",
    "RenderUnavailable",
    "StateMismatch",
    "make_instruction",
    "parse_instruction",
]
